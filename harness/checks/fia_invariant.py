"""Check a: the FIA host-side contract held on every attention call.

Every call (eager, between PIECEWISE pieces, inside a capture, in a task-group update) was
recorded by the op's host tiling with its tags. A call the scenario's contract rejects fails
the check; the report gives CANN's message, the step, bucket, layer and padding source, and
whether the other contract would have accepted the call, which is the question the relaxed
contract proposal (reference section 4) asks of every such failure.
"""

from __future__ import annotations

from harness.checks.result import CheckName, CheckResult, not_evaluated
from harness.graph.record import RunRecord
from harness.ops.observe import FiaCall


def _rejected(call: FiaCall, contract: str) -> bool:
    if call.error is not None:
        return True
    return not (call.relaxed_ok if contract == "relaxed" else call.strict_ok)


def check_fia_invariant(record: RunRecord, contract: str) -> CheckResult:
    calls = record.fia_calls
    violations = []
    for call in calls:
        if not _rejected(call, contract):
            continue
        tags = call.tags
        violations.append({
            "path": tags.get("path"), "phase": tags.get("phase"), "step": tags.get("step"),
            "layer": tags.get("layer"), "bucket": tags.get("bucket"), "padding": tags.get("padding"),
            "runtime_mode": tags.get("runtime_mode"), "T": call.T,
            "actual_seq_lengths": list(call.actual_seq_lengths),
            "actual_seq_lengths_kv": list(call.actual_seq_lengths_kv),
            "message": call.error or "rejected by the contract",
            "strict_ok": call.strict_ok, "relaxed_ok": call.relaxed_ok,
        })
    # The graph path first within a step: that is the pipeline under test.
    violations.sort(key=lambda v: (v["step"] if v["step"] is not None else -1, v["path"] != "graph"))
    strict_only = sum(1 for c in calls if not c.strict_ok and c.relaxed_ok)
    details = {"calls": len(calls), "contract": contract, "violations": violations,
               "strict_violations_relaxed_accepts": strict_only}
    if not calls:
        return not_evaluated(CheckName.FIA_INVARIANT, "no FIA call was made", details)
    if not violations:
        note = ""
        if contract == "relaxed" and strict_only:
            note = f"; {strict_only} call(s) would fail CANN's strict check today"
        return CheckResult(CheckName.FIA_INVARIANT, True, f"{len(calls)} FIA calls, all accepted ({contract}){note}",
                           details=details)
    first = violations[0]
    other = "relaxed" if contract == "strict" else "strict"
    other_ok = first["relaxed_ok"] if other == "relaxed" else first["strict_ok"]
    summary = (
        f"FIA rejected {len(violations)} call(s); first: {first['message']} at step {first['step']}, "
        f"bucket {first['bucket']}, layer {first['layer']} ({first['path']} path, {first['phase']}); "
        f"padding: {first['padding']}; the {other} contract would {'have accepted' if other_ok else 'also reject'} it"
    )
    steps = [step for v in violations if isinstance(step := v["step"], int)]
    return CheckResult(CheckName.FIA_INVARIANT, False, summary, min(steps) if steps else None, details)
