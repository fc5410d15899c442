"""The drafter's own metadata: a drafter that IS the target must have every draft accepted.

Speculative decoding is lossless, so a drafter bug (wrong rows read, unseen tokens skipped)
never changes the output the equality check compares: it only
lowers the acceptance. With the drafter cut to all of the target's layers, its greedy proposals
are the target's own greedy tokens, so anything below 100% acceptance is a drafter bug.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from harness.engine import load
from harness.graph.pipeline import run_pipeline
from harness.graph.record import RunRecord
from harness.scenario import load_scenario_text
from harness.resolve import resolve_item
from harness.executor import build_spec

SCENARIO = """
name: drafter
model: {kind: random, layers: 2, max_model_len: 64}
graph: {mode: FULL, capture_sizes: [2, 4, 8, 16]}
features: {mtp: {k: K}}
steps: 12
workload:
  requests:
    - {prompt_len: 5, output_len: 8}
    - {prompt_len: 3, output_len: 6, arrival_step: 1}
    - {prompt_len: 2, output_len: 5, arrival_step: 2}
"""


@pytest.mark.parametrize("k", [1, 2])
def test_a_drafter_equal_to_the_target_has_every_draft_accepted(k):
    (point,) = load_scenario_text(SCENARIO.replace("K", str(k)))
    item = resolve_item(point.scenario)
    spec = replace(build_spec(item), drafter_layers=item.model.num_layers)
    record = run_pipeline(spec, load("emulated"), RunRecord("FULL", "emulated", list(item.capture_sizes)))
    assert not record.errors, record.errors
    for path in ("reference", "padded", "graph"):
        stats = record.speculation[path]
        assert stats["proposed"] > 0
        assert stats["accepted"] == stats["proposed"], (path, stats)
    assert record.texts["graph"] == record.texts["plain"]
