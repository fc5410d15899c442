"""Check d: the captured graphs fit the device's stream pool.

Reads the engine's accounting (graphs captured, streams held, pool size) and fails when a
capture hit the runtime's 207008 error, naming the capture that hit it. Utilisation is
reported on every item, passing or not, so a configuration creeping towards the limit shows.
"""

from __future__ import annotations

from harness.checks.result import CheckName, CheckResult, not_evaluated
from harness.graph.record import ErrorCategory, RunRecord


def check_stream_budget(record: RunRecord) -> CheckResult:
    usage = record.stream_usage
    details = {"usage": usage, "graphs_captured": record.graphs_captured, "policy": record.budget}
    exhausted = [e for e in record.errors if e.category is ErrorCategory.STREAM_BUDGET]
    if exhausted:
        error = exhausted[0]
        return CheckResult(CheckName.STREAM_BUDGET, False, f"capture failed: {error.message}", None, details)
    if not record.graphs_captured:
        return not_evaluated(CheckName.STREAM_BUDGET, "no graph was captured", details)
    in_use, pool = usage.get("in_use"), usage.get("pool_size")
    if not pool:  # CUDA graphs: streams are not drawn from a fixed pool, so there is no budget to keep
        return not_evaluated(CheckName.STREAM_BUDGET, f"{record.graphs_captured} graphs captured on an engine with "
                             "no graph stream pool: no budget to exceed", details)
    if in_use is None:
        summary = f"{record.graphs_captured} graphs captured; the runtime reports no stream count"
    else:
        summary = f"{record.graphs_captured} graphs, {in_use} of {pool} streams ({100 * in_use / pool:.1f}%)"
    trimmed = record.budget.get("sizes_dropped") if record.budget else None
    if trimmed:
        summary += f"; policy dropped {len(trimmed)} capture size(s)"
    return CheckResult(CheckName.STREAM_BUDGET, True, summary, None, details)
