"""Load a scenario YAML file into validated matrix points, with errors located by line.

Pipeline: compose the YAML into a node tree (keeps every node's line) and construct the plain
data from it; validate the ``matrix``/``matrix_exclude`` part; expand the cross product of the
axes (minus exclusions); for each point, copy the data, set each axis value at its dotted path,
apply overrides, and validate a :class:`~harness.scenario.schema.Scenario`. Every pydantic error
location is walked back through the node tree to a line. Errors of all points are collected,
de-duplicated and raised together as one :class:`ScenarioFileError`.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import itertools
import math
import re
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable, Iterable, Mapping, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import ScenarioError, ScenarioFileError, SourceLocation
from .bounds import MAX_MATRIX_POINTS, MAX_MATRIX_WORK, MAX_NAME_CHARS
from .schema import (
    ConsistencyError,
    Scenario,
    _fmt_loc,
    check_matrix_path,
    exclude_issues,
    matrix_issues,
)
from .yaml_source import compose_text, read_source

__all__ = [
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

Loc = tuple[Any, ...]
_MATRIX_KEYS = ("matrix", "matrix_exclude")


# ----------------------------------------------------------------------------------------- points


@dataclass(frozen=True)
class ScenarioPoint:
    """One runnable item: a scenario with every matrix axis fixed.

    ``id``: ``""`` without a matrix, else the axis values rendered and joined by ``-``
    (see :func:`render_id`). ``axes``: axis path -> value for this point (empty without a
    matrix). ``scenario.matrix`` is None and ``scenario.matrix_exclude`` empty: they have been
    applied. ``source``: the file and the line of the scenario (first key) or of ``matrix:``.
    """

    id: str
    scenario: Scenario
    axes: dict[str, Any] = field(default_factory=dict)
    source: SourceLocation = field(default_factory=lambda: SourceLocation("<scenario>"))
    #: axis -> the index of this point's value in the file's ``matrix`` (to find its line)
    axis_index: dict[str, int] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.scenario.name or ""

    @property
    def display_name(self) -> str:
        """``name`` or ``name[id]`` (pytest style)."""
        return f"{self.name}[{self.id}]" if self.id else self.name


def modes_of(point: ScenarioPoint) -> str:
    """The graph mode a point runs in (upper case, e.g. ``"FULL_DECODE_ONLY"``)."""
    return point.scenario.graph.mode


# ------------------------------------------------------------------------------------ overrides


def _split(path: str) -> list[str]:
    return path.split(".")


def _set_path(data: dict, path: str, value: Any) -> bool:
    """Set ``data[a][b][c] = value`` for ``path == "a.b.c"``, creating missing mappings.
    Returns False (and leaves ``data`` unchanged) if an intermediate value is not a mapping."""
    parts = _split(path)
    cur = data
    for part in parts[:-1]:
        nxt = cur.get(part)
        if nxt is None:
            nxt = cur[part] = {}
        if not isinstance(nxt, dict):
            return False
        cur = nxt
    cur[parts[-1]] = copy.deepcopy(value)
    return True


def apply_overrides(scenario_dict: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict:
    """A deep copy of ``scenario_dict`` with each dotted-path override set.

    ``apply_overrides(raw, {"graph.mode": "FULL"})``. Raises :class:`ScenarioError` for a path
    that does not exist in the schema or runs through a non-mapping value.
    """
    out = copy.deepcopy(dict(scenario_dict))
    for key, value in overrides.items():
        why = check_matrix_path(key)
        if why:
            raise ScenarioError(why.replace("unknown path", "unknown override path"), field=key)
        if not _set_path(out, key, value):
            raise ScenarioError(
                f"cannot override {key!r}: a value on the way is not a mapping", field=key
            )
    return out


def parse_override(text: str) -> tuple[str, Any]:
    """``"graph.capture_sizes=[1, 2, 4]"`` -> ``("graph.capture_sizes", [1, 2, 4])``; the value
    is parsed as YAML (so ``4`` is an int, ``full`` a string)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ScenarioError(f"override must look like 'path=value', got {text!r}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ScenarioError(f"override value is not valid YAML: {exc}", field=key.strip())
    return key.strip(), value


# ------------------------------------------------------------------------------------------- ids


def render_value(value: Any, axis: str = "") -> str:
    """Compact, ``-k``-friendly rendering of one axis value (see docs/scenarios.md)."""
    seg = axis.rsplit(".", 1)[-1] if axis else ""
    if isinstance(value, dict) and isinstance(value.get("_id"), str):
        return value["_id"]
    if isinstance(value, bool):
        return seg if value and seg else ("no_" + seg if seg else str(value).lower())
    if value is None:
        return f"{seg}_default" if seg else "default"
    if isinstance(value, (int, float)):
        return f"{seg}{value}"
    if isinstance(value, str):
        return "_".join(value.split()) or "empty"
    if isinstance(value, list):
        return "x".join(render_value(v) for v in value) or "empty"
    if isinstance(value, dict):
        return "_".join(f"{k}{render_value(v)}" for k, v in value.items()) or "empty"
    return str(value)


def render_id(axes: Mapping[str, Any]) -> str:
    """The id of a matrix point: each axis value rendered, in axis order, joined by ``-``."""
    return "-".join(render_value(v, k) for k, v in axes.items())


def _strip_ids(value: Any) -> Any:
    if isinstance(value, dict) and "_id" in value:
        return {k: v for k, v in value.items() if k != "_id"}
    return value


# ------------------------------------------------------------------------------------------ YAML


class _Located:
    """The composed YAML tree; maps a data location to a (line, key-or-value) anchor."""

    def __init__(self, root: yaml.Node | None):
        self.root = root
        self._keys: dict[int, dict[str, tuple[yaml.Node, yaml.Node]]] = {}

    def _lookup(self, node: yaml.MappingNode, key: str):
        """``node``'s entry for ``key`` (the last one: PyYAML keeps it), indexed once per
        mapping so that locating many errors stays linear."""
        index = self._keys.get(id(node))
        if index is None:
            index = self._keys[id(node)] = {}
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode):
                    index[k.value] = (k, v)
        return index.get(key)

    def walk(self, loc: Iterable[Any], start: yaml.Node | None = None):
        """Follow ``loc`` from ``start`` (default root). Returns ``(node, key_node, matched)``:
        the deepest node reached, the mapping key that led to it (or None) and how many parts
        of ``loc`` were consumed."""
        node = self.root if start is None else start
        key_node = None
        matched = 0
        for part in loc:
            if isinstance(node, yaml.MappingNode):
                hit = self._lookup(node, str(part))
                if hit is None:
                    break
                key_node, node = hit
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
                if not 0 <= part < len(node.value):
                    break
                key_node, node = None, node.value[part]
            else:
                break
            matched += 1
        return node, key_node, matched

    @staticmethod
    def line_of(node, key_node, *, prefer_key: bool) -> int | None:
        if node is None and key_node is None:
            return None
        if key_node is not None and (prefer_key or not isinstance(node, yaml.ScalarNode)):
            return key_node.start_mark.line + 1
        return node.start_mark.line + 1


def locate(path: str | Path, field: str) -> int | None:
    """The line of ``field`` (dotted) in a scenario file, or of its nearest parent present."""
    try:
        root = compose_text(read_source(str(path)), str(path)).root
    except ScenarioError:  # a file that does not parse has reported that already
        return None
    tree = _Located(root)
    loc = [int(p) if p.isdigit() else p for p in field.split(".") if p]
    node, key_node, matched = tree.walk(loc)
    return tree.line_of(node, key_node, prefer_key=True)


# ------------------------------------------------------------------------------- pydantic errors


class _MatrixPart(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    matrix: dict[str, Annotated[list[Any], Field(min_length=1)]] | None = None
    matrix_exclude: list[dict[str, Any]] = Field(default_factory=list)


def _issues(exc: ValidationError) -> list[tuple[Loc, str, bool]]:
    """Flatten a ValidationError into ``(loc, message, at_key)``."""
    out: list[tuple[Loc, str, bool]] = []
    for e in exc.errors():
        loc = tuple(e["loc"])
        err = (e.get("ctx") or {}).get("error")
        if isinstance(err, ConsistencyError):
            for rel, msg in err.issues:
                out.append((loc + tuple(rel), msg, False))
            continue
        kind = e["type"]
        if kind == "extra_forbidden":
            out.append((loc, f"unknown key {loc[-1]!r}", True))
            continue
        if kind == "missing":
            out.append((loc, f"missing required key {loc[-1]!r}", False))
            continue
        out.append((loc, _plain_message(e, loc), False))
    return out


def _got(value: Any) -> str:
    """``, got 2``: the value the file gave, unless it is a whole mapping or list."""
    return "" if isinstance(value, (dict, list)) else f", got {value!r}"


def _plain_message(error: Mapping[str, Any], loc: Loc) -> str:
    """A pydantic error in the scenario file's own words: what the value must be, and what it
    was ("must be at most 16, got 100"), never the validator's vocabulary ("Input should be a
    valid dictionary or instance of DPSettings")."""
    kind, ctx, value = error["type"], error.get("ctx") or {}, error.get("input")
    msg = str(error["msg"])
    if kind == "value_error":  # the schema's own validators already speak the file's words
        return msg[len("Value error, "):] if msg.startswith("Value error, ") else msg
    bounds = {"less_than_equal": ("at most", "le"), "less_than": ("below", "lt"),
              "greater_than_equal": ("at least", "ge"), "greater_than": ("above", "gt"),
              "multiple_of": ("a multiple of", "multiple_of")}
    if kind in bounds:
        words, key = bounds[kind]
        return f"must be {words} {ctx.get(key)}{_got(value)}"
    if kind in ("too_long", "too_short"):
        actual, limit = ctx.get("actual_length"), ctx.get("max_length", ctx.get("min_length"))
        if kind == "too_short":
            return f"is empty: give at least {limit}" if not actual else f"has {actual}, at least {limit} needed"
        return f"has {actual} {'entry' if actual == 1 else 'entries'}, at most {limit} allowed"
    if kind in ("string_too_long", "string_too_short"):
        length = len(value) if isinstance(value, str) else "?"
        if kind == "string_too_short" and not length:
            return "must not be empty"
        most = "at most" if kind == "string_too_long" else "at least"
        return f"is {length} characters long, {most} {ctx.get('max_length', ctx.get('min_length'))} allowed"
    if kind in ("literal_error", "enum"):
        return f"must be one of {ctx.get('expected')}{_got(value)}"
    kinds = {"int_type": "a whole number", "int_parsing": "a whole number", "int_from_float": "a whole number",
             "float_type": "a number", "float_parsing": "a number", "finite_number": "a finite number",
             "bool_type": "true or false", "bool_parsing": "true or false", "string_type": "text",
             "list_type": "a list", "tuple_type": "a list", "set_type": "a list"}
    if kind in kinds:
        return f"must be {kinds[kind]}{_got(value)}"
    if kind in ("dict_type", "model_type", "model_attributes_type", "mapping_type"):
        holder = _type_at(loc)
        if isinstance(holder, type) and issubclass(holder, BaseModel) and holder.model_fields:
            fields = list(holder.model_fields)
            example = f", such as {{{fields[0]}: {value}}}" if isinstance(value, (int, float, str)) else ""
            return f"must be a mapping of its settings ({', '.join(fields)}){example}{_got(value)}"
        return f"must be a mapping (key: value){_got(value)}"
    return msg.replace("Input should be", "must be", 1) + _got(value)


def _unwrap(tp: Any) -> Any:
    while True:
        origin = get_origin(tp)
        if origin is Annotated:
            tp = get_args(tp)[0]
        elif origin is Union or origin is types.UnionType:
            args = [t for t in get_args(tp) if t is not type(None)]
            if len(args) != 1:
                return tp
            tp = args[0]
        else:
            return tp


def _type_at(loc: Loc, tp: Any = Scenario) -> Any:
    """The annotation at ``loc`` inside the schema (None if it cannot be followed)."""
    for part in loc:
        tp = _unwrap(tp)
        if isinstance(part, int) and get_origin(tp) is list:
            tp = get_args(tp)[0]
        elif isinstance(part, str) and isinstance(tp, type) and issubclass(tp, BaseModel):
            if part not in tp.model_fields:
                return None
            tp = tp.model_fields[part].annotation
        else:
            return None
    return _unwrap(tp)


def _suggest(loc: Loc) -> str:
    """' (did you mean ...?)' for an unknown key, from the fields of the model holding it."""
    if len(str(loc[-1])) > 64:
        return ""
    holder = _type_at(loc[:-1])
    if not (isinstance(holder, type) and issubclass(holder, BaseModel)):
        return ""
    close = difflib.get_close_matches(str(loc[-1]), list(holder.model_fields), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


# ---------------------------------------------------------------------------------------- loading


@dataclass
class _Raw:
    line: int | None
    field: str
    message: str
    group: tuple  # what makes two errors "the same error"
    expected: frozenset  # point indices where this error would be expected if not combination-bound


#: Picks the matrix points to expand: ``(matrix, excludes) -> index tuples`` (one index per axis).
Combinations = Callable[[dict[str, list[Any]], list[dict[str, Any]]], Iterable[tuple[int, ...]]]


def load_scenario_file(
    path: str | Path, overrides: Mapping[str, Any] | None = None, combinations: Combinations | None = None
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
    overrides: Mapping[str, Any] | None = None,
    stem: str | None = None,
    combinations: Combinations | None = None,
) -> list[ScenarioPoint]:
    """Like :func:`load_scenario_file`, from a string; ``stem`` is the default name."""
    if stem is None:
        stem = Path(path).stem if path and not path.startswith("<") else "scenario"
    composed = compose_text(text, path)
    root, raw = composed.root, composed.data
    tree = _Located(root)
    if raw is None:
        raise ScenarioFileError([ScenarioError("the file is empty", path=path, line=1)])
    if not isinstance(raw, dict):
        raise ScenarioFileError(
            [
                ScenarioError(
                    f"the top level must be a mapping of scenario fields, got "
                    f"{type(raw).__name__}",
                    path=path,
                    line=root.start_mark.line + 1,
                )
            ]
        )
    errors: list[ScenarioError] = []
    for loc, line, msg in composed.duplicates:
        errors.append(ScenarioError(msg, path=path, line=line, field=_fmt_loc(loc)))

    overrides = dict(overrides or {})
    bad = [
        ScenarioError(f"override: {why}", path=path, field=key)
        for key, why in ((k, check_matrix_path(k)) for k in overrides)
        if why
    ]
    if bad:
        raise ScenarioFileError(bad)

    # --- the matrix part
    matrix: dict[str, list[Any]] = {}
    excludes: list[dict[str, Any]] = []
    matrix_ok = True
    try:
        part = _MatrixPart.model_validate({k: raw[k] for k in _MATRIX_KEYS if k in raw})
    except ValidationError as exc:
        matrix_ok = False
        for loc, msg, at_key in _issues(exc):
            errors.append(_located(tree, path, loc, msg, at_key))
        part = None
    if part is not None:
        issues = [(("matrix",) + loc, msg) for loc, msg in matrix_issues(part.matrix)]
        issues += _id_issues(part.matrix)
        if not issues and part.matrix:
            issues += [(("matrix",) + loc, msg) for loc, msg in _keyword_issues(part.matrix)]
        if not issues:
            issues += exclude_issues(part.matrix, part.matrix_exclude)
        size_issue = _size_issue(part.matrix, composed.values)
        if size_issue:
            issues.append((("matrix",), size_issue))
        for loc, msg in issues:
            # a bad axis path / exclude key points at the key; a duplicate value at the value
            at_key = (loc[0] == "matrix" and len(loc) <= 2) or (
                loc[0] == "matrix_exclude" and len(loc) == 3
            )
            errors.append(_located(tree, path, loc, msg, at_key))
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

    # overrides of an axis replace the axis by the single override value
    for key, value in overrides.items():
        if key in matrix:
            matrix[key] = [value]
            excludes = [
                {k: v for k, v in ex.items() if k != key}
                for ex in excludes
                if key not in ex or ex[key] == value
            ]

    # keys under "x-" hold YAML anchors for merge keys (`x-base: &base {...}`, `<<: *base`)
    base = {k: v for k, v in raw.items() if k not in _MATRIX_KEYS and not _is_extension(k)}
    if base.get("name") is None:
        base["name"] = stem

    # --- expand
    axes_names = list(matrix)
    combos: list[dict[str, Any]] = []
    indices: list[tuple[int, ...]] = []
    chosen = (combinations(matrix, excludes) if combinations and axes_names
              else itertools.product(*(range(len(matrix[a])) for a in axes_names)))
    for idx in chosen:
        axes = {a: matrix[a][i] for a, i in zip(axes_names, idx)}
        if any(all(axes.get(k) == v for k, v in ex.items()) for ex in excludes):
            continue
        combos.append(axes)
        indices.append(idx)
    if axes_names and not combos and matrix_ok:
        errors.append(
            _located(tree, path, ("matrix_exclude",), "matrix_exclude removes every point", True)
        )

    ids = _unique_ids([render_id(a) for a in combos]) if axes_names else [""]  # for messages
    if not axes_names:
        combos, indices = [{}], [()]

    root_line = root.start_mark.line + 1
    matrix_line = tree.line_of(*tree.walk(("matrix",))[:2], prefer_key=True) if axes_names else None

    points: list[ScenarioPoint] = []
    point_index: list[int] = []
    raws: list[tuple[int, _Raw]] = []
    partial: list[tuple[ScenarioPoint, frozenset[str]]] = []  # points valid once their bad values go
    for n, (axes, idx) in enumerate(zip(combos, indices)):
        if len(raws) > _MAX_RAW_ERRORS:
            break  # enough to fix first; the rest would only repeat them
        data = dict(base)  # copied along each axis path only: points share the rest (read-only)
        for a, v in axes.items():
            _set_copied(data, a, _strip_ids(v))
        for k, v in overrides.items():
            _set_copied(data, k, v)
        source = SourceLocation(path, matrix_line if axes_names else root_line)
        try:
            scenario = Scenario.model_validate(data)
        except ValidationError as exc:
            issues = _issues(exc)
            for loc, msg, at_key in issues:
                raws.append(
                    (n, _point_error(tree, loc, msg, at_key, axes_names, idx, indices, overrides))
                )
            repaired = _repair(data, issues) if len(partial) < _MAX_REPAIRED and len(issues) <= _MAX_REPAIR_ISSUES else None
            if repaired is not None:  # the rest of the point, for the checks the schema cannot make
                scenario, removed = repaired
                partial.append((ScenarioPoint(ids[n] if axes_names else "", scenario,
                                              {a: _strip_ids(v) for a, v in axes.items()}, source,
                                              dict(zip(axes_names, idx))), removed))
            continue
        point_index.append(n)
        points.append(
            ScenarioPoint(
                id="",
                scenario=scenario,
                axes={a: _strip_ids(v) for a, v in axes.items()},
                source=source,
                axis_index=dict(zip(axes_names, idx)),
            )
        )

    # --- group point errors: report each distinct error once
    groups: dict[tuple, tuple[_Raw, set[int]]] = {}
    for n, r in raws:
        if r.group in groups:
            groups[r.group][1].add(n)
        else:
            groups[r.group] = (r, {n})
    ok_points = set(point_index)
    for r, where in groups.values():
        msg = r.message
        # name the points only if the error is bound to a combination: a point that should
        # show it (same axis value, or any point) validated cleanly. Points that failed for
        # another reason may merely hide it (pydantic skips a model's cross-field checks
        # once one of its fields is invalid).
        if axes_names and (set(r.expected) - set(where)) & ok_points:
            names = [ids[i] for i in sorted(where)]
            shown = ", ".join(names[:4]) + (f", ... ({len(names)} points)" if len(names) > 4 else "")
            msg += f" [matrix point{'s' if len(names) > 1 else ''} {shown}]"
        errors.append(ScenarioError(msg, path=path, line=r.line, field=r.field))

    if not errors and axes_names:
        # ids from the validated values where they are scalars (``full`` -> ``FULL``)
        final = _unique_ids(
            [
                render_id({a: _validated_value(p.scenario, a, v) for a, v in combos[n].items()})
                for p, n in zip(points, point_index)
            ]
        )
        points = [dataclasses.replace(p, id=i) for p, i in zip(points, final)]
    if errors:
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
        failure.points = [(p, frozenset()) for p in points] + partial
        raise failure
    return points


_REPAIR_ROUNDS = 3
#: Points repaired per file, and errors per point worth repairing: beyond them the file's
#: errors are mostly one mistake repeated, and the bound keeps a 1 MB file's load linear.
_MAX_REPAIRED = 64
_MAX_REPAIR_ISSUES = 20


def _repair(data: dict, issues: list[tuple[Loc, str, bool]]) -> tuple[Scenario, frozenset[str]] | None:
    """The point validated without the values its errors name (so their defaults apply), and
    the dotted fields left out; None when that does not make it valid in a few rounds (a
    missing required key, a value whose removal leaves another error)."""
    data = copy.deepcopy(data)
    removed: set[str] = set()
    for _ in range(_REPAIR_ROUNDS):
        changed = False
        for loc, msg, _ in issues:
            if msg.startswith("missing required key"):
                return None
            changed |= _drop(data, loc)
            removed.add(_fmt_loc(tuple(p for p in loc if not isinstance(p, int))))
        if not changed:
            return None
        try:
            return Scenario.model_validate(data), frozenset(removed)
        except ValidationError as exc:
            issues = _issues(exc)
    return None


def _drop(data: Any, loc: Loc) -> bool:
    """Remove the value at ``loc`` (the deepest mapping key on the way that exists)."""
    parents: list[tuple[dict, str]] = []
    cur = data
    for part in loc:
        if isinstance(cur, dict) and part in cur:
            parents.append((cur, part))
            cur = cur[part]
        elif isinstance(cur, list) and isinstance(part, int) and 0 <= part < len(cur):
            cur = cur[part]
        else:
            break
    if not parents:
        return False
    holder, key = parents[-1]
    del holder[key]
    return True


def locate_in_point(path: str | Path, point: ScenarioPoint, field: str) -> int | None:
    """The line where ``field`` (dotted) is written for ``point``: in its matrix value when an
    axis sets it, else in the file's body; None when the file does not write it (a default)."""
    try:
        root = compose_text(read_source(str(path)), str(path)).root
    except ScenarioError:
        return None
    tree = _Located(root)
    parts = tuple(int(p) if p.isdigit() else p for p in field.split(".") if p)
    for axis, index in point.axis_index.items():
        axis_parts = tuple(_split(axis))
        if parts[: len(axis_parts)] != axis_parts:
            continue
        start, _, ok = tree.walk(("matrix", axis, index))
        if ok != 3:
            return None  # the value came from an override, not from the file
        rest = parts[len(axis_parts):]
        node, key_node, matched = tree.walk(rest, start=start)
        return tree.line_of(node, key_node, prefer_key=False) if matched == len(rest) else None
    node, key_node, matched = tree.walk(parts)
    return tree.line_of(node, key_node, prefer_key=False) if matched == len(parts) else None


MAX_ERRORS = 50
"""Errors listed per file; a file with more is mostly one mistake repeated."""
_MAX_RAW_ERRORS = 10_000


def _set_copied(data: dict, path: str, value: Any) -> None:
    """Set ``path`` in ``data`` like :func:`_set_path`, copying (not mutating) every mapping on
    the way, so that ``data`` may share everything else with the file's other points."""
    parts = _split(path)
    cur = data
    for part in parts[:-1]:
        nxt = cur.get(part)
        if nxt is None:
            nxt = {}
        if not isinstance(nxt, dict):
            return
        nxt = cur[part] = dict(nxt)
        cur = nxt
    cur[parts[-1]] = value


_ID_CHARS = re.compile(r"[A-Za-z0-9_.+]+")


def _id_issues(matrix: Mapping[str, list[Any]] | None) -> list[tuple[Loc, str]]:
    """Explicit ``_id`` values must be usable in a pytest id and ``-k``, and distinct per axis."""
    issues: list[tuple[Loc, str]] = []
    for axis, values in (matrix or {}).items():
        seen: dict[str, int] = {}
        for i, value in enumerate(values):
            if not isinstance(value, dict) or "_id" not in value:
                continue
            given = value["_id"]
            where = ("matrix", axis, i, "_id")
            if not isinstance(given, str) or not _ID_CHARS.fullmatch(given) or len(given) > MAX_NAME_CHARS:
                issues.append((where, f"_id must be 1 to {MAX_NAME_CHARS} letters, digits, '_', '.' "
                                      f"or '+' (got {given!r})"))
            elif given in seen:
                issues.append((where, f"_id {given!r} is used twice on axis {axis!r} "
                                      f"(first at {axis}[{seen[given]}])"))
            else:
                seen[given] = i
    return issues


def _size_issue(matrix: Mapping[str, list[Any]] | None, values: int) -> str | None:
    """Refuse a matrix too large to expand before expanding it."""
    if not matrix:
        return None
    lengths = [len(v) for v in matrix.values()]
    points = math.prod(lengths)
    shape = " x ".join(map(str, lengths))
    if points > MAX_MATRIX_POINTS:
        return f"the matrix has {points} points ({shape}), above the maximum of {MAX_MATRIX_POINTS}"
    if points * values > MAX_MATRIX_WORK:
        return (f"the matrix has {points} points ({shape}) of {values} values each: "
                f"{points * values} values to validate, above the maximum of {MAX_MATRIX_WORK}")
    return None


def _is_extension(key: Any) -> bool:
    return isinstance(key, str) and key.startswith("x-")


def _validated_value(scenario: Scenario, axis: str, raw: Any) -> Any:
    """The validated value at ``axis`` if it is a scalar (normalised), else the raw value
    (which keeps an ``_id``)."""
    cur: Any = scenario
    for part in _split(axis):
        cur = getattr(cur, part, None)
    if cur is None or isinstance(cur, (str, int, float, bool)):
        return cur
    return raw


def _dedupe(errors: list[ScenarioError]) -> list[ScenarioError]:
    seen: set[tuple] = set()
    out = []
    for e in errors:
        key = (e.line, e.field, e.message)
        if key not in seen:
            seen.add(key)
            out.append(e)
    return out


def _unique_ids(ids: list[str]) -> list[str]:
    """Ids made unique by ``_1``, ``_2``, ... suffixes that collide with no other id."""
    counts: dict[str, int] = {}
    for i in ids:
        counts[i] = counts.get(i, 0) + 1
    taken = set(ids)
    last: dict[str, int] = {}
    out = []
    for i in ids:
        if counts[i] == 1:
            out.append(i)
            continue
        n = last.get(i, 0) + 1
        while f"{i}_{n}" in taken:
            n += 1
        last[i] = n
        taken.add(f"{i}_{n}")
        out.append(f"{i}_{n}")
    return out


def _keyword_issues(matrix: Mapping[str, list[Any]]) -> list[tuple[Loc, str]]:
    """``-k`` matches substrings: a value id inside another axis's value id (``decode`` inside
    ``FULL_DECODE_ONLY``) would make ``-k decode`` select both. Refused, at the shorter one
    (only names the user chose: strings and ``_id`` values)."""
    segments = {
        axis: [render_value(v, axis).lower() for v in values] for axis, values in matrix.items()
    }
    issues: list[tuple[Loc, str]] = []
    for axis, mine in segments.items():
        for i, seg in enumerate(mine):
            value = matrix[axis][i]
            if not (isinstance(value, str) or (isinstance(value, dict) and "_id" in value)):
                continue  # numbers and flags render with their field name: not the user's choice
            for other, theirs in segments.items():
                hit = next((t for t in theirs if other != axis and seg in t), None)
                if hit is not None:
                    shown = render_value(matrix[other][theirs.index(hit)], other)
                    issues.append(((axis, i), f"id {render_value(matrix[axis][i], axis)!r} is part "
                                              f"of id {shown!r} of axis {other!r}, so -k would "
                                              "select both: choose another name or _id"))
                    break
    return issues


def _located(tree: _Located, path: str, loc: Loc, msg: str, at_key: bool) -> ScenarioError:
    node, key_node, matched = tree.walk(loc)
    if at_key and matched < len(loc):
        at_key = False  # the key itself is not in the file: point at its parent
    if msg.startswith("unknown key"):
        msg += _suggest(loc)
    line = tree.line_of(node, key_node, prefer_key=at_key or matched < len(loc))
    return ScenarioError(msg, path=path, line=line, field=_fmt_loc(loc))


def _point_error(
    tree: _Located,
    loc: Loc,
    msg: str,
    at_key: bool,
    axes_names: list[str],
    idx: tuple[int, ...],
    indices: list[tuple[int, ...]],
    overrides: Mapping[str, Any],
) -> _Raw:
    """Locate an error of one matrix point: inside the matrix if ``loc`` runs through an axis,
    else in the base document."""
    if msg.startswith("unknown key"):
        msg += _suggest(loc)
    for pos, (a, i) in enumerate(zip(axes_names, idx)):
        parts = tuple(_split(a))
        if loc[: len(parts)] != parts:
            continue
        rest = loc[len(parts) :]
        start, _, ok = tree.walk(("matrix", a, i))
        if ok == 3:
            node, key_node, matched = tree.walk(rest, start=start)
        else:  # the axis value came from an override
            node, key_node, matched = start, None, 0
        if at_key and matched < len(rest):
            at_key = False
        line = tree.line_of(node, key_node, prefer_key=at_key or matched < len(rest))
        fld = f"matrix.{a}[{i}]"
        if rest:
            fld += ("" if isinstance(rest[0], int) else ".") + _fmt_loc(rest)
        same_value = frozenset(n for n, other in enumerate(indices) if other[pos] == i)
        return _Raw(line, fld, msg, (line, fld, msg), same_value)
    note = ""
    for k, v in overrides.items():
        parts = tuple(_split(k))
        if loc[: len(parts)] == parts:
            note = f" [override {k}={v!r}]"
    node, key_node, matched = tree.walk(loc)
    if at_key and matched < len(loc):
        at_key = False
    line = tree.line_of(node, key_node, prefer_key=at_key or matched < len(loc))
    fld = _fmt_loc(loc)
    return _Raw(line, fld, msg + note, (line, fld, msg + note), frozenset(range(len(indices))))
