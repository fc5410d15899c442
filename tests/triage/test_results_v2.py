"""Results file v2 through the plugin: the record travels as a report attribute (also across
xdist), junit keeps only small metrics plus suite properties, ids do not depend on --mode."""

from __future__ import annotations

import json
import shutil
import subprocess
import xml.etree.ElementTree as ET

import pytest

import harness.pytest_plugin  # noqa: F401 - imported once for pytester's in-process runs
import harness.report.html  # noqa: F401
import harness.session  # noqa: F401
from harness.report.results import REPORT_ATTR, SCHEMA_VERSION, item_key

from tests.pytester_project import TINY, harness_project

pytest_plugins = ["pytester"]



@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    return harness_project(pytester)


def _write(pytester: pytest.Pytester, path: str, text: str) -> None:
    target = pytester.path / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


def test_results_v2_fields_and_junit_without_the_record(project):
    _write(project, "scenarios/a.yaml", TINY.format(mode="", extra="matrix:\n  graph.mode: [FULL, PIECEWISE]"))
    _write(project, "scenarios/bad.yaml", TINY.format(mode=", mode: FULL", extra="fixes: {host_param_update: false}"))
    result = project.runpytest("-p", "no:cacheprovider", "-n", "2", "--results-json=out/r.json",
                               "--junitxml=out/junit.xml")
    result.assert_outcomes(passed=2, failed=1)
    data = json.loads((project.path / "out/r.json").read_text())
    assert data["schema"] == SCHEMA_VERSION == 2
    run = data["run"]
    assert {"-n", "--results-json=out/r.json", "--junitxml=out/junit.xml"} <= set(run["command"])
    assert run["started"] <= run["finished"] and run["duration"] >= 0
    env = run["environment"]
    assert env["backend"] == "emulated" and env["device"] and env["torch"] and env["python"]
    items = {item["nodeid"]: item for item in data["items"]}
    assert set(items) == {"scenarios/a.yaml::tiny[FULL]", "scenarios/a.yaml::tiny[PIECEWISE]",
                          "scenarios/bad.yaml::tiny"}
    bad = items["scenarios/bad.yaml::tiny"]
    assert bad["key"] == "scenarios/bad.yaml::tiny[FULL]"  # the mode is always part of the key
    assert bad["source"].startswith("scenarios/bad.yaml:")  # relative to the root
    assert bad["outcome"] == "failed" and bad["failed_checks"] == ["stale_params"]
    assert bad["started"] and bad["duration"] > 0
    assert bad["metrics"]["graphs_captured"] > 0 and 0 <= bad["metrics"]["padding_ratio"] < 1
    step = bad["run"]["steps"][0]
    assert "metadata" not in step and "executed" not in step and "reference_metadata" not in step
    assert set(step["host_lists"]) == {"actual_seq_lengths", "actual_seq_lengths_kv"}
    junit = (project.path / "out/junit.xml").read_text()
    assert "graph_harness_record" not in junit and "stale_params" in junit
    suite = ET.fromstring(junit).find("testsuite")
    suite_props = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert suite_props["backend"] == "emulated" and suite_props["device"] and suite_props["torch"]
    case = next(c for c in suite.iter("testcase") if c.get("classname", "").endswith("bad.yaml"))
    props = {p.get("name"): p.get("value") for p in case.find("properties")}
    assert props["failed_checks"] == "stale_params" and int(props["graphs_captured"]) > 0


def test_the_record_is_a_report_attribute(project):
    _write(project, "scenarios/a.yaml", TINY.format(mode=", mode: FULL", extra=""))
    _write(project, "conftest.py", 'pytest_plugins = ["harness.pytest_plugin"]\n'
                                   "seen = []\n"
                                   "def pytest_runtest_logreport(report):\n"
                                   "    if report.when == 'call':\n"
                                   f"        seen.append(getattr(report, {REPORT_ATTR!r}, None))\n"
                                   "def pytest_sessionfinish(session):\n"
                                   "    import json; open('seen.json', 'w').write(json.dumps(seen))\n")
    project.runpytest("-p", "no:cacheprovider", "-n", "1").assert_outcomes(passed=1)
    (record,) = json.loads((project.path / "seen.json").read_text())  # arrived on the controller
    assert record["nodeid"] == "scenarios/a.yaml::tiny" and record["outcome"] == "passed"


def test_keys_are_the_same_with_and_without_mode(project):
    _write(project, "scenarios/axis.yaml", TINY.format(mode="", extra="matrix:\n  graph.mode: [FULL, PIECEWISE]"))
    _write(project, "scenarios/free.yaml", TINY.format(mode="", extra="matrix:\n  model.dtype: [float32]"))
    project.runpytest("-p", "no:cacheprovider", "--results-json=plain.json").assert_outcomes(passed=3)
    project.runpytest("-p", "no:cacheprovider", "--mode=FULL,PIECEWISE", "--results-json=modes.json")
    plain = {i["key"] for i in json.loads((project.path / "plain.json").read_text())["items"]}
    modes = {i["key"]: i["nodeid"] for i in json.loads((project.path / "modes.json").read_text())["items"]}
    assert plain == {"scenarios/axis.yaml::tiny[FULL]", "scenarios/axis.yaml::tiny[PIECEWISE]",
                     "scenarios/free.yaml::tiny[float32-FULL]"}
    assert plain <= set(modes)  # with --mode the same items have the same keys (and one more)
    assert modes["scenarios/free.yaml::tiny[float32-FULL]"] == "scenarios/free.yaml::tiny[float32-FULL]"


def test_item_key_rules():
    assert item_key({"nodeid": "s/a.yaml::a[FULL-sp2]", "mode": "FULL"}) == "s/a.yaml::a[FULL-sp2]"
    assert item_key({"nodeid": "s/a.yaml::a[sp2]", "mode": "FULL"}) == "s/a.yaml::a[sp2-FULL]"
    assert item_key({"nodeid": "s/a.yaml::a", "mode": "NONE"}) == "s/a.yaml::a[NONE]"
    assert item_key({"nodeid": "s/a.yaml::a[FULL_DECODE_ONLY]", "mode": "FULL"}) == "s/a.yaml::a[FULL_DECODE_ONLY-FULL]"


@pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
def test_the_commit_of_the_checkout_is_recorded(project):
    _write(project, "scenarios/a.yaml", TINY.format(mode=", mode: FULL", extra=""))
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(project.path)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "scenarios"], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    project.runpytest("-p", "no:cacheprovider", "--results-json=r.json", "--junitxml=j.xml").assert_outcomes(passed=1)
    run = json.loads((project.path / "r.json").read_text())["run"]
    assert run["commit"] == head
    assert f'name="commit" value="{head}' in (project.path / "j.xml").read_text()
