"""Bad input and misuse through pytest itself: one clean line each, the rest of the suite runs,
and the reports are written in every case (issue 9)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

import harness.pytest_plugin  # noqa: F401 - see tests/plugin/test_plugin.py
import harness.report.html  # noqa: F401
import harness.session  # noqa: F401
from harness.engine import cuda_available

from tests.pytester_project import harness_project

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "scenario" / "bad_inputs"
GOOD = """\
name: tiny
graph: {capture_sizes: [1, 2, 4], mode: FULL}
steps: 3
workload:
  requests:
    - {prompt_len: 3, output_len: 3}
"""


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    (harness_project(pytester).path / "scenarios").mkdir()
    (pytester.path / "scenarios" / "good.yaml").write_text(GOOD)
    return pytester


def _clean(result: pytest.RunResult) -> str:
    out = result.stdout.str() + result.stderr.str()
    for bad in ("Traceback", "INTERNALERROR", "DumpError", "crashed"):
        assert bad not in out, out[-3000:]
    return out


def _reports(project: pytest.Pytester) -> tuple[dict, str]:
    data = json.loads((project.path / "out" / "results.json").read_text())
    html = (project.path / "out" / "report.html").read_text()
    return data, html


REPORTS = ["--results-json=out/results.json", "--html=out/report.html", "--self-contained-html"]


# ------------------------------------------------------------------------------ the whole corpus


def test_every_bad_file_is_one_located_error_and_the_rest_runs_with_reports(project):
    bad = project.path / "scenarios" / "bad"
    bad.mkdir()
    files = sorted(CORPUS.glob("*.yaml"))
    for path in files:
        shutil.copy(path, bad / path.name)
    result = project.runpytest("-p", "no:cacheprovider", *REPORTS)
    out = _clean(result)
    result.assert_outcomes(passed=1, errors=len(files))
    expected = (CORPUS / "expected.txt").read_text().splitlines()
    for line in expected:
        if not line.startswith("== "):
            assert f"scenarios/bad/{line}" in out, line
    data, html = _reports(project)
    assert data["summary"] == {"passed": 1} and len(data["items"]) == 1
    assert "tiny" in html


# ----------------------------------------------------------------------------------- --mode


@pytest.mark.parametrize("option, message", [
    ("--mode=", "--mode=: no mode given; choose from NONE, PIECEWISE, FULL"),
    ("--mode=FULL,FULL", "--mode=FULL,FULL: FULL is given twice"),
    ("--mode=full,FULL", "--mode=full,FULL: FULL is given twice"),
    ("--mode=FULL,,NONE", "--mode=FULL,,NONE: empty mode in 'FULL,,NONE'"),
    ("--mode=FAST", "--mode=FAST: "),
])
def test_bad_mode_option_is_one_usage_error_before_collection(project, option, message):
    result = project.runpytest(option, "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    _clean(result)
    errors = [line for line in result.stderr.lines if line.startswith("ERROR")]
    assert len(errors) == 1 and message in errors[0], result.stderr.str()


# --------------------------------------------------------------------------------- --backend


@pytest.mark.parametrize("backend", ["npu", "cuda"])
def test_an_absent_backend_fails_each_item_in_one_line_and_writes_the_reports(project, backend):
    if backend == "cuda" and cuda_available():
        pytest.skip("this machine has CUDA")
    (project.path / "scenarios" / "skipped.yaml").write_text(GOOD.replace("tiny", "skipped")
                                                             + "expect: {skip: not modelled}\n")
    result = project.runpytest(f"--backend={backend}", "-p", "no:cacheprovider", *REPORTS)
    out = _clean(result)
    result.assert_outcomes(failed=1, skipped=1)
    assert f"backend unavailable: backend '{backend}' selected but" in out
    data, html = _reports(project)
    assert data["summary"] == {"failed": 1, "skipped": 1}
    (failed,) = [item for item in data["items"] if item["outcome"] == "failed"]
    assert failed["verdict"].startswith("backend unavailable:") and failed["traceback"] is None
    assert data["environment"]["device"].startswith("unavailable")
    assert "backend unavailable" in html


# ---------------------------------------------------------------------------- --results-json


@pytest.mark.parametrize("where", ["directory", "under_a_file"])
def test_an_unwritable_results_path_is_an_error_naming_it_and_html_is_still_written(project, where):
    if where == "directory":
        (project.path / "target").mkdir()
        target = project.path / "target"
    else:
        (project.path / "target").write_text("a regular file\n")
        target = project.path / "target" / "results.json"
    result = project.runpytest(f"--results-json={target}", "--html=out/report.html",
                               "--self-contained-html", "-p", "no:cacheprovider")
    out = _clean(result)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert f"graph-harness: cannot write the JSON results to {target}: " in out
    assert "1 passed" in out
    assert "tiny" in (project.path / "out" / "report.html").read_text()


# ------------------------------------------------------------------------------- --lf / --ff


# stack harness-compose: its PIECEWISE batches get a dummy request, so the missing fix fails there too
MATRIX = GOOD.replace("mode: FULL", "mode: FULL") + ("stack: harness-compose\n"
                                                    "matrix:\n  fixes.fia_padding: [true, false]\n  graph.mode: [FULL, PIECEWISE]\n")


def test_last_failed_reruns_exactly_the_failed_items(project):
    (project.path / "scenarios" / "good.yaml").unlink()
    (project.path / "scenarios" / "m.yaml").write_text(MATRIX.replace("graph: {capture_sizes: [1, 2, 4], mode: FULL}",
                                                                      "graph: {capture_sizes: [1, 2, 4]}"))
    first = project.runpytest("-q")
    first.assert_outcomes(passed=2, failed=2)
    failed = sorted(re.findall(r"FAILED (\S+)", first.stdout.str()))
    assert failed == ["scenarios/m.yaml::tiny[no_fia_padding-FULL]",
                      "scenarios/m.yaml::tiny[no_fia_padding-PIECEWISE]"]
    again = project.runpytest("--lf")
    again.assert_outcomes(failed=2)  # and nothing else: the passed items are not even collected
    again.stdout.fnmatch_lines(["run-last-failure: rerun previous 2 failures*"])
    assert sorted(re.findall(r"FAILED (\S+)", again.stdout.str())) == failed
    first_failing = project.runpytest("-v", "--ff", "--collect-only")
    listed = [line.strip() for line in first_failing.stdout.lines if "<ScenarioItem" in line]
    assert [entry.split()[1].rstrip(">") for entry in listed[:2]] == [
        "tiny[no_fia_padding-FULL]", "tiny[no_fia_padding-PIECEWISE]"]


def test_a_failed_item_id_given_on_the_command_line_selects_it(project):
    (project.path / "scenarios" / "m.yaml").write_text(MATRIX.replace("graph: {capture_sizes: [1, 2, 4], mode: FULL}",
                                                                      "graph: {capture_sizes: [1, 2, 4]}"))
    result = project.runpytest("--collect-only", "-q", "-p", "no:cacheprovider",
                               "scenarios/m.yaml::tiny[fia_padding-PIECEWISE]")
    assert result.stdout.lines[0] == "scenarios/m.yaml::tiny[fia_padding-PIECEWISE]"
    result.stdout.fnmatch_lines(["*1 test collected*"])


# ------------------------------------------------------------------ -k selections of the docs


def _collected(result: pytest.RunResult) -> list[str]:
    return [line for line in result.stdout.lines if "::" in line]


def test_the_documented_selection_selects_exactly_what_it_says(project):
    doc = (ROOT / "docs" / "running.md").read_text()
    assert '-k "sp2 and uniform"' in doc
    target = project.path / "scenarios" / "features"
    target.mkdir()
    shutil.copy(ROOT / "scenarios" / "features" / "feature_matrix.yaml", target)
    every = _collected(project.runpytest("--collect-only", "-q", "-p", "no:cacheprovider", "scenarios/features"))
    selected = _collected(project.runpytest("--collect-only", "-q", "-p", "no:cacheprovider",
                                            "scenarios/features", "-k", "sp2 and uniform"))
    ids = {line: line.split("[", 1)[1].rstrip("]").split("-") for line in every}
    wanted = [line for line, (_mode, features, workload) in ids.items()
              if workload == "uniform" and "sp2" in features.split("_")]
    assert selected and selected == wanted
    full = _collected(project.runpytest("--collect-only", "-q", "-p", "no:cacheprovider",
                                        "scenarios/features", "-m", "full", "-k", "sp2 and uniform"))
    assert full and all("[FULL-" in line for line in full)
