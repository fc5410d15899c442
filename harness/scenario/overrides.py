"""Values set at a dotted path of a scenario: ``--override graph.mode=FULL`` and the matrix's
axis values alike."""

from __future__ import annotations

import copy

import yaml

from harness.plain import PlainData

from .errors import ScenarioError
from .schema import check_matrix_path

__all__ = ["apply_overrides", "parse_override", "set_copied"]


def _split(path: str) -> list[str]:
    return path.split(".")


def _set_path(data: dict, path: str, value: object) -> bool:
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


def apply_overrides(scenario_dict: PlainData, overrides: PlainData) -> dict:
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


def parse_override(text: str) -> tuple[str, object]:
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


def set_copied(data: dict, path: str, value: object) -> None:
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
