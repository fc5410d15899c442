"""The verdict of one check on one run, with what a triager needs to act on it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.names import CheckName


#: The four assertions (``execution`` is the verdict on what none of them explains).
CHECKS: tuple[CheckName, ...] = (CheckName.FIA_INVARIANT, CheckName.EQUALITY, CheckName.STALE_PARAMS,
                                 CheckName.STREAM_BUDGET)
EXECUTION = CheckName.EXECUTION


@dataclass
class CheckResult:
    name: str
    passed: bool
    summary: str
    first_step: int | None = None  # the step of the first violation (for root-cause ordering)
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "passed": self.passed, "summary": self.summary,
                "first_step": self.first_step, "details": self.details}
