#!/usr/bin/env python
"""Benchmark of the HTML report at scale: size per item, render time per item, browser time.

    .venv/bin/python benchmarks/report.py [--items 1000] [--records reports/scenarios.json]
                                          [--out reports/bench-report.json] [--keep PAGE.html]

A pytest run of ``--items`` synthetic items, each carrying a real item record (taken in turn
from a results file of a real run, ``make scenarios``'s by default, and spread over every
graph mode and feature combination so that the grid is full), through the real plugin and
pytest-html (``--self-contained-html``). Measures, in one run:

* ``render``: ms per item to render its fragment (Jinja2; and matplotlib charts for failing
  and known-bad items), timed around :func:`harness.report.html_hooks.attach_fragment`;
* ``size``: bytes of the HTML page per item;
* ``open``: seconds from navigation to the load event in headless Chromium (parsing, pytest-html
  building its table, the graph-harness script filling the open rows), and ``filter``: ms for
  a filter change to be applied and laid out (pytest-html's outcome checkbox: it rebuilds the
  whole table; the graph-harness mode filter: it hides rows);
* ``unit``: seconds of ``python -c "import torch"`` in the same run, the unit the README
  compares against (machines are noisy; ratios within one run are what carry over).
"""

from __future__ import annotations

import argparse
import json
import os
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

MODES = ["NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"]
FEATURES = [{}, {"sp": {"tp": 2}}, {"dp": {"size": 2}}, {"mtp": {"k": 1}}, {"mtp": {"k": 2}}, {"cp": {"size": 2}},
            {"sp": {"tp": 2}, "mtp": {"k": 1}}, {"dp": {"size": 2}, "mtp": {"k": 1}}]

CONFTEST = '''
import json, time
from pathlib import Path
import pytest
from harness.report.html_hooks import attach_fragment
from harness.report.results import RECORD_KEY

RECORDS = json.loads(Path(__file__).with_name("records.json").read_text())
TIMES = []

def record_of(i):
    return RECORDS[int(i) % len(RECORDS)]

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.when != "call":
        return
    record = record_of(item.callspec.params["i"])
    setattr(report, RECORD_KEY, record)   # the record as a report attribute (results v2)
    started = time.perf_counter()
    attach_fragment(report, record)
    TIMES.append((record["outcome"], time.perf_counter() - started))

def pytest_sessionfinish(session):
    Path(session.config.rootpath, "render_times.json").write_text(json.dumps(TIMES))
'''

TEST = '''
import pytest
from conftest import record_of

@pytest.mark.parametrize("i", range({items}))
def test_item(i):
    outcome = record_of(i)["outcome"]
    if outcome == "xfailed":
        pytest.xfail("known-bad scenario failed exactly as expected")
    if outcome == "skipped":
        pytest.skip("not modelled")
    if outcome == "failed":
        raise AssertionError("scenario failed")
'''


def spread(records: list[dict], items: int) -> list[dict]:
    """``items`` records: the real ones in turn, each under a mode and a feature combination."""
    out = []
    for i in range(items):
        record = json.loads(json.dumps(records[i % len(records)]))
        mode, features = MODES[i % len(MODES)], FEATURES[(i // len(MODES)) % len(FEATURES)]
        record.setdefault("run", {})
        if record["run"]:
            record["run"]["mode"] = mode
        scenario = record.setdefault("scenario", {}) or {}
        scenario.setdefault("graph", {})["mode"] = mode
        scenario["features"] = features
        record["name"] = f"{record.get('name')}-{i}"
        out.append(record)
    return out


def unit_seconds() -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    return time.perf_counter() - started


def browser_times(page: Path) -> dict:
    if find_chromium() is None:
        return {"open_s": None, "filter_outcome_ms": None, "filter_mode_ms": None, "errors": ["no chromium"]}
    settle = "new Promise(r => requestAnimationFrame(() => setTimeout(r, 0)))"
    timed = ("new Promise(r => {{ const t = performance.now(); {action}; "
             "requestAnimationFrame(() => setTimeout(() => r(performance.now() - t), 0)) }})")
    with Chromium() as browser:
        opened = browser.open(page)
        browser.evaluate(settle)
        rows = browser.evaluate("document.querySelectorAll('#results-table tbody.results-table-row').length")
        outcome = browser.evaluate(timed.format(action="document.querySelector('input[data-test-result=passed]').click()"))
        browser.evaluate(timed.format(action="document.querySelector('input[data-test-result=passed]').click()"))
        mode = browser.evaluate(timed.format(action="location.hash = 'mode=FULL'; window.dispatchEvent(new HashChangeEvent('hashchange'))"))
        shown = browser.evaluate("document.body.dataset.ghShown")
        return {"open_s": round(opened, 2), "rows": rows, "filter_outcome_ms": round(outcome), "filter_mode_ms": round(mode),
                "rows_after_mode_filter": int(shown), "errors": browser.errors}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--records", type=Path, default=ROOT / "reports" / "scenarios.json")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "bench-report.json")
    parser.add_argument("--keep", type=Path, default=None, help="copy the generated HTML page here")
    args = parser.parse_args()
    records = json.loads(args.records.read_text())["items"]
    with tempfile.TemporaryDirectory(prefix="gh-bench-report-") as tmp:
        project = Path(tmp)
        (project / "records.json").write_text(json.dumps(spread(records, args.items)))
        (project / "conftest.py").write_text(CONFTEST)
        (project / "test_items.py").write_text(TEST.format(items=args.items))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--html=report.html",
                        "--self-contained-html", "--results-json=results.json", "-o", "addopts="],
                       cwd=project, env=env, check=False, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - started
        page = project / "report.html"
        if args.keep:
            shutil.copyfile(page, args.keep)
        times = json.loads((project / "render_times.json").read_text())
        by = {}
        for outcome, seconds in times:
            by.setdefault(outcome, []).append(seconds * 1000)
        result = {
            "items": args.items, "records_from": str(args.records), "pytest_wall_s": round(wall, 1),
            "unit_import_torch_s": round(unit_seconds(), 2),
            "html_bytes": page.stat().st_size, "html_kb_per_item": round(page.stat().st_size / args.items / 1024, 1),
            "render_ms_median": {o: round(statistics.median(v), 1) for o, v in by.items()},
            "render_ms_total_per_item": round(sum(s for _, s in times) * 1000 / len(times), 1),
            **browser_times(page),
        }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print("| measure | value |\n|---|---|")
    for key, value in result.items():
        print(f"| {key} | {value} |")


if __name__ == "__main__":
    main()
