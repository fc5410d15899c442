"""The ids of matrix points: each axis value rendered compactly, joined by ``-``, unique in
the file, and usable with ``-k`` (see docs/scenarios.md)."""

from __future__ import annotations

import re
from typing import Mapping, Sequence

from harness.plain import PlainData

from .bounds import MAX_NAME_CHARS
from .fields import Loc
from .matrix import AxisValue
from .overrides import _split
from .schema import Scenario

__all__ = ["render_id", "render_value"]


def render_value(value: AxisValue, axis: str = "") -> str:
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


def render_id(axes: PlainData) -> str:
    """The id of a matrix point: each axis value rendered, in axis order, joined by ``-``."""
    return "-".join(render_value(v, k) for k, v in axes.items())


def _strip_ids(value: AxisValue) -> AxisValue:
    if isinstance(value, dict) and "_id" in value:
        return {k: v for k, v in value.items() if k != "_id"}
    return value


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


def _validated_value(scenario: Scenario, axis: str, raw: AxisValue) -> AxisValue:
    """The validated value at ``axis`` if it is a scalar (normalised), else the raw value
    (which keeps an ``_id``)."""
    cur: object = scenario
    for part in _split(axis):
        cur = getattr(cur, part, None)
    if cur is None or isinstance(cur, (str, int, float, bool)):
        return cur
    return raw


_ID_CHARS = re.compile(r"[A-Za-z0-9_.+]+")


def _id_issues(matrix: Mapping[str, Sequence[AxisValue]] | None) -> list[tuple[Loc, str]]:
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


def _keyword_issues(matrix: Mapping[str, Sequence[AxisValue]]) -> list[tuple[Loc, str]]:
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
