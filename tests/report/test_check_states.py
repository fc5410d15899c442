"""The shipped scenarios issue 29 named, as the suite runs them: no report contradicts itself.

A check that looked at nothing is "not evaluated" in the JSON record, the HTML fragment and the
terminal's failure text alike, never PASS beside a summary that says it compared nothing; and
a count is one number in the summary, the evidence heading and the JSON.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.collection import collect_points
from harness.report.html import render_item
from harness.report.results import item_record
from harness.report.terminal import failure_text
from harness.session import run_point

ROOT = Path(__file__).resolve().parents[2]
NOT_EVALUATED = {  # item -> the checks that looked at nothing
    ("known_bad/stream_budget_none.yaml", "PIECEWISE"): {"equality", "stale_params"},  # no capture fit
    ("known_bad/cp_no_kv_padding.yaml", "FULL"): {"equality", "stale_params"},  # the graph path stopped at step 0
    ("known_bad/fresh_input_tensor_debug.yaml", "FULL"): {"equality", "stale_params"},  # same, by design
    ("known_bad/no_host_param_update.yaml", "FULL"): set(),
}


def _record(path: str, mode: str) -> dict:
    points = [p for suffix, p, _ in collect_points(ROOT / "scenarios" / path) if p.scenario.graph.mode == mode]
    return item_record(run_point(points[0]), {"torch": "x"})


def _badges(fragment: str) -> dict[str, tuple[str, str]]:
    return {name: (label, summary) for name, label, summary in re.findall(
        r"<tr><th>(\w+)</th><td><span [^>]*>([^<]+)</span></td><td>([^<]*)</td>", fragment)}


@pytest.mark.parametrize("path, mode", list(NOT_EVALUATED), ids=[f"{p.split('/')[-1][:-5]}[{m}]" for p, m in NOT_EVALUATED])
def test_the_named_items_say_not_evaluated_alike_everywhere(path, mode):
    record = _record(path, mode)
    assert record["outcome"] == "xfailed"
    idle = NOT_EVALUATED[(path, mode)]
    badges = _badges(render_item(record, draw_charts=False))
    terminal = failure_text(record, where=f"scenarios/{path}:1")
    for name, check in record["checks"].items():
        looked = check["evaluated"]
        assert looked == (name not in idle), (name, check["summary"])
        assert (check["state"] == "not-evaluated") == (name in idle)
        assert (badges[name][0] == "not evaluated") == (name in idle), badges[name]
        assert (f"{name} not evaluated" in terminal) == (name in idle), terminal
        if name in idle:  # and its summary says so, whatever it did compare
            assert check["summary"].startswith("not evaluated: ") and badges[name][1].startswith("not evaluated: ")


def test_a_count_is_one_number_in_the_summary_the_heading_and_the_json():
    record = _record("known_bad/no_host_param_update.yaml", "FULL")
    stale = record["checks"]["stale_params"]
    total = stale["details"]["stale_total"]
    assert len(stale["details"]["stale"]) == 20 < total
    assert f"{total} stale list(s) in all" in stale["summary"]
    assert f"Stale host parameters: {total} stale list(s)" in render_item(record, draw_charts=False)
