"""The triage loop end to end: two runs of a suite, the diff between them, and narrow."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

import harness.pytest_plugin  # noqa: F401 - imported once for pytester's in-process runs
import harness.report.html  # noqa: F401
import harness.session  # noqa: F401
from harness.cli import main
from harness.narrow import NarrowError, find_point, narrow, split_target
from harness.scenario import load_scenario_file
from tests.pytester_project import harness_project

pytest_plugins = ["pytester"]

OK = """
name: ok
graph: {capture_sizes: [1, 2, 4], mode: FULL}
steps: 3
workload:
  requests:
    - {prompt_len: 3, output_len: 3}
"""
KNOWN_BAD = """
name: stale
graph: {capture_sizes: [1, 2, 4], mode: FULL}
fixes: {host_param_update: false}
steps: 3
workload:
  requests:
    - {prompt_len: 3, output_len: 3}
"""
EXPECT = "expect:\n  fail: [stale_params]\n"


def test_removing_a_known_bad_expect_is_exactly_one_new_failure_in_every_format(pytester, capsys):
    (harness_project(pytester).path / "scenarios").mkdir()
    (pytester.path / "scenarios/ok.yaml").write_text(OK)
    (pytester.path / "scenarios/stale.yaml").write_text(KNOWN_BAD + EXPECT)
    pytester.runpytest("-p", "no:cacheprovider", "--results-json=base.json").assert_outcomes(passed=1, xfailed=1)
    pytester.runpytest("-p", "no:cacheprovider", "--results-json=again.json").assert_outcomes(passed=1, xfailed=1)
    (pytester.path / "scenarios/stale.yaml").write_text(KNOWN_BAD)  # its expect removed
    pytester.runpytest("-p", "no:cacheprovider", "--results-json=cur.json").assert_outcomes(passed=1, failed=1)
    capsys.readouterr()
    base, cur = str(pytester.path / "base.json"), str(pytester.path / "cur.json")
    item = "scenarios/stale.yaml::stale[FULL]"
    quiet: list[str] = []  # capture time is noise on a loaded machine: the default threshold ignores it

    # two runs of the same code: no changes, whatever the machine's load did to the timings
    assert main(["diff", base, str(pytester.path / "again.json")]) == 0
    assert capsys.readouterr().out.splitlines()[1] == "no changes"

    assert main(["diff", base, cur, *quiet]) == 1
    text = capsys.readouterr().out
    assert "NEW FAILURES (1)" in text and f"{item}: stale_params (xfailed -> failed)" in text
    assert "scenarios/ok.yaml" not in text and "FIXED" not in text and "ADDED" not in text

    assert main(["diff", base, cur, "--format=markdown", *quiet]) == 1
    markdown = capsys.readouterr().out
    assert "### New failures (1)" in markdown
    assert f"| `{item}` | stale_params | xfailed -> failed |" in markdown
    assert "scenarios/ok.yaml" not in markdown

    assert main(["diff", base, cur, "--format=json", *quiet]) == 1
    data = json.loads(capsys.readouterr().out)
    assert [(c["key"], c["checks_after"]) for c in data["new_failures"]] == [(item, ["stale_params"])]
    assert not (data["fixed"] or data["changed_checks"] or data["added"] or data["removed"] or data["metrics"])
    assert data["exit_status"] == 1

    assert main(["diff", base, base]) == 0  # no change, no failure: CI passes


# -- narrow, on a fake runner: the search itself, in milliseconds ------------------------------
@dataclass
class _Result:
    failed_checks: list[str]
    verdict: str = ""
    duration: float = 0.0


@dataclass
class _FakeEngine:
    """Fails fia_invariant while SP is on and the prompt is odd (what SP padding breaks)."""

    seen: list[dict] = field(default_factory=list)

    def __call__(self, point):
        s = point.scenario
        self.seen.append(s.model_dump(mode="json"))
        odd = sum(r.prompt_len * r.repeat for r in s.workload.requests) % 2 == 1
        return _Result(["fia_invariant"] if s.features.sp.tp > 1 and odd else [])


FAKE = """
name: combo
model: {kind: random, layers: 2}
features: {sp: {tp: 4}, mtp: {k: 3}, dp: {size: 2, batches: unequal}}
fixes: {sp_padding: false}
graph: {mode: FULL, capture_sizes: [24, 48]}
steps: 4
workload:
  requests:
    - {prompt_len: 13, output_len: 4}
    - {prompt_len: 8, output_len: 4, arrival_step: 1, repeat: 2}
matrix:
  graph.mode: [FULL, PIECEWISE]
"""


def test_narrow_keeps_only_what_the_failure_needs(tmp_path):
    path = tmp_path / "combo.yaml"
    path.write_text(FAKE)
    engine = _FakeEngine()
    point = find_point(*split_target(f"{path}::combo[PIECEWISE]"))
    assert point.scenario.graph.mode == "PIECEWISE"
    result = narrow(point, runner=engine, target=f"{path}::combo[PIECEWISE]")
    minimal = result.minimal
    assert result.check == "fia_invariant"
    assert minimal["features"]["dp"]["size"] == 1 and minimal["features"]["mtp"]["k"] == 0
    assert minimal["features"]["sp"]["tp"] == 2  # lowered from 4
    assert [r["prompt_len"] for r in minimal["workload"]["requests"]] == [13]
    assert minimal["steps"] == 1 and minimal["model"]["layers"] == 1 and minimal["graph"]["mode"] == "PIECEWISE"
    assert minimal["graph"]["capture_sizes"] == [24]
    assert "passes without sp" in result.verdict and "fails with sp2" in result.verdict
    first = result.features[0]
    assert first.startswith("fails with ") and set(first[len("fails with "):].split("+")) == {"sp4", "dp2", "mtp3"}
    assert result.features[-1] == "minimal: sp2 fails fia_invariant"
    assert len(engine.seen) == len(result.trials) <= 40  # no candidate ran twice
    assert len({json.dumps(s, sort_keys=True) for s in engine.seen}) == len(engine.seen)


def test_narrow_refuses_what_it_cannot_narrow(tmp_path):
    path = tmp_path / "combo.yaml"
    path.write_text(FAKE)
    with pytest.raises(NarrowError, match="no item 'combo\\[NONE\\]'"):
        find_point(path, "combo[NONE]")
    with pytest.raises(NarrowError, match="no scenario named 'other'"):
        find_point(path, "other[FULL]")
    with pytest.raises(NarrowError, match="expected FILE.yaml::ITEM"):
        split_target(str(path))
    passing = find_point(path, "combo[FULL]")
    with pytest.raises(NarrowError, match="does not fail"):
        narrow(passing, runner=lambda p: _Result([]))


# -- narrow for real: the same engine and ranks as the item --------------------------------------
# SP tp=2 with MTP k=2 in FULL: vLLM refuses to start (max(q, tp) = 3 is not a multiple of 2), so
# the scenario models the harness's lcm composition (stack harness-compose), capture sizes [6].
# Prompts 13 + 12: odd on DP rank 0 and odd in all without DP, so SP rounds T up either way.
SP_MTP_DP = """
name: sp_mtp_dp
stack: harness-compose
model: {kind: random, layers: 1}
features: {sp: {tp: 2}, mtp: {k: 2}, dp: {size: 2}}
fixes: {sp_padding: false}
graph: {mode: FULL, capture_sizes: [6]}
steps: 1
workload:
  requests:
    - {prompt_len: 13, output_len: 1}
    - {prompt_len: 12, output_len: 1}
"""


# Six real trials (one 4-rank, four 2-rank, one single-rank) and a warm rank server: about twice
# `python -c "import torch"` (20 s at load 5 on the 2-core machine). `slow`, so that
# `-m "not slow"` skips it while editing; `make test` (CI) runs it.
@pytest.mark.slow
def test_narrow_names_sp_for_a_failing_sp_mtp_dp_scenario(tmp_path, capsys):
    path = tmp_path / "sp_mtp_dp.yaml"
    path.write_text(SP_MTP_DP)
    status = main(["narrow", f"{path}::sp_mtp_dp", "--backend=emulated", f"--output-dir={tmp_path / 'reports'}"])
    out = capsys.readouterr().out
    assert status == 0, out
    verdict = next(line.strip() for line in out.splitlines() if line.strip().startswith("fails with "))
    first = verdict.split(";")[0]
    assert set(first[len("fails with "):].split("+")) == {"sp2", "dp2", "mtp2"}  # in registry order
    assert "passes without sp" in verdict and "fails without dp" in verdict and "fails without mtp" in verdict
    # each trial printed once, as it ran (not again in the final report)
    assert len([line for line in out.splitlines() if line.strip().startswith("without sp: passes")]) == 1
    assert "trial(s), listed above" in out
    assert "minimal: sp2 fails fia_invariant" in out
    written = tmp_path / "reports" / "narrowed-sp_mtp_dp.yaml"
    assert f"minimal scenario: {written}" in out
    data = yaml.safe_load(written.read_text())
    assert data["features"] == {"sp": {"tp": 2}} and data["fixes"] == {"sp_padding": False}
    (point,) = load_scenario_file(written)
    assert point.scenario.features.mtp.k == 0 and point.scenario.features.dp.size == 1
