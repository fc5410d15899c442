"""The HTML report: one fragment per item, and the page's summary, from Jinja2 templates.

Pure functions of the JSON-ready records built by :mod:`harness.report.results`: no pytest, no
torch. Templates live in ``templates/`` and are autoescaped, so every value that came from a
user or a run is escaped; Python prepares plain values (lists, strings) and the templates lay
them out. An item's fragment reads in triage order: the verdict, the first failure (check,
step, bucket, and the fix switch the scenario turned off), every check's state, a per-step
token chart (failing items only: see :func:`render_item`), the evidence of the first failing
check before any other and before explained mismatches, the texts side by side, the per-step
dispatch, and the scenario as run. Every section tolerates a partial record (a crashed item
has ``run == {}``; a skipped one no run).

Slightly over 500 lines: each section of an item's fragment is one small function here, next to
the others it is ordered with; the page, grid and fragment store are the rest.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import zlib
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path

import jinja2
import yaml

from harness.report import charts
from harness.report.timing import replay_by_bucket
from harness.report.view import (EXPLAINED, FAIL, FirstFailure, check_states, feature_label, first_failure,
                                 fixes_off, item_mode)

__all__ = ["render_item", "render_page", "render_fragments", "read_fragments", "row_values", "item_key",
           "fixes_sentence", "TABLE_COLUMNS", "MAX_ROWS", "COLLAPSED"]

#: Rows of a violation / mismatch / stale table shown before an "N more" note.
MAX_ROWS = 12
#: Equality mismatches whose host-metadata deepdiff is shown (the first ones tell the story).
MAX_METADATA = 3
#: Outcomes whose items get charts: the ones a triager opens (drawing costs per item).
CHART_OUTCOMES = ("failed", "xfailed")
#: The columns graph-harness adds to pytest-html's results table: (column type, heading).
TABLE_COLUMNS = (("mode", "Mode"), ("features", "Features"), ("check", "Failed check"),
                 ("step", "Step"), ("bucket", "Bucket"))

_OUTCOME_LABEL = {"passed": "passed", "failed": "failed", "xfailed": "xfailed (known-bad, failed as expected)",
                  "skipped": "skipped"}
_TEMPLATES = Path(__file__).with_name("templates")
_FRAGMENTS = re.compile(r'<script type="application/x-gh-fragments" id="gh-fragments"[^>]*>([^<]*)</script>')


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(_TEMPLATES), autoescape=True,
                             undefined=jinja2.ChainableUndefined)
    env.globals["zip"] = zip
    return env


@lru_cache(maxsize=4)
def _static(name: str) -> str:
    return (_TEMPLATES / name).read_text()


# ---------------------------------------------------------------------------------------------
# small helpers


def _dict(value: object) -> Mapping:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list:
    return list(value) if isinstance(value, (list, tuple)) else []


def _text(value: object) -> str:
    """A value as a cell's text: ``None`` as an em dash, floats short."""
    if value is None:
        return "\u2014"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _compact(value: object, limit: int = 200) -> str:
    try:
        text = json.dumps(value, separators=(",", ":"), default=str)
    except (TypeError, ValueError):
        text = str(value)
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _yes_no(value: object) -> str:
    return "yes" if value is True else "no" if value is False else _text(value)


def _ints(values: object) -> list[str]:
    return [_text(v) for v in values] if isinstance(values, (list, tuple)) else [_text(values)]


def _utilisation(usage: Mapping) -> float | None:
    util = usage.get("utilisation")
    in_use, pool = usage.get("in_use"), usage.get("pool_size")
    if isinstance(in_use, (int, float)) and isinstance(pool, (int, float)) and pool:
        return 100.0 * in_use / pool
    return 100.0 * util if isinstance(util, (int, float)) and in_use is not None else None


def _relative(source: str) -> str:
    """An absolute ``file:line`` under the working directory, as a relative one (shorter)."""
    if not os.path.isabs(source):
        return source
    relative = os.path.relpath(source)
    return source if relative.startswith("..") else relative


def item_key(nodeid: str) -> str:
    """A short, stable key that links a results-table row to its fragment on the page."""
    return hashlib.sha1(nodeid.encode()).hexdigest()[:12]


def fixes_sentence(record: Mapping) -> str:
    """"fixes.host_param_update is false in this file": the switches whose removal explains it."""
    off = fixes_off(record.get("scenario"))
    if not off:
        return ""
    if len(off) == 1:
        return f"{off[0]} is false in this file"
    return f"{', '.join(off[:-1])} and {off[-1]} are false in this file"


# ---------------------------------------------------------------------------------------------
# evidence sections (one plain dict each; the template lays it out)


def _fia(check: Mapping) -> dict | None:
    details = _dict(check.get("details"))
    violations = _list(details.get("violations"))
    if check.get("passed", True) or not violations:
        return None
    contract = details.get("contract")
    other = "strict" if contract == "relaxed" else "relaxed"
    rows = []
    for v in map(_dict, violations[:MAX_ROWS]):
        other_ok = v.get("strict_ok") if other == "strict" else v.get("relaxed_ok")
        rows.append({"path": _text(v.get("path")), "phase": _text(v.get("phase")), "step": _text(v.get("step")),
                     "layer": _text(v.get("layer")), "bucket": _text(v.get("bucket")), "T": _text(v.get("T")),
                     "q": _ints(v.get("actual_seq_lengths")), "kv": _ints(v.get("actual_seq_lengths_kv")),
                     "padding": _text(v.get("padding")), "message": _text(v.get("message")),
                     "other_ok": _yes_no(other_ok)})
    return {"kind": "fia_invariant", "total": _total(details, "violations"), "calls": _text(details.get("calls")),
            "contract": _text(contract), "other": other, "rows": rows}


def _total(details: Mapping, name: str) -> int:
    """How many entries an evidence list had: the results file keeps the first ones of a long
    list and its length as ``<name>_total``, the number the check's summary gives."""
    total = details.get(f"{name}_total")
    return total if isinstance(total, int) else len(_list(details.get(name)))


def _stale(check: Mapping) -> dict | None:
    details = _dict(check.get("details"))
    stale = _list(details.get("stale"))
    if not stale:
        return None
    rows = [{"step": _text(s.get("step")), "layer": _text(s.get("layer")), "argument": _text(s.get("argument")),
             "bucket": _text(s.get("bucket")), "executed": _ints(s.get("executed")),
             "expected": _ints(s.get("expected"))} for s in map(_dict, stale[:MAX_ROWS])]
    return {"kind": "stale_params", "total": _total(details, "stale"), "rows": rows}


def _format_diff(diff: Mapping) -> str:
    """A deepdiff ``to_dict()`` as readable lines: one per changed path."""
    lines = []
    for kind, changes in diff.items():
        lines.append(f"{kind}:")
        if isinstance(changes, Mapping):
            for path, change in changes.items():
                if isinstance(change, Mapping) and ("old_value" in change or "new_value" in change):
                    lines.append(f"  {path}: {_compact(change.get('old_value'))} -> {_compact(change.get('new_value'))}")
                else:
                    lines.append(f"  {path}: {_compact(change)}")
        elif isinstance(changes, (list, tuple, set)):
            lines.extend(f"  {_compact(c)}" for c in changes)
        else:
            lines.append(f"  {_compact(changes)}")
    return "\n".join(lines)


def _host_lists(executed: object) -> str:
    return "\n".join(f"layer {layer}: " + "  ".join(f"{k}={_compact(v)}" for k, v in _dict(lists).items())
                     for layer, lists in enumerate(_list(executed)))


def _equality(check: Mapping, state: str | None) -> dict | None:
    details = _dict(check.get("details"))
    mismatches = _list(details.get("mismatches"))
    if not mismatches:
        return None
    rows: list[dict[str, object]] = []
    metadata: list[dict[str, object]] = []
    for m in map(_dict, mismatches[:MAX_ROWS]):
        tol = _dict(m.get("tolerance"))
        where = f"{_text(m.get('request'))} @ {_text(m.get('position'))}"
        if m.get("rows_differing") is not None:
            where += f" ({m.get('rows_differing')} rows differ)"
        rows.append({"step": _text(m.get("step")), "paths": _text(m.get("paths")), "effect": _text(m.get("effect")),
                     "runtime_mode": _text(m.get("runtime_mode")), "bucket": _text(m.get("bucket")), "where": where,
                     "abs": _text(m.get("max_abs_error")), "rel": _text(m.get("max_rel_error")),
                     "tokens": [(str(p), _ints(t)) for p, t in _dict(m.get("tokens")).items()],
                     "tolerance": f"atol {_text(tol.get('atol'))}, rtol {_text(tol.get('rtol'))}"})
        diff = _dict(m.get("metadata_diff"))
        if (diff or m.get("executed_host_lists") is not None) and len(metadata) < MAX_METADATA:
            metadata.append({"step": _text(m.get("step")), "paths": _text(m.get("paths")),
                             "diff": _format_diff(diff) if diff else "",
                             "executed": _host_lists(m.get("executed_host_lists"))})
    failing = state == FAIL
    label = "failing" if failing else "explained by another check's earlier failure"
    return {"kind": "equality", "total": _total(details, "mismatches"), "rows": rows, "metadata": metadata,
            "failing": failing, "state": label}


def _budget(check: Mapping, run: Mapping, *, failing: bool, draw: bool, salt: str) -> dict | None:
    details = _dict(check.get("details"))
    usage = _dict(run.get("stream_usage")) or _dict(details.get("usage"))
    graphs = run.get("graphs_captured", details.get("graphs_captured"))
    if not usage and graphs is None and not run.get("budget"):
        return None
    pct = _utilisation(usage)
    policy = _dict(run.get("budget")) or _dict(details.get("policy"))
    rows = []
    if policy:
        rows = [["sizes kept", " ".join(_ints(policy.get("sizes_kept")))],
                ["sizes dropped", " ".join(_ints(policy.get("sizes_dropped")))]]
        rows += [[str(k), _compact(v) if isinstance(v, (dict, list)) else _text(v)]
                 for k, v in policy.items() if k not in ("sizes_kept", "sizes_dropped")]
    chart = ""
    # Against a pool of thousands a handful of streams is a sliver: draw when it tells something.
    if draw and (failing or (pct or 0) >= 10):
        chart = charts.safely(charts.streams_svg, _list(usage.get("by_bucket")), usage.get("pool_size"), salt=salt)
    seconds = run.get("capture_seconds")
    return {"kind": "stream_budget", "graphs": _text(graphs), "in_use": _text(usage.get("in_use")),
            "pool": _text(usage.get("pool_size")), "utilisation": "\u2014" if pct is None else f"{pct:.1f}%",
            "capture_sizes": _ints(run.get("capture_sizes")) if run.get("capture_sizes") is not None else [],
            "capture_seconds": f"{seconds:.3f} s" if isinstance(seconds, (int, float)) else "",
            "policy": rows, "chart": chart, "failing": failing}


def _execution(check: Mapping, run: Mapping) -> dict | None:
    errors = _list(run.get("errors")) or _list(_dict(check.get("details")).get("errors"))
    if not errors:
        return None
    rows = [[_text(e.get(k)) for k in ("path", "phase", "step", "bucket", "kind", "message")]
            for e in map(_dict, errors[:MAX_ROWS])]
    return {"kind": "execution", "total": len(errors), "rows": rows}


def _texts(check: Mapping, run: Mapping, *, open_: bool) -> dict | None:
    details = _dict(check.get("details"))
    texts = _dict(details.get("texts")) or _dict(run.get("texts"))
    reference, graph = _dict(texts.get("reference")), _dict(texts.get("graph"))
    if not reference and not graph:
        return None
    repetition = _dict(details.get("repetition"))

    def rep(path: str, req: str) -> str:
        entry = _dict(_dict(repetition.get(path)).get(req))
        if not entry:
            return "\u2014"
        score = entry.get("score")
        score_text = f"{score:.2f}" if isinstance(score, (int, float)) else _text(score)
        return f"{score_text} / {_text(entry.get('longest_run'))}"

    rows = []
    for req in list(reference) + [r for r in graph if r not in reference]:
        ref, out = _list(reference.get(req)), _list(graph.get(req))
        marked = [(_text(tok), i < len(ref) and ref[i] == tok) for i, tok in enumerate(out)]
        first = next((i for i, (_, same) in enumerate(marked) if not same), None)
        if first is None and len(out) != len(ref):
            first = min(len(out), len(ref))
        rows.append({"request": str(req), "reference": _ints(ref), "graph": marked,
                     "rep_ref": rep("reference", req), "rep_graph": rep("graph", req), "first": first})
    return {"rows": rows, "open": open_ or any(r["first"] is not None for r in rows)}


def _steps(run: Mapping, *, open_: bool) -> dict | None:
    steps = _list(run.get("steps"))
    if not steps:
        return None
    rows = []
    for s in map(_dict, steps):
        reqs = []
        for entry in _list(s.get("requests")):
            entry = _list(entry)
            reqs.append(f"{entry[0]}:{entry[1]}+{entry[2]}" if len(entry) == 3 else _compact(entry))
        sampled = _dict(s.get("sampled"))
        differs = len({json.dumps(v, default=str) for v in sampled.values()}) > 1
        rows.append({"step": _text(s.get("step")), "requests": " ".join(reqs), "num_tokens": _text(s.get("num_tokens")),
                     "uniform": _yes_no(s.get("uniform_decode")), "mode": _text(s.get("runtime_mode")),
                     "padded": _text(s.get("num_tokens_padded")),
                     "reqs": f"{_text(s.get('num_reqs'))} \u2192 {_text(s.get('num_reqs_padded'))}",
                     "padding_source": _text(s.get("padding_source")), "reason": _text(s.get("dispatch_reason")),
                     "ledger": ", ".join(f"{k}={_text(v)}" for k, v in _dict(s.get("ledger")).items()),
                     "sampled": [(str(p), _ints(t)) for p, t in sampled.items()], "differs": differs,
                     "classes": "gh-diff" if differs else ""})
    return {"rows": rows, "open": open_}


def _scenario_yaml(record: Mapping) -> str:
    scenario = record.get("scenario")
    if not scenario:
        return ""
    try:
        return yaml.safe_dump(scenario, sort_keys=False, default_flow_style=None, width=110)
    except yaml.YAMLError:
        return json.dumps(scenario, indent=1, default=str)


def _evidence(record: Mapping, states: list, first: FirstFailure | None, *, draw: bool, salt: str,
              summary: bool = False) -> list[dict]:
    """Evidence sections: the first failing check, the other failures, then explained ones."""
    checks = _dict(record.get("checks"))
    run = _dict(record.get("run"))
    state_of = {s.name: s.state for s in states}
    rank: dict[str | None, int] = {FAIL: 1, EXPLAINED: 2}
    names = sorted(checks, key=lambda n: (0 if first and n == first.check else rank.get(state_of.get(n), 3),
                                          list(checks).index(n)))
    sections = []
    for name in names:
        check = _dict(checks[name])
        state = state_of.get(name)
        if name == "fia_invariant":
            section = _fia(check)
        elif name == "stale_params":
            section = _stale(check)
        elif name == "equality":
            section = _equality(check, state)
        elif name == "stream_budget":
            # A passing item's check line already says graphs, streams and utilisation.
            section = None if summary else _budget(check, run, failing=state == FAIL, draw=draw, salt=salt)
        elif name == "execution":
            section = _execution(check, run)
        else:
            section = None
        if section:
            sections.append(section)
    errors_section = _execution({}, run) if "execution" not in checks and _list(run.get("errors")) else None
    if errors_section:
        sections.append(errors_section)  # errors a check explains, listed after its evidence
    return sections


# ---------------------------------------------------------------------------------------------
# public


def row_values(record: Mapping | None) -> dict[str, str]:
    """The extra results-table cells of an item (plain text; empty for a non-scenario test)."""
    if not record:
        return {column: "" for column, _ in TABLE_COLUMNS}
    first = first_failure(record)
    failed = [s.name for s in check_states(record) if s.state == FAIL]
    return {"mode": item_mode(record), "features": feature_label(record.get("scenario")),
            "check": (first.check + (f" +{len(failed) - 1}" if len(failed) > 1 else "")) if first else "",
            "step": "" if first is None or first.step is None else str(first.step),
            "bucket": "" if first is None or first.bucket is None else str(first.bucket)}


def render_item(record: Mapping, *, draw_charts: bool | None = None, salt: str = "") -> str:
    """One item record as an HTML fragment (the page's CSS styles it: see :func:`render_page`).

    Charts are drawn for failing and known-bad items by default: those are the ones a triager
    opens, and a chart costs tens of milliseconds, too much for every item of a large matrix.
    """
    record = _dict(record)
    outcome = str(record.get("outcome") or "unknown")
    draw = outcome in CHART_OUTCOMES if draw_charts is None else draw_charts
    run = _dict(record.get("run"))
    states = check_states(record)
    first = first_failure(record)
    failing = first is not None
    summary = record.get("evidence") == "summary"  # a passing item's record: no per-step evidence
    duration = record.get("duration")
    context = {
        "outcome": outcome, "outcome_label": _OUTCOME_LABEL.get(outcome, outcome),
        "verdict": _text(record.get("verdict")), "source": _relative(_text(record.get("source"))),
        "mode": item_mode(record), "features": feature_label(record.get("scenario")),
        "backend": _text(record.get("backend")),
        "duration": f"{duration:.2f} s" if isinstance(duration, (int, float)) else None,
        "summary": summary,
        "capture_sizes": " ".join(_ints(run.get("capture_sizes"))) if summary and run.get("capture_sizes") else "",
        "first": first, "fixes": fixes_sentence(record) if failing else "",
        "has_run": bool(run), "checks": states,
        "step_chart": charts.safely(charts.step_tokens_svg, _list(run.get("steps")),
                                   failed_step=first.step if first else None, salt=salt) if draw else "",
        "evidence": _evidence(record, states, first, draw=draw, salt=salt, summary=summary),
        "texts": _texts(_dict(_dict(record.get("checks")).get("stale_params")), run, open_=failing),
        "step_rows": _steps(run, open_=failing),
        "notes": [str(n) for n in _list(run.get("notes"))],
        "traceback": record.get("traceback") or "",
        "scenario_yaml": "" if summary else _scenario_yaml(record),
    }
    return _environment().get_template("item.html.j2").render(context)


def _grid(records: list[Mapping]) -> dict:
    """Feature combination x mode: per cell the items and their outcomes (worst one colours it).

    One row per combination and one column per mode: there are at most five modes, so the
    grid is never wider than a window, while a nightly run has dozens of combinations (72 for
    the cross product), which scroll inside the grid's own box (a column per combination made
    the nightly page 7,652 px wide)."""
    severity = {"failed": 0, "xpassed": 1, "xfailed": 2, "skipped": 3, "passed": 4}
    cells: dict[tuple[str, str], dict[str, int]] = {}
    for record in records:
        key = (item_mode(record), feature_label(record.get("scenario")))
        outcome = str(record.get("outcome") or "unknown")
        counts = cells.setdefault(key, {})
        counts[outcome] = counts.get(outcome, 0) + 1
    mode_order = ["NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"]
    modes = sorted({m for m, _ in cells}, key=lambda m: (mode_order.index(m) if m in mode_order else 99, m))
    combos = sorted({f for _, f in cells}, key=lambda f: (f != "base", f.count("+"), f))
    rows = []
    for combo in combos:
        row: list[dict[str, object] | None] = []
        for mode in modes:
            cell = cells.get((mode, combo))
            if not cell:
                row.append(None)
                continue
            worst = min(cell, key=lambda o: severity.get(o, -1))
            title = ", ".join(f"{n} {o}" for o, n in sorted(cell.items(), key=lambda kv: severity.get(kv[0], -1)))
            bad = cell.get("failed", 0)
            total = sum(cell.values())
            row.append({"worst": worst, "total": total, "title": f"{mode} \u00d7 {combo}: {title}", "bad": bad,
                        "text": f"{bad}/{total}" if bad else str(total)})
        rows.append((combo, row))
    return {"modes": modes, "combos": combos, "rows": rows}


#: The rows pytest-html starts collapsed when the run does not choose (its ``render_collapsed``
#: default is "passed" alone): every row that did not fail, so that the page opens on the
#: failures (a nightly page began with 1,610 skipped rows open, 199,121 px tall).
COLLAPSED = "passed,skipped,xfailed,xpassed"


def render_page(records: Sequence[Mapping], *, media: bool = True, collapsed: str = COLLAPSED) -> str:
    """What goes once at the top of the page: CSS, the outcome grid, the run's charts, filters.

    ``collapsed``: the outcomes whose rows start collapsed (pytest-html's ``render_collapsed``;
    empty: leave pytest-html's setting alone). The page's script sets it in pytest-html's data
    before pytest-html reads it; a ``?collapsed=`` in the page's URL still wins.

    ``media``: whether any test of the run attached an image or a video. Without any, the
    page's script drops the ``<video>`` element from pytest-html's row template before
    pytest-html builds its rows: a thousand video elements, created again on every redraw,
    were four fifths of the cost of opening a 1,000-item report and of each sort, filter
    and click (pytest-html issue #684; figures in benchmarks/README.md)."""
    records = [_dict(r) for r in records or []]
    outcomes: dict[str, int] = {}
    for record in records:
        outcome = str(record.get("outcome") or "unknown")
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    grid = _grid(records)
    measured = [(_utilisation(_dict(_dict(r.get("run")).get("stream_usage"))), r) for r in records]
    usage = [(u, r) for u, r in measured if u is not None]
    peak = max(usage, key=lambda ur: ur[0]) if usage else None
    context = {
        "css": _static("report.css"), "script": _static("report.js"),
        "grid": grid, "outcomes": outcomes, "total": len(records),
        "waste_chart": charts.safely(charts.padding_waste_svg, records),
        "replay": replay_by_bucket(records),
        "backends": sorted({_text(r.get("backend")) for r in records} - {""}),
        "peak": None if peak is None else {"pct": f"{peak[0]:.1f}%", "mode": item_mode(peak[1]),
                                           "features": feature_label(peak[1].get("scenario")),
                                           "name": _text(peak[1].get("name"))},
        "checks": sorted({c for r in records for c in _list(r.get("failed_checks"))}),
        "modes": grid["modes"],
        "media": media,
        "collapsed": collapsed,
    }
    return _environment().get_template("page.html.j2").render(context)


def render_fragments(fragments: Mapping[str, str]) -> str:
    """Every item's fragment once, compressed together, for the page's script to open on demand.

    pytest-html rebuilds its whole results table on every filter, sort and click; fragments
    kept out of its data are laid out only when their row is open, so a 1,000-item page stays
    fast. They are one JSON object (key -> HTML), deflated and base64-encoded: the fragments
    of a run repeat each other (the same tables, check names and summaries), so together they
    compress about fourteenfold (a passing item's about thirtyfold), and base64 text can never
    end its script element. The page's script inflates them once (``DecompressionStream``, in
    every current browser); :func:`read_fragments` does the same in Python.
    """
    payload = json.dumps(dict(fragments), separators=(",", ":")).encode()
    data = base64.b64encode(zlib.compress(payload, 9)).decode("ascii")
    return _environment().get_template("fragments.html.j2").render(data=data, count=len(fragments))


def read_fragments(page: str) -> dict[str, str]:
    """The fragments of a written page, key -> HTML (for tests and benchmarks)."""
    match = _FRAGMENTS.search(page)
    if match is None:
        return {}
    return json.loads(zlib.decompress(base64.b64decode(match.group(1))))
