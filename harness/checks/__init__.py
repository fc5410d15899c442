"""The four assertions of the harness, as pure functions of a :class:`RunRecord`.

:func:`run_checks` runs them in root-cause order: the FIA invariant, stale host parameters and
the stream budget first; equality last, so that a mismatch caused by an earlier failure of
another check is reported as explained by it, and a known-bad scenario fails exactly the
check that must catch its bug.
"""

from __future__ import annotations

from harness.checks.equality import check_equality
from harness.checks.fia_invariant import check_fia_invariant
from harness.checks.result import CHECKS, EXECUTION, CheckName, CheckResult
from harness.checks.stale_params import check_stale_params
from harness.checks.stream_budget import check_stream_budget
from harness.graph.record import ErrorCategory, RunRecord

#: Error categories a check accounts for; any other error on a path is an unexplained crash.
EXPLAINED_ERRORS = {
    ErrorCategory.FIA_CONTRACT: CheckName.FIA_INVARIANT,
    ErrorCategory.STREAM_BUDGET: CheckName.STREAM_BUDGET,
}


def run_checks(record: RunRecord, *, contract: str, dtype: str, bitwise_replay: bool,
               tolerance: tuple[float, float] | None = None) -> dict[str, CheckResult]:
    results = {
        CheckName.FIA_INVARIANT: check_fia_invariant(record, contract),
        CheckName.STALE_PARAMS: check_stale_params(record),
        CheckName.STREAM_BUDGET: check_stream_budget(record),
    }
    causes = [r.first_step for r in results.values() if not r.passed and r.first_step is not None]
    results[CheckName.EQUALITY] = check_equality(record, dtype=dtype, bitwise_replay=bitwise_replay,
                                         override=tolerance, explained_from=min(causes) if causes else None)
    crashes = [e for e in record.errors if e.category not in EXPLAINED_ERRORS]
    if crashes:
        first = crashes[0]
        where = f"step {first.step}" if first.step is not None else first.phase
        results[EXECUTION] = CheckResult(
            EXECUTION, False, f"{first.path} path raised {first.kind} at {where}: {first.message}",
            first.step, {"errors": [vars(e) for e in crashes]})
    elif (on_host := ran_on_host(record)) is not None:
        results[EXECUTION] = CheckResult(EXECUTION, False, on_host, None, {"device_work": dict(record.device_work)})
    return {name: results[name] for name in (*CHECKS, EXECUTION) if name in results}


def ran_on_host(record: RunRecord) -> str | None:
    """Why the run did no work on its device (the first GPU run's items "passed" on the CPU),
    else None. A backend that cannot count kernels reports -1: its memory speaks alone."""
    work = record.device_work
    if not work or not record.steps:
        return None
    if work.get("kernels") == 0 or work.get("bytes_allocated") == 0:
        return (f"nothing ran on the {record.backend} device ({work.get('kernels')} kernels, "
                f"{work.get('bytes_allocated')} bytes of device memory): the model, caches and inputs stayed "
                "in host memory, so no graph captured any work")
    return None


__all__ = ["CHECKS", "EXECUTION", "CheckName", "CheckResult", "ran_on_host", "run_checks"]
