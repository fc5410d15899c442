"""The pytest plugin, driven through pytester: collection, ids, --mode, errors, reports."""

from __future__ import annotations

import json

import pytest

# Imported here so that pytester's in-process runs find them in sys.modules and never import
# them twice (torch.library ops can be defined only once per process).
import harness.pytest_plugin  # noqa: F401
import harness.report.html  # noqa: F401
import harness.session  # noqa: F401

from tests.pytester_project import TINY, harness_project

pytest_plugins = ["pytester"]



def _write(pytester: pytest.Pytester, path: str, text: str) -> None:
    target = pytester.path / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    return harness_project(pytester)


def test_matrix_points_become_items_with_selectable_ids(project):
    _write(project, "scenarios/a.yaml", TINY.format(mode="", extra="matrix:\n  graph.mode: [FULL, PIECEWISE]\n  model.dtype: [float32, bfloat16]"))
    result = project.runpytest("--collect-only", "-q", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines([
        "scenarios/a.yaml::tiny[[]FULL-float32[]]",
        "scenarios/a.yaml::tiny[[]FULL-bfloat16[]]",
        "scenarios/a.yaml::tiny[[]PIECEWISE-float32[]]",
        "scenarios/a.yaml::tiny[[]PIECEWISE-bfloat16[]]",
    ])
    selected = project.runpytest("--collect-only", "-q", "-k", "PIECEWISE and bfloat16", "-p", "no:cacheprovider")
    selected.stdout.fnmatch_lines(["*tiny[[]PIECEWISE-bfloat16[]]", "*1/4 tests collected*"])


def test_mode_option_intersects_with_the_mode_axis(project):
    _write(project, "scenarios/axis.yaml", TINY.format(mode="", extra="matrix:\n  graph.mode: [FULL, PIECEWISE, NONE]"))
    _write(project, "scenarios/fixed.yaml", TINY.format(mode=", mode: PIECEWISE", extra=""))
    _write(project, "scenarios/free.yaml", TINY.format(mode="", extra=""))
    result = project.runpytest("--collect-only", "-q", "--mode=FULL,NONE", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines_random([
        "scenarios/axis.yaml::tiny[[]FULL[]]",
        "scenarios/axis.yaml::tiny[[]NONE[]]",
        "scenarios/free.yaml::tiny[[]FULL[]]",  # names no mode: runs in each selected mode
        "scenarios/free.yaml::tiny[[]NONE[]]",
    ])
    assert "PIECEWISE" not in result.stdout.str()


def test_bad_mode_is_a_usage_error(project):
    result = project.runpytest("--mode=FAST")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--mode*FAST*"])


def test_bad_file_is_reported_with_line_and_field_while_the_rest_runs(project):
    _write(project, "scenarios/good.yaml", TINY.format(mode=", mode: FULL", extra=""))
    _write(project, "scenarios/bad.yaml", "name: bad\nmodel:\n  num_heads: 6\n  num_kv_heads: 4\nworkload:\n  requests: []\n")
    result = project.runpytest("-p", "no:cacheprovider", "-q")
    result.stdout.fnmatch_lines(["*scenarios/bad.yaml:4: model.num_kv_heads: 6 heads are not divisible by 4 KV heads*"])
    result.assert_outcomes(passed=1, errors=1)
    assert "Traceback" not in result.stdout.str()


def test_known_bad_is_xfail_and_an_unexpected_pass_fails(project):
    bad = "fixes: {host_param_update: false}\nexpect:\n  fail: [stale_params]"
    wrong = "expect:\n  fail: [stale_params]"  # nothing is broken: it must not pass quietly
    _write(project, "scenarios/bad.yaml", TINY.format(mode=", mode: FULL", extra=bad))
    _write(project, "scenarios/wrong.yaml", TINY.format(mode=", mode: FULL", extra=wrong))
    result = project.runpytest("-p", "no:cacheprovider", "-rxf")
    result.assert_outcomes(xfailed=1, failed=1)
    result.stdout.fnmatch_lines(["*known-bad scenario passed unexpectedly: expected stale_params to fail*"])


def test_skip_by_design_is_reported_as_skipped(project):
    _write(project, "scenarios/skip.yaml", TINY.format(mode=", mode: FULL", extra="expect: {skip: cascade attention excludes FULL}"))
    result = project.runpytest("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(skipped=1)
    # the skip points at the scenario file and line, not at the harness line that skipped it
    result.stdout.fnmatch_lines(["SKIPPED [[]1[]] scenarios/skip.yaml:2: unsupported by design: cascade attention excludes FULL"])
    assert "pytest_plugin.py" not in result.stdout.str()


def test_json_results_and_junit_properties_are_written_even_when_items_fail(project):
    _write(project, "scenarios/fail.yaml", TINY.format(mode=", mode: FULL", extra="fixes: {fia_padding: false}"))
    _write(project, "scenarios/ok.yaml", TINY.format(mode=", mode: PIECEWISE", extra=""))
    result = project.runpytest("-p", "no:cacheprovider", "--results-json=out/results.json", "--junitxml=out/junit.xml")
    result.assert_outcomes(passed=1, failed=1)
    data = json.loads((project.path / "out/results.json").read_text())
    assert data["summary"] == {"failed": 1, "passed": 1}
    by_name = {item["source"].split("/")[-1].split(":")[0]: item for item in data["items"]}
    assert by_name["fail.yaml"]["failed_checks"] == ["fia_invariant"]
    assert "561002" in by_name["fail.yaml"]["checks"]["fia_invariant"]["summary"]
    assert data["environment"]["torch"]
    junit = (project.path / "out/junit.xml").read_text()
    assert 'name="graphs_captured"' in junit and 'name="failed_checks" value="fia_invariant"' in junit


def test_html_report_embeds_the_item_explanation(project):
    _write(project, "scenarios/bad.yaml", TINY.format(mode=", mode: FULL", extra="fixes: {host_param_update: false}"))
    result = project.runpytest("scenarios", "--mode=FULL", "-p", "no:cacheprovider", "--html=report.html",
                               "--self-contained-html")
    result.assert_outcomes(failed=1)
    html = (project.path / "report.html").read_text()
    assert "<title id=\"head-title\">graph-harness: scenarios (FULL)</title>" in html  # what ran
    assert "capture-time" in html and "stale_params" in html
    from harness.report.html import read_fragments

    (fragment,) = read_fragments(html).values()  # the explanation, in the page's fragment store
    assert "Stale host parameters" in fragment and "capture-time" in fragment


def test_xdist_workers_send_their_records_to_the_controller(project):
    _write(project, "scenarios/a.yaml", TINY.format(mode="", extra="matrix:\n  graph.mode: [FULL, PIECEWISE, NONE]"))
    result = project.runpytest("-p", "no:cacheprovider", "-n", "2", "--results-json=r.json",
                               "--html=r.html", "--self-contained-html")  # pytest-metadata's table too
    result.assert_outcomes(passed=3)
    out = result.stdout.str() + result.stderr.str()
    for crash in ("DumpError", "crashed", "Traceback", "INTERNALERROR", "replacing crashed worker"):
        assert crash not in out, out[-3000:]
    assert len(json.loads((project.path / "r.json").read_text())["items"]) == 3


def test_the_xdist_controller_never_imports_torch(project):
    # The controller only hands out items: an import of torch there (seconds) would hold back
    # the start of every worker. Its environment table and results file still name torch.
    project.makeconftest(
        'import json, sys\n'
        'pytest_plugins = ["harness.pytest_plugin"]\n'
        'def pytest_sessionfinish(session):\n'
        '    if not hasattr(session.config, "workerinput"):\n'
        '        open("controller.json", "w").write(json.dumps("torch" in sys.modules))\n')
    _write(project, "scenarios/a.yaml", TINY.format(mode=", mode: FULL", extra=""))
    _write(project, "scenarios/b.yaml", TINY.format(mode=", mode: FULL", extra="").replace("name: tiny", "name: wide")
           .replace("steps: 3", "steps: 3\nfeatures: {dp: {size: 2}}"))
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "-n", "1", "--results-json=r.json")
    result.assert_outcomes(passed=2)
    assert json.loads((project.path / "controller.json").read_text()) is False
    assert json.loads((project.path / "r.json").read_text())["environment"]["torch"]


def test_problems_only_the_harness_sees_still_name_file_line_and_field(project):
    _write(project, "scenarios/sizes.yaml", "name: s\ngraph:\n  mode: FULL\n  capture_sizes: [1, 3]\n"
                                          "features: {sp: {tp: 2}}\nworkload:\n  requests:\n"
                                          "    - {prompt_len: 2, output_len: 2}\n")
    _write(project, "scenarios/canary.yaml", "name: c\nmodel:\n  kind: canary\n  layers: 9\n"
                                           "graph: {mode: FULL}\nworkload:\n  requests:\n"
                                           "    - {prompt_len: 2, output_len: 2}\n")
    result = project.runpytest("-p", "no:cacheprovider", "-q")
    result.stdout.fnmatch_lines_random([
        "*scenarios/sizes.yaml:4: graph.capture_sizes: sequence parallel with tp=2 leaves no capture size*",
        "*scenarios/canary.yaml:2: model.hidden_size: canary: hidden_size (64) must be >= 92*",
    ])
    result.assert_outcomes(errors=2)
    assert "Traceback" not in result.stdout.str()


def test_stack_option_sets_the_stack_of_scenarios_that_name_none(project):
    bad = "fixes: {fia_padding: false}\nexpect: {fail: [fia_invariant]}"
    _write(project, "scenarios/pw.yaml", TINY.format(mode=", mode: PIECEWISE", extra=bad))
    _write(project, "scenarios/named.yaml", TINY.format(mode=", mode: PIECEWISE", extra=bad + "\nstack: harness-compose")
           .replace("name: tiny", "name: named"))
    # upstream slices the query in PIECEWISE: the known-bad file passes unexpectedly on the default stack
    result = project.runpytest("-p", "no:cacheprovider", "-rA")
    result.assert_outcomes(failed=1, xfailed=1)
    result.stdout.fnmatch_lines(["*stack v0.23.0*", "FAILED scenarios/pw.yaml::tiny*"])
    # the harness's dummy-request rule needs the fix: --stack makes pw fail as expected; named keeps its own
    result = project.runpytest("-p", "no:cacheprovider", "--stack=harness-compose")
    result.assert_outcomes(xfailed=2)
    result = project.runpytest("-p", "no:cacheprovider", "--stack=v0.18.0", "-rA")
    result.assert_outcomes(failed=1, xfailed=1)


def test_unknown_stack_option_is_a_usage_error(project):
    _write(project, "scenarios/ok.yaml", TINY.format(mode="", extra=""))
    result = project.runpytest("-p", "no:cacheprovider", "--stack=v9")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--stack*invalid choice*v9*v0.23.0*"])


def test_a_scenario_file_named_on_the_command_line_is_collected_wherever_it_lives(project):
    _write(project, "mine/ok.yaml", TINY.format(mode=", mode: FULL", extra=""))
    _write(project, "mine/other.yaml", TINY.format(mode=", mode: FULL", extra=""))
    _write(project, "scenarios/lib.yaml", TINY.format(mode=", mode: FULL", extra=""))
    named = project.runpytest("mine/ok.yaml", "--collect-only", "-q", "-p", "no:cacheprovider")
    named.stdout.fnmatch_lines(["mine/ok.yaml::tiny", "*1 test collected*"])
    # a directory is walked with the scenario_files patterns: by default, folders named scenarios
    walked = project.runpytest("--collect-only", "-q", "-p", "no:cacheprovider")
    walked.stdout.fnmatch_lines(["scenarios/lib.yaml::tiny", "*1 test collected*"])
    assert "mine/" not in walked.stdout.str()


def test_the_scenario_files_ini_option_sets_which_files_are_collected(project):
    project.makeini("[pytest]\nscenario_files = mine/*.yaml special.yml\n")
    _write(project, "mine/deep/ok.yaml", TINY.format(mode=", mode: FULL", extra=""))
    _write(project, "elsewhere/special.yml", TINY.format(mode=", mode: FULL", extra=""))
    _write(project, "scenarios/lib.yaml", TINY.format(mode=", mode: FULL", extra=""))
    _write(project, "elsewhere/plain.yaml", "not: a scenario\n")
    result = project.runpytest("--collect-only", "-q", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines_random(["mine/deep/ok.yaml::tiny", "elsewhere/special.yml::tiny", "*2 tests collected*"])
    assert "scenarios/lib.yaml" not in result.stdout.str() and "plain.yaml" not in result.stdout.str()
