"""Names shared by every layer, as enums: strings only at the edges (YAML, JSON, reports).

A leaf module (imports nothing of the harness), so the scenario schema can use it without
importing the checks (which import torch).
"""

from __future__ import annotations

import enum

__all__ = ["CheckName"]


class CheckName(str, enum.Enum):
    """The checks, by the names scenarios (``expect: {fail: [...]}``), results and reports use.

    A ``str`` whose ``str()`` and format are its value, as 3.11's ``enum.StrEnum`` (the project
    supports Python 3.10)."""

    FIA_INVARIANT = "fia_invariant"
    EQUALITY = "equality"
    STALE_PARAMS = "stale_params"
    STREAM_BUDGET = "stream_budget"
    DISPATCH = "dispatch"  # the scenario's dispatch table (expect.dispatch) against the steps the run chose
    EXECUTION = "execution"  # a path raised something no check explains: a harness or pipeline crash

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)
