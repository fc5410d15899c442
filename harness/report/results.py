"""The results file (schema 2): one JSON record per item, and the run they belong to.

An item's record is what the JSON results file holds, what ``graph-harness diff`` compares and
what the HTML renderer reads, so a report can always be written from it, even for an item
that crashed. It travels from an xdist worker to the controller as a custom attribute of the
pytest report (:func:`attach_record`; :func:`harness.report.record.report_record` is the one
accessor every consumer uses), never inside junit's ``user_properties``: junit gets only the
small per-item :func:`metrics` and, once per suite, where the run came from.

A record is kept small on purpose (a nightly run has thousands of items, most of them
passing). A failing or known-bad item keeps its full evidence: the steps keep what the report
shows (requests, dispatch, padding ledger, sampled tokens, the graph path's actual sequence
lengths; block tables, slot mappings and the per-layer host lists the graph executed are
dropped, since the checks have already read them and put what a failure needs into their own
details), the texts, and each check's evidence. A passing or skipped item keeps a summary
(:func:`summary_record`): verdict, metrics, each check's summary line and counts, the scenario
as run and the run's totals, which is what ``graph-harness diff`` compares and what the
report's grid and charts read; ``--report-evidence=all`` keeps everything for every item.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path, PurePath
from typing import TYPE_CHECKING

from harness.graph.record import RunRecord, StepRecord, fia_calls_by_phase
from harness.plain import JsonObject
from harness.report.charts import step_padding
from harness.report.timing import step_timing
from harness.report.view import check_states

if TYPE_CHECKING:
    from harness.checks.result import CheckResult
    from harness.session import ItemResult

SCHEMA_VERSION = 2
RECORD_KEY = "graph_harness_record"
"""The pytest report attribute that carries an item's record (pytest serialises a report's
custom attributes for pytest-xdist, so it arrives at the controller as plain data). Read it
with :func:`harness.report.record.report_record`, the one accessor."""
REPORT_ATTR = RECORD_KEY

#: Host lists kept per step: the two the FIA invariant is about (per request, so short).
STEP_HOST_LISTS = ("actual_seq_lengths", "actual_seq_lengths_kv")
#: At most this many entries of a check's evidence list (violations, stale lists, mismatches)
#: are kept; the summary already says how many there were in all.
EVIDENCE_LIMIT = 20
#: The outcomes whose records keep their full evidence: the items a triager opens.
FULL_EVIDENCE_OUTCOMES = frozenset({"failed", "xfailed"})
#: ``--report-evidence``: full evidence for failing and known-bad items only, or for all.
EVIDENCE_CHOICES = ("failures", "all")


def attach_record(report: object, record: JsonObject) -> None:
    """Put an item's record on its pytest report (read back with ``report_record``)."""
    setattr(report, RECORD_KEY, record)


def iso_time(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="milliseconds")


def _step(step: StepRecord) -> JsonObject:
    entry = asdict(step)
    entry.pop("logits")  # tensors stay in memory; the checks already summarised them
    entry.pop("reference_metadata", None)
    entry.pop("executed", None)
    metadata = entry.pop("metadata", None) or {}
    entry["host_lists"] = {name: metadata[name] for name in STEP_HOST_LISTS if name in metadata}
    return entry


def run_evidence(record: RunRecord | None) -> JsonObject:
    if record is None:
        return {}
    steps = [_step(step) for step in record.steps]
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
        "padding": step_padding(steps),  # the page chart's data, kept for every item
        "timing": step_timing(steps),  # replay against eager per bucket: the page's table, kept too
        "texts": record.texts,
        "fia_calls": len(record.fia_calls),
        "fia_calls_by_phase": fia_calls_by_phase(record.fia_calls),  # the graph path's, by phase
        "speculation": record.speculation,
        "notes": record.notes,
    }


def _trim(details: JsonObject) -> JsonObject:
    """A check's details with each long evidence list cut to its first entries."""
    trimmed: JsonObject = {}
    for key, value in details.items():
        if isinstance(value, list) and len(value) > EVIDENCE_LIMIT and value and isinstance(value[0], dict):
            trimmed[key] = value[:EVIDENCE_LIMIT]
            trimmed[f"{key}_total"] = len(value)
        else:
            trimmed[key] = value
    return trimmed


def _check(check: CheckResult) -> JsonObject:
    data = check.to_dict()
    data["details"] = _trim(data.get("details") or {})
    return data


def _scalars(details: JsonObject) -> JsonObject:
    """A check's details without its evidence: the counts and names, no lists or tables (a
    non-empty evidence list leaves its length, ``<name>_total``)."""
    kept = {key: value for key, value in details.items() if value is None or isinstance(value, (bool, int, float, str))}
    for key, value in details.items():
        if isinstance(value, list) and value and isinstance(value[0], dict):
            kept.setdefault(f"{key}_total", len(value))
    return kept


def summary_record(record: JsonObject) -> JsonObject:
    """A passing or skipped item's record without the evidence nobody reads when nothing failed.

    Kept: the item's identity, verdict, metrics and scenario (what ``graph-harness diff`` and
    ``narrow`` read), each check's verdict, summary line and counts (so the report can still
    say PASS or *not evaluated*), the run's totals and its per-bucket padding (the page's
    charts). Dropped: per-step dispatch, texts, evidence lists, per-bucket stream usage and
    per-graph memory. Figures: benchmarks/README.md, "HTML report".
    """
    summary = dict(record, evidence="summary")
    summary["checks"] = {name: {**check, "details": _scalars(check.get("details") or {})}
                         for name, check in (record.get("checks") or {}).items()}
    run = dict(record.get("run") or {})
    if run and "padding" not in run:  # a record written before run.padding existed
        run["padding"] = step_padding(run.get("steps") or [])
    for bulky in ("steps", "texts"):
        run.pop(bulky, None)
    if isinstance(run.get("stream_usage"), dict):
        run["stream_usage"] = {k: v for k, v in run["stream_usage"].items() if k != "by_bucket"}
    if isinstance(run.get("memory"), dict):
        run["memory"] = {pool: {k: v for k, v in usage.items() if k != "graphs"} if isinstance(usage, dict) else usage
                         for pool, usage in run["memory"].items()}
    summary["run"] = run
    return summary


def relative_source(source: str, root: Path | None) -> str:
    """``path:line`` with the path relative to the run's root when it lies below it."""
    path, sep, line = source.rpartition(":")
    if not sep or not line.isdigit():
        path, line = source, ""
    if root is not None:
        try:
            path = Path(path).resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            pass
    return f"{path}:{line}" if line else path


def item_record(result: ItemResult, environment: JsonObject | None = None, *, nodeid: str = "",
                started: float | None = None, root: Path | None = None,
                evidence: str = "failures") -> JsonObject:
    """The JSON record of a :class:`harness.session.ItemResult` (plain data, JSON-safe).

    The run's environment lives once in the results file's ``run``; ``environment`` is for a
    record that stands alone (a test, a single rendered item). ``evidence`` is
    ``--report-evidence``: ``"failures"`` keeps the full evidence of failing and known-bad
    items only (the others get :func:`summary_record`), ``"all"`` of every item."""
    run = run_evidence(result.record)
    record: JsonObject = {
        "key": "",
        "nodeid": nodeid,
        "name": result.name,
        "id": result.id,
        "source": relative_source(result.source, root),
        "backend": result.backend,
        "mode": run.get("mode") or (result.scenario.get("graph") or {}).get("mode"),
        "started": iso_time(started) if started is not None else None,
        "duration": round(result.duration, 4),
        "outcome": result.outcome,
        "verdict": result.verdict,
        "failed_checks": result.failed_checks,
        "metrics": {},
        "checks": {name: _check(check) for name, check in result.checks.items()},
        "scenario": result.scenario,
        "run": run,
        "traceback": result.traceback,
        "evidence": "full",
    }
    if environment is not None:
        record["environment"] = environment
    for state in check_states(record):  # the word the HTML badge and the terminal use
        record["checks"][state.name]["state"] = state.state
    record["key"] = item_key(record)
    record["metrics"] = item_metrics(record)
    if evidence != "all" and record["outcome"] not in FULL_EVIDENCE_OUTCOMES:
        record = summary_record(record)
    # Through JSON once: tuples become lists and odd values strings, so every consumer (execnet,
    # the JSON file, the HTML renderer) sees the same plain data.
    return json.loads(json.dumps(record, default=str))


def item_key(record: JsonObject) -> str:
    """The id an item keeps across runs, with or without ``--mode``: the node id with the
    graph mode always among its bracketed parts (``--mode`` adds it to items of a file that
    names no mode; a run without ``--mode`` runs them in their own mode and does not)."""
    if record.get("key"):
        return record["key"]
    nodeid = record.get("nodeid") or _v1_nodeid(record)
    mode = record.get("mode") or (record.get("run") or {}).get("mode")
    if not mode:
        return nodeid
    head, bracket, rest = nodeid.partition("[")
    parts = rest[:-1] if rest.endswith("]") else rest
    if bracket and mode in re.split(r"[^A-Za-z0-9_]+", parts):
        return nodeid
    return f"{head}[{parts}-{mode}]" if bracket and parts else f"{head}[{mode}]"


def _v1_nodeid(record: JsonObject) -> str:
    """Schema 1 records had no node id: rebuild it from the source file, name and id.

    Their source was an absolute path; node ids start at the root, whose scenario library is
    the ``scenarios/`` folder, so the path is cut back to it (two checkouts then agree)."""
    path = str(record.get("source") or "").rpartition(":")[0] or str(record.get("source") or "")
    parts = PurePath(path).parts
    if PurePath(path).is_absolute() and "scenarios" in parts:
        path = "/".join(parts[parts.index("scenarios"):])
    name = record.get("name") or ""
    return f"{path}::{name}[{record['id']}]" if record.get("id") else f"{path}::{name}"


def item_metrics(record: JsonObject) -> JsonObject:
    """The numbers a nightly run tracks per item (and ``graph-harness diff`` compares)."""
    run = record.get("run") or {}
    usage = run.get("stream_usage") or {}
    steps = run.get("steps") or []
    padded = sum(s.get("num_tokens_padded") or 0 for s in steps)
    real = sum(s.get("num_tokens") or 0 for s in steps)
    return {
        "steps": len(steps),
        "graphs_captured": run.get("graphs_captured"),
        "streams_in_use": usage.get("in_use"),
        "stream_pool": usage.get("pool_size"),
        "padding_ratio": round((padded - real) / padded, 4) if padded else 0.0,
        "capture_seconds": run.get("capture_seconds"),
        "fia_calls": run.get("fia_calls"),
    }


def metrics(record: JsonObject) -> list[tuple[str, object]]:
    """Flat per-item metrics for junitxml's ``<properties>`` (one short line each)."""
    numbers = record.get("metrics") or item_metrics(record)
    return [
        ("outcome", record["outcome"]),
        ("failed_checks", ",".join(record["failed_checks"])),
        ("backend", record["backend"]),
        ("mode", record.get("mode")),
        *((name, numbers.get(name)) for name in ("steps", "graphs_captured", "streams_in_use", "stream_pool",
                                                  "padding_ratio", "capture_seconds")),
        ("duration", record["duration"]),
    ]


def write_results(path: Path, records: list[JsonObject], run: JsonObject) -> None:
    """Write the results file atomically (a crash mid-write never leaves half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    summary: dict[str, int] = {}
    for record in records:
        summary[record["outcome"]] = summary.get(record["outcome"], 0) + 1
    payload = {"schema": SCHEMA_VERSION, "run": run, "environment": run.get("environment", {}),
               "summary": summary, "items": sorted(records, key=lambda r: r.get("key") or "")}
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(results_text(payload))
    tmp.replace(path)


def results_text(payload: JsonObject) -> str:
    """The results file as text: the run's fields one per line, then one line per item.

    Compact JSON (no indentation: it was two fifths of the bytes) that stays readable with
    ``grep`` and line-wise diffs: every item record is one line.
    """
    def dump(value: object) -> str:
        return json.dumps(value, separators=(",", ":"), default=str)

    head = [f"{dump(key)}: {dump(value)}" for key, value in payload.items() if key != "items"]
    items = ",\n".join(dump(record) for record in payload.get("items", []))
    return "{\n" + ",\n".join(head) + ',\n"items": [\n' + items + "\n]}\n"
