"""The scenario's dispatch table against the steps the run chose (``expect.dispatch``).

Some rules of the pipeline leave no trace the four checks can see: a mixed batch that replays a
FULL graph in FULL_DECODE_ONLY computes the right numbers, a dummy request with KV length 1
instead of 0 reads only the null block, a ledger without its DP column still sums. A scenario
pins those decisions directly, the way vLLM's ``tests/v1/cudagraph/test_cudagraph_dispatch.py``
pins its dispatcher's: per chosen step (and rank), the runtime mode, the bucket, the batch
descriptor, the padding and, where it matters, the exact host lists.

Pure: the rows are plain dicts (``harness.scenario.DispatchRow.pinned`` plus ``step``, ``rank``,
``for_mode``, ``index``, ``line``), the evidence is the graph path's step records.
"""

from __future__ import annotations

from typing import Sequence

from harness.checks.result import CheckName, CheckResult
from harness.graph.record import RunRecord, StepRecord
from harness.plain import JsonObject, PlainData

__all__ = ["check_dispatch_table", "observed", "summarize_mismatches"]

#: Fields every row may pin, in the order a mismatch lists them.
FIELDS = ("mode", "bucket", "num_tokens", "padded_tokens", "uniform", "num_reqs", "num_reqs_padded",
          "dummy_requests", "descriptor", "ledger", "metadata")


def observed(step: StepRecord) -> JsonObject:
    """What the pipeline chose at one step, under the names a dispatch row uses."""
    return {
        "mode": step.runtime_mode,
        "bucket": step.num_tokens_padded,
        "num_tokens": step.num_tokens,
        "padded_tokens": step.num_tokens_padded - step.num_tokens,
        "uniform": step.uniform_decode,
        "num_reqs": step.num_reqs,
        "num_reqs_padded": step.num_reqs_padded,
        "dummy_requests": step.num_reqs_padded - step.num_reqs,
        "descriptor": step.descriptor,
        "ledger": dict(step.ledger),
        "metadata": step.metadata,
    }


def _where(row: PlainData) -> str:
    where = f"expect.dispatch[{row['index']}]"
    if row.get("line"):
        where += f" (line {row['line']})"
    return where


def _mismatch(row: PlainData, **fields: object) -> JsonObject:
    """One mismatch of ``row``: its index, step and (when known) file line, and ``fields``."""
    where = {"row": row["index"], "step": row["step"]}
    if row.get("line"):
        where["line"] = row["line"]
    return {**where, **fields}


def _differences(row: PlainData, got: PlainData) -> list[tuple[str, object, object]]:
    out = []
    for name in FIELDS:
        if name not in row:
            continue
        want = row[name]
        if name == "metadata":
            for key, value in want.items():
                have = (got["metadata"] or {}).get(key)
                if have != value:
                    out.append((f"metadata.{key}", value, have))
        elif want != got[name]:
            out.append((name, want, got[name]))
    return out


def summarize_mismatches(mismatches: Sequence[PlainData]) -> str:
    """The first mismatch in one line, and how many there are."""
    more = f" ({len(mismatches)} mismatches in all)" if len(mismatches) > 1 else ""
    return str(mismatches[0]["text"]) + more


def check_dispatch_table(record: RunRecord, rows: Sequence[PlainData], *, rank: int = 0,
                         mode: str | None = None) -> CheckResult:
    """Compare every row that applies to this rank and configured mode with the record.

    A row applies when its ``rank`` is None or this rank, and its ``for_mode`` None or ``mode``.
    A row whose step did not run on this rank is a mismatch (a table about steps that never
    happened proves nothing).
    """
    applicable = [r for r in rows if r.get("rank") in (None, rank) and r.get("for_mode") in (None, mode)]
    by_step = {s.step: s for s in record.steps}
    mismatches: list[JsonObject] = []
    for row in applicable:
        step = by_step.get(row["step"])
        if step is None:
            ran = sorted(by_step)
            span = f"steps {ran[0]}..{ran[-1]}" if ran else "no step"
            mismatches.append(_mismatch(row, field="step", expected="a step", got=f"not run (the run has {span})",
                                        text=f"{_where(row)}: step {row['step']} did not run on rank {rank} "
                                             f"(the run has {span})"))
            continue
        for name, want, got in _differences(row, observed(step)):
            mismatches.append(_mismatch(row, bucket=step.num_tokens_padded, field=name, expected=want, got=got,
                                        text=f"{_where(row)}: step {row['step']} rank {rank}: {name} expected "
                                             f"{want!r}, got {got!r}"))
    details: JsonObject = {"rows": len(applicable), "rank": rank, "table_mismatches": mismatches}
    if mismatches:
        return CheckResult(CheckName.DISPATCH, False, summarize_mismatches(mismatches), mismatches[0]["step"],
                           details)
    if not applicable:
        return CheckResult(CheckName.DISPATCH, True, f"no dispatch row applies to rank {rank}", None, details)
    return CheckResult(CheckName.DISPATCH, True, f"{len(applicable)} dispatch row(s) matched on rank {rank}",
                       None, details)
