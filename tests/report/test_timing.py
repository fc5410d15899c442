"""Replay against eager per bucket: what graph mode buys, next to the padding it costs."""

from __future__ import annotations

import re

import pytest

from harness.report.html import render_page
from harness.report.results import item_record, summary_record
from harness.report.timing import replay_by_bucket, step_timing
from harness.scenario import load_scenario_text
from harness.session import run_point


def _step(mode, bucket, real, graph=None, padded=None):
    seconds = {k: v for k, v in (("graph", graph), ("padded", padded)) if v is not None}
    return {"runtime_mode": mode, "num_tokens_padded": bucket, "num_tokens": real, "seconds": seconds}


def test_only_steps_that_replayed_with_both_times_count():
    steps = [_step("FULL", 4, 3, 0.002, 0.004), _step("PIECEWISE", 4, 4, 0.002, 0.002),
             _step("NONE", 8, 7, 0.001, 0.001),  # eager on the graph path: no replay to time
             _step("FULL", 8, 5, 0.003),  # the padded path did not run: no pair
             _step("FULL", 8, 6, 0.001, 0.003)]
    assert step_timing(steps) == {"4": {"steps": 2, "graph_s": 0.004, "padded_s": 0.006, "tokens": 8, "real": 7},
                                  "8": {"steps": 1, "graph_s": 0.001, "padded_s": 0.003, "tokens": 8, "real": 6}}


def test_items_add_up_per_bucket_into_means_speedups_and_padding():
    records = [{"run": {"timing": step_timing([_step("FULL", 4, 3, 0.002, 0.004)])}},
               {"run": {"timing": step_timing([_step("FULL", 4, 1, 0.004, 0.004)])}},
               {"run": {}}, {"outcome": "skipped"}]
    (row,) = replay_by_bucket(records)
    assert (row.bucket, row.steps) == (4, 2)
    assert row.graph_ms == pytest.approx(3.0) and row.eager_ms == pytest.approx(4.0)
    assert row.speedup == pytest.approx(4 / 3) and row.padding_pct == pytest.approx(50.0)


def test_a_run_records_both_paths_times_and_the_page_shows_them_per_bucket():
    (point,) = load_scenario_text("graph: {mode: FULL, capture_sizes: [2, 4]}\nsteps: 4\n"
                                  "workload: {requests: [{prompt_len: 3, output_len: 4}, {prompt_len: 2, output_len: 4}]}\n")
    record = summary_record(item_record(run_point(point, backend="emulated"), {}))
    timing = record["run"]["timing"]  # kept in the summary a passing item gets
    assert timing and all(e["graph_s"] > 0 and e["padded_s"] > 0 for e in timing.values())
    html = render_page([record])
    assert 'id="gh-replay"' in html and "on emulated" in html
    rows = re.findall(r"<tr><td>(\d+)</td><td>(\d+)</td>", html)
    assert [(b, int(n)) for b, n in rows] == [(b, e["steps"]) for b, e in timing.items()]
    assert 'id="gh-replay"' not in render_page([])


def test_async_steps_are_not_timed():
    (point,) = load_scenario_text("graph: {mode: FULL, capture_sizes: [2, 4], async_scheduling: true}\nsteps: 4\n"
                                  "workload: {requests: [{prompt_len: 3, output_len: 4}]}\n")
    result = run_point(point, backend="emulated")
    assert result.outcome == "passed", result.verdict
    assert all("graph" not in step.seconds for step in result.record.steps)
    assert item_record(result, {})["run"]["timing"] == {}
