"""One JSON-ready record per item: verdicts, metrics, the run's evidence, versions.

The record is what crosses process boundaries (pytest-xdist workers send it in the report's
``user_properties``), what the JSON results file holds, and what the HTML renderer reads, so a
report can always be written from it, even for an item that crashed.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from harness.graph.record import RunRecord

RECORD_KEY = "graph_harness_record"
SCHEMA_VERSION = 1


def run_evidence(record: RunRecord | None) -> dict[str, Any]:
    if record is None:
        return {}
    steps = []
    for step in record.steps:
        entry = asdict(step)
        entry.pop("logits")  # tensors stay in memory; the checks already summarised them
        steps.append(entry)
    return {
        "mode": record.mode,
        "capture_sizes": record.capture_sizes,
        "graphs_captured": record.graphs_captured,
        "capture_seconds": round(record.capture_seconds, 4),
        "stream_usage": record.stream_usage,
        "memory": record.memory,
        "budget": record.budget,
        "errors": [asdict(e) for e in record.errors],
        "steps": steps,
        "texts": record.texts,
        "fia_calls": len(record.fia_calls),
        "notes": record.notes,
    }


def item_record(result: Any, environment: dict[str, str]) -> dict[str, Any]:
    """The JSON record of a :class:`harness.session.ItemResult`."""
    return {
        "schema": SCHEMA_VERSION,
        "name": result.name,
        "id": result.id,
        "source": result.source,
        "backend": result.backend,
        "outcome": result.outcome,
        "verdict": result.verdict,
        "duration": round(result.duration, 4),
        "checks": {name: check.to_dict() for name, check in result.checks.items()},
        "failed_checks": result.failed_checks,
        "scenario": result.scenario,
        "run": run_evidence(result.record),
        "traceback": result.traceback,
        "environment": environment,
    }


def metrics(record: dict[str, Any]) -> list[tuple[str, Any]]:
    """Flat per-item metrics for junitxml's ``<properties>`` (one line each)."""
    run = record.get("run") or {}
    usage = run.get("stream_usage") or {}
    return [
        ("outcome", record["outcome"]),
        ("verdict", record["verdict"]),
        ("failed_checks", ",".join(record["failed_checks"])),
        ("backend", record["backend"]),
        ("mode", run.get("mode")),
        ("steps", len(run.get("steps") or [])),
        ("graphs_captured", run.get("graphs_captured")),
        ("streams_in_use", usage.get("in_use")),
        ("stream_pool", usage.get("pool_size")),
        ("capture_seconds", run.get("capture_seconds")),
        ("duration", record["duration"]),
    ]


def write_results(path: Path, records: list[dict[str, Any]], environment: dict[str, str],
                  summary: dict[str, int]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"schema": SCHEMA_VERSION, "environment": environment, "summary": summary, "items": records}
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1, default=str))
    tmp.replace(path)
