"""The dispatch table of a scenario (``expect.dispatch``): rows against the steps a run chose.

A row pins only what it names; a mismatch names the row, its line, the step, the rank, the field,
and both values; a row about a step that never ran fails; rows for other ranks or other modes are
not applied. End to end through ``run_point``: a wrong table fails a passing pipeline's item, and
a known-bad item may expect exactly ``dispatch`` to fail.
"""

from __future__ import annotations

import pytest

from harness.checks.dispatch_table import check_dispatch_table, observed
from harness.graph.record import RunRecord, StepRecord
from harness.scenario import ScenarioError, load_scenario_text
from harness.resolve import resolve_item
from harness.session import FAILED, PASSED, XFAILED, run_point


def _step(step: int, mode: str = "FULL", tokens: int = 5, padded: int = 8, reqs: int = 2, reqs_padded: int = 3):
    return StepRecord(step, [], tokens, False, mode, padded, reqs, reqs_padded, "", "",
                      ledger={"real": tokens, "bucket": padded - tokens},
                      descriptor={"num_tokens": padded, "num_reqs": None, "uniform_decode": False},
                      metadata={"actual_seq_lengths_kv": [3, 2, 0]})


def _record(*steps: StepRecord) -> RunRecord:
    record = RunRecord("FULL", "emulated", [8])
    record.steps = list(steps)
    return record


def _row(index: int = 0, **fields):
    return {"index": index, "rank": None, "for_mode": None, **fields}


def test_observed_names_what_a_row_can_pin():
    got = observed(_step(0))
    assert got["mode"] == "FULL" and got["bucket"] == 8 and got["padded_tokens"] == 3
    assert got["dummy_requests"] == 1 and got["descriptor"]["num_tokens"] == 8


def test_matching_rows_pass_and_say_how_many_matched():
    result = check_dispatch_table(_record(_step(0), _step(1)), [
        _row(0, step=0, mode="FULL", bucket=8, dummy_requests=1),
        _row(1, step=1, ledger={"real": 5, "bucket": 3}, metadata={"actual_seq_lengths_kv": [3, 2, 0]}),
    ])
    assert result.passed and "2 dispatch row(s) matched" in result.summary


def test_a_mismatch_names_row_step_rank_field_and_both_values():
    result = check_dispatch_table(_record(_step(0), _step(1, mode="PIECEWISE")), [
        _row(0, step=0, mode="FULL"), _row(1, step=1, mode="FULL", bucket=4),
    ], rank=0)
    assert not result.passed and result.first_step == 1
    assert result.summary.startswith("expect.dispatch[1]: step 1 rank 0: mode expected 'FULL', got 'PIECEWISE'")
    assert "(2 mismatches in all)" in result.summary
    fields = [m["field"] for m in result.details["table_mismatches"]]
    assert fields == ["mode", "bucket"]


def test_host_lists_compare_exactly_and_by_name():
    result = check_dispatch_table(_record(_step(0)), [_row(step=0, metadata={"actual_seq_lengths_kv": [3, 2, 1]})])
    assert not result.passed and "metadata.actual_seq_lengths_kv expected [3, 2, 1], got [3, 2, 0]" in result.summary


def test_a_row_about_a_step_that_did_not_run_fails():
    result = check_dispatch_table(_record(_step(0)), [_row(step=5, mode="FULL")])
    assert not result.passed and "step 5 did not run on rank 0 (the run has steps 0..0)" in result.summary


def test_rows_for_other_ranks_and_modes_are_not_applied():
    rows = [_row(0, step=0, rank=1, mode="NONE"), _row(1, step=0, for_mode="PIECEWISE", mode="NONE")]
    result = check_dispatch_table(_record(_step(0)), rows, rank=0, mode="FULL")
    assert result.passed and "no dispatch row applies to rank 0" in result.summary
    assert not check_dispatch_table(_record(_step(0)), rows, rank=1, mode="FULL").passed


SCENARIO = """
name: t
model: {max_model_len: 64}
graph: {mode: FULL, capture_sizes: [1, 2, 4, 8]}
workload:
  steps:
    - [{req: a, new_tokens: 3}, {req: b, new_tokens: 2}]
expect:
  dispatch:
    - {step: 0, mode: FULL, bucket: BUCKET, descriptor: {num_tokens: 8, num_reqs: 8}, num_reqs_padded: 3}
"""


def test_end_to_end_a_right_table_passes_and_a_wrong_one_fails_the_item():
    (point,) = load_scenario_text(SCENARIO.replace("BUCKET", "8"))
    result = run_point(point, backend="emulated")
    assert result.outcome == PASSED and "dispatch table matched" in result.verdict
    (point,) = load_scenario_text(SCENARIO.replace("BUCKET", "4"))
    result = run_point(point, backend="emulated")
    assert result.outcome == FAILED
    # the row's line was read when the text was loaded: the file is not read again
    assert point.dispatch_lines == (10,)
    assert "dispatch: expect.dispatch[0] (line 10): step 0 rank 0: bucket expected 4, got 8" in result.verdict
    assert result.checks["dispatch"].details["table_mismatches"][0]["line"] == 10


def test_a_known_bad_item_may_expect_exactly_the_dispatch_table_to_fail():
    text = SCENARIO.replace("BUCKET", "4").replace("expect:\n", "expect:\n  fail: [dispatch]\n")
    (point,) = load_scenario_text(text)
    assert run_point(point, backend="emulated").outcome == XFAILED


def test_rows_pin_only_the_fields_the_file_names():
    (point,) = load_scenario_text(SCENARIO.replace("BUCKET", "8"))
    (row,) = resolve_item(point.scenario).dispatch_rows
    assert set(row) == {"step", "rank", "for_mode", "index", "line", "mode", "bucket", "descriptor", "num_reqs_padded"}
    assert row["descriptor"] == {"num_tokens": 8, "num_reqs": 8, "uniform_decode": False}


@pytest.mark.parametrize("bad, message", [
    ("    - {step: 0}\n", "a dispatch row pins nothing"),
    ("    - {step: 0, mode: FULL}\n    - {step: 0, bucket: 8}\n", "step 0 is pinned twice"),
    ("    - {step: 0, mode: NONE, descriptor: {num_tokens: 8}}\n", "mode NONE replays no graph"),
    ("    - {step: 0, mode: FULLY}\n", "mode"),
])
def test_malformed_rows_are_load_errors(bad, message):
    text = SCENARIO.split("  dispatch:\n")[0] + "  dispatch:\n" + bad
    with pytest.raises(ScenarioError, match=message):
        load_scenario_text(text)
