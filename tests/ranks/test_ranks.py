"""Tests for harness.ranks: real spawned ranks with torch.distributed (gloo, FileStore).

Spawning a rank costs ~2-3 s (interpreter + torch import), so each test is one run.
"""

from __future__ import annotations

import os
import pickle
import tempfile
import time

import pytest
import torch

from harness import ranks
from harness.ranks import run_in_process, run_ranks
from tests.ranks import rank_fns


@pytest.fixture
def workdirs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the temp dirs run_ranks creates, to check they are removed."""
    made: list[str] = []
    real = tempfile.mkdtemp

    def mkdtemp(*a, **kw):
        made.append(real(*a, **kw))
        return made[-1]

    monkeypatch.setattr(ranks.tempfile, "mkdtemp", mkdtemp)
    return made


def _gone(pid: int) -> bool:
    """True when no process (not even a zombie) has this pid."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _assert_clean(outcome: ranks.RanksOutcome, workdirs: list[str]) -> None:
    assert outcome.pids and all(_gone(pid) for pid in outcome.pids), outcome.pids
    assert workdirs and not any(os.path.exists(d) for d in workdirs), workdirs


def test_all_reduce_results_in_rank_order_and_logs(workdirs: list[str]) -> None:
    out = run_ranks(rank_fns.all_reduce_sum, 2, args=(2.0,), timeout=60)
    assert out.ok, out.report()
    assert [r["rank"] for r in out.results] == [0, 1]
    for r in out.results:
        assert torch.equal(r["sum"], torch.full((4,), 6.0))  # 2*1 + 2*2
        assert r["threads"] == 1
    assert "hello from rank 0 of 2" in out.logs[0]
    assert "hello from rank 1 of 2" in out.logs[1]
    assert "rank 0" not in out.logs[1]
    _assert_clean(out, workdirs)


def test_exception_is_reported_and_peer_ended_promptly(workdirs: list[str]) -> None:
    t0 = time.monotonic()
    out = run_ranks(rank_fns.raise_on_rank1, 2, timeout=120, grace=1.0)
    elapsed = time.monotonic() - t0
    assert not out.ok
    assert out.results == [None, None]
    by_rank = {f.rank: f for f in out.failures}
    assert [f.rank for f in out.failures] == [0, 1]
    assert by_rank[1].kind == "exception"
    assert "ValueError" in by_rank[1].traceback and "rank 1 disagrees" in by_rank[1].message
    assert "ValueError" in by_rank[1].log  # the traceback is in the rank's log too
    assert by_rank[0].kind == "timeout" and "ended after rank 1 failed" in by_rank[0].message
    assert elapsed - out.startup < 30, (elapsed, out.startup)  # nowhere near the 120 s timeout
    assert "rank 1" in out.report() and "ValueError" in out.report()
    _assert_clean(out, workdirs)


def test_crash_reports_exit_code(workdirs: list[str]) -> None:
    out = run_ranks(rank_fns.exit_on_rank1, 2, args=(3,), timeout=120, grace=1.0)
    assert not out.ok
    by_rank = {f.rank: f for f in out.failures}
    assert by_rank[1].kind == "crash" and by_rank[1].exitcode == 3
    assert "code 3" in by_rank[1].message
    assert "rank 1 about to exit" in by_rank[1].log
    assert by_rank[0].kind == "timeout"
    assert out.duration - out.startup < 30, (out.duration, out.startup)
    _assert_clean(out, workdirs)


def test_hang_in_collective_times_out_and_ends_all(workdirs: list[str]) -> None:
    out = run_ranks(rank_fns.skip_collective_on_rank1, 2, timeout=8)
    assert not out.ok
    assert {f.rank: f.kind for f in out.failures} == {0: "timeout", 1: "timeout"}
    assert all("8s timeout" in f.message for f in out.failures)
    assert "rank 0 entering all_reduce" in out.failures[0].log
    # The budget counts from rank readiness: interpreter start and import torch are not in it.
    assert out.startup > 0 and 8 <= out.duration - out.startup < 20, (out.startup, out.duration)
    _assert_clean(out, workdirs)


def test_world_size_one_big_result_and_env(workdirs: list[str]) -> None:
    nbytes = 4 * 1024 * 1024
    out = run_ranks(rank_fns.big_result, 1, args=(nbytes,), timeout=60, env={"GH_RANKS_TEST": "seen"})
    assert out.ok, out.report()
    (res,) = out.results
    assert len(res["payload"]) == nbytes and res["payload"][:3] == b"\x00\x01\x02"
    assert res["env"] == "seen" and res["world"] == 1
    _assert_clean(out, workdirs)


def test_run_in_process() -> None:
    out = run_in_process(rank_fns.in_process_sum, args=(7,))
    assert out.ok and out.results == [7 + 1000] and out.pids == [os.getpid()]
    with_group = run_in_process(rank_fns.in_process_sum, args=(7,), process_group=True)
    assert with_group.ok and with_group.results == [7 + 1000], with_group.report()
    assert not torch.distributed.is_initialized()
    failed = run_in_process(rank_fns.fail_in_process)
    assert not failed.ok and failed.failures[0].kind == "exception"
    assert "KeyError" in failed.failures[0].traceback


def test_unpicklable_fn_is_a_caller_error() -> None:
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        run_ranks(lambda rank, ws: None, 2, timeout=5)
