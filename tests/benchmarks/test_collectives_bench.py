"""``benchmarks/collectives.py`` runs both families on real ranks and writes what it printed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import collectives as collectives_bench  # noqa: E402


def test_the_collectives_benchmark_measures_both_families(tmp_path: Path, capsys) -> None:
    out = tmp_path / "bench.json"
    assert collectives_bench.main(["--iters", "5", "--worlds", "2", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["world"], r["op"]) for r in rows] == [(2, op) for op in collectives_bench.OPS]
    for row in rows:
        for family in ("gloo", "shared_memory"):
            assert row[family]["cpu_us"] > 0 and row[family]["wall_us"] > 0, row
    assert "| 2 | all_gather |" in capsys.readouterr().out
