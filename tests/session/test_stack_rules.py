"""Issue 27's stack rules end to end: the same scenario text under the releases whose rule
differs, each item's graphs, notes and verdict as that release's (docs/conformance.md)."""

from __future__ import annotations

from harness import resolve
from harness.graph.capture_errors import GUIDANCE
from harness.resolve import PointSkipped, resolve_item
from harness.scenario import load_scenario_text
from harness.session import PASSED, SKIPPED, XFAILED, preflight, run_point

BASE = """
model: {kind: random, layers: 2, max_model_len: 64}
steps: 3
workload:
  requests:
    - {prompt_len: 3, output_len: 3}
    - {prompt_len: 2, output_len: 3}
"""


def _point(text: str, stack: str | None = None):
    (point,) = load_scenario_text(text + BASE + (f"stack: {stack}\n" if stack else ""))
    return point


def _skip_reason(scenario) -> str | None:
    try:
        resolve_item(scenario)
    except PointSkipped as skipped:
        return skipped.reason
    return None


def test_full_and_piecewise_downgraded_captures_only_piecewise_graphs_and_says_why():
    text = "graph: {mode: FULL_AND_PIECEWISE, capture_sizes: [1, 2, 4]}\n"
    old, new = (run_point(_point(text, stack), backend="emulated") for stack in ("v0.18.0", "v0.23.0"))
    assert old.outcome == new.outcome == PASSED
    # 2 layers: 3 pieces per size -> 9 PIECEWISE graphs; v0.23.0 adds the uniform FULL graphs of 1, 2, 4
    assert (old.record.graphs_captured, new.record.graphs_captured) == (9, 12)
    note = next(n for n in old.record.notes if n.startswith("FULL_AND_PIECEWISE -> PIECEWISE"))
    assert "PR #9572" in note and "no log line" in note
    assert not any("FULL_AND_PIECEWISE -> PIECEWISE" in n for n in new.record.notes)
    assert "FULL" not in {s.runtime_mode for s in old.record.steps}  # the 5-token prefill is eager on both
    assert "FULL" in {s.runtime_mode for s in new.record.steps}


def test_the_downgrade_decides_the_legacy_budget_and_spec_decode_rounding():
    text = "graph: {mode: FULL_AND_PIECEWISE, max_num_seqs: 512}\nengine: {budget_policy: legacy}\n"
    old = resolve_item(_point(text, "v0.18.0").scenario).budget
    new = resolve_item(_point(text, "v0.23.0").scenario).budget
    assert "FULL_AND_PIECEWISE" not in old.explanation and "FULL_AND_PIECEWISE" in new.explanation
    # spec decode rounds sizes only with a FULL decode routine, which the downgraded mode lacks
    mtp = "graph: {mode: FULL_AND_PIECEWISE, capture_sizes: [1, 2, 4, 8]}\nfeatures: {mtp: {k: 2}}\n"
    for stack, sizes in (("v0.18.0", [1, 2, 4, 8]), ("v0.23.0", [3, 6])):
        assert list(resolve_item(_point(mtp, stack).scenario).capture_sizes) == sizes


def test_a_stream_budget_failure_shows_the_text_of_the_release():
    text = ("graph: {mode: PIECEWISE, capture_sizes: [1, 2, 4, 8, 16, 24, 32, 40, 48]}\n"
            "engine: {stream_pool: 16, budget_policy: none}\nexpect: {fail: [stream_budget]}\n")
    for stack, guidance in (("v0.18.0", None), ("v0.23.0", "pr9962"), ("main", "pr10555")):
        result = run_point(_point(text, stack), backend="emulated")
        assert result.outcome == XFAILED, result.verdict
        summary = result.checks["stream_budget"].summary
        if guidance is None:
            assert summary.startswith("capture failed: error code 207008: Stream resources are insufficient")
        else:
            assert summary.startswith(f"capture failed: {GUIDANCE[guidance]}\nOriginal error:\nerror code 207008")
        (error,) = [e for e in result.record.errors if e.phase == "capture"]
        assert error.category.value == "stream_budget"


def test_a_budget_that_keeps_one_size_stops_v0_18_0_at_start_up(monkeypatch):
    """Under the scenario bounds (at most 64 layers, the cap of 1800 streams) n stays above 1, so
    the crash needs a tighter cap: the session's legacy inputs with ``max_streams=100``, through
    the real formula and the real skip path."""
    text = "graph: {mode: PIECEWISE, capture_sizes: [1, 2, 4, 8]}\nengine: {budget_policy: legacy}\n"
    (old,) = load_scenario_text(text + BASE.replace("layers: 2", "layers: 64") + "stack: v0.18.0\n")
    (new,) = load_scenario_text(text + BASE.replace("layers: 2", "layers: 64") + "stack: v0.23.0\n")
    budget = resolve.stream_budget
    monkeypatch.setattr(resolve, "stream_budget",
                        lambda policy, sizes, **inputs: budget(policy, sizes, **inputs, max_streams=100))
    # n = floor(100 / 65) = 1 of 4 sizes: v0.18.0 divides by zero at start-up, PR #9572 keeps [8]
    reason = _skip_reason(old.scenario)
    assert reason.startswith("the real engine refuses to start (stack v0.18.0): update_aclgraph_sizes")
    assert "ZeroDivisionError: division by zero" in reason
    result = run_point(old, backend="emulated")
    assert result.outcome == SKIPPED and result.verdict == reason
    assert _skip_reason(new.scenario) is None
    assert list(resolve_item(new.scenario).capture_sizes) == [8]


def test_mode_none_captures_nothing_and_refuses_no_size_list():
    # tp 2 keeps no size of [1, 3]: an error in a graph mode, nothing at all in NONE (vLLM: [], max 0)
    text = "graph: {mode: NONE, capture_sizes: [1, 3]}\nfeatures: {sp: {tp: 2}}\n"
    point = _point(text)
    assert preflight(point.scenario) is None
    result = run_point(point, backend="emulated")
    assert result.outcome == PASSED, result.verdict
    assert result.record.capture_sizes == [] and result.record.graphs_captured == 0
    assert any("graph mode NONE: no capture sizes" in n for n in result.record.notes)
    broken = _point(text.replace("NONE", "PIECEWISE"))
    assert preflight(broken.scenario)[0] == "graph.capture_sizes"


def test_compilation_mode_notes_and_skips_nothing():
    text = "graph: {mode: PIECEWISE, capture_sizes: [1, 2, 4], compilation_mode: NONE}\n"
    result = run_point(_point(text), backend="emulated")
    assert result.outcome == PASSED and result.record.graphs_captured == 0
    assert any(n.startswith("Cudagraph mode PIECEWISE is not compatible with compilation mode 0.Overriding to NONE.")
               for n in result.record.notes)
    assert {s.runtime_mode for s in result.record.steps} == {"NONE"}


def test_sp_and_mtp_refusal_follows_the_mode_the_release_runs():
    # tp 2, k 2: max(3, 2) is no common multiple, so vLLM refuses to start with a FULL decode routine;
    # on v0.18.0 FULL_AND_PIECEWISE is PIECEWISE: no rounding, no refusal
    text = "graph: {mode: FULL_AND_PIECEWISE, capture_sizes: [2, 4, 8]}\nfeatures: {sp: {tp: 2}, mtp: {k: 2}}\n"
    assert "refuses to start" in _skip_reason(_point(text, "v0.23.0").scenario)
    assert _skip_reason(_point(text, "v0.18.0").scenario) is None
    assert run_point(_point(text, "v0.23.0"), backend="emulated").outcome == SKIPPED
