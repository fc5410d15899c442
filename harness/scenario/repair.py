"""What the rest of a point gives when some of its values are refused: the point validated
again without them (their defaults apply), so that a caller can report, in the same pass, the
problems that only a whole scenario shows (the preflight's)."""

from __future__ import annotations

import copy

from pydantic import ValidationError

from harness.plain import Loc, RawKey

from .fields import _fmt_loc
from .messages import _issues
from .schema import Scenario

__all__ = ["MAX_REPAIRED", "MAX_REPAIR_ISSUES", "repair_point"]


_REPAIR_ROUNDS = 3
#: Points repaired per file, and errors per point worth repairing: beyond them the file's
#: errors are mostly one mistake repeated, and the bound keeps a 1 MB file's load linear.
MAX_REPAIRED = 64
MAX_REPAIR_ISSUES = 20


def repair_point(data: dict, issues: list[tuple[Loc, str, bool]]) -> tuple[Scenario, frozenset[str]] | None:
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


def _drop(data: object, loc: Loc) -> bool:
    """Remove the value at ``loc`` (the deepest mapping key on the way that exists)."""
    parents: list[tuple[dict, object]] = []
    cur = data
    for part in loc:
        key = part.value if isinstance(part, RawKey) else part
        if isinstance(cur, dict) and key in cur:
            parents.append((cur, key))
            cur = cur[key]
        elif isinstance(cur, list) and isinstance(part, int) and 0 <= part < len(cur):
            cur = cur[part]
        else:
            break
    if not parents:
        return False
    holder, key = parents[-1]
    del holder[key]
    return True
