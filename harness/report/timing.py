"""What graph mode buys, per bucket: a replay's wall time against eager's on the same padded batch.

Every step runs the graph path and the padded eager path on the same padded batch (the same
bucket, the same tokens), each timed to its logits on the host. Per bucket, over the steps whose
graph path replayed a graph, the two times side by side are the speed-up a replay buys on this
backend, and the padding share is what it costs. On a device, replay saves the launch of every
kernel; on the CPU emulator a replay re-runs the recorded operations on the host without the
model's Python, which is not a device's speed-up: the figures say what they measured, on what
(``backend``), and nothing more. Under async scheduling a step's time is not its own (the host
reads it one step late), so such steps are not timed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from harness.plain import PlainData

__all__ = ["BucketTiming", "replay_by_bucket", "step_timing"]

_REPLAYED = ("FULL", "PIECEWISE")  # a graph path step in another mode ran eagerly: no replay to time


def step_timing(steps: Iterable[PlainData]) -> dict[str, dict[str, float]]:
    """Per bucket of one run: steps replayed, the graph and padded-eager seconds they took (sums),
    and their real and padded tokens. Steps with either time missing are left out."""
    table: dict[int, dict[str, float]] = {}
    for step in steps:
        seconds = step.get("seconds")
        bucket = step.get("num_tokens_padded")
        if step.get("runtime_mode") not in _REPLAYED or not isinstance(seconds, Mapping) or not isinstance(bucket, int):
            continue
        graph, padded = seconds.get("graph"), seconds.get("padded")
        if not isinstance(graph, (int, float)) or not isinstance(padded, (int, float)):
            continue
        entry = table.setdefault(bucket, {"steps": 0, "graph_s": 0.0, "padded_s": 0.0, "tokens": 0, "real": 0})
        entry["steps"] += 1
        entry["graph_s"] += graph
        entry["padded_s"] += padded
        entry["tokens"] += bucket
        entry["real"] += int(step.get("num_tokens") or 0)
    return {str(bucket): {k: round(v, 6) if isinstance(v, float) else v for k, v in entry.items()}
            for bucket, entry in sorted(table.items())}


@dataclass(frozen=True)
class BucketTiming:
    """One bucket over a whole run: mean times per step, the speed-up, the padding share."""

    bucket: int
    steps: int
    graph_ms: float
    eager_ms: float
    padding_pct: float

    @property
    def speedup(self) -> float:
        return self.eager_ms / self.graph_ms if self.graph_ms else 0.0


def replay_by_bucket(records: Iterable[PlainData]) -> list[BucketTiming]:
    """Every item's per-bucket timing (``run.timing``) added up, one row per bucket."""
    total: dict[int, dict[str, float]] = {}
    for record in records:
        run = record.get("run") if isinstance(record, Mapping) else None
        timing = run.get("timing") if isinstance(run, Mapping) else None
        if not isinstance(timing, Mapping):
            continue
        for bucket, entry in timing.items():
            if not str(bucket).isdigit() or not isinstance(entry, Mapping):
                continue
            sums = total.setdefault(int(bucket), {"steps": 0, "graph_s": 0.0, "padded_s": 0.0, "tokens": 0, "real": 0})
            for key in sums:
                value = entry.get(key)
                if isinstance(value, (int, float)):
                    sums[key] += value
    rows = []
    for bucket, sums in sorted(total.items()):
        steps = int(sums["steps"])
        if not steps:
            continue
        padding = 100.0 * (sums["tokens"] - sums["real"]) / sums["tokens"] if sums["tokens"] else 0.0
        rows.append(BucketTiming(bucket, steps, 1000.0 * sums["graph_s"] / steps, 1000.0 * sums["padded_s"] / steps,
                                 padding))
    return rows
