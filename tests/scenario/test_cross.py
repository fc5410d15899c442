"""The cross product and its pairwise selection (harness.scenario.cross), item time limits."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from harness.pytest_matrix import ranks, unsupported
from harness.scenario import ScenarioFileError, load_scenario_file, load_scenario_text
from harness.scenario.cross import _cheapen, point_of, select, uncovered_pairs
from harness.scenario.limits import DEFAULT_ITEM_TIMEOUT_S, item_timeout, rank_timeout

CROSS = Path(__file__).parents[2] / "scenarios" / "cross_product" / "cross_product.yaml"


@pytest.fixture(scope="module")
def matrix() -> dict:
    return yaml.safe_load(CROSS.read_text())["matrix"]


def test_the_shipped_cross_product_is_the_whole_space(matrix) -> None:
    assert [len(v) for v in matrix.values()] == [5, 3, 7, 4, 2, 5]
    full = select(matrix, how="full")
    assert len(full) == 5 * 3 * 7 * 4 * 2 * 5 == 4200
    reasons = {unsupported(point_of(matrix, idx)) for idx in full}
    skipped = [idx for idx in full if unsupported(point_of(matrix, idx))]
    sp_cp = 5 * 2 * 7 * 4 * 1 * 5  # SP (tp 2, 4) with CP 2: not modelled
    # SP (tp 2, 4) with k 2 (q 3) in the three modes with a FULL decode routine, CP 1: max(3, tp)
    # is not a multiple of both, so vLLM refuses to start (adjust_cudagraph_sizes_for_spec_decode)
    refused = 3 * 2 * 7 * 1 * 1 * 5
    assert len(skipped) == sp_cp + refused
    assert any(r and r.startswith("cp: CP with a tensor-parallel model shard (sp)") for r in reasons)
    assert any(r and r.startswith("the real engine refuses to start (stack ") for r in reasons)
    lcm = [idx for idx in full if unsupported({**point_of(matrix, idx), "stack": "harness-compose"})]
    assert len(lcm) == sp_cp  # the harness's lcm composition runs them
    assert len(full) - len(skipped) >= 1000


def test_pairwise_covers_every_pair_of_runnable_values(matrix) -> None:
    chosen = select(matrix, how="pairwise", unsupported=unsupported)
    assert 35 <= len(chosen) <= 60  # at least 7 x 5 (the two largest axes), far below 2800
    assert not uncovered_pairs(matrix, chosen, unsupported=unsupported)
    assert all(unsupported(point_of(matrix, idx)) is None for idx in chosen)  # no skipped filler
    assert select(matrix, how="pairwise", unsupported=unsupported) == chosen  # deterministic


def test_pairwise_within_a_mode_covers_pairs_in_that_mode(matrix) -> None:
    restrict = {"graph.mode": ["FULL"]}
    chosen = select(matrix, how="pairwise", restrict=restrict, unsupported=unsupported)
    assert {matrix["graph.mode"][idx[0]] for idx in chosen} == {"FULL"}
    assert not uncovered_pairs(matrix, chosen, restrict=restrict, unsupported=unsupported)


@pytest.mark.parametrize("restrict", [None, {"graph.mode": ["FULL"]}], ids=["all_modes", "FULL"])
def test_a_cost_lowers_the_ranks_of_the_selection_not_its_coverage(matrix, restrict) -> None:
    plain = select(matrix, how="pairwise", restrict=restrict, unsupported=unsupported)
    cheap = select(matrix, how="pairwise", restrict=restrict, unsupported=unsupported, cost=ranks)
    assert not uncovered_pairs(matrix, cheap, restrict=restrict, unsupported=unsupported)
    assert all(unsupported(point_of(matrix, idx)) is None for idx in cheap)

    def total(rows) -> int:
        return sum(ranks(point_of(matrix, idx)) for idx in rows)

    # measured: 312 -> 199 ranks over all modes, 284 -> 192 in FULL alone
    assert total(cheap) <= 0.75 * total(plain) and len(cheap) <= len(plain)
    # the floor: each (tp, dp) pair in some item, costing at least tp x dp ranks
    tp, dp = matrix["features.sp.tp"], [d["size"] for d in matrix["features.dp"]]
    assert total(cheap) >= sum(t * d for t in tp for d in dp)


def test_cheapening_moves_and_drops_rows_but_keeps_every_pair() -> None:
    """A wasteful covering set: a dear row that another row makes redundant moves to a cheap
    point (here one already chosen, so it goes); dear rows that alone cover a pair stay."""
    cost = {0: 1, 1: 4}  # axis a's value is the price; b and c are free
    wasteful = [(1, 0, 0), (1, 1, 1), (0, 0, 1), (0, 1, 0), (1, 0, 1)]
    cheap = _cheapen(wasteful, [[0, 1]] * 3, ok=lambda idx: True, cost=lambda idx: cost[idx[0]])
    m = {"a": [0, 1], "b": [0, 1], "c": [0, 1]}
    assert uncovered_pairs(m, wasteful) == set() == uncovered_pairs(m, cheap)
    assert sorted(cheap) == [(0, 0, 1), (0, 1, 0), (1, 0, 0), (1, 1, 1)]  # 14 -> 10
    # a move the filter refuses is never made, whatever it would save
    kept = _cheapen(wasteful, [[0, 1]] * 3, ok=lambda idx: idx[0] == 1 or idx in wasteful,
                    cost=lambda idx: cost[idx[0]])
    assert all(idx in wasteful for idx in kept) and not uncovered_pairs(m, kept)


def test_a_selection_without_the_filter_misses_pairs() -> None:
    """The coverage check can fail: dropping a row of a covering array leaves pairs uncovered."""
    m = {"a": [0, 1, 2], "b": [0, 1, 2], "c": [0, 1]}
    chosen = select(m, how="pairwise")
    assert not uncovered_pairs(m, chosen)
    assert uncovered_pairs(m, chosen[1:])


def test_pairwise_respects_matrix_exclude() -> None:
    m = {"a": [0, 1, 2], "b": ["x", "y"], "c": [0, 1]}
    excludes = [{"a": 1, "b": "y"}]
    chosen = select(m, excludes, how="pairwise")
    assert all(not (m["a"][i] == 1 and m["b"][j] == "y") for i, j, _ in chosen)
    assert not uncovered_pairs(m, chosen, excludes)


def test_loader_expands_only_the_chosen_points() -> None:
    text = """
name: t
workload: {requests: [{prompt_len: 2, output_len: 2}]}
matrix:
  graph.mode: [FULL, PIECEWISE, NONE]
  features.mtp.k: [0, 1, 2]
  model.dtype: [float32, bfloat16]
"""
    every = load_scenario_text(text)
    picked = load_scenario_text(text, combinations=lambda m, e: select(m, e, how="pairwise"))
    assert len(every) == 18 and 9 <= len(picked) < 18
    assert {p.id for p in picked} <= {p.id for p in every}  # a pairwise item is an item of the full run


def test_cross_product_ids_name_every_axis() -> None:
    points = load_scenario_file(CROSS, combinations=lambda m, e: select(m, e, how="pairwise", unsupported=unsupported))
    assert points
    for p in points:
        mode, tp, dp, k, cp, workload = p.id.split("-")
        assert tp.startswith("tp") and dp.startswith("dp") and k.startswith("k") and cp.startswith("cp")
        assert p.scenario.matrix_selection == "pairwise"


def test_item_limits_and_rank_timeout() -> None:
    base = "name: t\nworkload: {requests: [{prompt_len: 2, output_len: 2}]}\n"
    (default,) = load_scenario_text(base)
    (own,) = load_scenario_text(base + "timeout_s: 12.5\nslow: true\n")
    assert item_timeout(default.scenario) == DEFAULT_ITEM_TIMEOUT_S
    assert item_timeout(own.scenario) == 12.5 and own.scenario.slow
    assert 0 < rank_timeout(own.scenario) < item_timeout(own.scenario)  # the ranks report first
    with pytest.raises(ScenarioFileError, match="timeout_s"):
        load_scenario_text(base + "timeout_s: 0\n")


def test_idle_batches_need_two_dp_ranks() -> None:
    base = "name: t\nworkload: {requests: [{prompt_len: 2, output_len: 2}]}\n"
    with pytest.raises(ScenarioFileError, match="'idle' batches need dp size >= 2"):
        load_scenario_text(base + "features: {dp: {size: 1, batches: idle}}\n")
    (ok,) = load_scenario_text(base + "features: {dp: {size: 2, batches: idle}}\n")
    assert ok.scenario.features.dp.batches == "idle"
