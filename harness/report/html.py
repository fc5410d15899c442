"""HTML for one item record (pytest-html's per-item extra) and for the report's summary.

Pure functions of the JSON-ready records built by :mod:`harness.report.results`: no pytest,
no torch, no external CSS or JS. The fragment explains a verdict in triage order: the verdict,
the checks, the evidence of each failing check (FIA violations, equality mismatches, stale
host lists and the texts side by side, the stream budget), the per-step dispatch, path errors,
and the scenario as run. Every value that came from a user or a run is escaped, and every
section tolerates a partial record (a crashed item has ``run == {}``; a skipped one no run).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from html import escape
from typing import Any

import yaml

from harness.names import CheckName

__all__ = ["render_item", "render_summary", "STYLE"]

#: Rows of a violation / mismatch / stale table shown before an "N more" note.
MAX_ROWS = 20
_CHECK_ORDER = tuple(CheckName)  # the one list of check names (harness.names)
_OUTCOME_LABEL = {
    "passed": "passed",
    "failed": "failed",
    "xfailed": "xfailed (known-bad, failed as expected)",
    "skipped": "skipped",
}

STYLE = """<style>
.gh-item,.gh-summary{font:13px/1.4 system-ui,sans-serif;color:#222}
.gh-item h4{margin:.9em 0 .3em;font-size:13px}
.gh-item table,.gh-summary table{border-collapse:collapse;margin:.2em 0}
.gh-item th,.gh-item td,.gh-summary th,.gh-summary td{border:1px solid #ccc;padding:2px 6px;text-align:left;vertical-align:top}
.gh-item th,.gh-summary th{background:#f2f2f2}
.gh-item pre{background:#f7f7f7;border:1px solid #ddd;padding:4px 6px;white-space:pre-wrap;margin:.2em 0}
.gh-item .gh-verdict{font-size:14px;margin:.2em 0}
.gh-item .gh-badge{display:inline-block;padding:0 6px;border-radius:3px;color:#fff;font-weight:600}
.gh-item .gh-pass,.gh-summary .gh-pass{background:#2e7d32}
.gh-item .gh-fail,.gh-summary .gh-fail{background:#c62828}
.gh-item .gh-xfail{background:#ef6c00}
.gh-item .gh-skip{background:#757575}
.gh-item tr.gh-diff td{background:#fff3e0}
.gh-item mark{background:#ffcdd2;padding:0 1px}
.gh-item .gh-muted{color:#777}
.gh-item .gh-tokens{font-family:monospace;word-break:break-all}
</style>"""

_DOT = " \u00b7 "
_OUTCOME_CLASS = {"passed": "gh-pass", "failed": "gh-fail", "xfailed": "gh-xfail", "skipped": "gh-skip"}


# ---------------------------------------------------------------------------------------------
# small helpers


def _e(value: Any) -> str:
    """Escaped text of ``value``; ``None`` as an em dash."""
    if value is None:
        return "\u2014"
    if isinstance(value, float):
        return escape(f"{value:.4g}")
    return escape(str(value), quote=True)


def _dict(value: Any) -> dict:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list:
    return list(value) if isinstance(value, (list, tuple)) else []


def _ints(values: Any) -> str:
    """A token / length list as space-separated ints."""
    if not isinstance(values, (list, tuple)):
        return _e(values)
    return " ".join(_e(v) for v in values)


def _compact(value: Any, limit: int = 240) -> str:
    try:
        text = json.dumps(value, separators=(",", ":"), default=str)
    except (TypeError, ValueError):
        text = str(value)
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _badge(passed: bool) -> str:
    return '<span class="gh-badge gh-pass">PASS</span>' if passed else '<span class="gh-badge gh-fail">FAIL</span>'


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]], row_classes: Sequence[str] | None = None) -> str:
    """A table; ``headers`` are escaped here, cells must already be HTML."""
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = []
    for i, row in enumerate(rows):
        cls = row_classes[i] if row_classes and i < len(row_classes) and row_classes[i] else ""
        attr = f' class="{cls}"' if cls else ""
        body.append(f"<tr{attr}>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _more(total: int, shown: int, what: str = "rows") -> str:
    return f'<p class="gh-muted">{total - shown} more {_e(what)} not shown</p>' if total > shown else ""


def _details(summary: str, body: str, open_: bool = False) -> str:
    return f"<details{' open' if open_ else ''}><summary>{summary}</summary>{body}</details>"


def _yes_no(value: Any) -> str:
    return "yes" if value is True else "no" if value is False else _e(value)


def _pct(usage: Mapping) -> float | None:
    util = usage.get("utilisation")
    if isinstance(util, (int, float)):
        return 100.0 * util
    in_use, pool = usage.get("in_use"), usage.get("pool_size")
    if isinstance(in_use, (int, float)) and isinstance(pool, (int, float)) and pool:
        return 100.0 * in_use / pool
    return None


# ---------------------------------------------------------------------------------------------
# sections


def _verdict(record: Mapping) -> str:
    outcome = str(record.get("outcome") or "unknown")
    cls = _OUTCOME_CLASS.get(outcome, "gh-skip")
    label = _OUTCOME_LABEL.get(outcome, outcome)
    run = _dict(record.get("run"))
    facts = [f"source <code>{_e(record.get('source'))}</code>", f"backend <b>{_e(record.get('backend'))}</b>"]
    if run.get("mode"):
        facts.append(f"mode <b>{_e(run.get('mode'))}</b>")
    if record.get("id"):
        facts.append(f"id <code>{_e(record.get('id'))}</code>")
    if isinstance(record.get("duration"), (int, float)):
        facts.append(f"{record['duration']:.2f} s")
    return (f'<p class="gh-verdict"><span class="gh-badge {cls}">{_e(label)}</span> '
            f"{_e(record.get('verdict'))}</p><p>{_DOT.join(facts)}</p>")


def _checks(checks: Mapping) -> str:
    if not checks:
        return "<h4>Checks</h4><p class=\"gh-muted\">no check ran</p>"
    names = [n for n in _CHECK_ORDER if n in checks] + [n for n in checks if n not in _CHECK_ORDER]
    rows = []
    for name in names:
        check = _dict(checks[name])
        rows.append([f"<b>{_e(name)}</b>", _badge(bool(check.get("passed"))), _e(check.get("summary"))])
    return "<h4>Checks</h4>" + _table(["check", "result", "summary"], rows)


def _fia(check: Mapping) -> str:
    if not check or check.get("passed", True):
        return ""
    details = _dict(check.get("details"))
    violations = _list(details.get("violations"))
    if not violations:
        return ""
    contract = details.get("contract")
    other = "strict" if contract == "relaxed" else "relaxed"
    rows = []
    for v in violations[:MAX_ROWS]:
        v = _dict(v)
        other_ok = v.get("strict_ok") if other == "strict" else v.get("relaxed_ok")
        rows.append([_e(v.get("path")), _e(v.get("phase")), _e(v.get("step")), _e(v.get("layer")),
                     _e(v.get("bucket")), _e(v.get("T")), f'<span class="gh-tokens">{_ints(v.get("actual_seq_lengths"))}</span>',
                     f'<span class="gh-tokens">{_ints(v.get("actual_seq_lengths_kv"))}</span>',
                     _e(v.get("padding")), _e(v.get("message")), _yes_no(other_ok)])
    head = (f"<h4>FIA invariant: {len(violations)} rejected call(s) of {_e(details.get('calls'))} "
            f"(contract {_e(contract)})</h4>")
    return head + _table(["path", "phase", "step", "layer", "bucket", "T", "actual_seq_lengths",
                          "actual_seq_lengths_kv", "padding source", "CANN message",
                          f"{other} would accept"], rows) + _more(len(violations), len(rows), "violations")


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


def _host_lists(executed: Any) -> str:
    lines = []
    for layer, lists in enumerate(_list(executed)):
        lists = _dict(lists)
        parts = [f"{k}={_compact(v)}" for k, v in lists.items()]
        lines.append(f"layer {layer}: " + "  ".join(parts))
    return "\n".join(lines)


def _equality(check: Mapping) -> str:
    if not check:
        return ""
    details = _dict(check.get("details"))
    mismatches = _list(details.get("mismatches"))
    if not mismatches:
        return ""
    rows, extra = [], []
    for m in mismatches[:MAX_ROWS]:
        m = _dict(m)
        tol = _dict(m.get("tolerance"))
        tokens = _dict(m.get("tokens"))
        token_text = "<br>".join(f"{_e(p)}: <span class=\"gh-tokens\">{_ints(t)}</span>" for p, t in tokens.items())
        where = f"{_e(m.get('request'))} @ {_e(m.get('position'))}"
        if m.get("rows_differing") is not None:
            where += f" <span class=\"gh-muted\">({_e(m.get('rows_differing'))} rows differ)</span>"
        rows.append([_e(m.get("step")), _e(m.get("paths")), _e(m.get("effect")), _e(m.get("runtime_mode")),
                     _e(m.get("bucket")), where, _e(m.get("max_abs_error")), _e(m.get("max_rel_error")),
                     token_text, f"atol {_e(tol.get('atol'))}, rtol {_e(tol.get('rtol'))}"])
        diff = _dict(m.get("metadata_diff"))
        body = ""
        if diff:
            body += f"<p>host metadata, reference \u2192 graph path (deepdiff)</p><pre>{_e(_format_diff(diff))}</pre>"
        if m.get("executed_host_lists") is not None:
            body += f"<p>host lists the graph executed</p><pre>{_e(_host_lists(m.get('executed_host_lists')))}</pre>"
        if body:
            extra.append(_details(f"step {_e(m.get('step'))}, {_e(m.get('paths'))}: metadata", body,
                                  open_=not extra and not check.get("passed", True)))
    state = "failing" if not check.get("passed", True) else "explained by another check"
    return (f"<h4>Equality: {len(mismatches)} mismatch(es) ({_e(state)})</h4>"
            + _table(["step", "paths", "effect", "runtime mode", "bucket", "request @ position", "max abs err",
                      "max rel err", "tokens", "tolerance"], rows)
            + _more(len(mismatches), len(rows), "mismatches") + "".join(extra))


def _token_cells(reference: list, graph: list) -> tuple[str, str, int | None]:
    """Both texts as token strings, graph tokens differing from the reference marked."""
    ref_html = " ".join(_e(t) for t in reference)
    parts, first = [], None
    for i, tok in enumerate(graph):
        same = i < len(reference) and reference[i] == tok
        if not same and first is None:
            first = i
        parts.append(_e(tok) if same else f"<mark>{_e(tok)}</mark>")
    if first is None and len(graph) != len(reference):
        first = min(len(graph), len(reference))
    return ref_html, " ".join(parts), first


def _stale(check: Mapping, run: Mapping) -> str:
    details = _dict(_dict(check).get("details"))
    out = []
    stale = _list(details.get("stale"))
    if stale:
        rows = []
        for s in stale[:MAX_ROWS]:
            s = _dict(s)
            rows.append([_e(s.get("step")), _e(s.get("layer")), _e(s.get("argument")), _e(s.get("bucket")),
                         f'<span class="gh-tokens">{_ints(s.get("executed"))}</span>',
                         f'<span class="gh-tokens">{_ints(s.get("expected"))}</span>'])
        out.append(f"<h4>Stale host parameters: {len(stale)} stale list(s)</h4>"
                   + _table(["step", "layer", "argument", "bucket", "executed (graph)", "expected (live batch)"], rows)
                   + _more(len(stale), len(rows), "stale lists"))
    texts = _dict(details.get("texts")) or _dict(run.get("texts"))
    reference, graph = _dict(texts.get("reference")), _dict(texts.get("graph"))
    if reference or graph:
        repetition = _dict(details.get("repetition"))
        rep_ref, rep_graph = _dict(repetition.get("reference")), _dict(repetition.get("graph"))
        rows, classes = [], []
        for req in list(reference) + [r for r in graph if r not in reference]:
            ref_tokens, graph_tokens = _list(reference.get(req)), _list(graph.get(req))
            ref_html, graph_html, first = _token_cells(ref_tokens, graph_tokens)

            def rep(table: Mapping) -> str:
                entry = _dict(table.get(req))
                if not entry:
                    return "\u2014"
                score = entry.get("score")
                score_text = f"{score:.2f}" if isinstance(score, (int, float)) else _e(score)
                return f"{score_text} / {_e(entry.get('longest_run'))}"

            rows.append([_e(req), f'<span class="gh-tokens">{ref_html}</span>',
                         f'<span class="gh-tokens">{graph_html}</span>', rep(rep_ref), rep(rep_graph),
                         "\u2014" if first is None else _e(first)])
            classes.append("gh-diff" if first is not None else "")
        out.append("<h4>Generated texts (reference eager vs graph)</h4>"
                   + _table(["request", "reference tokens", "graph tokens", "repetition ref (score / longest run)",
                             "repetition graph (score / longest run)", "first divergence"], rows, classes))
    return "".join(out)


def _budget(check: Mapping, run: Mapping) -> str:
    details = _dict(_dict(check).get("details"))
    usage = _dict(run.get("stream_usage")) or _dict(details.get("usage"))
    graphs = run.get("graphs_captured", details.get("graphs_captured"))
    if not usage and graphs is None and not run.get("budget"):
        return ""
    pct = _pct(usage)
    facts = [f"graphs captured <b>{_e(graphs)}</b>",
             f"streams <b>{_e(usage.get('in_use'))}</b> / pool <b>{_e(usage.get('pool_size'))}</b>",
             f"utilisation <b>{'—' if pct is None else f'{pct:.1f}%'}</b>"]
    if run.get("capture_sizes") is not None:
        facts.append(f"capture sizes <span class=\"gh-tokens\">{_ints(run.get('capture_sizes'))}</span>")
    if isinstance(run.get("capture_seconds"), (int, float)):
        facts.append(f"capture {run['capture_seconds']:.3f} s")
    out = "<h4>Stream budget</h4><p>" + " \u00b7 ".join(facts) + "</p>"
    policy = _dict(run.get("budget")) or _dict(details.get("policy"))
    if policy:
        rows = [["sizes kept", f'<span class="gh-tokens">{_ints(policy.get("sizes_kept"))}</span>'],
                ["sizes dropped", f'<span class="gh-tokens">{_ints(policy.get("sizes_dropped"))}</span>']]
        for key, value in policy.items():
            if key not in ("sizes_kept", "sizes_dropped"):
                rows.append([_e(key), _e(value if not isinstance(value, (dict, list)) else _compact(value))])
        out += "<p>capture-size policy decision</p>" + _table(["", "value"], rows)
    return out


def _steps(run: Mapping) -> str:
    steps = _list(run.get("steps"))
    if not steps:
        return ""
    rows, classes = [], []
    for s in steps:
        s = _dict(s)
        reqs = []
        for entry in _list(s.get("requests")):
            entry = _list(entry)
            if len(entry) == 3:
                reqs.append(f"{_e(entry[0])}:{_e(entry[1])}+{_e(entry[2])}")
            else:
                reqs.append(_e(_compact(entry)))
        ledger = _dict(s.get("ledger"))
        sampled = _dict(s.get("sampled"))
        distinct = {json.dumps(v, default=str) for v in sampled.values()}
        differs = len(distinct) > 1
        sampled_html = "<br>".join(f"{_e(p)}: <span class=\"gh-tokens\">{_ints(t)}</span>" for p, t in sampled.items())
        if differs:
            sampled_html = "<b>differ</b><br>" + sampled_html
        uniform = s.get("uniform_decode")
        rows.append([_e(s.get("step")), " ".join(reqs), _e(s.get("num_tokens")), _yes_no(uniform),
                     _e(s.get("runtime_mode")), _e(s.get("num_tokens_padded")),
                     f"{_e(s.get('num_reqs'))} \u2192 {_e(s.get('num_reqs_padded'))}", _e(s.get("padding_source")),
                     _e(s.get("dispatch_reason")), ", ".join(f"{_e(k)}={_e(v)}" for k, v in ledger.items()),
                     sampled_html])
        classes.append("gh-diff" if differs else "")
    return ("<h4>Per-step dispatch</h4>"
            + _table(["step", "requests (id:computed+new)", "num_tokens", "uniform decode", "runtime mode",
                      "padded num_tokens", "num_reqs \u2192 padded", "padding source", "dispatch reason",
                      "padding ledger", "sampled tokens"], rows, classes))


def _errors(record: Mapping, run: Mapping) -> str:
    errors = _list(run.get("errors"))
    out = ""
    if errors:
        rows = []
        for e in errors[:MAX_ROWS]:
            e = _dict(e)
            rows.append([_e(e.get("path")), _e(e.get("phase")), _e(e.get("step")), _e(e.get("bucket")),
                         _e(e.get("kind")), _e(e.get("message"))])
        out += ("<h4>Path errors</h4>" + _table(["path", "phase", "step", "bucket", "kind", "message"], rows)
                + _more(len(errors), len(rows), "errors"))
    notes = _list(run.get("notes"))
    if notes:
        out += "<h4>Notes</h4><ul>" + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul>"
    tb = record.get("traceback")
    if tb:
        out += _details("<b>Traceback</b>", f"<pre>{_e(tb)}</pre>", open_=True)
    return out


def _scenario(record: Mapping) -> str:
    scenario = record.get("scenario")
    if not scenario:
        return ""
    try:
        text = yaml.safe_dump(scenario, sort_keys=False, default_flow_style=None, width=100)
    except yaml.YAMLError:
        text = json.dumps(scenario, indent=1, default=str)
    return _details("Scenario as run (YAML)", f"<pre>{_e(text)}</pre>")


def _environment(record: Mapping) -> str:
    env = _dict(record.get("environment"))
    if not env:
        return ""
    return '<p class="gh-muted">' + " \u00b7 ".join(f"{_e(k)} {_e(v)}" for k, v in env.items()) + "</p>"


# ---------------------------------------------------------------------------------------------
# public


def _section(name: str, render, *args) -> str:
    try:
        return render(*args)
    except Exception as error:  # noqa: BLE001 - a malformed record must not break the whole report
        return f'<p class="gh-muted">[{_e(name)} could not be rendered: {_e(type(error).__name__)}: {_e(error)}]</p>'


def render_item(record: dict) -> str:
    """One item record (:func:`harness.report.results.item_record`) as a self-contained HTML fragment."""
    record = _dict(record)
    checks = _dict(record.get("checks"))
    run = _dict(record.get("run"))
    parts = [
        _section("verdict", _verdict, record),
        _section("environment", _environment, record),
        _section("checks", _checks, checks),
        _section(CheckName.FIA_INVARIANT, _fia, _dict(checks.get(CheckName.FIA_INVARIANT))),
        _section(CheckName.EQUALITY, _equality, _dict(checks.get(CheckName.EQUALITY))),
        _section(CheckName.STALE_PARAMS, _stale, _dict(checks.get(CheckName.STALE_PARAMS)), run),
        _section(CheckName.STREAM_BUDGET, _budget, _dict(checks.get(CheckName.STREAM_BUDGET)), run),
        _section("steps", _steps, run),
        _section("errors", _errors, record, run),
        _section("scenario", _scenario, record),
    ]
    if not run and record.get("outcome") != "skipped":
        parts.insert(3, '<p class="gh-muted">no run evidence: the item stopped before the pipeline ran</p>')
    return STYLE + '<div class="gh-item">' + "".join(parts) + "</div>"


def render_summary(records: list[dict]) -> str:
    """Counts by outcome, and per graph mode: items, failures, graphs captured, max stream utilisation."""
    outcomes: dict[str, int] = {}
    modes: dict[str, dict[str, Any]] = {}
    for record in records or []:
        record = _dict(record)
        outcome = str(record.get("outcome") or "unknown")
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        run = _dict(record.get("run"))
        mode = run.get("mode") or _dict(_dict(record.get("scenario")).get("graph")).get("mode") or "\u2014"
        entry = modes.setdefault(str(mode), {"items": 0, "failed": 0, "graphs": 0, "util": None})
        entry["items"] += 1
        entry["failed"] += outcome == "failed"
        graphs = run.get("graphs_captured")
        if isinstance(graphs, int):
            entry["graphs"] += graphs
        pct = _pct(_dict(run.get("stream_usage")))
        if pct is not None and (entry["util"] is None or pct > entry["util"]):
            entry["util"] = pct
    order = [o for o in ("passed", "failed", "xfailed", "skipped") if o in outcomes]
    order += sorted(o for o in outcomes if o not in order)
    counts = _table([*order, "total"], [[_e(outcomes[o]) for o in order] + [_e(sum(outcomes.values()))]])
    rows = []
    for mode in sorted(modes):
        m = modes[mode]
        fail = f'<span class="gh-badge gh-fail">{m["failed"]}</span>' if m["failed"] else "0"
        rows.append([_e(mode), _e(m["items"]), fail, _e(m["graphs"]),
                     "\u2014" if m["util"] is None else f"{m['util']:.1f}%"])
    per_mode = _table(["mode", "items", "failures", "graphs captured", "max stream utilisation"], rows)
    return STYLE + f'<div class="gh-summary"><h4>Outcomes</h4>{counts}<h4>Per graph mode</h4>{per_mode}</div>'
