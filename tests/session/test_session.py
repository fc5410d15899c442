"""The session: expectations decide outcomes; a run is deterministic bit for bit."""

from __future__ import annotations

import dataclasses

import torch

from harness.checks import CheckResult
from harness.scenario import Expect, load_scenario_text
from harness.session import FAILED, PASSED, XFAILED, run_point
from harness.verdict import decide

SCENARIO = """
name: s
model: {kind: random, layers: 2}
graph: {mode: FULL, capture_sizes: [1, 2, 4, 8]}
steps: 6
workload:
  requests:
    - {prompt_len: 5, output_len: 6}
    - {prompt_len: 2, output_len: 4, arrival_step: 1, repeat: 2}
"""


def _checks(*failing):
    names = ("fia_invariant", "equality", "stale_params", "stream_budget")
    return {n: CheckResult(n, n not in failing, f"{n} summary") for n in names}


def test_decide_compares_failures_with_the_expectation_exactly():
    assert decide(Expect(), _checks())[0] == PASSED
    assert decide(Expect(), _checks("equality"))[0] == FAILED
    assert decide(Expect(fail=["stale_params"]), _checks("stale_params"))[0] == XFAILED
    outcome, verdict = decide(Expect(fail=["stale_params"]), _checks())
    assert outcome == FAILED and "passed unexpectedly" in verdict
    outcome, verdict = decide(Expect(fail=["stale_params"]), _checks("stale_params", "equality"))
    assert outcome == FAILED and "unexpected failure of equality" in verdict


def test_runs_are_deterministic_bit_for_bit():
    (point,) = load_scenario_text(SCENARIO)
    first, second = run_point(point, backend="emulated"), run_point(point, backend="emulated")
    assert first.outcome == second.outcome == PASSED
    assert first.record.texts == second.record.texts
    for a, b in zip(first.record.steps, second.record.steps):
        assert a.metadata == b.metadata
        for path in a.logits:
            assert torch.equal(a.logits[path], b.logits[path])


TP2 = """
name: tp2
model: {kind: random, layers: 1, hidden_size: 32, num_heads: 4, num_kv_heads: 2, head_dim: 8}
graph: {mode: FULL_AND_PIECEWISE, capture_sizes: [2, 4, 8]}
features: {sp: {tp: 2}, mtp: {k: 1}}
steps: 5
workload:
  requests:
    - {prompt_len: 3, output_len: 4, repeat: 2}
"""


def test_tp_ranks_compute_the_reference_once_and_rank_0_compares_it():
    from harness.ranks import run_ranks
    from harness.resolve import resolve_item
    from harness.executor import rank_job

    (point,) = load_scenario_text(TP2)
    out = run_ranks(rank_job, 2, args=(resolve_item(point.scenario),), timeout=300)
    assert out.ok, out.report()
    (first, first_checks), (second, second_checks) = out.results
    assert first.reference_here and not second.reference_here
    assert {"reference", "plain"} <= set(first.texts) and not {"reference", "plain"} & set(second.texts)
    assert all("reference" in s.sampled for s in first.steps) and not any("reference" in s.sampled for s in second.steps)
    assert "ran on the first rank of its TP/CP group" in " ".join(second.notes)
    assert all(c.passed for c in first_checks.values()) and all(c.passed for c in second_checks.values())
    assert first.texts["graph"] == second.texts["graph"]  # the same tokens on both ranks
    assert first_checks["equality"].details["compared"] > second_checks["equality"].details["compared"] > 0


def test_a_crash_inside_the_pipeline_is_the_items_result(monkeypatch):
    import harness.executor as executor

    def boom(*args, **kwargs):
        raise RuntimeError("pipeline exploded")

    monkeypatch.setattr(executor, "run_pipeline", boom)
    (point,) = load_scenario_text(SCENARIO)
    result = run_point(point, backend="emulated")
    assert result.outcome == FAILED and "pipeline exploded" in result.verdict and result.traceback


def test_speculative_greedy_output_equals_plain_greedy_output():
    (point,) = load_scenario_text(SCENARIO + "features: {mtp: {k: 2}}\n")
    result = run_point(point, backend="emulated")
    assert result.outcome == PASSED, result.verdict
    texts = result.record.texts
    assert texts["graph"] == texts["plain"] == texts["reference"]
    stats = result.record.speculation["graph"]
    assert stats["proposed"] > 0 and 0 <= stats["accepted"] <= stats["proposed"]


def test_a_failing_rank_fails_only_its_item_with_its_log(monkeypatch):
    import harness.executor as executor
    from harness.ranks import RankFailure, RanksOutcome

    failure = RankFailure(1, "timeout", "did not finish within the 300s timeout", None, "rank 1 entered all_reduce")
    outcome = RanksOutcome(ok=False, results=[None, None], failures=[failure], duration=1.0,
                           logs=["", "rank 1 entered all_reduce"], pids=[1, 2])
    monkeypatch.setattr(executor, "run_ranks", lambda *args, **kwargs: outcome)
    (point,) = load_scenario_text(SCENARIO + "features: {sp: {tp: 2}}\n")
    result = run_point(point, backend="emulated")
    assert result.outcome == FAILED and result.failed_checks == ["execution"]
    assert "rank 1 timeout" in result.verdict
    assert "rank 1 entered all_reduce" in result.checks["execution"].details["ranks"]


def test_an_item_that_compared_nothing_does_not_pass():
    # Validation refuses a request arriving after the last step; built past validation here,
    # the run executes no step, and "all checks passed" would be a pass with no evidence.
    import dataclasses

    (point,) = load_scenario_text(SCENARIO.replace("steps: 6", "steps: 6\nexpect: pass"))
    late = point.scenario.workload.model_copy(update={"requests": [
        point.scenario.workload.requests[0].model_copy(update={"arrival_step": 5})]})
    scenario = point.scenario.model_copy(update={"steps": 2, "workload": late})
    result = run_point(dataclasses.replace(point, scenario=scenario), backend="emulated")
    assert not result.record.steps
    assert result.outcome == FAILED and result.verdict.startswith("nothing was compared")


def test_the_cyclic_collector_is_paused_while_a_pipeline_runs_and_back_after(monkeypatch):
    """Paused during the run (a crash included), restored after; left off if it was off."""
    import gc

    import harness.executor as executor

    seen = []

    def pipeline(*args, **kwargs):
        seen.append(gc.isenabled())
        raise RuntimeError("pipeline exploded")

    monkeypatch.setattr(executor, "run_pipeline", pipeline)
    (point,) = load_scenario_text(SCENARIO)
    assert gc.isenabled()
    assert run_point(point, backend="emulated").outcome == FAILED
    assert seen == [False] and gc.isenabled()
    gc.disable()
    try:
        run_point(point, backend="emulated")
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_run_executes_the_resolution_made_at_collection(tmp_path, monkeypatch):
    """The preflight is the item's resolution, made once: collection keeps it on the item and the
    run reads it (resolving again would be a second, possibly different, decision)."""
    import harness.session
    from harness.collection import collect_points
    from harness.resolve import PointSkipped, ResolvedItem

    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO)
    ((suffix, point, resolution),) = collect_points(path, backend="emulated", fia_contract="relaxed")
    assert isinstance(resolution, ResolvedItem) and resolution.scenario.fia_contract == "relaxed"

    def resolve_again(*args, **kwargs):
        raise AssertionError("the point was resolved a second time")

    monkeypatch.setattr(harness.session, "resolve_item", resolve_again)
    result = run_point(point, backend="emulated", resolution=resolution)
    assert result.outcome == PASSED and result.scenario["fia_contract"] == "relaxed"
    skipped = run_point(point, backend="emulated", resolution=PointSkipped("decided at collection"))
    assert (skipped.outcome, skipped.verdict) == ("skipped", "decided at collection")
    wrong = run_point(point, backend="emulated", resolution=dataclasses.replace(resolution, backend="cuda"))
    assert wrong.outcome == FAILED and "resolved for backend 'cuda'" in wrong.verdict


def test_a_point_that_cannot_run_keeps_its_features_for_its_markers():
    """The engine refuses SP tp=2 with MTP k=2 (no capture size is a multiple of 3 and 2): the
    item is skipped, and still marked sp and mtp (``-m sp`` selects it, as before it resolved)."""
    from harness.collection import resolve_point
    from harness.resolve import PointSkipped

    (point,) = load_scenario_text(TP2.replace("mtp: {k: 1}", "mtp: {k: 2}").replace("name: tp2", "name: refused"))
    skipped = resolve_point(point)
    assert isinstance(skipped, PointSkipped) and "multiple of 3" in skipped.reason
    assert [f.name for f in skipped.features] == ["sp", "mtp"]
