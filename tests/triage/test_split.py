"""A run split over runners (pytest-split's --splits/--group), its durations file and its merge.

Through the real plugin and pytest-split in pytester projects: every item lands in exactly one
group (with durations for some items, none, or all; with and without pytest-xdist, which must
not change which group an item is in), the run record says which group ran what, and
``graph-harness merge`` gives back one run, the unsplit run's verdicts item for item, or
refuses with every problem named.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import harness.pytest_plugin  # noqa: F401 - imported once for pytester's in-process runs
import harness.report.html  # noqa: F401
import harness.session  # noqa: F401
from harness.cli import main as cli
from harness.report.durations import MIN_COST_S, durations, item_cost
from harness.report.html import read_fragments
from harness.report.merge import MergeError, Shard, merge
from harness.report.verdicts import compare_files, differences

from tests.pytester_project import TINY, harness_project

pytest_plugins = ["pytester"]

pytest.importorskip("pytest_split")

#: Six FULL items, one of them known-bad (fails stale_params as its file expects), one failing.
MATRIX = TINY.format(mode=", mode: FULL", extra="matrix:\n  model.dtype: [float32, bfloat16]\n"
                                               "  steps: [2, 3, 4]\n")
KNOWN_BAD = TINY.format(mode=", mode: FULL", extra="fixes: {host_param_update: false}\n"
                                                 "expect: {fail: [stale_params], reason: frozen host lists}")
FAILING = TINY.format(mode=", mode: FULL", extra="fixes: {host_param_update: false}")


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    project = harness_project(pytester)
    for name, text in (("matrix", MATRIX), ("known_bad", KNOWN_BAD), ("failing", FAILING)):
        (project.path / "scenarios").mkdir(exist_ok=True)
        (project.path / f"scenarios/{name}.yaml").write_text(text)
    return project


def _run(project: pytest.Pytester, out: str, *args: str) -> dict:
    project.runpytest("-p", "no:cacheprovider", f"--results-json={out}", *args)
    return json.loads((project.path / out).read_text())


def _ids(data: dict) -> set[str]:
    return {item["nodeid"] for item in data["items"]}


def test_every_item_lands_in_exactly_one_group_with_or_without_xdist(project):
    whole = _run(project, "whole.json")
    assert len(whole["items"]) == 8
    # durations for some items only: the others get pytest-split's average, and still one group
    known = sorted(_ids(whole))[:3]
    (project.path / ".test_durations").write_text(json.dumps({nodeid: 2.0 for nodeid in known}))
    serial, parallel = [], []
    for group in (1, 2, 3):
        serial.append(_run(project, f"s{group}.json", "--splits", "3", "--group", str(group)))
        parallel.append(_run(project, f"p{group}.json", "--splits", "3", "--group", str(group), "-n", "2"))
    for one, two in zip(serial, parallel):  # least_duration does not depend on the collection order
        assert _ids(one) == _ids(two)
        assert one["run"]["split"]["selected"] and set(one["run"]["split"]["selected"]) == _ids(one)
        assert set(two["run"]["split"]["collected"]) == _ids(whole)
    groups = [_ids(data) for data in serial]
    assert sum(len(g) for g in groups) == 8 and set().union(*groups) == _ids(whole)
    assert all(groups)
    first = serial[0]["run"]
    assert first["split"]["algorithm"] == "least_duration" and first["split"]["durations"]["found"]
    assert first["split"]["durations"]["path"] == ".test_durations"
    assert first["title"].endswith("(group 1 of 3)")


def test_the_recorded_collection_is_after_marker_selection_and_before_the_split(project):
    data = _run(project, "g1.json", "--splits", "2", "--group", "1", "-m", "known_bad")
    split = data["run"]["split"]
    assert split["collected"] == ["scenarios/known_bad.yaml::tiny"]
    assert split["algorithm"] == "least_duration"
    named = _run(project, "g2.json", "--splits", "2", "--group", "1", "--splitting-algorithm=duration_based_chunks")
    assert named["run"]["split"]["algorithm"] == "duration_based_chunks"  # a named algorithm is kept


def test_merged_groups_are_the_unsplit_run(project, tmp_path):
    whole = _run(project, "whole.json", "-n", "2")
    shards = [str(project.path / f"g{g}.json") for g in (1, 2, 3)]
    for group in (1, 2, 3):
        _run(project, f"g{group}.json", "--splits", "3", "--group", str(group), "-n", "2")
    merged, page = tmp_path / "merged.json", tmp_path / "merged.html"
    assert cli(["merge", *shards, "-o", str(merged), "--html", str(page)]) == 0
    rows, _, _ = compare_files(project.path / "whole.json", merged)
    assert len(rows) == 8 and not differences(rows)
    data = json.loads(merged.read_text())
    assert data["summary"] == whole["summary"] == {"passed": 6, "xfailed": 1, "failed": 1}
    run = data["run"]
    assert [g["group"] for g in run["groups"]] == [1, 2, 3] and run["split"]["items"] == 8
    assert "--group" not in run["command"] and run["title"].endswith("(3 groups merged)")
    html = page.read_text()
    assert len(read_fragments(html)) == 8  # every item's fragment, as pytest-html's page of a run
    for nodeid in _ids(whole):
        assert nodeid in html
    assert "(3 groups merged)" in html and "gh-grid" in html
    assert cli(["diff", str(project.path / "whole.json"), str(merged)]) == 0


def _shards(project: pytest.Pytester) -> list[Shard]:
    out = []
    for group in (1, 2):
        data = _run(project, f"g{group}.json", "--splits", "2", "--group", str(group))
        out.append(Shard(f"g{group}.json", data))
    return out


def _problems(shards: list[Shard]) -> str:
    with pytest.raises(MergeError) as error:
        merge(shards)
    return str(error.value)


def test_a_merge_refuses_groups_that_are_not_one_run(project):
    one, two = _shards(project)
    assert len(merge([one, two])[1]) == 8

    other = json.loads(json.dumps(two.data))
    other["run"]["commit"] = "0" * 40
    assert "groups from different commits: commit differs" in _problems([one, Shard("g2.json", other)])

    other = json.loads(json.dumps(two.data))
    other["run"]["options"]["stack"] = "v0.18.0"
    assert "groups from different stacks: --stack differs" in _problems([one, Shard("g2.json", other)])

    other = json.loads(json.dumps(two.data))
    dropped = other["run"]["split"]["collected"].pop()
    said = _problems([one, Shard("g2.json", other)])
    assert "groups from different item sets" in said and f"only in g1.json: {dropped}" in said

    said = _problems([one])
    assert "group 2 of 2 is missing" in said
    for nodeid in two.data["run"]["split"]["selected"][:5]:
        assert nodeid in said  # the items nobody ran are named
    assert "group 1 of 2 appears 2 times" in _problems([one, one])

    other = json.loads(json.dumps(two.data))
    lost = other["items"].pop()["nodeid"]
    said = _problems([one, Shard("g2.json", other)])
    assert f"missing from g2.json (group 2): {lost}" in said

    other = json.loads(json.dumps(two.data))
    other["items"].append(one.data["items"][0])
    said = _problems([one, Shard("g2.json", other)])
    assert f"doubled: 1 item(s) in each of g1.json (group 1), g2.json (group 2): {one.data['items'][0]['nodeid']}" \
        in said and "holds items its group did not select" in said


def test_the_merge_command_says_each_problem_and_exits_2(project, capsys):
    _shards(project)
    out = str(project.path / "m.json")
    assert cli(["merge", str(project.path / "g1.json"), "-o", out]) == 2
    assert "graph-harness merge: group 2 of 2 is missing" in capsys.readouterr().err
    assert cli(["merge", str(project.path / "nothing.json"), "-o", out]) == 2
    assert "nothing.json: cannot read" in capsys.readouterr().err
    assert not Path(out).exists()
    shards = [str(project.path / f"g{g}.json") for g in (1, 2)]
    assert cli(["merge", *shards, "-o", out]) == 0
    assert cli(["merge", out, "-o", str(project.path / "again.json")]) == 2
    assert "already a merged file" in capsys.readouterr().err


def test_an_item_costs_its_wall_time_times_its_ranks():
    def record(duration, features):
        return {"nodeid": "x", "duration": duration, "scenario": {"features": features, "fixes": {}}}

    assert item_cost(record(0.5, {})) == 0.5
    assert item_cost(record(0.5, {"sp": {"tp": 2}, "dp": {"size": 2}})) == 2.0
    assert item_cost(record(0.0, {})) == MIN_COST_S  # a skip still takes a turn
    assert item_cost({"nodeid": "y", "duration": 1.0}) == 1.0  # a crash before the scenario: one rank
    table = durations([{"items": [record(1.0, {}) | {"nodeid": "b"}, record(1.0, {}) | {"nodeid": "a"}]},
                       {"items": [record(3.0, {}) | {"nodeid": "a"}]}])
    assert table == {"a": 3.0, "b": 1.0} and list(table) == ["a", "b"]  # the later file wins, sorted


def test_the_durations_command_writes_what_pytest_split_reads(project):
    whole = _run(project, "whole.json")
    out = project.path / ".test_durations"
    assert cli(["durations", str(project.path / "whole.json"), "-o", str(out)]) == 0
    table = json.loads(out.read_text())
    assert set(table) == _ids(whole) and all(value >= MIN_COST_S for value in table.values())
    result = project.runpytest("-p", "no:cacheprovider", "--splits", "2", "--group", "1", "--co", "-q")
    total = sum(table.values())
    result.stdout.fnmatch_lines(["*Running group 1/2 (estimated duration: *"])
    estimate = float(result.stdout.str().split("estimated duration: ")[1].split("s)")[0])
    assert 0 < estimate <= total
