"""The step planner: every step of every dispatched path is dispatched exactly once.

The count is taken on the real pipeline (``executor.run_rank``): ``Dispatcher.dispatch`` is
wrapped to count calls, and every ``StepPlanner.plan`` / ``reference`` call must account for
exactly one (plan: a step or an idle rank's dummies) or zero (reference, or no work on any
rank) of them; nothing else may dispatch, but the drafter's own dispatch of its first pass
(vLLM Ascend's proposer calls the runner's dispatcher itself), once per draft. Single-rank runs
cover every mode with and without speculative decoding; multi-rank runs (real processes) cover
SP, DP with idle ranks, and CP.
"""

from __future__ import annotations

import pytest

from harness.resolve import resolve_item, scenario_features
from harness.graph import plan as plan_module
from harness.graph.capture_sizes import resolve_capture_sizes
from harness.graph.dispatcher import Dispatcher
from harness.graph.modes import CUDAGraphMode
from harness.graph.capture_sizes import dummy_request_lens
from harness.graph.plan import PlanKind, PlannerConfig, StepPlanner
from harness.ranks import run_ranks
from harness.scenario import Scenario

MODES = ["NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"]


def _scenario(mode: str, features: dict) -> dict:
    return {
        "model": {"kind": "random", "layers": 1, "num_heads": 4, "num_kv_heads": 4},
        "graph": {"mode": mode, "capture_sizes": [1, 2, 4, 6, 8, 12, 16], "max_num_seqs": 4},
        "steps": 6,
        "features": features,
        "workload": {"requests": [{"prompt_len": 5, "output_len": 4},
                                  {"prompt_len": 2, "output_len": 5, "arrival_step": 1, "repeat": 2}]},
    }


def count_dispatches(scenario_json: dict, ctx=None) -> dict:
    """Run one rank of ``scenario_json``; return what was dispatched where."""
    from harness import executor

    from harness.graph.draft_runner import DraftGraphRunner

    calls = {"dispatch": 0, "outside_plan": 0, "plans": [], "bad": [], "redispatched": 0, "drafts": 0}
    inside = {"depth": 0}
    original_dispatch = Dispatcher.dispatch
    original_plan, original_reference = plan_module.StepPlanner.plan, plan_module.StepPlanner.reference
    original_draft = DraftGraphRunner.dispatch

    def dispatch(self, *args, **kwargs):
        calls["dispatch"] += 1
        if not inside["depth"]:
            calls["outside_plan"] += 1
        return original_dispatch(self, *args, **kwargs)

    def counted(method, kind):
        def wrapper(self, step):
            before = calls["dispatch"]
            inside["depth"] += 1
            try:
                result = method(self, step)
            finally:
                inside["depth"] -= 1
            made = calls["dispatch"] - before
            # A plan dispatches its own batch once (an idle rank its dummy batch), and once more
            # when the DP agreement changed its count or mode (vLLM Ascend's re-dispatch); the
            # reference path never dispatches; "no rank has work" dispatched at most the dummy.
            if kind == "reference":
                expected = {0}
            elif result is None:
                expected = {0, 1}
            else:
                expected = {2} if "(DP: agreed" in result.decision.reason else {1}
            label = (kind, result.kind.value if result is not None else None)
            calls["plans"].append(label)
            calls["redispatched"] += made == 2
            if made not in expected:
                calls["bad"].append((label, made))
            return result
        return wrapper

    def draft_dispatch(self, batch, plan):
        before = calls["dispatch"]
        inside["depth"] += 1
        try:
            return original_draft(self, batch, plan)
        finally:
            inside["depth"] -= 1
            made = calls["dispatch"] - before
            calls["drafts"] += made
            if made != (self.dispatcher is not None):  # a draft graph's dispatch, once; none without graphs
                calls["bad"].append((("draft", None), made))

    Dispatcher.dispatch = dispatch
    plan_module.StepPlanner.plan = counted(original_plan, "plan")
    plan_module.StepPlanner.reference = counted(original_reference, "reference")
    DraftGraphRunner.dispatch = draft_dispatch
    try:
        item = resolve_item(Scenario.model_validate(scenario_json))
        if ctx is None:
            executor.run_rank(item)
        else:
            executor.run_rank(item, ctx)
    finally:
        Dispatcher.dispatch = original_dispatch
        plan_module.StepPlanner.plan, plan_module.StepPlanner.reference = original_plan, original_reference
        DraftGraphRunner.dispatch = original_draft
    return calls


def _rank_counts(rank: int, world: int, scenario_json: dict) -> dict:
    from harness.features.layout import rank_context

    scenario = Scenario.model_validate(scenario_json)
    return count_dispatches(scenario_json, rank_context(scenario_features(scenario), rank, world))


def _assert_once(calls: dict) -> None:
    assert calls["bad"] == [], f"steps not dispatched exactly once: {calls['bad']}"
    assert calls["outside_plan"] == 0, "something outside the planner dispatched"
    planned = [p for p in calls["plans"] if p[0] == "plan" and p[1] is not None]
    assert len(planned) > 0 and calls["dispatch"] >= len(planned) + calls["redispatched"]


@pytest.mark.parametrize("features", [{}, {"mtp": {"k": 2}}], ids=["plain", "mtp2"])
@pytest.mark.parametrize("mode", MODES)
def test_every_step_is_dispatched_once_on_one_rank(mode, features):
    calls = count_dispatches(_scenario(mode, features))
    _assert_once(calls)
    assert ("reference", PlanKind.REFERENCE.value) in calls["plans"]
    assert (calls["drafts"] > 0) == (bool(features) and mode != "NONE")  # the draft model's own dispatch


@pytest.mark.parametrize("features", [
    {"sp": {"tp": 2}},
    {"dp": {"size": 2, "batches": "unequal"}},  # rank 1 idles: IDLE plans, still one dispatch each
    {"cp": {"size": 2}},
], ids=["sp2", "dp2_unequal", "cp2"])
def test_every_step_is_dispatched_once_and_redispatched_only_after_dp_agreement(features):
    outcome = run_ranks(_rank_counts, 2, args=(_scenario("FULL_AND_PIECEWISE", features),), timeout=600)
    assert outcome.ok, outcome.report()
    for calls in outcome.results:
        _assert_once(calls)
    if "dp" in features:
        assert any(p == ("plan", PlanKind.IDLE.value) for calls in outcome.results for p in calls["plans"])


def test_sp_and_mtp_compose_capture_sizes_to_multiples_of_lcm():
    """The bug of per-feature rules: SP kept [2, 4, 8], MTP rounded to q=3 -> [3, 6]: T=3 on tp=2."""
    from harness.graph.capture_sizes import SizeConstraint

    sp2 = SizeConstraint(2, "keep", "sequence parallel with tp=2")
    k2 = SizeConstraint(3, "round_up", "speculative decoding with q=3")
    assert resolve_capture_sizes(max_num_seqs=8, capture_sizes=[1, 2, 4, 8], constraints=[sp2, k2],
                                 spec_sp_multiple="lcm") == [6]
    sp4 = SizeConstraint(4, "keep", "sequence parallel with tp=4")
    k3 = SizeConstraint(4, "round_up", "speculative decoding with q=4")
    assert resolve_capture_sizes(max_num_seqs=8, capture_sizes=[1, 2, 4, 8, 16], constraints=[sp4, k3]) == [4, 8, 16]


def test_preflight_and_run_use_the_same_resolved_sizes():
    from harness import executor, session

    scenario = Scenario.model_validate({**_scenario("FULL", {"sp": {"tp": 2}, "mtp": {"k": 2}}),
                                        "graph": {"mode": "FULL", "capture_sizes": [1, 2, 4, 8]},
                                        "stack": "harness-compose"})
    assert session.preflight(scenario) is None
    item = resolve_item(scenario)
    assert list(item.capture_sizes) == list(executor.build_spec(item).graph.capture_sizes) == [6]


@pytest.mark.parametrize("num_tokens, max_num_seqs, lens", [
    (24, 8, [3] * 8), (10, 4, [2, 2, 2, 4]), (3, 8, [1, 1, 1]), (7, 1, [7]),
])
def test_a_mixed_graph_is_captured_on_vllm_s_dummy_split(num_tokens, max_num_seqs, lens):
    """vLLM's ``_dummy_run`` (non-uniform): min(T, max_num_seqs) requests of T // n, the
    remainder on the last, so no dummy outgrows a real request where the batch is legal."""
    assert dummy_request_lens(num_tokens, max_num_seqs) == lens
    planner = StepPlanner(PlannerConfig(CUDAGraphMode.PIECEWISE, (num_tokens,), max_num_seqs, 1, 16, 4))
    (_, _, meta), = planner.capture_plans()
    assert meta.query_lens == lens


def test_an_idle_dp_rank_s_dummy_is_one_request_of_q_tokens_padded_like_any_batch():
    """vLLM Ascend ``execute_dummy_batch``: ``_dummy_run(num_tokens=q, uniform_decode=True)``, whose
    one request has KV length q (``seq_lens`` = its query length) and slots -1; in pure FULL the
    agreed T (16 tokens, where a request's table holds 3 blocks of 4) is reached by the mixed
    branch of ``_pad_query_start_loc_for_fia``: one dummy request, ``query_start_loc`` [0, 1, 16]."""
    planner = StepPlanner(PlannerConfig(CUDAGraphMode.FULL, (16,), 2, 1, 4, 3))
    meta = planner._idle_metadata(planner.dispatcher.dispatch(16, 2, False))
    assert (meta.num_reqs, meta.num_reqs_padded, meta.num_input_tokens) == (0, 2, 16)
    assert meta.actual_seq_lengths == [1, 16] and meta.seq_lens == [1, 0]
    assert meta.block_table == [[0, 0, 0], [0, 0, 0]]
    assert meta.slot_mapping == [-1] * 16 and meta.query_start_loc == [0, 1, 16]
