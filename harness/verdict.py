"""An item's outcome: its checks' verdicts held against what its scenario expects.

A scenario that expects ``pass`` passes when every check does; a known-bad scenario
(``expect.failing_checks``) passes as xfailed only when exactly those checks fail, and a
known-bad that passes, or fails differently, is a failure. Outcomes use pytest's words."""

from __future__ import annotations

from collections.abc import Iterable
from harness.checks import CHECKS, EXECUTION, CheckName, CheckResult
from harness.graph.record import RunRecord
from harness.scenario import Expect

__all__ = ["FAILED", "PASSED", "SKIPPED", "XFAILED", "decide", "judge"]

PASSED, FAILED, XFAILED, SKIPPED = "passed", "failed", "xfailed", "skipped"


def judge(expect: Expect, checks: dict[str, CheckResult], record: RunRecord) -> tuple[str, str]:
    """An item's outcome and its one-line verdict: :func:`decide`, and a run that compared
    nothing never passes."""
    outcome, verdict = decide(expect, checks)
    if outcome == PASSED and not record.steps:
        return FAILED, "nothing was compared: no step ran, so no check saw any evidence"
    return outcome, verdict


def decide(expect: Expect, checks: dict[str, CheckResult]) -> tuple[str, str]:
    """The outcome of ``checks`` under ``expect`` (a scenario's ``expect`` section)."""
    failed = {name for name, r in checks.items() if not r.passed}
    if expect.outcome == "pass":
        if not failed:
            table = " and the dispatch table matched" if CheckName.DISPATCH in checks else ""
            idle = [name for name in _ordered(checks) if not checks[name].evaluated]
            if not idle:
                return PASSED, "all four checks passed" + table
            ran = [name for name in _ordered(checks) if checks[name].evaluated and name in CHECKS]
            return PASSED, (f"{', '.join(ran) or 'no check'} passed; not evaluated: {', '.join(idle)}" + table)
        return FAILED, "; ".join(f"{name}: {checks[name].summary}" for name in _ordered(failed))
    wanted = set(expect.failing_checks)
    if failed == wanted:
        return XFAILED, f"known-bad scenario failed exactly as expected ({', '.join(_ordered(failed))})"
    if not failed:
        return FAILED, (f"known-bad scenario passed unexpectedly: expected {', '.join(_ordered(wanted))} to fail"
                        + (f" ({expect.reason})" if expect.reason else ""))
    missing, extra = wanted - failed, failed - wanted
    parts = []
    if missing:
        parts.append(f"expected {', '.join(_ordered(missing))} to fail but it passed")
    if extra:
        parts.append("unexpected failure of " + "; ".join(f"{n}: {checks[n].summary}" for n in _ordered(extra)))
    return FAILED, "known-bad scenario failed differently: " + "; ".join(parts)


def _ordered(names: Iterable[str]) -> list[str]:
    order = (*CHECKS, CheckName.DISPATCH, EXECUTION)
    return sorted(names, key=order.index)
