"""Issue 27 points 5 and 6 on the real pipeline: dummy runs without attention metadata, and the
draft model's own graphs.

Expected values come from the upstream rules named (docs/conformance.md), not from the harness's
output:

* vLLM ``gpu_model_runner.py`` ``_warmup_and_capture``: warm-ups run with runtime NONE and
  ``force_attention = cudagraph_runtime_mode == FULL``; ``_dummy_run`` builds attention metadata
  only for a FULL run (vLLM Ascend ``_should_build_dummy_attn_metadata``), and vLLM Ascend's
  attention returns zeros without it. So a PIECEWISE key makes no FIA call before the first step,
  and a FULL key makes ``warmup_runs x layers`` in its warm-ups and ``layers`` in its capture.
* vLLM Ascend's proposer (``spec_decode/llm_base_proposer.py``, v0.23.0): ``dummy_run`` after
  each of the target's dummy runs, on the same batch descriptor; the draft model compiled like
  the target (``draft_layers + 1`` piecewise graphs per size), one FULL graph per FULL key holding
  all ``k`` rounds (``_run_merged_draft``, PR #6860), whose ``k x draft_layers`` FIA task groups
  are updated after each replay (``update_full_graph_params(..., draft_attn_metadatas)``), and
  rounds 2..k of a FULL draft with ``query_start_loc = arange(T + 1)`` and zero KV lengths past
  the real requests (``attn_update_stack_num_spec_norm``).
"""

from __future__ import annotations

import pytest

from harness import executor
from harness.graph.record import fia_calls_by_phase
from harness.resolve import resolve_item
from harness.scenario import load_scenario_text

SIZES = [3, 6, 9, 12]  # multiples of q = 3 (k = 2): every size is also a uniform-decode key
TARGET_LAYERS, DRAFT_LAYERS, K, WARMUPS = 2, 1, 2, 1

SCENARIO = """
name: draft_graphs
model: {kind: random, layers: 2, max_model_len: 64}
graph: {mode: MODE, capture_sizes: [3, 6, 9, 12]EXTRA}
features: {mtp: {k: 2}}
fixes: {drafter_param_update: FIX}
steps: 10
workload:
  requests:
    - {prompt_len: 5, output_len: 8}
    - {prompt_len: 3, output_len: 6, arrival_step: 1}
    - {prompt_len: 2, output_len: 5, arrival_step: 2}
"""


def run(mode: str, *, fix: bool = True, extra: str = ""):
    text = SCENARIO.replace("MODE", mode).replace("FIX", str(fix).lower()).replace("EXTRA", extra)
    (point,) = load_scenario_text(text)
    record, checks = executor.run_rank(resolve_item(point.scenario))
    return record, {str(name): check for name, check in checks.items()}


def piecewise(layers: int) -> int:
    return len(SIZES) * (layers + 1)  # every size, one graph per piece (layers + 1 pieces)


# (target graphs, draft graphs) per mode, from the rules in the module docstring. FULL captures
# mixed keys of every size, FULL_DECODE_ONLY uniform-decode keys (every size here: each is a
# multiple of q and at most max_num_seqs * q), FULL_AND_PIECEWISE both kinds.
GRAPHS = {
    "NONE": (0, 0),
    "PIECEWISE": (piecewise(TARGET_LAYERS), piecewise(DRAFT_LAYERS)),
    "FULL": (len(SIZES), len(SIZES)),
    "FULL_DECODE_ONLY": (len(SIZES), len(SIZES)),
    "FULL_AND_PIECEWISE": (piecewise(TARGET_LAYERS) + len(SIZES), piecewise(DRAFT_LAYERS) + len(SIZES)),
}
FULL_KEYS = {"NONE": 0, "PIECEWISE": 0, "FULL": len(SIZES), "FULL_DECODE_ONLY": len(SIZES),
             "FULL_AND_PIECEWISE": len(SIZES)}


@pytest.mark.parametrize("mode", list(GRAPHS))
def test_the_draft_model_is_captured_per_capture_key(mode):
    record, checks = run(mode)
    target, draft = GRAPHS[mode]
    assert (record.graphs_captured - record.draft_graphs_captured, record.draft_graphs_captured) == (target, draft)
    assert all(check.passed for check in checks.values()), {n: c.summary for n, c in checks.items()}


@pytest.mark.parametrize("mode", list(GRAPHS))
def test_only_full_keys_run_attention_before_the_first_step(mode):
    record, _ = run(mode)
    phases = fia_calls_by_phase(record.fia_calls)
    full = FULL_KEYS[mode]
    assert phases.get("warmup", 0) == WARMUPS * TARGET_LAYERS * full  # a PIECEWISE key's: none
    assert phases.get("capture", 0) == TARGET_LAYERS * full
    assert phases.get("draft-capture", 0) == K * DRAFT_LAYERS * full  # every round of the merged graph
    assert "draft-warmup" not in phases  # the drafter's warm-ups are runtime NONE: no metadata


@pytest.mark.parametrize("mode", ["FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"])
def test_every_full_draft_replay_updates_each_round_and_layer(mode):
    record, _ = run(mode)
    full_drafts = [s for s in record.steps if s.draft and s.draft["mode"] == "FULL"]
    assert full_drafts
    phases = fia_calls_by_phase(record.fia_calls)
    assert phases["draft-update"] == len(full_drafts) * K * DRAFT_LAYERS
    for step in full_drafts:
        draft, rows = step.draft, step.draft["bucket"]
        later = draft["metadata"][1]  # round 2: T one-token requests, KV lengths zero-padded
        assert later["actual_seq_lengths"] == list(range(1, rows + 1))
        kv = later["actual_seq_lengths_kv"]
        real = sum(1 for length in kv if length > 0)
        assert real and kv == kv[:real] + [0] * (rows - real)
        assert draft["executed"] == [{name: lists[name] for name in lists}
                                     for lists in draft["metadata"] for _ in range(DRAFT_LAYERS)]


@pytest.mark.parametrize("mode", ["FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"])
def test_without_the_update_a_draft_replay_runs_its_capture_lists(mode):
    record, checks = run(mode, fix=False)
    full_drafts = [s for s in record.steps if s.draft and s.draft["mode"] == "FULL"]
    assert full_drafts and "draft-update" not in fia_calls_by_phase(record.fia_calls)
    by_bucket: dict[int, list] = {}
    for step in full_drafts:
        assert step.draft["executed"] != step.draft["metadata"]
        by_bucket.setdefault(step.draft["bucket"], []).append(step.draft["executed"])
    for replays in by_bucket.values():  # every replay of one key runs the same (capture-time) lists
        assert all(executed == replays[0] for executed in replays)
    assert [name for name, check in checks.items() if not check.passed] == ["stale_params"]
    assert checks["stale_params"].summary.startswith("draft graph replayed capture-time")


def test_no_draft_graphs_without_vllm_compile():
    # vLLM Ascend `use_cuda_graph = runner._use_aclgraph()`: false unless compilation mode VLLM_COMPILE
    record, checks = run("FULL", extra=", compilation_mode: NONE")
    assert record.draft_graphs_captured == 0 and record.graphs_captured == len(SIZES)
    assert all(s.draft["mode"] == "NONE" for s in record.steps if s.draft)
    assert "draft-capture" not in fia_calls_by_phase(record.fia_calls)
    assert all(check.passed for check in checks.values())


IDLE = """
name: idle_rank_attention
model: {kind: random, layers: 2, max_model_len: 64}
graph: {mode: MODE, capture_sizes: [1, 2, 4, 8], max_num_seqs: 8}
features: {dp: {size: 2, batches: idle}}
steps: 3
workload:
  requests:
    - {prompt_len: 3, output_len: 3}
"""


@pytest.mark.parametrize("mode, attends", [("NONE", False), ("PIECEWISE", False), ("FULL_DECODE_ONLY", True)])
def test_an_idle_dp_rank_attends_only_in_its_full_dummy_steps(mode, attends):
    """vLLM Ascend's ``execute_dummy_batch`` runs ``_dummy_run``, which builds attention metadata
    only for a FULL run (``_should_build_dummy_attn_metadata``); without it the attention
    returns zeros and FIA is not called. Rank 1 gets no request: every step of its graph and
    padded paths is a dummy. In FULL_DECODE_ONLY its dummy is one uniform request, which replays
    the uniform FULL graph (``rules/dp_idle_rank.yaml``)."""
    from harness.executor import rank_job
    from harness.ranks import run_ranks

    (point,) = load_scenario_text(IDLE.replace("MODE", mode))
    item = resolve_item(point.scenario)
    outcome = run_ranks(rank_job, 2, args=(item,), timeout=300)
    assert outcome.ok, outcome.report()
    (busy, busy_checks), (idle, idle_checks) = outcome.results
    assert all(not s.sampled.get("graph") for s in idle.steps)  # idle throughout: nothing sampled
    for path in ("graph", "padded"):
        at_steps = {k: n for k, n in fia_calls_by_phase(idle.fia_calls, path).items() if k not in ("warmup", "capture")}
        assert bool(at_steps) is attends, (path, at_steps)
        assert set(fia_calls_by_phase(busy.fia_calls, path)) - {"warmup", "capture"}  # the busy rank attends
    assert all(c.passed for c in (*busy_checks.values(), *idle_checks.values()))
