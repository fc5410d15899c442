"""The items of one scenario file, exactly as pytest collection makes them.

Shared by the pytest plugin and ``python -m harness.scenario check`` so that the two can never
disagree about a file: both load it (schema and limits), expand ``--mode`` for files that name
no mode, and run the preflight that only the harness can do (the feature registry, the canary's
model rules, capture sizes a feature leaves empty, the world size). Every problem is a
:class:`~harness.scenario.ScenarioError` naming the file, the line and the field.

This sits above :mod:`harness.session` (it needs the preflight, hence torch); the scenario
package stays pure and imports it only from its command line.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from harness.graph.modes import parse_mode
from harness.scenario import GRAPH_MODES, ScenarioError, ScenarioPoint, load_scenario_file, locate
from harness.scenario.yaml_source import compose_text, read_source

__all__ = ["collect_points", "names_a_mode", "parse_modes", "preflight_point"]


def parse_modes(option: str | None) -> list[str] | None:
    """``--mode`` as a list of distinct graph modes; None when the option is not given.

    Raises ValueError (the plugin turns it into a usage error) for an empty value, an unknown
    mode, or a mode given twice (it would make two items with one id).
    """
    if option is None:
        return None
    names = [name.strip() for name in option.split(",")]
    if not any(names):
        raise ValueError(f"no mode given; choose from {', '.join(GRAPH_MODES)}")
    modes: list[str] = []
    for name in names:
        if not name:
            raise ValueError(f"empty mode in {option!r}")
        mode = str(parse_mode(name))
        if mode in modes:
            raise ValueError(f"{mode} is given twice")
        modes.append(mode)
    return modes


def names_a_mode(path: str | Path) -> bool:
    """Whether the file fixes its own mode (``graph.mode`` or a ``graph.mode`` matrix axis)."""
    try:
        data = compose_text(read_source(str(path)), str(path)).data
    except ScenarioError:
        return True  # the loader reports the problem
    if not isinstance(data, dict):
        return True
    graph = data.get("graph")
    matrix = data.get("matrix")
    return (isinstance(graph, dict) and "mode" in graph) or (
        isinstance(matrix, dict) and "graph.mode" in matrix
    )


def collect_points(path: str | Path, modes: list[str] | None = None,
                   combinations: Any = None, stack: str | None = None) -> list[tuple[str, ScenarioPoint]]:
    """``(item id, point)`` for every item of the file: the matrix id, plus the mode when the
    file names none and ``modes`` expands it; ``combinations`` selects matrix points (see
    :func:`harness.scenario.load_scenario_file`); ``stack`` (``--stack``) is set on every point
    that names no stack of its own. Raises :class:`ScenarioError` for the file."""
    runs: list[tuple[str | None, dict[str, Any]]] = [(None, {})]
    if modes and not names_a_mode(path):
        runs = [(mode, {"graph.mode": mode}) for mode in modes]
    items: list[tuple[str, ScenarioPoint]] = []
    for mode, overrides in runs:
        for point in load_scenario_file(path, overrides=overrides or None, combinations=combinations):
            if modes and point.scenario.graph.mode not in modes:
                continue
            if stack is not None and point.scenario.stack is None:
                point = dataclasses.replace(point, scenario=point.scenario.model_copy(update={"stack": stack}))
            preflight_point(path, point)
            items.append(("-".join(part for part in (point.id, mode) if part), point))
    return items


def preflight_point(path: str | Path, point: ScenarioPoint) -> None:
    """Problems only the harness can see (the point's resolution), located like the loader's errors."""
    from harness.resolve import ItemProblem, PointSkipped, resolve_item

    scenario = point.scenario
    problem: tuple[str, str] | None = None
    try:
        item = resolve_item(scenario)
    except ItemProblem as error:
        problem = (error.field, error.message)
    except PointSkipped:
        pass  # a point that cannot run is skipped with its reason: nothing wrong with the file
    else:
        if scenario.expect.outcome != "skip":
            problem = _dispatch_rank_problem(scenario, item.world_size)
    if problem:
        field, message = problem
        where = f" [matrix point {point.id}]" if point.id else ""
        raise ScenarioError(message + where, path=str(path),
                            line=locate(path, re.sub(r"\[(\d+)\]", r".\1", field)) or point.source.line,
                            field=field)


def _dispatch_rank_problem(scenario: Any, world: int) -> tuple[str, str] | None:
    """A dispatch row about a rank the item does not have: it could never be checked."""
    for i, row in enumerate(scenario.expect.dispatch or ()):
        if row.rank is not None and row.rank >= world:
            return (f"expect.dispatch[{i}].rank",
                    f"rank {row.rank} does not exist: this item has {world} rank(s) (0..{world - 1})")
    return None
