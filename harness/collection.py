"""The items of one scenario file, exactly as pytest collection makes them.

Shared by the pytest plugin and ``python -m harness.scenario check`` so that the two can never
disagree about a file: both load it (schema and limits), expand ``--mode`` for files that name
no mode, and run the preflight that only the harness can do (the feature registry, the canary's
model rules, capture sizes a feature leaves empty, the world size). Every problem is a
:class:`~harness.scenario.ScenarioError` naming the file, the line and the field.

The preflight is the point's resolution (:func:`harness.resolve.resolve_item`), made once: each
collected item carries it (:class:`CollectedItem`), and the item's run executes it instead of
resolving the point again.

This sits above :mod:`harness.session` (it needs the preflight, hence torch); the scenario
package stays pure and imports it only from its command line.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Union

from harness.graph.modes import parse_mode
from harness.plain import JsonObject
from harness.scenario import (GRAPH_MODES, Scenario, ScenarioError, ScenarioFileError, ScenarioPoint,
                              load_scenario_file, locate, locate_in_point)
from harness.scenario.loader import Combinations
from harness.scenario.yaml_source import compose_text, read_source

if TYPE_CHECKING:  # pragma: no cover - harness.resolve imports torch; this module loads it lazily
    from harness.resolve import ItemProblem, PointSkipped, ResolvedItem

__all__ = ["CollectedItem", "Resolution", "collect_points", "names_a_mode", "parse_modes", "preflight_error",
           "preflight_point", "resolve_point"]

#: A point resolved at collection: the item its run executes, or why it cannot run.
Resolution = Union["ResolvedItem", "PointSkipped"]


class CollectedItem(NamedTuple):
    """One item of a file: its id suffix (matrix id, mode), its point, and its resolution."""

    suffix: str
    point: ScenarioPoint
    resolution: Resolution


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


def collect_points(path: str | Path, modes: list[str] | None = None, combinations: Combinations | None = None,
                   stack: str | None = None, *, backend: str = "emulated",
                   fia_contract: str | None = None) -> list[CollectedItem]:
    """Every item of the file: its id suffix (the matrix id, plus the mode when the file names
    none and ``modes`` expands it), its point and its resolution for ``backend`` (a resolved
    name) with ``fia_contract`` (``--fia-contract``); ``combinations`` selects matrix points (see
    :func:`harness.scenario.load_scenario_file`); ``stack`` (``--stack``) is set on every point
    that names no stack of its own.

    Raises one :class:`ScenarioFileError` with every problem of the file, in one pass: the
    schema's, and the preflight's of every point, including the points that pass the schema
    once the values it refused are left out (a problem that involves such a value is not
    reported: the value is wrong already)."""
    from harness.resolve import ItemProblem

    runs: list[tuple[str | None, JsonObject]] = [(None, {})]
    if modes and not names_a_mode(path):
        runs = [(mode, {"graph.mode": mode}) for mode in modes]
    items: list[CollectedItem] = []
    errors: list[ScenarioError] = []
    problems: dict[tuple, tuple[ScenarioError, list[str]]] = {}  # one entry per distinct problem
    for mode, overrides in runs:
        try:
            loaded: list[tuple[ScenarioPoint, frozenset[str]]] = [(p, frozenset()) for p in
                      load_scenario_file(path, overrides=overrides or None, combinations=combinations)]
        except ScenarioFileError as failure:
            errors.extend(failure.errors)
            loaded = failure.points
        for point, removed in loaded:
            if modes and point.scenario.graph.mode not in modes:
                continue
            if stack is not None and point.scenario.stack is None:
                point = dataclasses.replace(point, scenario=point.scenario.model_copy(update={"stack": stack}))
            resolution = resolve_point(point, backend, fia_contract=fia_contract)
            problem = preflight_error(path, point, resolution, unreliable=removed)
            if problem is not None:
                error, point_id = problem
                key = (error.line, error.field, error.message)
                problems.setdefault(key, (error, []))[1].append(point_id)
            elif not removed and not errors and not isinstance(resolution, ItemProblem):
                items.append(CollectedItem("-".join(part for part in (point.id, mode) if part), point, resolution))
    for error, point_ids in problems.values():
        named = [i for i in dict.fromkeys(point_ids) if i]
        if named:
            shown = ", ".join(named[:4]) + (f", ... ({len(named)} points)" if len(named) > 4 else "")
            error = ScenarioError(f"{error.message} [matrix point{'s' if len(named) > 1 else ''} {shown}]",
                                  path=error.path, line=error.line, field=error.field)
        errors.append(error)
    if errors:
        unique = {(e.line, e.field, e.message): e for e in errors}
        raise ScenarioFileError(sorted(unique.values(), key=lambda e: e.line if e.line is not None else 0))
    return items


#: Dotted scenario fields named in a message ("..., with features.sp.tp=3").
_FIELD_NAMES = re.compile(r"\b((?:model|graph|features|workload|engine|fixes|expect)(?:\.[A-Za-z_]\w*)+)")


def _section(field: str) -> str:
    """What a field belongs with: a feature or fix by name, the rest by top-level section."""
    parts = field.split(".")
    return ".".join(parts[:2]) if parts[0] in ("features", "fixes") else parts[0]


def resolve_point(point: ScenarioPoint, backend: str = "emulated", *,
                  fia_contract: str | None = None) -> Resolution | ItemProblem:
    """The point's resolution, its preflight: the item to run (:class:`ResolvedItem`), why it
    cannot run (:class:`PointSkipped`: nothing wrong with the file), or what the harness cannot
    run as written (:class:`ItemProblem`: an error of the file)."""
    from harness.resolve import ItemProblem, PointSkipped, resolve_item

    try:
        return resolve_item(point.scenario, backend, fia_contract=fia_contract, dispatch_lines=point.dispatch_lines)
    except (ItemProblem, PointSkipped) as outcome:
        return outcome.with_traceback(None)  # kept on the item: without the resolution's frames


def preflight_error(path: str | Path, point: ScenarioPoint, resolution: Resolution | ItemProblem,
                    unreliable: frozenset[str] = frozenset()) -> tuple[ScenarioError, str] | None:
    """The problem of the file that the point's ``resolution`` shows, located at the value the
    user must change, with the point's matrix id; None without one (or when it involves a field
    in ``unreliable``: values the schema refused, whose defaults stand in)."""
    from harness.resolve import ItemProblem, ResolvedItem

    scenario = point.scenario
    problem: tuple[str, str] | None = None
    if isinstance(resolution, ItemProblem):
        problem = (resolution.field, resolution.message)
    elif isinstance(resolution, ResolvedItem) and scenario.expect.outcome != "skip":
        # a point reported as skipped starts no process
        problem = _dispatch_rank_problem(scenario, resolution.world_size)
    if not problem:
        return None
    field, message = problem
    named = [field, *(f for f in _FIELD_NAMES.findall(message) if f != field)]
    if unreliable and {_section(f) for f in named} & {_section(f) for f in unreliable}:
        return None
    field, line, message = _value_to_change(path, point, named, message)
    return ScenarioError(message, path=str(path), line=line, field=field), point.id


def _value_to_change(path: str | Path, point: ScenarioPoint, named: list[str], message: str) -> tuple[str, int | None, str]:
    """The field, line and message of a problem: the first field it names that the file
    writes for this point (where the user can change it), else the field the check named,
    at its nearest parent written (or the scenario's first line)."""
    dotted = [re.sub(r"\[(\d+)\]", r".\1", f) for f in named]
    for shown, field in zip(named, dotted):
        line = locate_in_point(path, point, field)
        if line is not None:
            if shown != named[0]:
                message += f" ({named[0]} is not in this file: it keeps its default)"
            return shown, line, message
    return named[0], locate(path, dotted[0]) or point.source.line, message


def preflight_point(path: str | Path, point: ScenarioPoint) -> None:
    """Raise the point's preflight problem as a located :class:`ScenarioError`."""
    problem = preflight_error(path, point, resolve_point(point))
    if problem is not None:
        error, point_id = problem
        where = f" [matrix point {point_id}]" if point_id else ""
        raise ScenarioError(error.message + where, path=error.path, line=error.line, field=error.field)


def _dispatch_rank_problem(scenario: Scenario, world: int) -> tuple[str, str] | None:
    """A dispatch row about a rank the item does not have: it could never be checked."""
    for i, row in enumerate(scenario.expect.dispatch or ()):
        if row.rank is not None and row.rank >= world:
            return (f"expect.dispatch[{i}].rank",
                    f"rank {row.rank} does not exist: this item has {world} rank(s) (0..{world - 1})")
    return None
