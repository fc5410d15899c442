"""Check b: eager and replay agree, on real tokens only.

Three ways per step: the eager unpadded reference, eager with the graph path's padding, and
the graph path. Greedy tokens must match exactly; logits within tolerance. Graph against padded
eager isolates graph effects (on the emulator the same kernels run on the same shapes, so this
is bitwise by default); padded against reference isolates padding effects. The first mismatch
is reported with its step, request, position and errors, and a deepdiff of the host metadata
the paths ran with. Mismatches from a step at or after the first failure of another check are
explained by that failure and reported, not failed twice.

Where a comparison is not bitwise (padded against reference; graph against padded on a device),
the tolerance scales with the row: a logit's rounding error follows the size of the hidden state
and weights that made it, not its own size, so a near-zero logit would otherwise need a relative
agreement no rounding-level difference meets. And two paths whose logits agree within that
tolerance but whose greedy tokens differ sat on a tie, within rounding: from that step on they
feed different tokens, so that pair is not compared any more (as vLLM's ``check_logprobs_close``
stops at the first accepted divergence). Ranks that split the model (TP, CP) against the
unsplit reference in bfloat16 meet such ties.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from deepdiff import DeepDiff

from harness.checks.result import CheckName, CheckResult, not_evaluated
from harness.graph.record import RunRecord, StepRecord
from harness.plain import JsonObject

#: Per-dtype tolerances for comparisons that are not bitwise (logits are float32, but a bf16
#: model's rows carry bf16 rounding from every layer).
DTYPE_TOLERANCE = {"float32": (1e-5, 1.3e-6), "bfloat16": (2e-2, 1.6e-2)}
#: Mismatches kept as evidence; ``mismatches_total`` says how many there were when more.
MAX_MISMATCHES = 20


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float

    @property
    def bitwise(self) -> bool:
        return self.atol == 0 and self.rtol == 0


def default_tolerances(dtype: str, bitwise_replay: bool,
                       override: tuple[float, float] | None) -> tuple[Tolerance, Tolerance]:
    """(graph vs padded, padded vs reference) tolerances."""
    if override is not None:
        given = Tolerance(*override)
        return given, given
    per_dtype = Tolerance(*DTYPE_TOLERANCE[dtype])
    return (Tolerance(0.0, 0.0) if bitwise_replay else per_dtype), per_dtype


def _compare(a: torch.Tensor, b: torch.Tensor, tol: Tolerance) -> bool:
    """``a`` and ``b`` agree: bitwise, or every element within ``atol + rtol * max |row of b|``."""
    if a.shape != b.shape:
        return False
    if tol.bitwise:
        return torch.equal(a, b)
    if a.numel() == 0:
        return True
    a, b = a.double(), b.double()
    scale = b.abs().amax(dim=-1, keepdim=True)
    return bool(((a - b).abs() <= tol.atol + tol.rtol * scale).all())  # NaN compares False: a mismatch


def _first_row_mismatch(step: StepRecord, a: torch.Tensor, b: torch.Tensor, tol: Tolerance) -> JsonObject:
    diff = (a.double() - b.double()).abs()
    bad_rows = [i for i in range(a.shape[0]) if not _compare(a[i], b[i], tol)]
    row = bad_rows[0] if bad_rows else 0
    start = 0
    request, position = None, row
    for req_id, _, new in step.requests:
        if row < start + new:
            request, position = req_id, row - start
            break
        start += new
    rel = diff[row] / b[row].double().abs().clamp_min(1e-12)
    return {"row": row, "request": request, "position": position,
            "max_abs_error": float(diff[row].max()), "max_rel_error": float(rel.max()),
            "rows_differing": len(bad_rows)}


def _tokens(step: StepRecord, path: str) -> list[list[int]] | list[int] | None:
    """What ``path`` took from the step's logits: the verified tokens per request where recorded
    (under spec decode a step's rows give the bonus token too), else the sampled token."""
    return step.generated.get(path) or step.sampled.get(path)


def _divergence_step(record: RunRecord, path: str) -> int | None:
    for step in record.steps:
        if _tokens(step, path) != _tokens(step, "reference"):
            return step.step
    return record.steps[-1].step if record.steps else None


def _agrees(spec: list[int], plain: list[int], *, cut_short: bool) -> bool:
    """Speculative and plain greedy text of one request agree: equal, or, where the step limit
    cut either run short, the shorter is the start of the longer."""
    if not cut_short:
        return spec == plain
    n = min(len(spec), len(plain))
    return spec[:n] == plain[:n]


def check_equality(record: RunRecord, *, dtype: str, bitwise_replay: bool,
                   override: tuple[float, float] | None = None,
                   explained_from: int | None = None) -> CheckResult:
    graph_tol, padding_tol = default_tolerances(dtype, bitwise_replay, override)
    mismatches: list[JsonObject] = []
    ties: list[JsonObject] = []  # pairs that parted at a tie within rounding: compared no further
    compared = 0
    graph_compared = 0  # comparisons that involve the graph path: what makes the check evaluated
    for step in record.steps:
        logits = step.logits
        pairs = (("graph", "padded", graph_tol, "graph effect"), ("padded", "reference", padding_tol, "padding effect"))
        for left, right, tol, effect in pairs:
            if left not in logits or right not in logits or any(t["paths"] == f"{left} vs {right}" for t in ties):
                continue
            if not tol.bitwise and step.proposed.get(left) != step.proposed.get(right):
                # Their drafters parted at a tie (a TP rank's draft model against the unsplit one):
                # the verify rows after the first read different inputs, and the paths' steps
                # differ from here on. Lossless, so their texts still answer to plain greedy.
                ties.append({"step": step.step, "paths": f"{left} vs {right}", "drafts": True,
                             "tokens": {left: step.proposed.get(left), right: step.proposed.get(right)}})
                continue
            compared += 1
            graph_compared += left == "graph"
            tokens_equal = _tokens(step, left) == _tokens(step, right)
            close = _compare(logits[left], logits[right], tol)
            if close and tokens_equal:
                continue
            if close and not tol.bitwise:  # different tokens from logits within rounding: a tie
                ties.append({"step": step.step, "paths": f"{left} vs {right}",
                             "tokens": {left: _tokens(step, left), right: _tokens(step, right)}})
                continue
            found = {"step": step.step, "paths": f"{left} vs {right}", "effect": effect,
                     "tolerance": {"atol": tol.atol, "rtol": tol.rtol},
                     "tokens": {left: step.sampled.get(left), right: step.sampled.get(right)},
                     "runtime_mode": step.runtime_mode, "bucket": step.num_tokens_padded}
            if logits[left].shape == logits[right].shape:
                found.update(_first_row_mismatch(step, logits[left], logits[right], tol))
            found["metadata_diff"] = DeepDiff(step.reference_metadata, step.metadata,
                                              verbose_level=2).to_dict() if step.reference_metadata else {}
            if step.executed is not None:
                found["executed_host_lists"] = step.executed
            mismatches.append(found)
    plain = record.texts.get("plain")
    if plain is not None:  # speculative decoding: greedy spec output must equal greedy plain output
        compared += 1
        graph_compared += bool(any(record.texts.get("graph", {}).values())) and not record.error_of("graph")
        for path in ("reference", "graph"):
            text = record.texts.get(path, {})
            cut = set(record.unfinished.get(path, ())) | set(record.unfinished.get("plain", ()))
            differing = [req for req in plain if not _agrees(text.get(req) or [], plain[req], cut_short=req in cut)]
            if differing and path == "graph" and ties and _divergence_step(record, path) >= min(t["step"] for t in ties):
                differing = []  # the graph path left the reference's tokens at a rounding tie, not by speculating
            if differing and not record.error_of(path):
                req = differing[0]
                mismatches.append({"step": _divergence_step(record, path), "paths": f"{path} (speculative) vs plain greedy",
                                   "effect": "speculative decoding changed the output", "request": req,
                                   "tokens": {path: text.get(req), "plain": plain[req]},
                                   "runtime_mode": "-", "bucket": "-"})
    details = {"compared": compared, "graph_compared": graph_compared, "mismatches": mismatches[:MAX_MISMATCHES],
               "ties": ties, "tolerance": {"graph_vs_padded": vars(graph_tol), "padded_vs_reference": vars(padding_tol)}}
    if len(mismatches) > MAX_MISMATCHES:  # the count the summary gives, kept with the shortened list
        details["mismatches_total"] = len(mismatches)
    unexplained = [m for m in mismatches
                   if explained_from is None or m["step"] is None or m["step"] < explained_from]
    if not unexplained:
        if mismatches:
            summary = (f"{len(mismatches)} mismatch(es) from step {mismatches[0]['step']} on, explained by "
                       f"an earlier failure of another check (step {explained_from})")
            return CheckResult(CheckName.EQUALITY, True, summary, details=details)
        if graph_compared == 0:  # padded vs reference alone says nothing about replay
            why = "the graph path produced no step to compare"
            if compared:
                why += f" ({compared} padded vs reference comparison(s) equal)"
            return not_evaluated(CheckName.EQUALITY, why, details)
        summary = (f"{compared} comparisons equal ({graph_compared} graph vs padded"
                   f"{', bitwise' if graph_tol.bitwise else ''})")
        for tie in ties:
            what = "proposed different drafts" if tie.get("drafts") else "parted at a tie within rounding"
            summary += f"; {tie['paths']} {what} at step {tie['step']}, compared up to there"
        return CheckResult(CheckName.EQUALITY, True, summary, details=details)
    first = unexplained[0]
    where = (f"request {first.get('request')} position {first.get('position')}, max abs error "
             f"{first.get('max_abs_error', float('nan')):.3g}, max rel error {first.get('max_rel_error', float('nan')):.3g}")
    summary = (f"{first['paths']} differ at step {first['step']} ({first['effect']}, {first['runtime_mode']}, "
               f"bucket {first['bucket']}): {where}; tokens {first['tokens']}")
    return CheckResult(CheckName.EQUALITY, False, summary, first["step"], details)
