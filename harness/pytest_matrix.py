"""pytest glue for the matrix selection (pairwise or full), item time limits and markers.

Kept apart from :mod:`harness.pytest_plugin` so that file only calls in here:

* ``--matrix=pairwise|full``: for scenario files that declare ``matrix_selection: pairwise``
  (the shipped cross product), which points become items. Default: pairwise, a covering
  array of every pair of axis values (:mod:`harness.scenario.cross`), cheapened to fewer ranks
  (a point costs its world size); ``full`` is every point, for nightly runs. Files without the
  declaration always expand fully, as before.
* markers: ``cross_product`` on every item of such a file, ``slow`` on items of scenarios that
  say ``slow: true``; under pytest-xdist the ``slow`` items are handed out first;
* a wall-clock limit on every scenario item through pytest-timeout (its ``timeout_s``, else
  :data:`~harness.scenario.limits.DEFAULT_ITEM_TIMEOUT_S`), enforced with SIGALRM so a hang
  fails its item and the session goes on. The ranks' own timeout is derived from the same
  limit (:func:`~harness.scenario.limits.rank_timeout`) and fires first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import pytest

from harness.plain import JsonObject
from harness.scenario import Scenario
from harness.scenario.cross import SELECTIONS, Selection, select
from harness.scenario.limits import item_timeout
from harness.scenario.loader import Combinations
from harness.scenario.matrix import AxisValue
from harness.scenario.overrides import set_copied

CROSS_PRODUCT_MARKER = "cross_product"
SLOW_MARKER = "slow"


def add_options(group: pytest.OptionGroup) -> None:
    group.addoption("--matrix", default=None, choices=SELECTIONS,
                    help="points of a 'matrix_selection: pairwise' file (the shipped cross product) to run: "
                         "pairwise (default: every pair of axis values in some item) or full (every point)")


def register_markers(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{CROSS_PRODUCT_MARKER}: items of the feature cross product "
                                       "(pairwise selection by default, --matrix=full for every point)")
    config.addinivalue_line("markers", f"{SLOW_MARKER}: long-running scenario kinds (deselect with -m 'not slow')")


def combinations(config: pytest.Config, path: Path, modes: list[str] | None,
                 stack: str | None = None) -> Combinations | None:
    """The point selection for this file, or None for the loader's full expansion. ``stack``
    (``--stack``) is what a point that names no stack is judged under."""
    base = _pairwise_base(path)
    if base is None:
        return None
    how: Selection = config.getoption("--matrix") or "pairwise"  # the option's choices are SELECTIONS

    def chosen(matrix: dict[str, list[AxisValue]], excludes: list[JsonObject]):
        restrict = None
        if modes and "graph.mode" in matrix:  # cover pairs within the run's modes
            kept = [v for v in matrix["graph.mode"] if _mode(v) in modes]
            # none kept: the run has no item of this file (collection drops the points by mode)
            restrict = {"graph.mode": kept} if kept else None
        if stack and "stack" not in base:
            defaults = {**base, "stack": stack}
        else:
            defaults = base

        # A value the schema refuses raises one of _UNREADABLE here: the point is judged runnable
        # and reports the value, located, when it is validated.
        def judged(point: JsonObject) -> str | None:
            try:
                return unsupported(_whole(defaults, point, matrix))
            except _UNREADABLE:
                return None

        def cost(point: JsonObject) -> int:
            try:
                return ranks(_whole(defaults, point, matrix))
            except _UNREADABLE:
                return 1

        return select(matrix, excludes, how=how, restrict=restrict, unsupported=judged, cost=cost)

    return chosen


#: What judging a raw point raises for a value the schema refuses (pydantic's errors are ValueErrors).
_UNREADABLE = (ValueError, TypeError, KeyError, AttributeError)


def _whole(base: JsonObject, point: JsonObject, axes: Iterable[str]) -> JsonObject:
    """The scenario a (possibly partial) point of the selection stands for: the file's own
    fields with each axis value the point has set at its path, as the loader sets it (copying
    only the mappings on the way: the file's fields are shared, read-only)."""
    data = dict(base)
    for axis in axes:
        value: object = point
        for part in axis.split("."):
            if not isinstance(value, dict) or part not in value:
                break
            value = value[part]
        else:
            set_copied(data, axis, value)
    return data


def mark_item(item: pytest.Item, scenario: Scenario) -> None:
    """Markers and the time limit of one scenario item."""
    if scenario.slow:
        item.add_marker(SLOW_MARKER)
    if scenario.matrix_selection == "pairwise":
        item.add_marker(CROSS_PRODUCT_MARKER)
    if item.config.pluginmanager.hasplugin("timeout"):
        # func_only: the alarm is armed around the item's call only. Armed for the whole runtest
        # protocol, it can fire in pytest's own hooks around the phases (logstart, reporting),
        # where it is an INTERNALERROR that ends the session; a scenario item has no fixtures.
        item.add_marker(pytest.mark.timeout(item_timeout(scenario), method="signal", func_only=True))


def slow_first(items: list[pytest.Item]) -> None:
    """Move the ``slow`` items to the front, keeping every other order (a stable sort).

    pytest-xdist hands items out in this order: a slow item near the end keeps one worker busy
    alone after the others have run out (measured on ``make scenarios``: the 40-layer item, 3 s,
    began 4 s before the end and one worker idled 1.8 s). Longest first is the classic remedy.
    Only the ``slow`` kinds move: ordering every item by its cost made both workers start on
    their 16-rank items together (32 ranks on two cores), which was slower."""
    items.sort(key=lambda item: item.get_closest_marker(SLOW_MARKER) is None)


def unsupported(point: JsonObject) -> str | None:
    """Why a (possibly partial) point cannot run: a feature does not model it (asking the
    features themselves), or the real engine refuses to start it."""
    from harness.features import active_features, unsupported_reason
    from harness.resolve import refused_at_start_up

    features = active_features(point.get("features", {}), point.get("fixes", {}))
    return unsupported_reason(features, point) or refused_at_start_up(point, features)


def ranks(point: JsonObject) -> int:
    """Ranks a point's features spread it over: what an item of it costs, to first order."""
    from harness.features import point_world_size

    return point_world_size(point)


def _pairwise_base(path: Path) -> JsonObject | None:
    """The file's fields outside its matrix when it declares ``matrix_selection: pairwise``,
    else None: a point is judged with them (a file's ``features.dp.size: 2`` holds for an axis
    of ``features.dp.batches``)."""
    from harness.scenario import ScenarioError
    from harness.scenario.yaml_source import compose_text, read_source

    try:  # the bounded reader: an alias bomb or bad bytes must not hang or raise here
        data = compose_text(read_source(str(path)), str(path)).data
    except ScenarioError:
        return None  # the loader reports it
    if not isinstance(data, dict) or data.get("matrix_selection") != "pairwise":
        return None
    return {k: v for k, v in data.items() if k not in ("matrix", "matrix_exclude", "matrix_selection")}


def _mode(value: object) -> str:
    return str(value).strip().upper().replace("-", "_")
