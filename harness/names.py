"""Names shared by every layer, as enums: strings only at the edges (YAML, JSON, reports).

A leaf module (imports nothing of the harness), so the scenario schema can use it without
importing the checks (which import torch).
"""

from __future__ import annotations

import enum

__all__ = ["CheckName"]


class CheckName(enum.StrEnum):
    """The checks, by the names scenarios (``expect: {fail: [...]}``), results and reports use."""

    FIA_INVARIANT = "fia_invariant"
    EQUALITY = "equality"
    STALE_PARAMS = "stale_params"
    STREAM_BUDGET = "stream_budget"
    DISPATCH = "dispatch"  # the scenario's dispatch table (expect.dispatch) against the steps the run chose
    EXECUTION = "execution"  # a path raised something no check explains: a harness or pipeline crash
