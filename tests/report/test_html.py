"""The per-item HTML fragment, the page summary and the check states, from records of real (tiny) runs."""

from __future__ import annotations

import copy
import re

import pytest

from harness.report import charts
from harness.report.html import read_fragments, render_fragments, render_item, render_page, row_values
from harness.report.view import check_states, first_failure
from harness.report.results import item_record, summary_record
from harness.report.terminal import states_line
from harness.report.html_hooks import report_title
from harness.scenario import load_scenario_text
from harness.session import run_point

TINY = """
name: tiny
description: "tiny <script>alert('x')</script> & co"
workload:
  requests:
    - {prompt_len: 5, output_len: 6}
    - {prompt_len: 3, output_len: 4, arrival_step: 1}
graph: {mode: FULL, capture_sizes: [1, 2, 4, 8]}
steps: 6
"""
STALE = TINY + "fixes: {host_param_update: false}\nexpect: {fail: [stale_params]}\n"
UNPADDED_FIA = TINY + "fixes: {fia_padding: false}\n"
SMALL_POOL = TINY + "engine: {stream_pool: 2}\n"
ENV = {"torch": "x"}


def _record(text: str, evidence: str = "failures") -> dict:
    (point,) = load_scenario_text(text)
    return item_record(run_point(point), ENV, evidence=evidence)


@pytest.fixture(scope="module")
def good_full() -> dict:
    """A passing item with every piece of evidence (``--report-evidence=all``)."""
    return _record(TINY, evidence="all")


@pytest.fixture(scope="module")
def good(good_full) -> dict:
    """The same item as the plugin records it by default: a summary."""
    return summary_record(good_full)


@pytest.fixture(scope="module")
def stale() -> dict:
    return _record(STALE)


def _text(html: str) -> str:
    return re.sub(r"<[^>]+>", "", html)


def test_passing_item_by_default_shows_its_checks_only(good):
    assert good["outcome"] == "passed" and good["evidence"] == "summary"
    html = render_item(good)
    assert html.count(">PASS<") == 4 and ">FAIL<" not in html and "not evaluated" not in html
    assert "all four checks passed" in html and "4 graphs, 4 of 2048 streams (0.2%)" in html
    assert "&lt;string&gt;:2" in html and 'capture sizes <span class="gh-tok">1 2 4 8</span>' in html
    # no per-step evidence, texts, scenario YAML or stream-budget section: a passing item is small
    for absent in ("Generated texts", "Per-step dispatch", "Scenario as run", "<h4>Stream budget", "<svg"):
        assert absent not in html
    assert len(html) < 1200


def test_a_summary_keeps_what_the_grid_the_charts_and_diff_read(good, good_full):
    assert charts.padding_by_bucket([good]) == charts.padding_by_bucket([good_full]) != {}
    assert good["metrics"] == good_full["metrics"] and good["metrics"]["steps"] == 6
    for field in ("key", "outcome", "verdict", "failed_checks", "scenario", "source", "duration"):
        assert good[field] == good_full[field]
    assert row_values(good) == row_values(good_full)
    assert [(s.name, s.state, s.summary) for s in check_states(good)] == \
        [(s.name, s.state, s.summary) for s in check_states(good_full)]
    assert "steps" not in good["run"] and "texts" not in good["run"] and "by_bucket" not in good["run"]["stream_usage"]
    assert good["checks"]["equality"]["details"] == {"compared": 12, "graph_compared": 6}


def test_passing_item_with_all_evidence_shows_checks_texts_and_dispatch(good_full):
    assert good_full["outcome"] == "passed" and good_full["evidence"] == "full"
    html = render_item(good_full)
    assert html.startswith('<div class="gh-item">') and "<style" not in html  # CSS is once per page
    for name in ("fia_invariant", "equality", "stale_params", "stream_budget"):
        assert name in html
    assert html.count(">PASS<") == 4 and ">FAIL<" not in html
    assert "First failure" not in html and "<svg" not in html  # charts only where a triager looks
    assert "all four checks passed" in html
    assert "&lt;string&gt;:2" in html and "emulated" in html
    assert "mode <b>FULL</b>" in html and "features <b>base</b>" in html
    # texts side by side, always, even when the check passed
    assert "Generated texts" in html and "reference tokens" in html
    assert "5 6 7 8 9 10" in html and "<mark>" not in html
    # dispatch table
    assert "Per-step dispatch" in html
    assert "r0:0+5" in html and "r1:0+3" in html
    assert "exact FULL key for 8 tokens" in html and ">FULL<" in html
    assert "real=5, bucket=3" in html
    assert "gh-diff" not in html.split("Per-step dispatch")[1].split("</table>")[0].replace('class="gh-diff"', "")
    # stream budget
    assert "Stream budget" in html and "0.2%" in html
    # scenario: YAML, collapsed, escaped
    assert "Scenario as run (YAML)" in html and "<details><summary>Scenario" in html
    assert "mode: FULL" in html
    assert "<script>" not in html
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in html


def test_known_bad_stale_params(stale):
    assert stale["outcome"] == "xfailed"
    html = render_item(stale)
    assert "xfailed (known-bad, failed as expected)" in html
    assert "capture-time" in html
    # the first failure leads, with the fix switch the file turned off
    first = html.index("First failure: stale_params")
    assert first < html.index("<h4>Checks</h4>")
    assert "at step 0, bucket 8" in html and "fixes.host_param_update is false in this file" in html
    # check states: equality's mismatches are explained by stale_params, not a green PASS
    assert 'gh-s-explained">explained by stale_params<' in html and html.count(">PASS<") == 2
    # the failing check's evidence comes before the explained mismatches, and a chart is drawn
    assert html.index("Stale host parameters") < html.index("Equality:")
    assert html.count("<svg") == 1 and "first failure" in html
    assert "Stale host parameters" in html and "executed (graph)" in html
    # graph text differs from the reference: highlighted, with repetition scores
    assert "<mark>" in html
    assert 'class="gh-diff"' in html
    assert "1.00 / 6" in html and "0.00 / 1" in html
    # equality mismatches explained by the stale check, with metadata deepdiff and executed lists
    assert "Equality:" in html and "explained by another check" in html
    assert row_values(stale) == {"mode": "FULL", "features": "base", "check": "stale_params", "step": "0",
                                 "bucket": "8"}
    assert "deepdiff" in html and "iterable_item_added" in html
    assert "root[&#39;actual_seq_lengths&#39;][1]" in html
    assert "host lists the graph executed" in html and "layer 0: actual_seq_lengths=" in html
    # rows where paths sampled different tokens are marked
    steps = html.split("Per-step dispatch")[1]
    assert "<b>differ</b>" in steps


def test_fia_violation_and_stream_budget_failure():
    fia = render_item(_record(UNPADDED_FIA))
    assert "FIA invariant: 2 rejected call(s)" in fia
    assert "561002" in fia and "relaxed would accept" in fia
    assert "unpadded metadata: last element &lt; T (5 &lt; 8)" in fia
    assert "Path errors" in fia and "FiaContractError" in fia

    budget = render_item(_record(SMALL_POOL))
    assert "207008" in budget and "Path errors" in budget and "StreamBudgetError" in budget
    assert ">FAIL<" in budget


def test_fia_table_is_capped():
    record = {"outcome": "failed", "checks": {"fia_invariant": {
        "name": "fia_invariant", "passed": False, "summary": "s",
        "details": {"contract": "strict", "calls": 50,
                    "violations": [{"step": i, "message": "<bad>", "relaxed_ok": i % 2 == 0} for i in range(50)]}}}}
    html = render_item(record)
    assert "38 more violations not shown" in html
    assert "&lt;bad&gt;" in html and "<bad>" not in html


def test_crashed_and_skipped_records_render(good):
    crashed = copy.deepcopy(good)
    crashed.update(outcome="failed", verdict="harness error: RuntimeError: <boom>", run={}, checks={},
                   failed_checks=[], traceback="Traceback (most recent call last):\n  <frame>\nRuntimeError: <boom>")
    html = render_item(crashed)
    assert "no check ran" in html and "no run evidence" in html
    assert "Traceback" in html and "&lt;boom&gt;" in html and "<boom>" not in html

    (point,) = load_scenario_text(TINY + "features: {sp: {tp: 2}, cp: {size: 2}}\n")
    skipped = item_record(run_point(point), ENV)
    assert skipped["outcome"] == "skipped" and skipped["run"] == {}
    html = render_item(skipped)
    assert "skipped" in html and "not modelled" in html

    # hand-made partial / malformed records never raise
    for partial in ({}, {"outcome": "failed"}, {"run": None, "checks": None, "scenario": None},
                    {"run": {"steps": [{"requests": [["r0"]], "sampled": None}], "stream_usage": {"in_use": 1}},
                     "checks": {"equality": {"passed": False, "details": {"mismatches": [{"metadata_diff": {"x": 1}}]}},
                                "stale_params": {"details": {"texts": {"graph": {"r0": [1, 2]}}}}}}):
        assert '<div class="gh-item">' in render_item(partial)


def test_records_written_before_checks_said_evaluated_still_read_not_evaluated(good):
    legacy = copy.deepcopy(good)
    for check in legacy["checks"].values():
        check.pop("evaluated")
    legacy["checks"]["equality"]["details"]["compared"] = 0
    legacy["checks"]["fia_invariant"]["details"]["calls"] = 0
    states = {s.name: s for s in check_states(legacy)}
    assert states["equality"].label == "not evaluated" and states["fia_invariant"].state == "not-evaluated"
    html = render_item(legacy, draw_charts=False)
    assert html.count(">not evaluated<") == 2 and html.count(">PASS<") == 2
    assert first_failure(legacy) is None


# The graph path never replays: its captures exhaust a 2-stream pool (the issue's
# stream_budget_none), or it runs only PIECEWISE (no FULL replay whose host lists could go stale).
@pytest.mark.parametrize("text, idle", [
    (SMALL_POOL, {"equality", "stale_params"}),
    (TINY.replace("mode: FULL", "mode: PIECEWISE"), {"stale_params"}),
])
def test_a_check_that_looked_at_nothing_says_not_evaluated_in_json_html_and_terminal(text, idle):
    record = _record(text)
    checks = record["checks"]
    # the JSON: the check says it, with the state word the page's badge uses
    assert {n for n, c in checks.items() if c["evaluated"] is False} == idle
    assert {n for n, c in checks.items() if c["state"] == "not-evaluated"} == idle
    for name in idle:
        assert checks[name]["passed"] and checks[name]["summary"].startswith("not evaluated: ")
        assert "comparisons equal" not in checks[name]["summary"] and "live on every replay" not in checks[name]["summary"]
    # the HTML: a "not evaluated" badge beside a summary that says the same, never PASS
    rows = {name: (label, summary) for name, label, summary in re.findall(
        r"<tr><th>(\w+)</th><td><span [^>]*>([^<]+)</span></td><td>([^<]*)</td>", render_item(record, draw_charts=False))}
    assert {n for n, (label, _) in rows.items() if label == "not evaluated"} == idle
    assert all(summary.startswith("not evaluated: ") for n, (_, summary) in rows.items() if n in idle)
    # the terminal: the failure block lists each check's state with the same words
    states = states_line(record)
    for name in idle:
        assert f"{name} not evaluated" in states
    if record["outcome"] == "passed":  # and the verdict does not claim all four passed
        assert "all four checks passed" not in record["verdict"]
        assert record["verdict"].endswith("not evaluated: " + ", ".join(sorted(idle)))


def test_one_count_has_one_number_in_the_summary_the_heading_and_the_json():
    many = STALE.replace("steps: 6", "steps: 12") + "model: {layers: 3}\n"
    record = _record(many)
    details = record["checks"]["stale_params"]["details"]
    total = details["stale_total"]
    assert total > len(details["stale"]) == 20  # the JSON keeps the first 20 and the count
    assert f"{total} stale list(s) in all" in record["checks"]["stale_params"]["summary"]
    html = _text(render_item(record, draw_charts=False))
    assert f"Stale host parameters: {total} stale list(s)" in html
    assert f"{total - 12} more stale lists not shown" in html  # 12 rows shown of the total


def test_page_grid_charts_and_filters(good, stale):
    crashed = dict(good, outcome="failed", run={})
    skipped = {"outcome": "skipped", "scenario": {"graph": {"mode": "PIECEWISE"}, "features": {"sp": {"tp": 2}}}}
    html = render_page([good, stale, crashed, skipped])
    assert html.count("<style>") == 1 and html.count("<script") == 1 and 'data-gh-media="1"' in html
    assert 'id="gh-grid"' in html
    # FULL x base holds a pass, a known-bad and a failure: the failure colours it
    assert 'class="gh-cell gh-o-failed" data-mode="FULL" data-features="base"' in html
    assert 'data-mode="PIECEWISE" data-features="sp2"' in html and ">1/3<" in html
    # the legend says what a cell shows, and each cell shows it: its items, failed/total when some failed
    assert "a cell shows how many items it holds, as failed/total when some failed" in html
    for title, text in re.findall(r'title="([^"]*)">([^<]*)</td>', html):
        counts = {outcome: int(n) for n, outcome in re.findall(r"(\d+) (\w+)", title.split(": ", 1)[1])}
        total, failed = sum(counts.values()), counts.get("failed", 0)
        assert text == (f"{failed}/{total}" if failed else str(total)), (title, text)
    # one row per feature combination, one column per mode: never wider than five modes
    assert re.search(r"<thead><tr><th>features \\ mode</th><th>PIECEWISE</th><th>FULL</th></tr>", html), html[:3000]
    assert 'id="gh-waste"' in html and html.count("<svg") == 1
    assert 'id="gh-filter"' in html and "<option>stale_params</option>" in html
    assert "peak stream utilisation <b>0.2%</b>" in html
    empty = render_page([])
    assert "no scenario item ran" in empty and "<svg" not in empty


def test_fragments_are_compressed_once_and_cannot_end_their_script_element():
    fragments = {"k1": "<div>a</div>", "k2": "<p><!--<script></script><script>alert(1)</SCRIPT>"}
    page = render_fragments(fragments)
    assert page.count("<script") == 1 and page.count("</script>") == 1 and "<!--" not in page
    assert 'id="gh-fragments" data-count="2"' in page and "alert" not in page
    assert read_fragments("<html>" + page + "</html>") == fragments
    # a run's fragments repeat each other: together they compress many times over
    many = {f"k{i}": f'<div class="gh-item"><p>item {i} passed</p><table>{"<tr><td>PASS</td></tr>" * 4}</table></div>'
            for i in range(200)}
    assert len(render_fragments(many)) * 5 < sum(len(v) for v in many.values())
    assert read_fragments("no fragments here") == {}


def test_charts_are_inline_svg_with_ids_unique_per_chart():
    steps = [{"step": 0, "ledger": {"real": 5, "bucket": 3}, "num_tokens_padded": 8, "runtime_mode": "FULL"},
             {"step": 1, "ledger": {"real": 3, "sp": 1}, "num_tokens_padded": 4, "runtime_mode": "FULL"},
             {"step": 2, "ledger": {"real": 2}, "num_tokens_padded": 2, "runtime_mode": "NONE"}]
    first = charts.step_tokens_svg(steps, failed_step=0, salt="a")
    second = charts.step_tokens_svg(steps, salt="b")
    assert first.startswith("<svg") and "<?xml" not in first and "<metadata" not in first
    assert ">first failure<" in first and ">first failure<" not in second
    assert ">real<" in first and ">bucket<" in first and ">sp<" in first  # text stays text
    ids = lambda svg: set(re.findall(r' id="([^"]+)"', svg))  # noqa: E731
    assert ids(first) and not ids(first) & ids(second)
    streams = charts.streams_svg([{"bucket": 8, "in_use": 1}, {"bucket": 4, "in_use": 2},
                                  {"bucket": 2, "in_use": 2, "needed": 1, "failed": True}], 2)
    assert ">pool (2)<" in streams and ">needed (failed)<" in streams
    assert charts.padding_by_bucket([{"run": {"steps": steps}}]) == {4: {"steps": 1, "real": 3, "sp": 1},
                                                                     8: {"steps": 1, "real": 5, "bucket": 3}}
    assert charts.step_tokens_svg([]) == "" and charts.streams_svg([], 2) == "" and charts.padding_waste_svg([]) == ""
    assert "chart not drawn: ZeroDivisionError" in charts.safely(lambda: 1 / 0)


def test_the_page_keeps_the_video_template_only_when_a_test_attached_media():
    from types import SimpleNamespace

    from harness.report.html_hooks import HtmlReport

    hooks = HtmlReport([])
    hooks.pytest_runtest_logreport(SimpleNamespace(when="call", nodeid="t::a", extras=[{"format_type": "html"}]))
    assert not hooks.media  # an HTML extra is not media: the page drops pytest-html's <video>
    hooks.pytest_runtest_logreport(SimpleNamespace(when="call", nodeid="t::b", extras=[{"format_type": "image"}]))
    assert hooks.media
    assert 'data-gh-media="0"' in render_page([], media=False) and 'data-gh-media="1"' in render_page([], media=True)


def test_an_xdist_controller_imports_matplotlib_while_its_workers_run(monkeypatch):
    """The summary charts are drawn once the workers are done: the import is done before."""
    import threading

    from harness.report.html_hooks import HtmlReport

    calls: list[str] = []
    monkeypatch.setattr(charts, "preload", lambda: calls.append(threading.current_thread().name))
    HtmlReport([], preload_charts=False).pytest_sessionstart(None)
    HtmlReport([], preload_charts=True).pytest_sessionstart(None)
    for thread in threading.enumerate():
        if thread.name == "graph-harness-charts":
            thread.join(timeout=60)
    assert calls == ["graph-harness-charts"]  # once, off the main thread


def test_preloading_the_charts_never_raises(monkeypatch):
    def broken():
        raise ImportError("no matplotlib here")

    monkeypatch.setattr(charts, "_matplotlib", broken)
    charts.preload()  # the chart that needs it says so, not the preload


def test_the_page_title_says_what_ran():
    assert report_title(["tests", "scenarios"]) == "graph-harness: tests, scenarios"  # make test
    assert report_title(["scenarios/"], ["FULL"]) == "graph-harness: scenarios/ (FULL)"  # make scenarios
    assert report_title(["/repo/scenarios/x.yaml::x[FULL]"], cwd="/repo") == "graph-harness: scenarios/x.yaml::x[FULL]"
    assert "graph-mode scenarios" not in report_title(["tests"])
