"""The building blocks of the scenario schema: a strict base model, bounded ints, and the
located error of a cross-field rule.

Every model forbids unknown keys and validates strictly (YAML already gives native types:
``"2"`` is not accepted for an int, ``true`` is not accepted for an int).

Cross-field rules raise :class:`ConsistencyError`, a ``ValueError`` that carries a list of
``(relative_loc, message)`` issues; the loader expands each issue into its own error pointing at
the offending field. Used from plain Python, the same error reads as one message.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.fields import FieldInfo

from . import bounds as L
from harness.graph.modes import CUDAGraphMode
from harness.names import CheckName as _CheckName
from harness.plain import Loc, RawKey

__all__ = ["CHECK_NAMES", "GRAPH_MODES", "CheckName", "ConsistencyError", "GraphMode", "Loc", "NonNeg", "NonNegFloat",
           "NonNegInt", "Pos", "PosInt", "Text"]

GRAPH_MODES = tuple(m.name for m in CUDAGraphMode)
CHECK_NAMES = tuple(c.value for c in _CheckName)

GraphMode = Literal[GRAPH_MODES]  # type: ignore[valid-type]
CheckName = Literal[CHECK_NAMES]  # type: ignore[valid-type]  # one enum: harness.checks.result.CheckName

PosInt = Annotated[int, Field(ge=1)]
NonNegInt = Annotated[int, Field(ge=0)]
NonNegFloat = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]


def Pos(maximum: int) -> FieldInfo:
    """The bounds ``1..maximum`` of an int (docs/scenarios.md, "Limits"), as annotation
    metadata: ``Annotated[int, Pos(n)]`` (a call is not a type a type checker can read)."""
    return Field(ge=1, le=maximum)


def NonNeg(maximum: int) -> FieldInfo:
    """The bounds ``0..maximum`` of an int: ``Annotated[int, NonNeg(n)]``."""
    return Field(ge=0, le=maximum)


Text = Annotated[str, Field(max_length=L.MAX_STRING_CHARS)]
_NAME = r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$"



class ConsistencyError(ValueError):
    """A cross-field validation failure carrying one or more located issues.

    ``issues`` is a list of ``(loc, message)``; ``loc`` is relative to the model whose validator
    raised (pydantic reports the error at that model's location; the loader appends ``loc``).
    """

    def __init__(self, issues: list[tuple[Loc, str]]):
        self.issues = list(issues)
        super().__init__(
            "; ".join(f"{_fmt_loc(loc)}: {msg}" if loc else msg for loc, msg in self.issues)
        )


def _fmt_loc(loc: Loc) -> str:
    out = ""
    for part in loc:
        if isinstance(part, RawKey):
            continue  # a key that is no text has no field name: its message names it
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


class _Base(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
