"""The HTML report of a real run, read as a file and in headless Chromium; the terminal lines.

One small suite runs once per module, on two xdist workers (a pass in two modes, a pass with MTP, a known-bad item
that fails as expected, an unexpected failure) with pytest-html; the tests read its page, its
data and its terminal output. The browser test skips where no Chromium is installed
(Debian: ``apt-get install chromium``).
"""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.report.browser import Chromium
from harness.report.html import read_fragments

from tests.report.chromium import needs_chromium

ROOT = Path(__file__).resolve().parents[2]
BASE = """
name: {name}
graph: {{capture_sizes: [1, 2, 4]{mode}}}
steps: 3
workload:
  requests:
    - {{prompt_len: 3, output_len: 3}}
"""
FILES = {
    "ok.yaml": BASE.format(name="ok", mode="") + "matrix:\n  graph.mode: [FULL, PIECEWISE]\n",
    "mtp.yaml": BASE.format(name="mtp", mode=", mode: FULL") + "features: {mtp: {k: 1}}\n",
    "bad.yaml": BASE.format(name="bad", mode=", mode: FULL")
    + "fixes: {host_param_update: false}\nexpect: {fail: [stale_params]}\n",
    "fail.yaml": BASE.format(name="fail", mode=", mode: FULL") + "fixes: {fia_padding: false}\n",
    "skip.yaml": BASE.format(name="skip", mode=", mode: FULL") + "expect: {skip: not modelled here}\n",
}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    project = tmp_path_factory.mktemp("report")
    (project / "scenarios").mkdir()
    for name, text in FILES.items():
        (project / "scenarios" / name).write_text(text)
    (project / "conftest.py").write_text('pytest_plugins = ["harness.pytest_plugin"]\n')
    env = dict(os.environ, COLUMNS="240", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    # -n 2: fragments and records are rendered on the workers and must reach the controller.
    done = subprocess.run([sys.executable, "-m", "pytest", "scenarios", "-p", "no:cacheprovider", "-rxfs", "-n", "2",
                           "--html=out/report.html", "--self-contained-html", "--results-json=out/r.json"],
                          cwd=project, env=env, capture_output=True, text=True, timeout=1800)
    page = (project / "out" / "report.html").read_text()
    blob = re.search(r'data-jsonblob="(.*?)"></div>', page, re.S)
    assert blob, done.stdout[-3000:]
    data = json.loads(html.unescape(blob.group(1)))
    tests = {nodeid.split("::")[-1]: entries[-1] for nodeid, entries in data["tests"].items()}
    return {"project": project, "stdout": done.stdout, "page": page, "tests": tests,
            "path": project / "out" / "report.html"}


def _page_data(page: str) -> dict:
    blob = re.search(r'data-jsonblob="(.*?)"></div>', page, re.S)
    assert blob, page[:2000]
    data = json.loads(html.unescape(blob.group(1)))
    return {nodeid: entries[-1] for nodeid, entries in data["tests"].items()}


@pytest.fixture(scope="module")
def replayed(run) -> dict:
    """The same run's page rebuilt from its results file alone (what graph-harness merge writes)."""
    from harness.report.replay import rebuild_reports

    path = run["project"] / "out" / "replayed.html"
    assert rebuild_reports(run["project"] / "out" / "r.json", html=str(path)) == 0
    page = path.read_text()
    return {"page": page, "path": path, "tests": {k.split("::")[-1]: v for k, v in _page_data(page).items()}}


def test_a_page_rebuilt_from_the_results_file_is_the_runs_page(run, replayed):
    """The merged nightly's page is drawn by the same hooks from the records: the same rows, result,
    columns, fragments and summary as the page of the run itself."""
    ran, again = run["tests"], replayed["tests"]
    assert set(ran) == set(again)
    for name, entry in ran.items():
        for column in ("result", "mode", "features", "check", "step", "bucket"):
            assert again[name][column] == entry[column], (name, column)
        assert again[name]["testId"] == entry["testId"]
    assert read_fragments(replayed["page"]) == read_fragments(run["page"])
    summary = re.compile(r'<section id="gh-summary">.*?</section>', re.S)
    assert summary.search(replayed["page"]).group(0) == summary.search(run["page"]).group(0)
    title = '<title id="head-title">graph-harness: scenarios</title>'
    assert title in run["page"] and title in replayed["page"]  # the run's title, not the replay's


def test_columns_fragments_and_css_once(run):
    page, tests = run["page"], run["tests"]
    assert set(tests) == {"ok[FULL]", "ok[PIECEWISE]", "mtp", "bad", "fail", "skip"}
    header = page[page.index('id="results-table-head"'):]
    for title in ("Mode", "Features", "Failed check", "Step", "Bucket"):
        assert f">{title}</th>" in header
    assert tests["ok[PIECEWISE]"]["mode"] == "PIECEWISE" and tests["mtp"]["features"] == "mtp1"
    assert tests["fail"]["check"] == "fia_invariant" and tests["bad"]["check"] == "stale_params"
    assert tests["fail"]["bucket"].endswith("4")  # a hidden sort prefix, then the bucket
    # each item: its fragment's key on its Mode cell, its fragment in the page's one compressed
    # store, the CSS once; nothing else of ours in pytest-html's data, no log for a passed item
    fragments = read_fragments(page)
    keys = []
    for name, entry in tests.items():
        (mode_cell,) = [c for c in entry["resultsTableRow"] if 'class="col-mode"' in c]
        keys.append(re.search(r'data-gh="(\w+)"', mode_cell).group(1))
        assert fragments[keys[-1]].startswith('<div class="gh-item">') and entry["extras"] == []
        assert (entry["log"] == "") == (entry["result"] in ("Passed", "Skipped")), name
    assert sorted(keys) == sorted(fragments) and page.count('id="gh-fragments"') == 1
    assert page.count(".gh-item h4 {") == 1 and page.count('<section id="gh-summary">') == 1


def test_no_pytest_traceback_on_known_bad_items_and_a_useful_failure_line(run):
    def log(name: str) -> str:  # without xdist's "[gw0] linux -- Python ..." first line
        text = run["tests"][name]["log"]
        return text.split("\n", 1)[1] if text.startswith("[gw") else text

    bad, fail = log("bad"), log("fail")
    assert "Traceback" not in bad and "_pytest" not in bad and len(bad) < 2000
    assert bad.startswith("scenarios/bad.yaml:2: stale_params failed at step 0, bucket 4: graph replayed")
    assert "fixes.host_param_update is false in this file (line 8)" in bad
    assert "checks: fia_invariant PASS, stale_params FAIL, stream_budget PASS, equality explained by stale_params" in bad
    assert "verdict: known-bad scenario failed exactly as expected (stale_params)" in bad
    assert fail.startswith("scenarios/fail.yaml:2: fia_invariant failed at step 0, bucket 4: FIA rejected")
    assert "fixes.fia_padding is false in this file (line 8)" in fail
    assert "reports:" not in fail  # named once, at the end of the run
    # the terminal: the short summary gives the check, then line, step and bucket; a failure
    # block has no xdist worker line; known-bad items are one line; a skip points at its file
    out = run["stdout"]
    assert re.search(r"FAILED scenarios/fail.yaml::fail - fia_invariant failed \(line 2, step 0, bucket 4\): "
                     r"FIA rejected", out), out[-2000:]
    failures = out[out.index("= FAILURES ="):out.index("short test summary info")]
    assert failures.count("scenarios/fail.yaml:2: fia_invariant failed") == 1 and "-- Python" not in failures
    assert "XFAIL [1] known-bad scenario items failed exactly the checks their files name (scenarios: 1)" in out
    assert "XFAIL scenarios/bad.yaml" not in out
    assert "SKIPPED [1] scenarios/skip.yaml:2: unsupported by design: not modelled here" in out
    assert out.count("graph-harness reports: HTML out/report.html, JSON out/r.json") == 1


@needs_chromium
@pytest.mark.parametrize("which", ["run", "replayed"])
def test_report_in_headless_chromium(which, request, tmp_path):
    run = request.getfixturevalue(which)
    rows = "#results-table tbody.results-table-row"
    shown = f"[...document.querySelectorAll('{rows}')].filter(r => !r.hidden).length"
    # two frames and a moment: pytest-html's redraw, our filter, then the IntersectionObserver
    tick = "new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => setTimeout(r, 100))))"
    ready = ("new Promise(r => { const wait = () => document.body.dataset.ghFragments ? r(document.body.dataset"
             ".ghFragments) : setTimeout(wait, 20); wait() })")
    with Chromium() as browser:
        browser.open(run["path"])
        assert browser.evaluate(ready) == "ready"  # the fragments inflated
        browser.evaluate(tick)  # rows near the viewport are filled after the first layout
        assert browser.errors == []
        # pytest-html's row template lost its <video> (no test attached media), rows are whole
        assert browser.evaluate("document.querySelectorAll('video').length") == 0
        assert browser.evaluate("document.querySelectorAll('#results-table .media').length") == 6
        assert browser.evaluate(f"document.querySelectorAll('{rows}').length") == 6
        # the grid (FULL x base holds a failure, so it is red) and the run's chart
        assert browser.evaluate("document.querySelector('#gh-grid td[data-mode=FULL][data-features=base]')"
                                ".classList.contains('gh-o-failed')")
        assert browser.evaluate("document.querySelectorAll('#gh-waste svg').length") == 1
        # only the failed row starts open (passed, skipped and known-bad rows are collapsed); it
        # got its fragment, with the per-step chart
        open_rows = "[...document.querySelectorAll('#results-table .extras-row:not(.hidden)')]"
        assert browser.evaluate(f"{open_rows}.length") == 1
        assert browser.evaluate("document.querySelectorAll('.gh-item').length") == 1
        assert browser.evaluate("document.querySelectorAll('.gh-item svg').length") >= 1
        # pytest-html's run count gives the rows (it leaves skipped tests out of its "N tests")
        assert re.match(r"6 tests took .* \(5 ran, 1 skipped\)\.$", browser.evaluate(
            "document.querySelector('.run-count').textContent.trim()"))
        # filters: by the URL hash, by a grid cell, by the form; they survive pytest-html redraws
        browser.evaluate(f"location.hash = 'mode=PIECEWISE'; {tick}")
        assert browser.evaluate(shown) == 1
        browser.evaluate(f"document.querySelector('#gh-grid td[data-mode=FULL][data-features=mtp1]').click(); {tick}")
        assert browser.evaluate(shown) == 1 and "mode=FULL" in browser.evaluate("location.hash")
        browser.evaluate("document.querySelector('#gh-filter').reset()")
        browser.evaluate(f"const s = document.querySelector('#gh-filter select[name=check]'); s.value = '*';"
                         f"s.dispatchEvent(new Event('input', {{bubbles: true}})); {tick}")
        assert browser.evaluate(shown) == 2  # the failure and the known-bad item
        browser.evaluate(f"document.querySelector('input[data-test-result=xfailed]').click(); {tick}")
        assert browser.evaluate(shown) == 1  # pytest-html's own outcome filter, then ours again
        # opening a passed row fills its details
        browser.evaluate(f"location.hash = ''; {tick}")
        browser.evaluate(f"document.querySelector('tbody.passed .col-result').click(); {tick}")
        assert browser.evaluate("document.querySelectorAll('.gh-item').length") == 2  # fail + the opened pass
        # the passed row has no log, and pytest-html's empty log box went with it
        assert browser.evaluate("document.querySelectorAll('tbody.passed .extras-row:not(.hidden) .logwrapper')"
                                ".length") == 0
        assert browser.errors == []
        browser.screenshot(tmp_path / "report.png")
