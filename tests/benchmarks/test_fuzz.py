"""The random-scenario run (``benchmarks/fuzz.py``) is reproducible and sorts outcomes right.

Cheap: a handful of single-rank-sized files, most refused or tiny; the full run is the script's.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import fuzz  # noqa: E402


def test_the_same_seed_writes_the_same_scenarios():
    first = [fuzz.random_scenario(random.Random(7), f"s{i}") for i in range(5)]
    again = [fuzz.random_scenario(random.Random(7), f"s{i}") for i in range(5)]
    assert first == again and len(set(first)) > 1


def test_crashes_hangs_and_empty_runs_are_harness_bugs_and_check_verdicts_are_not():
    assert fuzz.classify("failed", "harness error: ValueError: x") == "harness bug"
    assert fuzz.classify("failed", "execution: rank 1 timeout: did not finish within the 48s timeout") == "harness bug"
    assert fuzz.classify("failed", "nothing was compared: no step ran") == "harness bug"
    assert fuzz.classify("failed", "equality: padded vs reference differ at step 2") == "check failed"
    assert fuzz.classify("passed", "all four checks passed") == "passed"


def test_a_short_run_writes_its_report(tmp_path):
    status = fuzz.main(["--count", "4", "--seed", "3", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "fuzz.json").read_text())
    assert report["seed"] == 3 and sum(report["counts"].values()) == len(report["rows"]) >= 4
    assert status == (1 if report["counts"].get("harness bug") else 0)
    assert all(row["kind"] != "refused" or row["verdict"].startswith(str(tmp_path)) for row in report["rows"])
