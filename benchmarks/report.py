#!/usr/bin/env python
"""Benchmark of the HTML and JSON reports at scale: bytes per item, render time, browser time.

    .venv/bin/python benchmarks/report.py [--items 1000] [--records reports/scenarios.json]
                                          [--out reports/bench-report.json] [--keep PAGE.html]
    .venv/bin/python benchmarks/report.py --sizes PAGE.html RESULTS.json   # a real run's files
    .venv/bin/python benchmarks/report.py --matrix scenarios/cross_product/cross_product.yaml
                                          # the nightly's 4,200 rows, from a real run's records
    .venv/bin/python benchmarks/report.py --page reports/nightly.html      # a real page's geometry

A pytest run of ``--items`` synthetic items, each carrying a real item record: the records of
a real run (``--records``, a results file, ``make scenarios``'s by default) taken in turn and
replicated under distinct ids (``<node id>#<copy>``), each keeping its own mode, features and
outcome, so the page has the outcome mix and the shapes of that real run. They go through the
real plugin and pytest-html (``--self-contained-html``) with the plugin's rules: the record a
current plugin would write (passing items keep a summary, unless ``--report-evidence=all``),
its fragment rendered by :func:`harness.report.html_hooks.attach_fragment`. Measures, in one run:

* ``size``: bytes of the HTML page and of the JSON results per item, in all and by outcome
  (an item's bytes: its entry in pytest-html's data, as escaped on the page, plus its
  fragment; the page's fixed part, CSS, scripts, the summary, apart);
* ``render``: ms per item to render its fragment (Jinja2; and matplotlib charts for failing
  and known-bad items);
* ``open``: in headless Chromium, seconds from navigation to the load event and until the open
  rows near the viewport are filled, with the DevTools performance counters (script, layout,
  style) that say where the time went; ``filter``/``toggle``: ms for a change to be applied
  and laid out (pytest-html's outcome checkbox and a row's open/close: it rebuilds the whole
  table; the graph-harness mode filter and a grid cell: they hide rows);
* ``unit``: seconds of ``python -c "import torch"`` in the same run, the unit the README
  compares against (machines are noisy; ratios within one run are what carry over).

``--sizes`` reads the HTML page and JSON results of any real run and prints the same size
breakdown, without running anything.
"""

from __future__ import annotations

import argparse
import hashlib
import html
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.report.browser import Chromium, find_chromium  # noqa: E402
try:  # an older version (one plain script element per fragment) has neither, and needs neither
    from harness.report.html import read_fragments, render_fragments  # noqa: E402
except ImportError:
    read_fragments = render_fragments = None

CONFTEST = '''
import json, time
from pathlib import Path
import pytest
from harness.report.html_hooks import attach_fragment
from harness.report.results import RECORD_KEY
try:  # what the plugin keeps of a passing item (absent in versions that kept everything)
    from harness.report.results import FULL_EVIDENCE_OUTCOMES, summary_record
except ImportError:
    summary_record = None

RECORDS = json.loads(Path(__file__).with_name("records.json").read_text())
EVIDENCE = Path(__file__).with_name("evidence.txt").read_text().strip()
TIMES = []

def record_of(i):
    return RECORDS[int(i)]

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.when != "call":
        return
    record = record_of(item.callspec.params["i"])
    if summary_record and EVIDENCE != "all" and record["outcome"] not in FULL_EVIDENCE_OUTCOMES \\
            and record.get("evidence") != "summary":
        record = summary_record(record)
    setattr(report, RECORD_KEY, record)   # the record as a report attribute (results v2)
    started = time.perf_counter()
    attach_fragment(report, record)
    TIMES.append((record["outcome"], time.perf_counter() - started))

def pytest_sessionfinish(session):
    Path(session.config.rootpath, "render_times.json").write_text(json.dumps(TIMES))
'''

TEST = '''
import json
from pathlib import Path
import pytest
from conftest import record_of

IDS = json.loads(Path(__file__).with_name("ids.json").read_text())

@pytest.mark.parametrize("i", range(len(IDS)), ids=IDS)
def test_item(i):
    outcome = record_of(i)["outcome"]
    if outcome == "xfailed":
        pytest.xfail(record_of(i)["verdict"])
    if outcome == "skipped":
        pytest.skip(record_of(i)["verdict"])
    if outcome == "failed":
        raise AssertionError(record_of(i)["verdict"])
'''


def replicate(records: list[dict], items: int) -> list[dict]:
    """``items`` records: the real ones in turn, copy ``n`` of each under ``<node id>#<n>``."""
    out = []
    for i in range(items):
        record = json.loads(json.dumps(records[i % len(records)]))
        copy = i // len(records)
        for field in ("nodeid", "key"):
            if record.get(field):
                record[field] = f"{record[field]}#{copy}"
        out.append(record)
    return out


def matrix_records(templates: dict[str, dict], matrix_file: Path, failing: dict[str, int] | None = None) -> list[dict]:
    """One record per point of ``matrix_file``'s whole matrix (what ``--matrix=full`` runs):
    a real record of the point's outcome (``templates``: outcome -> record of a real run)
    under the point's node id, with its mode and scenario, so that the page has the nightly's
    rows, grid and outcome mix. A point unsupported by design is skipped with its reason, the
    others pass, except ``failing`` (outcome -> every n-th runnable point), so that a page
    also holds failed and known-bad rows."""
    from harness.resolve import ItemProblem, PointSkipped, resolve_item
    from harness.scenario import load_scenario_file

    def unsupported_reason(scenario) -> str | None:
        try:
            resolve_item(scenario)
        except PointSkipped as skipped:
            return str(skipped)
        except ItemProblem:
            return None
        return None

    relative = matrix_file.resolve().relative_to(ROOT).as_posix() if matrix_file.resolve().is_relative_to(ROOT) \
        else matrix_file.name
    out = []
    runnable = 0
    for point in load_scenario_file(matrix_file):
        reason = unsupported_reason(point.scenario)
        outcome = "skipped" if reason else "passed"
        if reason is None:
            runnable += 1
            for kind, every in (failing or {}).items():
                if runnable % every == 0:
                    outcome = kind
        record = json.loads(json.dumps(templates[outcome]))
        nodeid = f"{relative}::{point.name}[{point.id}]"
        record.update(nodeid=nodeid, key=nodeid, name=point.name, id=point.id, mode=point.scenario.graph.mode,
                      scenario=point.scenario.model_dump(mode="json"), source=f"{relative}:{point.source.line}")
        if isinstance(record.get("run"), dict) and record["run"]:
            record["run"]["mode"] = point.scenario.graph.mode
        if reason:
            record["verdict"] = reason
        out.append(record)
    return out


def build_page(records: list[dict], project: Path, evidence: str = "failures") -> tuple[Path, float]:
    """The items of ``records`` through the real plugin and pytest-html, in ``project``:
    the page's path and the seconds pytest took."""
    (project / "records.json").write_text(json.dumps(records))
    (project / "ids.json").write_text(json.dumps([r.get("key") or r.get("nodeid") or str(i)
                                                  for i, r in enumerate(records)]))
    (project / "evidence.txt").write_text(evidence)
    (project / "conftest.py").write_text(CONFTEST)
    (project / "test_items.py").write_text(TEST)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--html=report.html",
                    "--self-contained-html", "--results-json=results.json", "-o", "addopts="],
                   cwd=project, env=env, check=False, stdout=subprocess.DEVNULL)
    return project / "report.html", time.perf_counter() - started


#: The page's geometry at a window's width: how wide and tall it is, the grid's box, the rows
#: and which of them started open, and the two counts pytest-html and the grid give.
GEOMETRY = """(() => {
  const box = document.querySelector('.gh-grid-box')
  const rect = box ? box.getBoundingClientRect() : {width: 0, height: 0, right: 0}
  const rows = document.querySelectorAll('#results-table tbody.results-table-row')
  const open = [...rows].filter(r => !r.querySelector('.extras-row')?.classList.contains('hidden'))
  return {
    window_width: window.innerWidth,
    page_width: document.documentElement.scrollWidth, page_height: document.documentElement.scrollHeight,
    grid_box_width: Math.round(rect.width), grid_box_height: Math.round(rect.height),
    grid_box_right: Math.round(rect.right),
    grid_width: document.getElementById('gh-grid')?.scrollWidth || 0,
    rows: rows.length,
    open_rows: open.length,
    open_outcomes: [...new Set(open.map(r => [...r.classList].find(c => c !== 'results-table-row')))],
    run_count: document.querySelector('.run-count')?.textContent.trim() || '',
  }
})()"""


def page_geometry(page: Path, width: int = 1400, height: int = 1000) -> dict:
    """Open ``page`` in headless Chromium at ``width`` x ``height``: :data:`GEOMETRY`, the
    seconds to the load event, and the script errors the page raised."""
    with Chromium(width=width, height=height) as browser:
        loaded = browser.open(page)
        browser.evaluate(READY)
        browser.evaluate(SETTLE)
        geometry = browser.evaluate(GEOMETRY)
        return {**geometry, "open_s": round(loaded, 2), "errors": list(browser.errors)}


def unit_seconds() -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    return time.perf_counter() - started


# -- sizes -----------------------------------------------------------------------------------------
def _fragment_keys(blob: dict) -> dict[str, str]:
    """fragment key -> outcome of the item (pytest-html's result label, lower case)."""
    keys = {}
    for nodeid, entries in blob["tests"].items():
        keys[hashlib.sha1(nodeid.encode()).hexdigest()[:12]] = entries[-1]["result"].lower()
    return keys


def _fragment_store(page: str) -> tuple[dict[str, str], int, bool]:
    """(key -> fragment HTML, bytes of the store on the page, whether it is compressed)."""
    plain = re.findall(r'<script type="text/x-gh-item" id="gh-x-(\w+)">(.*?)</script>', page, re.S)
    if plain:  # the earlier layout: one script element of plain text per item
        return {k: v for k, v in plain}, sum(len(v) + 50 for _, v in plain), False
    match = re.search(r'<script type="application/x-gh-fragments"[^>]*>[^<]*</script>', page)
    return read_fragments(page), len(match.group(0)) if match else 0, True


def page_sizes(page_path: Path) -> dict:
    """Bytes of an HTML report: per item by outcome (its data entry + its fragment), the fixed part.

    With the compressed fragment store, an outcome's fragment bytes are those of its fragments
    compressed alone (in page order) and base64-encoded, over its items: what they add."""
    page = page_path.read_text()
    attribute = re.search(r'data-jsonblob="(.*?)"></div>', page, re.S)
    blob = json.loads(html.unescape(attribute.group(1)))
    outcome_of = _fragment_keys(blob)
    per: dict[str, list[int]] = {}
    entry_bytes = 0
    for entries in blob["tests"].values():
        for entry in entries:
            size = len(html.escape(json.dumps(entry)))  # as Jinja2 escapes the blob on the page
            entry_bytes += size
            per.setdefault(entry["result"].lower(), []).append(size)
    fragments, store_bytes, compressed = _fragment_store(page)
    grouped: dict[str, dict[str, str]] = {}
    for key, text in fragments.items():
        grouped.setdefault(outcome_of.get(key, "?"), {})[key] = text
    items = sum(len(v) for v in per.values())
    by_outcome = {}
    for outcome, sizes in per.items():
        group = grouped.get(outcome, {})
        if compressed:
            added = len(render_fragments(group)) if group else 0
        else:
            added = sum(len(v) + 50 for v in group.values())
        fragment = added / len(group) if group else 0
        by_outcome[outcome] = {"items": len(sizes), "data_bytes": round(statistics.mean(sizes)),
                               "fragment_bytes": round(fragment),
                               "fragment_text_bytes": round(statistics.mean(len(v) for v in group.values())) if group else 0,
                               "bytes": round(statistics.mean(sizes) + fragment)}
    return {"bytes": len(page), "items": items, "bytes_per_item": round(len(page) / max(items, 1)),
            "fixed_bytes": len(page) - entry_bytes - store_bytes, "fragment_store_bytes": store_bytes,
            "fragments_compressed": compressed, "by_outcome": by_outcome}


def results_sizes(path: Path) -> dict:
    """Bytes of a JSON results file per item, by outcome (each record as the file writes it)."""
    text = path.read_text()
    data = json.loads(text)
    compact = "\n" in text[:200] and text.count("\n") < len(data["items"]) + 20  # one line per item
    per: dict[str, list[int]] = {}
    for record in data["items"]:
        size = len(json.dumps(record, separators=(",", ":"))) if compact else len(json.dumps(record, indent=1))
        per.setdefault(record["outcome"], []).append(size)
    items = len(data["items"])
    return {"bytes": len(text), "items": items, "bytes_per_item": round(len(text) / max(items, 1)),
            "by_outcome": {o: {"items": len(v), "bytes": round(statistics.mean(v))} for o, v in per.items()}}


# -- browser ---------------------------------------------------------------------------------------
READY = ("new Promise(r => { const t = performance.now(); const wait = () => (document.body.dataset"
         ".ghFragments || !document.querySelector('script#gh-fragments')) ? r(performance.now() - t)"
         " : setTimeout(wait, 10); wait() })")
SETTLE = "new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => setTimeout(r, 50))))"
TIMED = ("new Promise(r => {{ const t = performance.now(); {action}; "
         "requestAnimationFrame(() => requestAnimationFrame(() => setTimeout(() => r(performance.now() - t), 0))) }})")
COUNTERS = ("ScriptDuration", "LayoutDuration", "RecalcStyleDuration", "TaskDuration", "Nodes")


def _counters(browser: Chromium) -> dict[str, float]:
    metrics = browser.send("Performance.getMetrics")["metrics"]
    return {m["name"]: m["value"] for m in metrics if m["name"] in COUNTERS}


def _delta(before: dict, after: dict) -> dict:
    return {k: round(after[k] - before.get(k, 0), 3) if k != "Nodes" else int(after[k]) for k in after}


def _timed(browser: Chromium, action: str) -> dict:
    before = _counters(browser)
    ms = browser.evaluate(TIMED.format(action=action))
    return {"ms": round(ms), **_delta(before, _counters(browser))}


def browser_times(page: Path, repeats: int = 3) -> dict:
    """Open the page ``repeats`` times (fresh browser each), median of each figure."""
    if find_chromium() is None:
        return {"errors": ["no chromium"]}
    runs = []
    errors: list[str] = []
    for _ in range(repeats):
        with Chromium() as browser:
            browser.send("Performance.enable", timeMode="threadTicks")
            loaded = browser.open(page)
            browser.evaluate(READY)  # the fragment store inflated (immediately for older pages)
            browser.evaluate(SETTLE)
            nav = browser.evaluate("(() => { const n = performance.getEntriesByType('navigation')[0];"
                                   " return {parsed: n.domInteractive, dom_ready: n.domContentLoadedEventEnd,"
                                   " load: n.loadEventEnd} })()")
            opened = {"load_s": round(loaded, 2), **{k: round(v) for k, v in nav.items()},
                      **_delta({}, _counters(browser))}
            rows = browser.evaluate("document.querySelectorAll('#results-table tbody.results-table-row').length")
            filled = browser.evaluate("document.querySelectorAll('.gh-item').length")
            box = "document.querySelector('input[data-test-result=passed]').click()"
            outcome = _timed(browser, box)
            _timed(browser, box)
            toggle = _timed(browser, "document.querySelector('#results-table tbody.results-table-row .col-result').click()")
            mode = _timed(browser, "location.hash = 'mode=FULL'; window.dispatchEvent(new HashChangeEvent('hashchange'))")
            shown = int(browser.evaluate("document.body.dataset.ghShown"))
            cell = _timed(browser, "document.querySelector('#gh-grid td.gh-cell:not(.gh-empty)').click()")
            errors += browser.errors
            runs.append({"open": opened, "rows": rows, "rows_filled_at_open": filled, "filter_outcome": outcome,
                         "toggle_row": toggle, "filter_mode": mode, "rows_after_mode_filter": shown,
                         "filter_grid_cell": cell})

    def median(path: list[str]):
        values = []
        for run in runs:
            value = run
            for key in path:
                value = value[key]
            values.append(value)
        return statistics.median(values) if isinstance(values[0], (int, float)) else values[0]

    def merged(template: dict, path: list[str]) -> dict:
        return {k: merged(v, [*path, k]) if isinstance(v, dict) else median([*path, k]) for k, v in template.items()}

    return {**merged(runs[0], []), "repeats": repeats, "errors": sorted(set(errors))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--records", type=Path, default=ROOT / "reports" / "scenarios.json")
    parser.add_argument("--evidence", default="failures", choices=("failures", "all"),
                        help="as --report-evidence: which items keep their full evidence")
    parser.add_argument("--repeats", type=int, default=3, help="browser opens (median)")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "bench-report.json")
    parser.add_argument("--keep", type=Path, default=None, help="copy the generated HTML page here")
    parser.add_argument("--matrix", type=Path, default=None, metavar="FILE.yaml",
                        help="one item per point of this file's whole matrix (the nightly's rows: "
                             "scenarios/cross_product/cross_product.yaml), from --records' records by outcome")
    parser.add_argument("--page", type=Path, default=None, metavar="PAGE.html",
                        help="only the geometry and open time of a real run's page (at 1,400 px)")
    parser.add_argument("--sizes", nargs=2, type=Path, metavar=("PAGE.html", "RESULTS.json"),
                        help="only the size breakdown of a real run's files")
    args = parser.parse_args()
    if args.sizes:
        print(json.dumps({"html": page_sizes(args.sizes[0]), "json": results_sizes(args.sizes[1])}, indent=1))
        return
    if args.page:  # a real run's page: its geometry and open time only
        print(json.dumps({"page": str(args.page), **page_geometry(args.page)}, indent=1))
        return
    records = json.loads(args.records.read_text())["items"]
    with tempfile.TemporaryDirectory(prefix="gh-bench-report-") as tmp:
        project = Path(tmp)
        if args.matrix:
            templates = {r["outcome"]: r for r in reversed(records)}
            chosen = matrix_records(templates, args.matrix)
            args.items = len(chosen)
        else:
            chosen = replicate(records, args.items)
        page, wall = build_page(chosen, project, args.evidence)
        if args.keep:
            shutil.copyfile(page, args.keep)
        times = json.loads((project / "render_times.json").read_text())
        by: dict[str, list[float]] = {}
        for outcome, seconds in times:
            by.setdefault(outcome, []).append(seconds * 1000)
        result = {
            "items": args.items, "records_from": str(args.records), "distinct_records": len(records),
            "evidence": args.evidence, "pytest_wall_s": round(wall, 1),
            "unit_import_torch_s": round(unit_seconds(), 2),
            "html": page_sizes(page), "json": results_sizes(project / "results.json"),
            "render_ms_median": {o: round(statistics.median(v), 1) for o, v in by.items()},
            "browser": browser_times(page, args.repeats),
            "geometry": page_geometry(page) if find_chromium() else {},
            "unit_import_torch_s_after": round(unit_seconds(), 2),
        }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
