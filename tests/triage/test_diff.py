"""graph-harness diff on hand-made results files: each kind of change lands in its own bucket."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cli import main
from harness.report.diff import diff_results, load_results, parse_threshold, render_markdown, render_text, ResultsFileError


def _item(key: str, outcome: str = "passed", checks: tuple[str, ...] = (), **metrics) -> dict:
    numbers = {"graphs_captured": 5, "streams_in_use": 5, "padding_ratio": 0.25, "capture_seconds": 0.1}
    numbers.update(metrics)
    return {"key": key, "nodeid": key, "outcome": outcome, "failed_checks": list(checks),
            "verdict": f"{outcome} verdict", "metrics": numbers}


def _results(*items: dict) -> dict:
    return {"schema": 2, "run": {"commit": "abc123"}, "items": list(items)}


BASE = _results(
    _item("a.yaml::a[FULL]"),
    _item("b.yaml::b[FULL]", "xfailed", ("stale_params",)),
    _item("c.yaml::c[FULL]", "failed", ("equality",)),
    _item("d.yaml::d[FULL]", "failed", ("equality",)),
    _item("gone.yaml::g[FULL]"),
    _item("m.yaml::m[FULL]"),
)
CURRENT = _results(
    _item("a.yaml::a[FULL]"),
    _item("b.yaml::b[FULL]", "failed", ("stale_params",)),  # its expect removed: a new failure
    _item("c.yaml::c[FULL]"),  # fixed
    _item("d.yaml::d[FULL]", "failed", ("fia_invariant",)),  # fails differently
    _item("new.yaml::n[FULL]"),  # added
    _item("m.yaml::m[FULL]", graphs_captured=7, capture_seconds=0.104, padding_ratio=0.5),
)


def test_each_change_is_sorted_into_its_bucket():
    diff = diff_results(BASE, CURRENT)
    assert [(c.key, c.checks_after) for c in diff.new_failures] == [("b.yaml::b[FULL]", ["stale_params"])]
    assert [c.key for c in diff.fixed] == ["c.yaml::c[FULL]"]
    assert [(c.key, c.checks_before, c.checks_after) for c in diff.changed_checks] == [
        ("d.yaml::d[FULL]", ["equality"], ["fia_invariant"])]
    assert [c.key for c in diff.added] == ["new.yaml::n[FULL]"]
    assert [c.key for c in diff.removed] == ["gone.yaml::g[FULL]"]
    # capture time moved by 4 %: noise under the default threshold; the two others are news
    assert [(m.metric, m.before, m.after) for m in diff.metrics] == [("graphs_captured", 5, 7), ("padding_ratio", 0.25, 0.5)]
    assert diff.exit_status == 1


def test_no_change_is_an_empty_diff_with_status_zero():
    diff = diff_results(BASE, BASE)
    assert not (diff.new_failures or diff.fixed or diff.changed_checks or diff.added or diff.removed or diff.metrics)
    assert diff.exit_status == 0
    assert render_text(diff).splitlines()[1] == "no changes"


def test_a_new_item_that_fails_is_a_new_failure():
    diff = diff_results(_results(), _results(_item("x.yaml::x[FULL]", "failed", ("equality",))))
    assert [c.key for c in diff.new_failures] == [c.key for c in diff.added] == ["x.yaml::x[FULL]"]


def test_thresholds_are_configurable():
    name, limits = parse_threshold("capture_seconds=0.01:0")
    diff = diff_results(BASE, CURRENT, thresholds={name: limits})
    assert "capture_seconds" in {m.metric for m in diff.metrics}
    with pytest.raises(ValueError, match="METRIC"):
        parse_threshold("speed=1")


def test_markdown_escapes_table_cells():
    current = _results(_item("p.yaml::p[a|b]", "failed", ("equality",)))
    text = render_markdown(diff_results(_results(), current))
    assert "`p.yaml::p[a\\|b]`" in text and "### New failures (1)" in text


def test_schema_1_files_are_read_with_keys_rebuilt(tmp_path):
    old = {"schema": 1, "environment": {}, "summary": {}, "items": [
        {"name": "x", "id": "sp2", "source": "scenarios/x.yaml:3", "outcome": "passed", "failed_checks": [],
         "verdict": "ok", "run": {"mode": "FULL", "graphs_captured": 3, "steps": []}}]}
    new = _results(_item("scenarios/x.yaml::x[sp2-FULL]", graphs_captured=3))
    (tmp_path / "old.json").write_text(json.dumps(old))
    diff = diff_results(load_results(tmp_path / "old.json"), new)
    assert not diff.added and not diff.removed


def test_schema_1_absolute_sources_match_the_root_relative_node_ids():
    old = {"schema": 1, "items": [
        {"name": "x", "id": "FULL", "source": "/ci/checkout/scenarios/x.yaml:3", "outcome": "passed",
         "failed_checks": [], "verdict": "ok", "run": {"mode": "FULL"}}]}
    diff = diff_results(old, _results(_item("scenarios/x.yaml::x[FULL]")))
    assert not diff.added and not diff.removed


def test_runs_that_share_few_items_list_each_added_and_removed_item():
    # DeepDiff >= 8 reports dicts sharing under a third of their keys as one root change by
    # default; the diff must still name every item (regression: an IndexError on that path).
    base = _results(_item("a.yaml::a[FULL]"), *(_item(f"old.yaml::o[{i}-FULL]") for i in range(5)))
    current = _results(_item("a.yaml::a[FULL]"), *(_item(f"new.yaml::n[{i}-FULL]", "failed", ("equality",))
                                                   for i in range(5)))
    diff = diff_results(base, current)
    assert len(diff.added) == 5 and len(diff.removed) == 5 and len(diff.new_failures) == 5


@pytest.mark.parametrize("content, message", [
    (None, "cannot read"),
    ("{not json", "not JSON"),
    ('{"schema": 2}', "no 'items' list"),
    ('{"schema": 9, "items": []}', "results schema 9"),
])
def test_bad_files_are_one_line_and_status_2(tmp_path, capsys, content, message):
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_text(content)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(BASE))
    assert main(["diff", str(bad), str(good)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and str(bad) in err
    with pytest.raises(ResultsFileError):
        load_results(bad)


def test_cli_writes_each_format(tmp_path, capsys):
    (tmp_path / "a.json").write_text(json.dumps(BASE))
    (tmp_path / "b.json").write_text(json.dumps(CURRENT))
    assert main(["diff", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--format=json",
                 "-o", str(tmp_path / "out/d.json")]) == 1
    data = json.loads((tmp_path / "out/d.json").read_text())
    assert data["exit_status"] == 1 and data["new_failures"][0]["key"] == "b.yaml::b[FULL]"
    assert main(["diff", str(tmp_path / "b.json"), str(tmp_path / "b.json"), "--format=markdown"]) == 0
    assert "no changes" in capsys.readouterr().out


def test_timing_noise_of_two_runs_of_one_commit_is_no_change():
    # The extremes of two real runs of one commit (make scenarios, the second beside two CPU
    # burners): a small item's capture 31x slower, a 2 s item 7x faster, a 40-layer one 17 s slower.
    times = {"small": (0.0214, 0.6737), "mid": (1.971, 0.2767), "big": (4.0967, 21.6065)}
    base = _results(*(_item(f"{k}.yaml::{k}[FULL]", capture_seconds=a) for k, (a, _) in times.items()))
    again = _results(*(_item(f"{k}.yaml::{k}[FULL]", capture_seconds=b) for k, (_, b) in times.items()))
    diff = diff_results(base, again)
    assert diff.unchanged and diff.metrics == [] and diff.noise == 3 and diff.exit_status == 0
    text = render_text(diff)
    assert text.splitlines()[1] == "no changes" and "3 capture-time move(s) within timing noise" in text
    assert "no changes" in render_markdown(diff)
    # a gross change is still news: tenfold and seconds
    slower = _results(_item("small.yaml::small[FULL]", capture_seconds=0.3), _item("big.yaml::big[FULL]", capture_seconds=60.0))
    assert [m.key for m in diff_results(base, slower).metrics] == ["big.yaml::big[FULL]"]
    # and every move is listed on request
    listed = diff_results(base, again, thresholds={"capture_seconds": (0.0, 0.0)})
    assert len(listed.metrics) == 3 and listed.noise == 0


def test_two_real_runs_of_one_commit_on_a_loaded_machine_say_no_changes(capsys):
    # make scenarios twice at one commit, the second beside two CPU burners (load average 24),
    # each reduced to what diff reads: capture times moved up to 31x and by up to 17.5 s.
    data = Path(__file__).with_name("data")
    a, b = str(data / "same_commit_a.json"), str(data / "same_commit_b.json")
    assert load_results(a)["run"]["commit"] == load_results(b)["run"]["commit"]
    assert main(["diff", a, b]) == 0
    assert capsys.readouterr().out.splitlines()[1] == "no changes"
    assert main(["diff", a, b, "--threshold", "capture_seconds=0:0"]) == 0
    assert "METRICS MOVED (82)" in capsys.readouterr().out
