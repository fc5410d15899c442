"""Where a value is written in a scenario file: a data location walked back through the
composed YAML tree to a line."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import yaml

from .errors import ScenarioError
from .overrides import _split
from .points import ScenarioPoint
from .yaml_source import compose_text, read_source

__all__ = ["locate", "locate_in_point"]


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
