"""A rank that ends while a peer still waits for it in a collective (harness.ranks.stranded):
the run fails within seconds as a hang naming both ranks, never a slower rank.

No time limit here (process start and a loaded machine would make one flaky): a run's timeout is
set far above what the detection needs, and the failure's kind says which of the two fired
(``"hang"`` or ``"timeout"``). How fast the shipped known-bad scenario fails is measured by
``benchmarks/hang.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.ranks import run_ranks, stranded
from harness.ranks.protocol import STACK_MARKER, STACKS_END, without_stacks
from harness.ranks.stacks import Frame, job_frames, runtime_frame, where
from tests.ranks import rank_fns
from tests.ranks.conftest import assert_clean

ROOT = Path(__file__).resolve().parents[2]


def test_a_rank_waiting_for_a_finished_peer_fails_as_a_hang_naming_both(workdirs: list[str]) -> None:
    """Rank 1 returned; rank 0 waits in a collective rank 1 never joins (gloo). Not the timeout
    (300 s: the kinds say which fired): a hang, with where rank 0 waits and what rank 1 did."""
    out = run_ranks(rank_fns.collective_after_rank1_finished, 2, timeout=300)
    assert not out.ok
    by_rank = {f.rank: f for f in out.failures}
    assert by_rank[0].kind == "hang", out.report()
    assert "tests/ranks/rank_fns.py:" in by_rank[0].message
    assert "in collective_after_rank1_finished" in by_rank[0].message
    assert "rank 1 finished its job" in by_rank[0].message and "end-of-job barrier" in by_rank[0].message
    assert "in all_reduce" in by_rank[0].traceback  # its stacks, dumped when the hang was seen
    assert "rank 0 entering all_reduce" in by_rank[0].log and "Python stacks" not in by_rank[0].log
    assert by_rank[1].kind == "timeout" and "finished its job" in by_rank[1].message
    assert "rank 0, which failed" in by_rank[1].message and "in barrier" in by_rank[1].traceback
    assert out.root_cause is by_rank[0]
    assert_clean(out, workdirs)


@pytest.mark.parametrize("busy", [True, False], ids=["computing", "sleeping"])
def test_a_slower_rank_is_not_failed_after_its_peer_finished(workdirs: list[str], busy: bool,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank that computes (it uses CPU) or waits in its own code (a sleep: not the runtime)
    for longer than the idle window after its peer returned is slower, not stuck."""
    looked: list[list[int]] = []

    def dump_stacks(procs, workdir, ranks):
        looked.append(list(ranks))
        return real(procs, workdir, ranks)

    real = stranded.dump_stacks
    monkeypatch.setattr(stranded, "dump_stacks", dump_stacks)
    out = run_ranks(rank_fns.slower_rank0, 2, args=(1.5 * stranded.IDLE_WINDOW_S, busy), timeout=300)
    assert out.ok, out.report()
    assert out.results == [0, 1]
    # the sleeping rank is looked at once (found in its own code), and its log keeps no trace
    # of the look (a computing one is not looked at, unless the machine starves it of CPU)
    assert busy or looked == [[0]]
    assert "Python stacks" not in out.logs[0] and "end of the rank's stacks" not in out.logs[0]
    assert_clean(out, workdirs)


def test_a_rank_waiting_for_a_computing_peer_is_not_failed_though_a_third_finished(workdirs: list[str]) -> None:
    """Rank 2 returned, rank 1 waits in a collective, but the peer it waits for (rank 0) still
    computes: the run can move, nobody fails."""
    out = run_ranks(rank_fns.pair_goes_on_after_rank2_finished, 3, args=(1.5 * stranded.IDLE_WINDOW_S,),
                    timeout=300)
    assert out.ok, out.report()
    assert out.results == [2, 2, 2]
    assert_clean(out, workdirs)


def test_the_known_bad_scenario_fails_as_a_hang_naming_both_ranks_and_where_they_stand() -> None:
    """DP without its sync, one rank idle: the idle rank's job ends at once while the busy one
    waits for it in check_agreement. The item's verdict says so (not "rank 0 timeout")."""
    from harness.scenario import load_scenario_file
    from harness.session import XFAILED, run_point

    points = load_scenario_file(ROOT / "scenarios" / "known_bad" / "dp_idle_no_sync.yaml")
    assert points
    for point in points:
        result = run_point(point, backend="emulated")
        assert result.outcome == XFAILED, result.verdict
        summary = result.checks["execution"].summary
        assert summary.startswith("rank 0 hang: waits at harness/features/dp.py:"), summary
        assert "in check_agreement" in summary and "rank 1 finished its job" in summary, summary
        assert "rank 1: timeout: finished its job" in result.checks["execution"].details["ranks"]


_DUMP = """Thread 0x00007f01 (most recent call first):
  File "{root}/harness/ranks/worker.py", line 157 in _watch_parent
  File "/usr/lib/python3.11/threading.py", line 982 in run

Current thread 0x00007f02 (most recent call first):
  File "{root}/harness/engine/emulated/collectives.py", line 176 in _take
  File "{torch}/_ops.py", line 1279 in __call__
  File "{root}/harness/features/dp.py", line 105 in check_agreement
  File "{root}/harness/graph/pipeline.py", line 272 in _execute
  File "{root}/harness/ranks/worker.py", line 121 in _run_job
  File "{root}/harness/ranks/worker.py", line 67 in worker_main
"""


def test_where_a_rank_stands_is_read_from_its_job_threads_stack() -> None:
    import torch

    dump = _DUMP.format(root=ROOT, torch=Path(torch.__file__).parent)
    frames = job_frames(dump, "_run_job", str(ROOT / "harness" / "ranks" / "worker.py"))
    assert [f.function for f in frames] == ["_take", "__call__", "check_agreement", "_execute"]
    assert runtime_frame(frames[0]) and runtime_frame(frames[1]) and not runtime_frame(frames[2])
    assert where(frames) == ("harness/features/dp.py:105 in check_agreement "
                             "(in harness/engine/emulated/collectives.py:176 in _take)")
    assert where(frames[2:]) == "harness/features/dp.py:105 in check_agreement"
    assert job_frames(dump, "_run_job", "/elsewhere/worker.py") == []  # no thread runs a job
    assert where([]) == "an unknown place (no stack)"
    assert not runtime_frame(Frame(str(ROOT / "tests" / "ranks" / "rank_fns.py"), 1, "f"))


def test_a_rank_log_keeps_what_follows_a_look_at_its_stacks() -> None:
    log = f"a\n\n{STACK_MARKER}Thread 0x1 ...\n{STACKS_END}b\n\n{STACK_MARKER}Thread 0x2 ...\n"
    assert without_stacks(log) == "a\nb\n"
    assert without_stacks("plain\n") == "plain\n"
