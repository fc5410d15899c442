"""Load a scenario YAML file into validated matrix points, with errors located by line.

Pipeline (:func:`load_scenario_text`, one named step each): compose the YAML into a node tree
(keeps every node's line) and construct the plain data from it; validate the
``matrix``/``matrix_exclude`` part; expand the cross product of the axes (minus exclusions);
for each point, copy the data, set each axis value at its dotted path, apply overrides, and
validate a :class:`~harness.scenario.schema.Scenario`. Every pydantic error location is walked
back through the node tree to a line. Errors of all points are collected, de-duplicated and
raised together as one :class:`ScenarioFileError`.

The parts it is built from each have a module: :mod:`.points` (what a point is),
:mod:`.overrides` (values at dotted paths), :mod:`.matrix` and :mod:`.ids` (the matrix's checks
and its points' ids), :mod:`.locate` (data location -> line, for fields and errors),
:mod:`.messages` (pydantic's errors in the file's words), :mod:`.repair` (what a point that
failed gives without its refused values). Their public names are importable from here as
before.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from pydantic import ValidationError

from harness.plain import JsonObject, PlainData

from .errors import ScenarioError, ScenarioFileError, SourceLocation
from .fields import _fmt_loc
from .ids import _id_issues, _keyword_issues, _strip_ids, _unique_ids, _validated_value, render_id, render_value
from .locate import PointError, _Located, file_error, locate, locate_in_point, point_error
from .matrix import AxisValue, _MatrixPart, _size_issue, exclude_issues
from .messages import _issues
from .overrides import apply_overrides, parse_override, set_copied
from .points import ScenarioPoint, modes_of
from .repair import MAX_REPAIR_ISSUES, MAX_REPAIRED, repair_point
from .schema import Scenario, check_matrix_path, matrix_issues
from .yaml_source import Composed, compose_text, read_source

__all__ = [
    "Combinations",
    "ScenarioPoint",
    "apply_overrides",
    "load_scenario_file",
    "load_scenario_text",
    "locate",
    "locate_in_point",
    "modes_of",
    "parse_override",
    "render_id",
    "render_value",
]

_MATRIX_KEYS = ("matrix", "matrix_exclude")

MAX_ERRORS = 50
"""Errors listed per file; a file with more is mostly one mistake repeated."""
_MAX_RAW_ERRORS = 10_000


#: Picks the matrix points to expand: ``(matrix, excludes) -> index tuples`` (one index per axis).
Combinations = Callable[[dict[str, list[AxisValue]], list[JsonObject]], Iterable[tuple[int, ...]]]


@dataclass
class _Matrix:
    """The matrix as it will be expanded: axis -> values, the exclusions, and whether the file's
    matrix part was valid (if not, only the first value of each usable axis is expanded, to
    still report the other errors)."""

    axes: dict[str, list[AxisValue]]
    excludes: list[JsonObject]
    ok: bool


@dataclass
class _Expansion:
    """The points to validate: each one's axis values and their indices in the matrix, and the
    ids that messages name them by."""

    axes_names: list[str]
    combos: list[JsonObject]
    indices: list[tuple[int, ...]]
    ids: list[str]


@dataclass
class _Validated:
    """What validating every point gave: the valid points (with their index in the expansion),
    every point's errors, and the points valid once their bad values are left out."""

    points: list[ScenarioPoint] = dataclasses.field(default_factory=list)
    index: list[int] = dataclasses.field(default_factory=list)
    raws: list[tuple[int, PointError]] = dataclasses.field(default_factory=list)
    partial: list[tuple[ScenarioPoint, frozenset[str]]] = dataclasses.field(default_factory=list)


def load_scenario_file(
    path: str | Path, overrides: PlainData | None = None, combinations: Combinations | None = None
) -> list[ScenarioPoint]:
    """Load one scenario file: one :class:`ScenarioPoint` per matrix point (one if no matrix).

    ``overrides`` (dotted path -> value) are applied to every point after the matrix values;
    an override of a matrix axis replaces that axis by the single override value.
    ``combinations`` selects the points to expand (default: the whole cross product; see
    :mod:`harness.scenario.cross` for a pairwise selection); exclusions apply either way.
    Raises :class:`ScenarioFileError` listing every problem found.
    """
    text = read_source(str(path))
    return load_scenario_text(text, path=str(path), overrides=overrides, stem=Path(path).stem,
                              combinations=combinations)

def load_scenario_text(
    text: str,
    path: str = "<string>",
    overrides: PlainData | None = None,
    stem: str | None = None,
    combinations: Combinations | None = None,
) -> list[ScenarioPoint]:
    """Like :func:`load_scenario_file`, from a string; ``stem`` is the default name."""
    if stem is None:
        stem = Path(path).stem if path and not path.startswith("<") else "scenario"
    composed = compose_text(text, path)
    raw = _top_level(composed, path)
    tree = _Located(composed.root)
    errors = [ScenarioError(msg, path=path, line=line, field=_fmt_loc(loc)) for loc, line, msg in composed.duplicates]
    overrides = _checked_overrides(overrides, path)
    matrix = _matrix_part(raw, tree, path, composed.values, errors)
    _override_axes(matrix, overrides)
    expansion = _expand(matrix, combinations)
    if expansion.axes_names and not expansion.combos and matrix.ok:
        errors.append(
            file_error(tree, path, ("matrix_exclude",), "matrix_exclude removes every point", True)
        )
    if not expansion.axes_names:
        expansion.combos, expansion.indices = [{}], [()]
    validated = _validate_points(_base_data(raw, stem), expansion, overrides, tree, path, composed)
    errors.extend(_point_errors(validated, expansion, path))
    if errors:
        raise _file_failure(errors, validated, path)
    return _with_dispatch_lines(_with_final_ids(validated, expansion), tree)


def _top_level(composed: Composed, path: str) -> JsonObject:
    """The file's data: a mapping of scenario fields (an empty file, or another top level, is
    the file's only error)."""
    raw = composed.data
    if raw is None:
        raise ScenarioFileError([ScenarioError("the file is empty", path=path, line=1)])
    if not isinstance(raw, dict):
        raise ScenarioFileError(
            [
                ScenarioError(
                    f"the top level must be a mapping of scenario fields, got "
                    f"{type(raw).__name__}",
                    path=path,
                    line=composed.root_line,
                )
            ]
        )
    return raw


def _checked_overrides(overrides: PlainData | None, path: str) -> JsonObject:
    """The overrides, each path into the schema (else every bad one is the file's error)."""
    overrides = dict(overrides or {})
    bad = [
        ScenarioError(f"override: {why}", path=path, field=key)
        for key, why in ((k, check_matrix_path(k)) for k in overrides)
        if why
    ]
    if bad:
        raise ScenarioFileError(bad)
    return overrides


def _matrix_part(raw: JsonObject, tree: _Located, path: str, values: int,
                 errors: list[ScenarioError]) -> _Matrix:
    """Validate ``matrix``/``matrix_exclude`` (their schema, axis paths, ids, size), adding
    each problem to ``errors``, and return the matrix to expand."""
    matrix: dict[str, list[AxisValue]] = {}
    excludes: list[JsonObject] = []
    matrix_ok = True
    try:
        part = _MatrixPart.model_validate({k: raw[k] for k in _MATRIX_KEYS if k in raw})
    except ValidationError as exc:
        matrix_ok = False
        for loc, msg, at_key in _issues(exc):
            errors.append(file_error(tree, path, loc, msg, at_key))
        part = None
    if part is not None:
        issues = [(("matrix",) + loc, msg) for loc, msg in matrix_issues(part.matrix)]
        issues += _id_issues(part.matrix)
        if not issues and part.matrix:
            issues += [(("matrix",) + loc, msg) for loc, msg in _keyword_issues(part.matrix)]
        if not issues:
            issues += exclude_issues(part.matrix, part.matrix_exclude)
        size_issue = _size_issue(part.matrix, values)
        if size_issue:
            issues.append((("matrix",), size_issue))
        for loc, msg in issues:
            # a bad axis path / exclude key points at the key; a duplicate value at the value
            at_key = (loc[0] == "matrix" and len(loc) <= 2) or (
                loc[0] == "matrix_exclude" and len(loc) == 3
            )
            errors.append(file_error(tree, path, loc, msg, at_key))
        matrix_ok = not issues
        matrix = dict(part.matrix or {})
        excludes = list(part.matrix_exclude)
    if not matrix_ok:
        # expand only the first value of each usable axis, to still report the other errors
        given = raw.get("matrix")
        matrix = {
            k: v[:1]
            for k, v in (given.items() if isinstance(given, dict) else ())
            if isinstance(v, list) and v and check_matrix_path(k) is None
        }
        excludes = []
    return _Matrix(matrix, excludes, matrix_ok)


def _override_axes(matrix: _Matrix, overrides: PlainData) -> None:
    """An override of an axis replaces the axis by the single override value."""
    for key, value in overrides.items():
        if key in matrix.axes:
            matrix.axes[key] = [value]
            matrix.excludes = [
                {k: v for k, v in ex.items() if k != key}
                for ex in matrix.excludes
                if key not in ex or ex[key] == value
            ]


def _base_data(raw: JsonObject, stem: str) -> JsonObject:
    """The data every point starts from: the file without its matrix part and its extensions
    (keys under ``x-`` hold YAML anchors for merge keys: ``x-base: &base {...}``, ``<<: *base``),
    named after the file unless it names itself."""
    base = {k: v for k, v in raw.items() if k not in _MATRIX_KEYS and not _is_extension(k)}
    if base.get("name") is None:
        base["name"] = stem
    return base


def _expand(matrix: _Matrix, combinations: Combinations | None) -> _Expansion:
    """The points of the matrix (``combinations`` picks them, default the whole cross product)
    that no exclusion removes."""
    axes_names = list(matrix.axes)
    combos: list[JsonObject] = []
    indices: list[tuple[int, ...]] = []
    chosen = (combinations(matrix.axes, matrix.excludes) if combinations and axes_names
              else itertools.product(*(range(len(matrix.axes[a])) for a in axes_names)))
    for idx in chosen:
        axes = {a: matrix.axes[a][i] for a, i in zip(axes_names, idx)}
        if any(all(axes.get(k) == v for k, v in ex.items()) for ex in matrix.excludes):
            continue
        combos.append(axes)
        indices.append(idx)
    ids = _unique_ids([render_id(a) for a in combos]) if axes_names else [""]  # for messages
    return _Expansion(axes_names, combos, indices, ids)


def _validate_points(base: JsonObject, expansion: _Expansion, overrides: PlainData, tree: _Located,
                     path: str, composed: Composed) -> _Validated:
    """Validate every point: its axis values and the overrides set on the base data. A point
    that fails keeps its located errors, and, repaired, what the rest of it gives."""
    axes_names, indices = expansion.axes_names, expansion.indices
    root_line = composed.root_line
    matrix_line = tree.line_of(*tree.walk(("matrix",))[:2], prefer_key=True) if axes_names else None
    out = _Validated()
    for n, (axes, idx) in enumerate(zip(expansion.combos, indices)):
        if len(out.raws) > _MAX_RAW_ERRORS:
            break  # enough to fix first; the rest would only repeat them
        data = dict(base)  # copied along each axis path only: points share the rest (read-only)
        for a, v in axes.items():
            set_copied(data, a, _strip_ids(v))
        for k, v in overrides.items():
            set_copied(data, k, v)
        source = SourceLocation(path, matrix_line if axes_names else root_line)
        try:
            scenario = Scenario.model_validate(data)
        except ValidationError as exc:
            issues = _issues(exc)
            for loc, msg, at_key in issues:
                out.raws.append(
                    (n, point_error(tree, loc, msg, at_key, axes_names, idx, indices, overrides))
                )
            repaired = (repair_point(data, issues) if len(out.partial) < MAX_REPAIRED
                        and len(issues) <= MAX_REPAIR_ISSUES else None)
            if repaired is not None:  # the rest of the point, for the checks the schema cannot make
                scenario, removed = repaired
                out.partial.append((ScenarioPoint(expansion.ids[n] if axes_names else "", scenario,
                                                  {a: _strip_ids(v) for a, v in axes.items()}, source,
                                                  dict(zip(axes_names, idx))), removed))
            continue
        out.index.append(n)
        out.points.append(
            ScenarioPoint(
                id="",
                scenario=scenario,
                axes={a: _strip_ids(v) for a, v in axes.items()},
                source=source,
                axis_index=dict(zip(axes_names, idx)),
            )
        )
    return out


def _point_errors(validated: _Validated, expansion: _Expansion, path: str) -> list[ScenarioError]:
    """Each distinct error of the points once, naming the points it is bound to."""
    groups: dict[tuple, tuple[PointError, set[int]]] = {}
    for n, r in validated.raws:
        if r.group in groups:
            groups[r.group][1].add(n)
        else:
            groups[r.group] = (r, {n})
    ok_points = set(validated.index)
    errors = []
    for r, where in groups.values():
        msg = r.message
        # name the points only if the error is bound to a combination: a point that should
        # show it (same axis value, or any point) validated cleanly. Points that failed for
        # another reason may merely hide it (pydantic skips a model's cross-field checks
        # once one of its fields is invalid).
        if expansion.axes_names and (set(r.expected) - set(where)) & ok_points:
            names = [expansion.ids[i] for i in sorted(where)]
            shown = ", ".join(names[:4]) + (f", ... ({len(names)} points)" if len(names) > 4 else "")
            msg += f" [matrix point{'s' if len(names) > 1 else ''} {shown}]"
        errors.append(ScenarioError(msg, path=path, line=r.line, field=r.field))
    return errors


def _file_failure(errors: list[ScenarioError], validated: _Validated, path: str) -> ScenarioFileError:
    """Every error of the file, by line, once each, at most :data:`MAX_ERRORS` of them."""
    errors.sort(key=lambda e: (e.line if e.line is not None else 0))
    errors = _dedupe(errors)
    if len(errors) > MAX_ERRORS:
        left = len(errors) - MAX_ERRORS
        errors = errors[:MAX_ERRORS] + [
            ScenarioError(f"{left} more error(s) not shown: fix these first", path=path)
        ]
    failure = ScenarioFileError(errors)
    # What the rest of the file gives, so that a caller can report the problems the schema
    # cannot see in the same pass: the points that validated, and the points that did once
    # the values named above were left out (each with the fields it lost).
    failure.points = [(p, frozenset()) for p in validated.points] + validated.partial
    return failure


def _with_final_ids(validated: _Validated, expansion: _Expansion) -> list[ScenarioPoint]:
    """The points with their ids, from the validated values where they are scalars (``full`` ->
    ``FULL``); without a matrix, as they are."""
    if not expansion.axes_names:
        return validated.points
    final = _unique_ids(
        [
            render_id({a: _validated_value(p.scenario, a, v) for a, v in expansion.combos[n].items()})
            for p, n in zip(validated.points, validated.index)
        ]
    )
    return [dataclasses.replace(p, id=i) for p, i in zip(validated.points, final)]


def _with_dispatch_lines(points: list[ScenarioPoint], tree: _Located) -> list[ScenarioPoint]:
    """The points with the line of each of their ``expect.dispatch`` rows."""
    def line(i: int) -> int | None:
        node, key_node, _ = tree.walk(("expect", "dispatch", i))
        return tree.line_of(node, key_node, prefer_key=True)

    return [dataclasses.replace(p, dispatch_lines=tuple(line(i) for i in range(len(rows))))
            if (rows := p.scenario.expect.dispatch) else p for p in points]


def _is_extension(key: object) -> bool:
    return isinstance(key, str) and key.startswith("x-")


def _dedupe(errors: list[ScenarioError]) -> list[ScenarioError]:
    seen: set[tuple] = set()
    out = []
    for e in errors:
        key = (e.line, e.field, e.message)
        if key not in seen:
            seen.add(key)
            out.append(e)
    return out


