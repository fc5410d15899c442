"""The verdict of one check on one run, with what a triager needs to act on it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

CHECKS = ("fia_invariant", "equality", "stale_params", "stream_budget")
EXECUTION = "execution"  # a path raised something no check explains: a harness or pipeline crash


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
