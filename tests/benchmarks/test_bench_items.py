"""The speed benchmarks name scenario items by id; those ids cannot rot when a matrix changes.

Cheap: it loads the scenario files and runs nothing (``benchmarks/suite_speed.py`` and
``benchmarks/ranks.py`` do). A renamed item would make a benchmark time nothing, or crash.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import ranks as ranks_bench  # noqa: E402
import suite_speed  # noqa: E402

from harness.scenario import load_scenario_file  # noqa: E402
from harness.resolve import resolve_item  # noqa: E402


def _ids(path: str) -> set[str]:
    return {point.id for point in load_scenario_file(ROOT / path)}


@pytest.mark.parametrize("path, ident", suite_speed.BUDGET_ITEMS)
def test_every_budget_item_of_the_suite_benchmark_exists(path, ident):
    assert ident in _ids(path) or (ident == "" and len(_ids(path)) == 1)


def test_the_two_rank_items_exist_and_have_two_ranks():
    points = {p.id: p for p in load_scenario_file(ROOT / "scenarios/features/feature_matrix.yaml")}
    for ident in suite_speed.TWO_RANK_ITEMS:
        assert resolve_item(points[ident].scenario).world_size == 2, ident


def test_the_rank_benchmark_items_have_the_world_size_they_stand_for():
    points = {p.id: p for p in load_scenario_file(ROOT / "scenarios/cross_product/cross_product.yaml")}
    for world, ident in ranks_bench.ITEMS.items():
        assert resolve_item(points[ident].scenario).world_size == world, ident


def test_the_hang_benchmark_scenario_exists_and_has_two_ranks():
    import hang as hang_bench

    points = load_scenario_file(hang_bench.SCENARIO)
    assert points and all(resolve_item(p.scenario).world_size == 2 for p in points)
