"""Compare two results files: what a nightly run broke, fixed or moved since the last one.

``graph-harness diff BASELINE.json CURRENT.json`` reads two results files (schema 1 or 2),
reduces every item to what a triager compares (outcome, failed checks, a few metrics), lets
deepdiff find every difference between the two reductions, and sorts each difference by its
path into: new failures, fixed items, changed failed checks, items added and removed, and
metrics that moved beyond a threshold. Only new failures make the exit status non-zero, so a
CI job can gate on them while metric moves stay informational. Wall-clock metrics (capture
time) are reported only past a threshold that two runs of one commit on a loaded machine did
not reach; the moves below it are counted, not listed, so that a diff of two runs of the same
code says "no changes".

Pure: reads JSON, imports neither pytest nor torch.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from deepdiff import DeepDiff

from harness.plain import JsonObject
from harness.report.results import item_key, item_metrics

#: Outcomes that count as broken. ``xfailed`` is a known-bad scenario failing as designed.
FAILING = frozenset({"failed", "error"})

#: Metrics compared by default: (relative threshold, absolute floor). A metric "moved" when
#: it changed by more than both; the relative change is taken against the smaller of the two
#: values, so that halving and doubling count alike. Counts are exact (any change is news).
THRESHOLDS: dict[str, tuple[float, float]] = {
    "graphs_captured": (0.0, 0.0),
    "streams_in_use": (0.0, 0.0),
    "padding_ratio": (0.10, 0.01),
    # Wall clock: two runs of one commit on the 2-core machine (make scenarios; the second beside
    # two CPU burners, load average up to 24) moved small items' capture times up to 31x (by
    # 0.65 s at most), a 2 s item 7.1x (by 1.7 s) and a 40-layer item 5.3x (4.1 s against
    # 21.6 s): tests/triage/data/same_commit_*.json, benchmarks/README.md "Diff noise".
    # Reported only past both: more than tenfold and by more than 5 s.
    "capture_seconds": (9.0, 5.0),
}
#: Metrics that measure time, not work: noise on a shared machine, counted when suppressed.
WALL_CLOCK = frozenset({"capture_seconds"})


class ResultsFileError(ValueError):
    """A results file that cannot be read or is not a graph-harness results file."""


@dataclass
class ItemChange:
    key: str
    before: str | None  # outcome in the baseline (None: not there)
    after: str | None  # outcome now
    checks_before: list[str] = field(default_factory=list)
    checks_after: list[str] = field(default_factory=list)
    verdict: str = ""  # the current verdict (the baseline's for a removed item)


@dataclass
class MetricMove:
    key: str
    metric: str
    before: float
    after: float

    @property
    def change(self) -> float | None:
        """Relative change, None when the baseline was zero."""
        return (self.after - self.before) / abs(self.before) if self.before else None


@dataclass
class RunDiff:
    baseline: JsonObject  # path, commit, items: where each side came from
    current: JsonObject
    new_failures: list[ItemChange] = field(default_factory=list)
    fixed: list[ItemChange] = field(default_factory=list)
    changed_checks: list[ItemChange] = field(default_factory=list)
    added: list[ItemChange] = field(default_factory=list)
    removed: list[ItemChange] = field(default_factory=list)
    metrics: list[MetricMove] = field(default_factory=list)
    #: wall-clock moves within the threshold, not listed: how much timing noise there was
    noise: int = 0
    noise_limit: tuple[float, float] = THRESHOLDS["capture_seconds"]

    @property
    def exit_status(self) -> int:
        return 1 if self.new_failures else 0

    @property
    def unchanged(self) -> bool:
        return not (self.new_failures or self.fixed or self.changed_checks or self.added or self.removed
                    or self.metrics)

    def to_dict(self) -> JsonObject:
        data = asdict(self)
        for move, entry in zip(self.metrics, data["metrics"]):
            entry["change"] = move.change
        data["exit_status"] = self.exit_status
        data["unchanged"] = self.unchanged
        return data


# -- reading -------------------------------------------------------------------------------------
def load_results(path: str | Path) -> JsonObject:
    """A results file as a dict, or a :class:`ResultsFileError` that names the file."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as error:
        raise ResultsFileError(f"{path}: cannot read: {error.strerror or error}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ResultsFileError(f"{path}: not JSON: {error}") from None
    if not isinstance(data, dict) or not isinstance(data.get("items"), list):
        raise ResultsFileError(f"{path}: not a graph-harness results file (no 'items' list)")
    if data.get("schema") not in (1, 2):
        raise ResultsFileError(f"{path}: results schema {data.get('schema')!r} is not one this version reads (1, 2)")
    return data


def reduce_items(data: JsonObject) -> dict[str, JsonObject]:
    """key -> what a diff compares, for every item of a results file."""
    reduced: dict[str, JsonObject] = {}
    for record in data["items"]:
        if not isinstance(record, dict):
            continue
        given = record.get("metrics")
        metrics = given if isinstance(given, dict) else item_metrics(record)
        reduced[item_key(record)] = {
            "outcome": record.get("outcome"),
            "failed_checks": sorted(record.get("failed_checks") or []),
            "verdict": record.get("verdict") or "",
            "metrics": {name: metrics.get(name) for name in THRESHOLDS if isinstance(metrics.get(name), (int, float))},
        }
    return reduced


def _origin(path: str | Path, data: JsonObject) -> JsonObject:
    given = data.get("run")
    run = given if isinstance(given, dict) else {}
    return {"path": str(path), "commit": run.get("commit"), "started": run.get("started"), "items": len(data["items"])}


# -- comparing -----------------------------------------------------------------------------------
def diff_results(baseline: JsonObject, current: JsonObject, *,
                 thresholds: dict[str, tuple[float, float]] | None = None,
                 baseline_path: str | Path = "baseline", current_path: str | Path = "current") -> RunDiff:
    limits = {**THRESHOLDS, **(thresholds or {})}
    before, after = reduce_items(baseline), reduce_items(current)
    result = RunDiff(_origin(baseline_path, baseline), _origin(current_path, current),
                     noise_limit=limits["capture_seconds"])
    # The verdict text is explanation, not state: it is reported, never compared.
    # threshold_to_diff_deeper=0: DeepDiff >= 8 otherwise reports two dicts sharing under a third
    # of their keys (a baseline whose ids changed) as one root change, with no item in it.
    comparable: JsonObject = {"exclude_regex_paths": [r"root\[.+?\]\['verdict'\]"], "threshold_to_diff_deeper": 0}
    tree = DeepDiff(before, after, view="tree", **comparable)
    outcome_changed: set[str] = set()
    checks_changed: set[str] = set()
    for kind, changes in tree.items():
        for change in changes:
            path = change.path(output_format="list")
            key = path[0]
            if len(path) == 1:  # a whole item appeared or disappeared
                (result.added if kind == "dictionary_item_added" else result.removed).append(_change(key, before, after))
            elif path[1] == "outcome":
                outcome_changed.add(key)
            elif path[1] == "failed_checks":
                checks_changed.add(key)
            elif path[1] == "metrics" and len(path) == 3:
                move = _metric_move(key, path[2], before, after, limits)
                if move:
                    result.metrics.append(move)
                elif path[2] in WALL_CLOCK:
                    result.noise += 1
    for key in sorted(outcome_changed | checks_changed):
        change = _change(key, before, after)
        was_failing, is_failing = change.before in FAILING, change.after in FAILING
        if is_failing and not was_failing:
            result.new_failures.append(change)
        elif was_failing and not is_failing:
            result.fixed.append(change)
        elif key in checks_changed:
            result.changed_checks.append(change)
    # An item that is new tonight and failing is a new failure too: a gate must not let it in.
    result.new_failures.extend(c for c in result.added if c.after in FAILING)
    for bucket in (result.new_failures, result.added, result.removed):
        bucket.sort(key=lambda c: c.key)
    result.metrics.sort(key=lambda m: (m.key, m.metric))
    return result


def _change(key: str, before: JsonObject, after: JsonObject) -> ItemChange:
    old, new = before.get(key) or {}, after.get(key) or {}
    return ItemChange(key, old.get("outcome"), new.get("outcome"), old.get("failed_checks", []),
                      new.get("failed_checks", []), (new or old).get("verdict", ""))


def _metric_move(key: str, metric: str, before: JsonObject, after: JsonObject,
                 limits: dict[str, tuple[float, float]]) -> MetricMove | None:
    old = before[key]["metrics"].get(metric)
    new = after[key]["metrics"].get(metric)
    if old is None or new is None or metric not in limits:
        return None  # a metric only one side has is not a move
    relative, floor = limits[metric]
    delta = abs(new - old)
    if delta > floor and delta > relative * min(abs(old), abs(new)):
        return MetricMove(key, metric, old, new)
    return None


def parse_threshold(text: str) -> tuple[str, tuple[float, float]]:
    """``METRIC=REL`` or ``METRIC=REL:FLOOR`` (e.g. ``capture_seconds=0.3:0.02``)."""
    name, sep, value = text.partition("=")
    if not sep or name not in THRESHOLDS:
        raise ValueError(f"threshold {text!r}: expected METRIC=REL[:FLOOR] with METRIC one of {', '.join(THRESHOLDS)}")
    rel, _, floor = value.partition(":")
    try:
        return name, (float(rel), float(floor) if floor else THRESHOLDS[name][1])
    except ValueError:
        raise ValueError(f"threshold {text!r}: REL and FLOOR must be numbers") from None


# -- rendering -----------------------------------------------------------------------------------
def _checks(names: list[str]) -> str:
    return ", ".join(names) if names else "(no check failed)"


def _outcomes(change: ItemChange) -> str:
    return f"{change.before or 'absent'} -> {change.after or 'absent'}"


def _number(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _move(move: MetricMove) -> str:
    pct = f" ({move.change:+.0%})" if move.change is not None else ""
    return f"{_number(move.before)} -> {_number(move.after)}{pct}"


def _header(diff: RunDiff) -> str:
    def side(origin: JsonObject) -> str:
        commit = f", commit {str(origin['commit'])[:12]}" if origin.get("commit") else ""
        return f"{origin['path']} ({origin['items']} items{commit})"

    return f"{side(diff.baseline)} -> {side(diff.current)}"


def _counts(diff: RunDiff) -> str:
    return (f"{len(diff.new_failures)} new failure(s), {len(diff.fixed)} fixed, "
            f"{len(diff.changed_checks)} with changed failed checks, {len(diff.added)} added, "
            f"{len(diff.removed)} removed, {len(diff.metrics)} metric move(s)")


def _noise(diff: RunDiff) -> str:
    if not diff.noise:
        return ""
    relative, floor = diff.noise_limit
    return (f"{diff.noise} capture-time move(s) within timing noise not listed (reported past "
            f"{relative + 1:g}x and {floor:g} s; --threshold capture_seconds=0:0 lists every one)")


def render_text(diff: RunDiff) -> str:
    lines = [f"graph-harness diff: {_header(diff)}", "no changes" if diff.unchanged else _counts(diff)]
    if _noise(diff):
        lines.append(_noise(diff))
    sections: list[tuple[str, list[str]]] = [  # (title, a line per change or move)
        ("NEW FAILURES", [f"{c.key}: {_checks(c.checks_after)} ({_outcomes(c)}): {c.verdict}"
                          for c in diff.new_failures]),
        ("FIXED", [f"{c.key}: was {_checks(c.checks_before)} ({_outcomes(c)})" for c in diff.fixed]),
        ("CHANGED FAILED CHECKS", [f"{c.key}: {_checks(c.checks_before)} -> {_checks(c.checks_after)} ({_outcomes(c)})"
                                   for c in diff.changed_checks]),
        ("ADDED", [f"{c.key}: {c.after}" for c in diff.added]),
        ("REMOVED", [f"{c.key}: was {c.before}" for c in diff.removed]),
        ("METRICS MOVED", [f"{m.key}: {m.metric} {_move(m)}" for m in diff.metrics]),
    ]
    for title, entries in sections:
        if entries:
            lines.append("")
            lines.append(f"{title} ({len(entries)})")
            lines.extend(f"  {entry}" for entry in entries)
    return "\n".join(lines) + "\n"


def _md(text: object) -> str:
    """A table cell: pipes escaped, newlines flattened, code spans for ids."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_markdown(diff: RunDiff) -> str:
    status = "**new failures**" if diff.new_failures else "no new failures"
    lines = ["## graph-harness diff", "", f"{_md(_header(diff))}", "",
             "no changes" if diff.unchanged else f"{status}: {_counts(diff)}"]
    if _noise(diff):
        lines.extend(["", _md(_noise(diff))])

    def table(title: str, head: list[str], rows: list[list[str]]) -> None:
        if not rows:
            return
        lines.extend(["", f"### {title} ({len(rows)})", "", "| " + " | ".join(head) + " |",
                      "|" + "---|" * len(head)])
        lines.extend("| " + " | ".join(_md(cell) for cell in row) + " |" for row in rows)

    table("New failures", ["item", "failed checks", "outcome", "verdict"],
          [[f"`{c.key}`", _checks(c.checks_after), _outcomes(c), c.verdict] for c in diff.new_failures])
    table("Fixed", ["item", "failed checks before", "outcome"],
          [[f"`{c.key}`", _checks(c.checks_before), _outcomes(c)] for c in diff.fixed])
    table("Changed failed checks", ["item", "before", "after", "outcome"],
          [[f"`{c.key}`", _checks(c.checks_before), _checks(c.checks_after), _outcomes(c)] for c in diff.changed_checks])
    table("Added", ["item", "outcome"], [[f"`{c.key}`", str(c.after)] for c in diff.added])
    table("Removed", ["item", "outcome before"], [[f"`{c.key}`", str(c.before)] for c in diff.removed])
    table("Metrics moved", ["item", "metric", "change"], [[f"`{m.key}`", m.metric, _move(m)] for m in diff.metrics])
    return "\n".join(lines) + "\n"


def render_json(diff: RunDiff) -> str:
    return json.dumps(diff.to_dict(), indent=1) + "\n"


RENDERERS = {"text": render_text, "markdown": render_markdown, "json": render_json}


def diff_files(baseline: str | Path, current: str | Path, *,
               thresholds: dict[str, tuple[float, float]] | None = None) -> RunDiff:
    return diff_results(load_results(baseline), load_results(current), thresholds=thresholds,
                        baseline_path=baseline, current_path=current)
