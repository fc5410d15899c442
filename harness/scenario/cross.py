"""Which points of a scenario matrix run: the full cross product, or a pairwise covering array.

The feature space (five modes x SP x DP x MTP x CP x workloads) is thousands of points; each
bug seen so far needs two axes to line up (SP tp 2 with MTP k 2, DP with an idle rank, ...), so a
*pairwise* selection, in which every pair of values of any two axes appears in at least one
item, finds them at a few percent of the cost. The full product stays one option away
(``--matrix=full``) for nightly runs. The covering array comes from allpairspy rather than a
hand-rolled greedy search.

A selection never contains a point that ``matrix_exclude`` drops, and (given a check) never a
point that is unsupported by design: such a point would be a skipped item covering nothing.
The full product keeps those, so that they are reported as skipped with their reason.

Items are not equally dear: a point of dp 4 x tp 4 runs sixteen ranks, one of dp 1 x tp 1 runs
one. allpairspy knows nothing of that and happily stacks the dear values of several axes in one
row. Given a ``cost`` (the harness passes the point's world size), :func:`_cheapen` then lowers
the selection's total cost without losing a pair: it moves rows to cheaper values wherever each
pair the row gave up is still covered by another row, and drops rows left redundant. On the
shipped cross product that cuts the ranks of the default run by about a third.

Pure: no pytest, no torch. The result is a list of index tuples (one index per axis, in axis
order) for :func:`harness.scenario.loader.load_scenario_file`'s ``combinations``.
"""

from __future__ import annotations

import functools
import itertools
from collections import Counter
from typing import Callable, Iterable, Literal, Mapping, Sequence

from allpairspy import AllPairs

from harness.plain import JsonObject, PlainData

from .matrix import AxisValue

Selection = Literal["full", "pairwise"]
SELECTIONS: tuple[Selection, ...] = ("pairwise", "full")
Index = tuple[int, ...]
#: ``point -> reason`` (None when the point can run); the point is the nested mapping of its axes.
#: It is also asked about partial points (the first axes only) while the covering array is
#: built, and must then judge by the axes present, reading absent settings as their defaults.
Unsupported = Callable[[JsonObject], "str | None"]
#: ``point -> cost`` of running a (whole) point, in any unit (the harness: its ranks).
Cost = Callable[[JsonObject], float]


def select(
    matrix: Mapping[str, Sequence[AxisValue]],
    excludes: Sequence[PlainData] = (),
    *,
    how: Selection = "full",
    restrict: Mapping[str, Iterable[AxisValue]] | None = None,
    unsupported: Unsupported | None = None,
    cost: Cost | None = None,
) -> list[Index]:
    """The chosen points of ``matrix`` as index tuples, in cross-product order.

    ``restrict`` narrows axes to some of their values first (``{"graph.mode": ["FULL"]}`` for
    ``--mode=FULL``), so a pairwise selection covers every pair *within* the run's modes rather
    than being thinned out afterwards. ``cost`` makes the pairwise selection cheaper at equal
    coverage (:func:`_cheapen`).
    """
    names = list(matrix)
    allowed = [_allowed(name, matrix[name], restrict) for name in names]
    if how == "full":
        return list(itertools.product(*allowed))
    if how != "pairwise":
        raise ValueError(f"unknown matrix selection {how!r}; known: {', '.join(SELECTIONS)}")
    if len(names) < 2:  # a single axis has no pairs: every value once
        return [idx for idx in itertools.product(*allowed) if runnable(matrix, idx, excludes, unsupported)]

    def keep(row: list[tuple[int, int]]) -> bool:
        prefix = tuple(index for _, index in row)
        if _excluded(matrix, names[: len(prefix)], prefix, excludes):
            return False
        return unsupported is None or unsupported(point_of(matrix, prefix)) is None

    # values carry their axis so equal indices of different axes stay distinct
    parameters = [[(axis, index) for index in values] for axis, values in enumerate(allowed)]
    rows = {tuple(index for _, index in row) for row in AllPairs(parameters, filter_func=keep)}
    # allpairspy's greedy search can miss a pair once the filter has rejected rows: add, for
    # what is left, the runnable point that covers the most of it (a few rows at most).
    candidates = [idx for idx in itertools.product(*allowed) if runnable(matrix, idx, excludes, unsupported)]
    missing = set().union(*map(_pairs, candidates)) - set().union(*map(_pairs, rows))
    if missing:
        while missing:
            best = max(candidates, key=lambda idx: len(_pairs(idx) & missing))
            rows.add(best)
            missing -= _pairs(best)
    if cost is not None:
        ok = set(candidates)
        rows = set(_cheapen(sorted(rows), allowed, lambda idx: idx in ok, lambda idx: cost(point_of(matrix, idx))))
    return sorted(rows)


def _cheapen(rows: list[Index], allowed: Sequence[Sequence[int]], ok: Callable[[Index], bool],
             cost: Callable[[Index], float]) -> list[Index]:
    """``rows`` at a lower total cost, covering the same pairs.

    Dearest row first, each row moves to the cheapest runnable point one axis away that gives
    up only pairs some other row also covers; repeated until nothing moves (every move lowers
    the total, so this ends). Then rows whose every pair another row covers are dropped,
    dearest first. Deterministic: the order of rows and values decides every tie.
    """
    rows = list(rows)
    dear = functools.cache(cost)  # a point's cost is asked for again and again
    covered = Counter(pair for row in rows for pair in _pairs(row))
    moved = True
    while moved:
        moved = False
        for i in sorted(range(len(rows)), key=lambda i: -dear(rows[i])):
            row, best = rows[i], rows[i]
            for axis, values in enumerate(allowed):
                for value in values:
                    candidate = row[:axis] + (value,) + row[axis + 1 :]
                    if dear(candidate) >= dear(best) or not ok(candidate):
                        continue
                    if all(covered[pair] > 1 for pair in _pairs(row) - _pairs(candidate)):
                        best = candidate
            if best != row:
                covered.subtract(_pairs(row))
                covered.update(_pairs(best))
                rows[i], moved = best, True
    unique: list[Index] = []
    for row in rows:
        if row in unique:  # two rows moved to the same point: one copy covers nothing
            covered.subtract(_pairs(row))
        else:
            unique.append(row)
    kept: list[Index] = []
    for row in sorted(unique, key=lambda r: (-dear(r), r)):
        if all(covered[pair] > 1 for pair in _pairs(row)):
            covered.subtract(_pairs(row))
        else:
            kept.append(row)
    return kept


def runnable(matrix: Mapping[str, Sequence[AxisValue]], idx: Index, excludes: Sequence[PlainData] = (),
             unsupported: Unsupported | None = None) -> bool:
    """Whether a point is neither excluded nor unsupported by design."""
    if _excluded(matrix, list(matrix), idx, excludes):
        return False
    return unsupported is None or unsupported(point_of(matrix, idx)) is None


def uncovered_pairs(matrix: Mapping[str, Sequence[AxisValue]], chosen: Iterable[Index],
                    excludes: Sequence[PlainData] = (), *,
                    restrict: Mapping[str, Iterable[AxisValue]] | None = None,
                    unsupported: Unsupported | None = None) -> set[tuple[int, int, int, int]]:
    """Pairs ``(axis a, index, axis b, index)`` that some runnable point has but no chosen one.

    Empty for a correct pairwise selection: the property the tests check.
    """
    names = list(matrix)
    allowed = [_allowed(name, matrix[name], restrict) for name in names]
    need: set[tuple[int, int, int, int]] = set()
    for idx in itertools.product(*allowed):
        if runnable(matrix, idx, excludes, unsupported):
            need |= _pairs(idx)
    for idx in chosen:
        need -= _pairs(idx)
    return need


def point_of(matrix: Mapping[str, Sequence[AxisValue]], idx: Index) -> JsonObject:
    """The nested mapping a point's axis values make (``{"features": {"sp": {"tp": 2}}}``)."""
    out: JsonObject = {}
    for name, index in zip(matrix, idx):
        value = matrix[name][index]
        if isinstance(value, dict):
            value = {k: v for k, v in value.items() if k != "_id"}
        *parents, leaf = name.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        if isinstance(value, dict) and isinstance(node.get(leaf), dict):
            node[leaf].update(value)
        else:
            node[leaf] = value
    return out


def _allowed(name: str, values: Sequence[AxisValue],
             restrict: Mapping[str, Iterable[AxisValue]] | None) -> list[int]:
    if not restrict or name not in restrict:
        return list(range(len(values)))
    wanted = list(restrict[name])
    return [i for i, value in enumerate(values) if value in wanted]


def _excluded(matrix: Mapping[str, Sequence[AxisValue]], names: Sequence[str], prefix: Index,
              excludes: Sequence[PlainData]) -> bool:
    """Whether an exclude entry whose axes all lie in ``prefix`` matches it."""
    values = {name: matrix[name][index] for name, index in zip(names, prefix)}
    return any(all(k in values and values[k] == v for k, v in entry.items()) for entry in excludes)


def _pairs(idx: Index) -> set[tuple[int, int, int, int]]:
    return {(a, idx[a], b, idx[b]) for a in range(len(idx)) for b in range(a + 1, len(idx))}
