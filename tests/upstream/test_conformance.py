"""The upstream judge: its comparison, its room, and (where `make upstream` made the venv) a run of it.

The comparison and the harness's side run everywhere; the upstream side needs the upstream venv
and skips without it, naming the command that makes it.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness.upstream.conformance import SETUP, Report, _python, compare, harness_answer, random_points, render, run

POINT = {"id": 0, "mode": "FULL_DECODE_ONLY", "max_num_seqs": 8, "max_num_batched_tokens": 512,
         "capture_sizes": None, "max_capture_size": None, "k": 0, "stack": "v0.23.0"}
#: vLLM 0.23.0 + vLLM Ascend 0.23.0.post1's answer for POINT (harness/upstream/worker.py, 2026-12-08).
UPSTREAM = {"id": 0, "mode": "FULL_DECODE_ONLY", "sizes": [1, 2, 4, 8],
            "keys": {"FULL": [[1, 1, True], [2, 2, True], [4, 4, True], [8, 8, True]]}}


def test_the_harness_answers_in_the_workers_terms_and_agrees_on_a_stored_answer():
    ours = harness_answer(POINT)
    report = Report("v0.23.0", {})
    compare(POINT, UPSTREAM, ours, report)
    assert report.compared == {"start-up": 1, "graph mode": 1, "capture sizes": 1, "dispatcher keys": 1}
    assert report.differences == []


def test_each_rule_that_differs_is_named_and_unrecorded():
    report = Report("v0.23.0", {})
    wrong = dict(UPSTREAM, sizes=[1, 2, 4], keys={"FULL": [[1, 1, True]]})
    compare(POINT, wrong, harness_answer(POINT), report)
    assert [d.rule for d in report.unrecorded] == ["capture sizes", "dispatcher keys"]
    refused = {"id": 0, "refused": "ValueError: no"}
    compare(POINT, refused, harness_answer(POINT), report)
    assert report.unrecorded[-1].rule == "start-up" and report.unrecorded[-1].upstream == "ValueError: no"
    text = render(report)
    assert "capture sizes" in text and "upstream: vllm VllmConfig._set_cudagraph_sizes" in text


def test_random_points_are_seeded():
    assert random_points(50, seed=3) == random_points(50, seed=3) != random_points(50, seed=4)


def test_nothing_on_the_default_path_imports_the_upstream_room():
    code = ("import sys, harness.pytest_plugin, harness.cli, harness.session, harness.report.merge; "
            "print([m for m in sys.modules if m.startswith('harness.upstream')])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.skipif(not _python("v0.23.0").exists(), reason=f"no upstream venv: run `{SETUP}`")
def test_upstream_executed_agrees_on_the_stored_answer_and_on_random_points():
    report = run([POINT, *random_points(40, seed=7)[1:]], "v0.23.0", progress=False)
    assert report.adapter_errors == []
    assert report.points == 40 and report.compared["start-up"] == 40
    assert not [d for d in report.differences if d.point["id"] == 0]
