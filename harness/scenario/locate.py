"""Where a value is written in a scenario file: a data location walked back through the
composed YAML tree to a line, for a field (:func:`locate`, :func:`locate_in_point`) and for the
loader's errors (:func:`file_error`, and :func:`point_error` for an error of one matrix point,
which may come from an axis value, the file's body or an override)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import yaml

from harness.plain import Loc, PlainData, RawKey

from .errors import ScenarioError
from .fields import _fmt_loc
from .messages import _suggest
from .overrides import _split
from .points import ScenarioPoint
from .yaml_source import compose_text, read_source

__all__ = ["PointError", "file_error", "locate", "locate_in_point", "point_error"]



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

    @staticmethod
    def _raw_key(node: yaml.MappingNode, value: object):
        """``node``'s entry whose key YAML reads as ``value`` (a bool, null or number: the text
        ``true``, ``~`` or ``0x3`` may stand for it), the last one as PyYAML keeps it."""
        constructor = yaml.constructor.SafeConstructor()
        hit = None
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode) and k.tag != "tag:yaml.org,2002:str":
                try:
                    key = constructor.construct_object(k)
                except Exception:  # noqa: BLE001 - a key it cannot read is not the one sought
                    continue
                if type(key) is type(value) and key == value:
                    hit = (k, v)
        return hit

    def walk(self, loc: Iterable[str | int | RawKey], start: yaml.Node | None = None):
        """Follow ``loc`` from ``start`` (default root). Returns ``(node, key_node, matched)``:
        the deepest node reached, the mapping key that led to it (or None) and how many parts
        of ``loc`` were consumed."""
        node = self.root if start is None else start
        key_node = None
        matched = 0
        for part in loc:
            if isinstance(node, yaml.MappingNode):
                hit = self._raw_key(node, part.value) if isinstance(part, RawKey) else self._lookup(node, str(part))
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


@dataclass
class PointError:
    """An error of one matrix point, located in the file; the loader reports each distinct one
    once, naming the points it is bound to."""

    line: int | None
    field: str
    message: str
    group: tuple  # what makes two errors "the same error"
    expected: frozenset  # point indices where this error would be expected if not combination-bound


def file_error(tree: _Located, path: str, loc: Loc, msg: str, at_key: bool) -> ScenarioError:
    """An error at ``loc`` of the file as written, at the line of its key (``at_key``) or value."""
    node, key_node, matched = tree.walk(loc)
    if at_key and matched < len(loc):
        at_key = False  # the key itself is not in the file: point at its parent
    if msg.startswith("unknown key"):
        msg += _suggest(loc)
    line = tree.line_of(node, key_node, prefer_key=at_key or matched < len(loc))
    return ScenarioError(msg, path=path, line=line, field=_fmt_loc(loc))


def point_error(
    tree: _Located,
    loc: Loc,
    msg: str,
    at_key: bool,
    axes_names: list[str],
    idx: tuple[int, ...],
    indices: list[tuple[int, ...]],
    overrides: PlainData,
) -> PointError:
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
        return PointError(line, fld, msg, (line, fld, msg), same_value)
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
    return PointError(line, fld, msg + note, (line, fld, msg + note), frozenset(range(len(indices))))
