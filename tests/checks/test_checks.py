"""Each check on hand-made run records: it passes on good evidence and fails on bad."""

from __future__ import annotations

import torch

from harness.checks import run_checks
from harness.checks.equality import check_equality
from harness.checks.fia_invariant import check_fia_invariant
from harness.checks.stale_params import check_stale_params
from harness.checks.stream_budget import check_stream_budget
from harness.engine import GraphHangError, StreamBudgetError
from harness.graph.record import ErrorCategory, PathError, RunRecord, StepRecord
from harness.ops import FiaCall


def _step(index=0, executed=None, live=None, logits=None, sampled=None):
    live = live or {"actual_seq_lengths": [1, 2], "actual_seq_lengths_kv": [5, 6]}
    return StepRecord(step=index, requests=[("a", 4, 1), ("b", 5, 1)], num_tokens=2, uniform_decode=True,
                      runtime_mode="FULL", num_tokens_padded=2, num_reqs=2, num_reqs_padded=2,
                      padding_source="none", dispatch_reason="exact FULL key", metadata=dict(live),
                      reference_metadata=dict(live), executed=executed, logits=logits or {}, sampled=sampled or {})


def _call(T, last, strict_ok, relaxed_ok, error=None):
    return FiaCall("out", T, (last,), (3,), 1, "strict", strict_ok, relaxed_ok, error,
                   {"path": "graph", "phase": "update", "step": 2, "layer": 1, "bucket": T, "padding": "p"})


def test_fia_invariant_reports_the_first_violation_and_the_other_contract():
    record = RunRecord("FULL", "emulated", [8])
    record.fia_calls = [_call(8, 8, True, True), _call(8, 5, False, True, "[561002] When layout is TND ...")]
    result = check_fia_invariant(record, "strict")
    assert not result.passed and result.first_step == 2
    assert "561002" in result.summary and "relaxed contract would have accepted it" in result.summary
    record.fia_calls = [_call(8, 5, False, True)]  # the same call made under the relaxed contract
    assert check_fia_invariant(record, "relaxed").passed  # 5 < 8 is legal under the proposal
    assert not check_fia_invariant(record, "strict").passed
    record.fia_calls = [_call(8, 8, True, True)]
    assert check_fia_invariant(record, "strict").passed


def test_stale_params_compares_executed_lists_with_the_live_batch():
    record = RunRecord("FULL", "emulated", [2])
    live = {"actual_seq_lengths": [1, 2], "actual_seq_lengths_kv": [5, 6]}
    record.steps = [_step(0, executed=[dict(live)], live=live)]
    assert check_stale_params(record).passed
    record.steps = [_step(0, executed=[{"actual_seq_lengths": [1, 2], "actual_seq_lengths_kv": [1, 1]}], live=live)]
    result = check_stale_params(record)
    assert not result.passed and "capture-time actual_seq_lengths_kv [1, 1] at step 0" in result.summary


def test_stale_params_falls_back_to_repeated_text_where_the_engine_cannot_say():
    record = RunRecord("FULL", "npu", [2])
    record.steps = [_step(0)]
    record.steps[0].host_lists_unverifiable = True
    record.texts = {"reference": {"a": [5, 6, 7, 8, 9]}, "graph": {"a": [5, 5, 5, 5, 5]}}
    assert not check_stale_params(record).passed
    record.texts["graph"] = {"a": [5, 6, 7, 8, 9]}
    assert check_stale_params(record).passed


def test_stream_budget_fails_on_207008_and_reports_utilisation():
    record = RunRecord("PIECEWISE", "emulated", [1, 2])
    record.graphs_captured, record.stream_usage = 6, {"in_use": 6, "pool_size": 2048}
    assert "6 of 2048 streams (0.3%)" in check_stream_budget(record).summary
    record.errors.append(PathError.of("graph", None, "capture", StreamBudgetError(1, 2048, 2048, "graph#7")))
    assert record.errors[-1].category is ErrorCategory.STREAM_BUDGET  # classified by class, not name
    assert not check_stream_budget(record).passed


def test_stream_budget_is_not_evaluated_on_an_engine_without_a_stream_pool():
    record = RunRecord("FULL", "cuda", [1, 2])  # CUDA graphs: what harness.engine.cuda reports
    record.graphs_captured, record.stream_usage = 2, {"pool_size": None, "in_use": None, "graphs": 2}
    result = check_stream_budget(record)
    assert not result.evaluated and "no graph stream pool" in result.summary


def test_equality_bitwise_on_the_emulator_and_first_mismatch_located():
    base = torch.zeros(2, 4)
    bumped = base.clone()
    bumped[1, 2] = 1e-7
    record = RunRecord("FULL", "emulated", [2])
    same = {"reference": base, "padded": base.clone(), "graph": base.clone()}
    toks = {"reference": [1, 2], "padded": [1, 2], "graph": [1, 2]}
    record.steps = [_step(0, logits=same, sampled=toks)]
    assert check_equality(record, dtype="float32", bitwise_replay=True).passed
    record.steps = [_step(0, logits={**same, "graph": bumped}, sampled=toks)]
    result = check_equality(record, dtype="float32", bitwise_replay=True)
    assert not result.passed
    assert "request b position 0" in result.summary and "graph effect" in result.summary
    assert check_equality(record, dtype="float32", bitwise_replay=False).passed  # within tolerance
    explained = check_equality(record, dtype="float32", bitwise_replay=True, explained_from=0)
    assert explained.passed and "explained" in explained.summary


def test_tolerance_scales_with_the_row_so_a_near_zero_logit_needs_no_relative_agreement():
    """bf16 rounding of a row whose largest logit is 3: an error of 0.03 on a logit of 0.01 is
    rounding (relative error 3, far above rtol), an error of 0.3 is not."""
    reference = torch.tensor([[3.0, 0.01, -1.0, 0.5], [2.0, 1.0, 0.0, -2.0]])
    rounded, wrong = reference.clone(), reference.clone()
    rounded[0, 1] += 0.03
    wrong[0, 1] += 0.3
    record = RunRecord("FULL", "emulated", [2])
    toks = {"reference": [0, 0], "padded": [0, 0], "graph": [0, 0]}
    record.steps = [_step(0, logits={"reference": reference, "padded": rounded, "graph": rounded.clone()}, sampled=toks)]
    assert check_equality(record, dtype="bfloat16", bitwise_replay=True).passed
    record.steps = [_step(0, logits={"reference": reference, "padded": wrong, "graph": wrong.clone()}, sampled=toks)]
    result = check_equality(record, dtype="bfloat16", bitwise_replay=True)
    assert not result.passed and "padding effect" in result.summary


def test_paths_that_part_at_a_rounding_tie_are_compared_up_to_there_and_never_on_a_bitwise_pair():
    tie = torch.tensor([[1.0, 1.004, 0.0, -1.0], [2.0, 0.0, 0.0, 0.0]])
    flipped = torch.tensor([[1.004, 1.0, 0.0, -1.0], [2.0, 0.0, 0.0, 0.0]])
    record = RunRecord("FULL", "emulated", [2])
    record.steps = [
        _step(0, logits={"reference": tie, "padded": flipped, "graph": flipped.clone()},
              sampled={"reference": [1, 0], "padded": [0, 0], "graph": [0, 0]}),
        # afterwards the paths feed different tokens: their logits have nothing in common
        _step(1, logits={"reference": torch.zeros(2, 4), "padded": torch.ones(2, 4), "graph": torch.ones(2, 4)},
              sampled={"reference": [0, 0], "padded": [1, 1], "graph": [1, 1]}),
    ]
    result = check_equality(record, dtype="bfloat16", bitwise_replay=True)
    assert result.passed and "padded vs reference parted at a tie within rounding at step 0" in result.summary
    assert result.details["ties"][0]["tokens"] == {"padded": [0, 0], "reference": [1, 0]}
    # the same flip between graph and padded, compared bitwise, is a mismatch
    record.steps = record.steps[:1]
    record.steps[0].logits["graph"], record.steps[0].sampled["graph"] = tie.clone(), [1, 0]
    result = check_equality(record, dtype="bfloat16", bitwise_replay=True)
    assert not result.passed and "graph vs padded" in result.summary


def test_a_tie_on_a_bonus_token_parts_the_paths_though_their_first_tokens_agree():
    # Spec decode: a request's rows verify its draft (row 0) and give the bonus token (row 1). The
    # draft is accepted on both paths; the bonus row sits on a tie within bf16 rounding, so the
    # paths feed different tokens from the next step on (a fuzz-found false failure: SP + MTP).
    tie = torch.tensor([[3.0, 0.0, 0.0, 0.0], [0.0, 1.0, 1.004, -1.0]])
    flipped = torch.tensor([[3.0, 0.0, 0.0, 0.0], [0.0, 1.004, 1.0, -1.0]])
    later = {"reference": torch.zeros(2, 4), "padded": torch.ones(2, 4), "graph": torch.ones(2, 4)}
    record = RunRecord("FULL", "emulated", [2])
    record.steps = [
        _step(0, logits={"reference": tie, "padded": flipped, "graph": flipped.clone()},
              sampled={"reference": [0], "padded": [0], "graph": [0]}),
        _step(1, logits=later, sampled={"reference": [0], "padded": [1], "graph": [1]}),
    ]
    for step in record.steps:
        step.requests = [("a", 4, 2)]
    # without the verified tokens only the first token is seen: step 1 looks like a padding bug
    assert not check_equality(record, dtype="bfloat16", bitwise_replay=True).passed
    record.steps[0].generated = {"reference": [[0, 2]], "padded": [[0, 1]], "graph": [[0, 1]]}
    result = check_equality(record, dtype="bfloat16", bitwise_replay=True)
    assert result.passed and "padded vs reference parted at a tie within rounding at step 0" in result.summary
    assert result.details["ties"][0]["tokens"] == {"padded": [[0, 1]], "reference": [[0, 2]]}


def test_paths_whose_drafters_part_at_a_tie_are_compared_up_to_there_unless_bitwise():
    # A TP rank's bf16 draft model against the unsplit one may propose another token: the verify
    # rows after the first then read different inputs, and later steps differ in shape.
    logits = torch.tensor([[3.0, 0.0, 0.0, 0.0], [0.0, 2.0, 0.0, 0.0]])
    record = RunRecord("FULL", "emulated", [2])
    record.steps = [
        _step(0, logits={"reference": logits, "padded": logits + 1, "graph": logits + 1},
              sampled={"reference": [0], "padded": [0], "graph": [0]}),
        _step(1, logits={"reference": torch.zeros(1, 4), "padded": torch.ones(3, 4), "graph": torch.ones(3, 4)},
              sampled={"reference": [0], "padded": [1], "graph": [1]}),
    ]
    record.steps[0].requests = [("a", 4, 2)]
    record.steps[0].proposed = {"reference": {"a": [1]}, "padded": {"a": [2]}, "graph": {"a": [2]}}
    result = check_equality(record, dtype="bfloat16", bitwise_replay=True)
    assert result.passed and "padded vs reference proposed different drafts at step 0" in result.summary
    # graph against padded is bitwise: drafts that differ there are a bug, compared as ever
    record.steps[0].proposed["graph"] = {"a": [1]}
    record.steps[1].logits["graph"] = torch.zeros(1, 4)
    assert not check_equality(record, dtype="bfloat16", bitwise_replay=True).passed


def test_speculative_text_must_equal_plain_greedy_unless_the_step_limit_cut_it_short():
    record = RunRecord("FULL", "emulated", [2])
    record.texts = {"reference": {"a": [5, 6, 7]}, "graph": {"a": [5, 6, 7]}, "plain": {"a": [5, 6, 7, 8, 9]}}
    assert not check_equality(record, dtype="float32", bitwise_replay=True).passed  # finished short: a bug
    record.unfinished = {"reference": ["a"], "graph": ["a"], "plain": []}
    assert check_equality(record, dtype="float32", bitwise_replay=True).passed  # cut by the steps: a prefix
    record.texts["graph"] = {"a": [5, 6, 9]}
    result = check_equality(record, dtype="float32", bitwise_replay=True)
    assert not result.passed and "graph (speculative) vs plain greedy" in result.summary


def test_unexplained_path_errors_are_an_execution_failure():
    record = RunRecord("FULL", "emulated", [2])
    record.errors.append(PathError.of("graph", 3, "step", GraphHangError("replay of graph#2 waits")))
    checks = run_checks(record, contract="strict", dtype="float32", bitwise_replay=True)
    assert not checks["execution"].passed and "GraphHangError at step 3" in checks["execution"].summary
