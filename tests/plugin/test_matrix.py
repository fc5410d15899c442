"""--matrix (pairwise / full), the cross_product and slow markers, per-item time limits."""

from __future__ import annotations

import pytest

import harness.pytest_plugin  # noqa: F401 - see tests/plugin/test_plugin.py: import once per process
import harness.report.html  # noqa: F401
import harness.session  # noqa: F401

from tests.pytester_project import harness_project

pytest_plugins = ["pytester"]

CROSS = """
name: cube
matrix_selection: pairwise
graph: {capture_sizes: [1, 2, 4]}
steps: 3
workload:
  requests:
    - {prompt_len: 3, output_len: 3}
matrix:
  graph.mode: [FULL, PIECEWISE, NONE]
  model.dtype: [float32, bfloat16]
  features.mtp.k: [0, 1, 2]
  steps: [2, 3, 4]
"""

TINY = """
name: {name}
graph: {{capture_sizes: [1, 2, 4], mode: FULL}}
workload:
  requests:
    - {{prompt_len: 3, output_len: 3}}
{extra}
"""


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    (harness_project(pytester).path / "scenarios").mkdir()
    return pytester


def _count(result: pytest.RunResult) -> int:
    line = next(l for l in result.outlines if "collected" in l)
    return int(line.split()[0].split("/")[0])


def test_pairwise_by_default_full_on_request_and_marked(project):
    (project.path / "scenarios" / "cube.yaml").write_text(CROSS)
    pairwise = project.runpytest("--collect-only", "-q", "-p", "no:cacheprovider")
    full = project.runpytest("--collect-only", "-q", "-p", "no:cacheprovider", "--matrix=full")
    assert _count(full) == 3 * 2 * 3 * 3
    assert 9 <= _count(pairwise) < 54
    marked = project.runpytest("--collect-only", "-q", "-p", "no:cacheprovider", "-m", "cross_product")
    assert _count(marked) == _count(pairwise)


def test_mode_option_selects_pairs_within_the_mode(project):
    (project.path / "scenarios" / "cube.yaml").write_text(CROSS)
    result = project.runpytest("--collect-only", "-q", "-p", "no:cacheprovider", "--mode=PIECEWISE")
    items = [l for l in result.outlines if "::cube[" in l]
    assert items and all("PIECEWISE" in l for l in items)
    assert len(items) >= 9  # every (dtype, k, steps) pair within PIECEWISE: at least 3 x 3


def test_files_without_the_declaration_expand_fully(project):
    (project.path / "scenarios" / "cube.yaml").write_text(CROSS.replace("matrix_selection: pairwise\n", ""))
    assert _count(project.runpytest("--collect-only", "-q", "-p", "no:cacheprovider")) == 54


def test_a_hung_item_fails_on_its_limit_and_the_session_goes_on(project):
    """timeout_s far below what the item needs: pytest-timeout fails it; the next item passes."""
    (project.path / "scenarios" / "a_hangs.yaml").write_text(
        TINY.format(name="hangs", extra="timeout_s: 0.01\nmodel: {kind: random, layers: 4}\nsteps: 12"))
    (project.path / "scenarios" / "b_fine.yaml").write_text(TINY.format(name="fine", extra="slow: true\nsteps: 3"))
    # In a subprocess: the inner run's SIGALRM must never land in this (xdist worker) process,
    # whose execnet machinery it can interrupt under load (an INTERNALERROR, seen once).
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed") == 1 and outcomes.get("failed", 0) + outcomes.get("errors", 0) == 1, outcomes
    result.stdout.fnmatch_lines(["*Timeout*0.01*"])
    slow = project.runpytest("--collect-only", "-q", "-p", "no:cacheprovider", "-m", "slow")
    assert _count(slow) == 1 and any("fine" in l for l in slow.outlines)


def test_a_limit_never_fires_in_pytest_s_own_hooks(project):
    """A loaded machine can spend longer than a tiny limit inside pytest's hooks around an item
    (here a slow logstart hook stands in for it). The alarm is armed around the call only, so
    the item fails on its limit and the session goes on; armed for the whole protocol it fired
    in logstart, an INTERNALERROR that ended the run (seen in CI)."""
    project.makeconftest('''pytest_plugins = ["harness.pytest_plugin"]
import time

def pytest_runtest_logstart(nodeid, location):
    time.sleep(0.05)
''')
    (project.path / "scenarios" / "a_hangs.yaml").write_text(
        TINY.format(name="hangs", extra="timeout_s: 0.01\nmodel: {kind: random, layers: 4}\nsteps: 12"))
    (project.path / "scenarios" / "b_fine.yaml").write_text(TINY.format(name="fine", extra="steps: 3"))
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "-q")  # SIGALRM stays out of this worker
    assert "INTERNALERROR" not in result.stdout.str()
    assert result.parseoutcomes() == {"passed": 1, "failed": 1}
    result.stdout.fnmatch_lines(["*Timeout*0.01*"])


def test_an_xdist_worker_runs_the_slow_items_first(project):
    """The slow kinds go first, every other item keeps its place: no long item is left to run
    alone at the end of a distributed run."""
    for name, extra in (("a_first", ""), ("b_second", ""), ("c_slow", "slow: true"), ("d_last", "")):
        (project.path / "scenarios" / f"{name}.yaml").write_text(TINY.format(name=name, extra=extra + "\nsteps: 2"))
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "-n", "1", "-v")
    ran = [line.split("::")[1].split()[0] for line in result.outlines if "PASSED" in line and "::" in line]
    assert ran == ["c_slow", "a_first", "b_second", "d_last"], result.outlines[-20:]
    plain = project.runpytest("--collect-only", "-q", "-p", "no:cacheprovider")  # no xdist: file order
    assert [l.split("::")[1].split()[0] for l in plain.outlines if "::" in l] == [
        "a_first", "b_second", "c_slow", "d_last"]
