"""The verdict of one check on one run, with what a triager needs to act on it.

A check that saw no evidence at all passes *not evaluated* (``evaluated=False``, a summary
that starts with "not evaluated:"), never a plain PASS.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.names import CheckName as CheckName  # re-exported: the checks name themselves through here
from harness.plain import JsonObject


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
    details: JsonObject = field(default_factory=dict)
    #: False when the check looked at nothing (no FIA call, no graph step compared, no FULL
    #: replay, no capture): its pass would be vacuous, so every report says "not evaluated".
    #: Decided here, by the check that knows what it compared, so that the HTML, the JSON and
    #: the terminal cannot disagree.
    evaluated: bool = True

    def to_dict(self) -> JsonObject:
        return {"name": self.name, "passed": self.passed, "evaluated": self.evaluated, "summary": self.summary,
                "first_step": self.first_step, "details": self.details}


def not_evaluated(name: str, why: str, details: JsonObject | None = None) -> CheckResult:
    """A pass that looked at nothing: ``why`` says what was missing."""
    return CheckResult(name, True, f"not evaluated: {why}", None, details or {}, evaluated=False)
