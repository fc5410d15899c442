"""What the real engine refuses to start, judged on raw matrix points (the cross product's
selection) by the same rules the resolution meets: vLLM's ``adjust_cudagraph_sizes_for_spec_decode``
refuses speculation with SP where ``max(q, tp)`` is no common multiple, only with a FULL decode
routine, and the stack's start-up rules decide the routine (FULL_AND_PIECEWISE is PIECEWISE on
v0.18.0, before PR #9572)."""

from __future__ import annotations

import pytest

from harness.features import active_features
from harness.resolve import PointSkipped, refused_at_start_up, resolve_item
from harness.scenario import load_scenario_text


def _judge(point: dict) -> str | None:
    return refused_at_start_up(point, active_features(point.get("features", {}), point.get("fixes", {})))


SP_MTP = {"features": {"sp": {"tp": 2}, "mtp": {"k": 2}}}


@pytest.mark.parametrize("point, refused", [
    (SP_MTP, True),  # absent graph.mode reads as the schema's default, FULL
    ({**SP_MTP, "graph": {"mode": "FULL_DECODE_ONLY"}}, True),
    ({**SP_MTP, "graph": {"mode": "PIECEWISE"}}, False),  # no FULL decode routine: nothing rounds
    ({**SP_MTP, "graph": {"mode": "FULL_AND_PIECEWISE"}, "stack": "v0.18.0"}, False),  # downgraded there
    ({**SP_MTP, "stack": "harness-compose"}, False),  # lcm(3, 2) composes
    ({"features": {"sp": {"tp": 2}, "mtp": {"k": 1}}}, False),  # max(2, 2) is a common multiple
    ({"features": {"mtp": {"k": 2}}}, False),  # no SP
])
def test_raw_points_are_refused_as_the_engine_would(point, refused):
    reason = _judge(point)
    assert (reason is not None) is refused, reason
    if refused:
        assert reason.startswith("the real engine refuses to start (stack v0.23.0): Can't determine cudagraph shapes")


def test_the_resolution_skips_the_same_point_with_the_same_words():
    (point,) = load_scenario_text("""
name: sp_mtp
model: {kind: random, layers: 2, num_heads: 2, num_kv_heads: 2, max_model_len: 64}
graph: {mode: FULL, capture_sizes: [2, 4, 6, 8]}
features: {sp: {tp: 2}, mtp: {k: 2}}
steps: 2
workload:
  requests:
    - {prompt_len: 3, output_len: 2}
""")
    with pytest.raises(PointSkipped) as skipped:
        resolve_item(point.scenario)
    assert skipped.value.reason == _judge(SP_MTP)
