"""Tests for harness.ranks: real rank processes with torch.distributed (gloo, FileStore).

Ranks are warm workers (forked once from the warm server, in milliseconds, then reused) unless a
test asks for ``warm=False`` (interpreter + torch import, seconds): those tests are one run each.
No time limit below includes process start: ``outcome.startup`` is subtracted where a duration
is bounded.
"""

from __future__ import annotations

import os
import json
import multiprocessing.process
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from harness import ranks
from harness.ranks import run_in_process, run_ranks
from tests.ranks import rank_fns
from tests.ranks.conftest import assert_clean as _assert_clean, gone as _gone


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
    assert out.root_cause is by_rank[1]  # the cause, not its victim
    assert elapsed < 30, elapsed  # nowhere near the 120 s timeout
    assert "rank 1" in out.report() and "ValueError" in out.report()
    _assert_clean(out, workdirs)


def test_crash_reports_exit_code(workdirs: list[str]) -> None:
    out = run_ranks(rank_fns.exit_on_rank1, 2, args=(3,), timeout=120, grace=1.0)
    assert not out.ok
    by_rank = {f.rank: f for f in out.failures}
    assert by_rank[1].kind == "crash" and by_rank[1].exitcode == 3
    assert out.root_cause.rank == 1
    assert "code 3" in by_rank[1].message
    assert "rank 1 about to exit" in by_rank[1].log
    assert by_rank[0].kind == "timeout"
    assert out.duration < 30
    _assert_clean(out, workdirs)


def test_hang_in_collective_times_out_and_ends_all(workdirs: list[str]) -> None:
    out = run_ranks(rank_fns.skip_collective_on_rank1, 2, timeout=3)
    assert not out.ok
    assert {f.rank: f.kind for f in out.failures} == {0: "timeout", 1: "timeout"}
    assert all("3s timeout" in f.message for f in out.failures)
    assert "rank 0 entering all_reduce" in out.failures[0].log
    # each hung rank says where it hangs: its Python stack, dumped before it was ended
    assert "in all_reduce" in out.failures[0].traceback and "in skip_collective_on_rank1" in out.failures[0].traceback
    assert "in skip_collective_on_rank1" in out.failures[1].traceback and "all_reduce" not in out.failures[1].traceback
    assert "Python stacks" not in out.failures[0].log  # the dump is the traceback, not repeated in the log
    assert 3 <= out.duration - out.startup < 15  # the timeout counts from ready, not from start
    _assert_clean(out, workdirs)


def test_world_size_one_big_result_and_env(workdirs: list[str]) -> None:
    nbytes = 4 * 1024 * 1024
    # cold start (spawn): the path for env that must precede the torch import
    out = run_ranks(rank_fns.big_result, 1, args=(nbytes,), timeout=60, env={"GH_RANKS_TEST": "seen"}, warm=False)
    assert out.ok, out.report()
    (res,) = out.results
    assert len(res["payload"]) == nbytes and res["payload"][:3] == b"\x00\x01\x02"
    assert res["env"] == "seen" and res["world"] == 1
    _assert_clean(out, workdirs, warm=False)


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


def test_warm_workers_are_reused_and_a_bigger_world_adds_some(workdirs: list[str]) -> None:
    ranks.close_pool()
    first = run_ranks(rank_fns.parent_pid, 2, timeout=60)
    server = ranks.warm_server_pid()
    second = run_ranks(rank_fns.parent_pid, 2, timeout=60)
    assert first.ok and second.ok, first.report() + second.report()
    assert server is not None and ranks.warm_server_pid() == server
    assert first.results == [server, server] == second.results  # forked by the warm server
    assert second.pids == first.pids  # the same two processes, one job each time
    wider = run_ranks(rank_fns.all_reduce_sum, 3, args=(1.0,), timeout=60)
    assert wider.ok and wider.results[0]["sum"][0] == 6.0, wider.report()
    assert set(first.pids) < set(wider.pids)  # two reused, one forked
    assert "hello from rank 2 of 3" in wider.logs[2] and "of 2" not in wider.logs[0]  # a log per run
    _assert_clean(wider, workdirs)


def test_a_worker_puts_its_environment_back(workdirs: list[str]) -> None:
    ranks.close_pool()
    first = run_ranks(rank_fns.big_result, 1, args=(256,), timeout=60, env={"GH_RANKS_TEST": "seen"})
    second = run_ranks(rank_fns.big_result, 1, args=(256,), timeout=60)
    assert first.ok and second.ok and first.pids == second.pids
    assert first.results[0]["env"] == "seen" and second.results[0]["env"] is None
    _assert_clean(second, workdirs)


def test_a_failed_run_leaves_the_next_one_healthy(workdirs: list[str]) -> None:
    hung = run_ranks(rank_fns.skip_collective_on_rank1, 2, timeout=2, grace=0.5)
    assert not hung.ok and {f.kind for f in hung.failures} == {"timeout"}
    crashed = run_ranks(rank_fns.exit_on_rank1, 2, args=(9,), timeout=60, grace=0.5)
    assert not crashed.ok and crashed.failures[1].exitcode == 9
    assert all(_gone(pid) for pid in hung.pids + crashed.pids)  # a failed run's workers are ended
    after = run_ranks(rank_fns.all_reduce_sum, 2, args=(1.0,), timeout=60)
    assert after.ok, after.report()
    assert not set(after.pids) & set(hung.pids + crashed.pids)  # new ones
    assert torch.equal(after.results[0]["sum"], torch.full((4,), 3.0))
    _assert_clean(after, workdirs)
    assert not any(os.path.exists(d) for d in workdirs), workdirs  # the failed runs' dirs too


def test_a_dead_warm_server_is_replaced(workdirs: list[str]) -> None:
    """The server and an idle worker die (killed from outside): the next run forks new workers
    from a new server."""
    assert run_ranks(rank_fns.parent_pid, 1, timeout=60).ok
    old, (idle,) = ranks.warm_server_pid(), ranks.pool_pids()
    os.kill(old, signal.SIGKILL)
    os.kill(idle, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while not (_gone_or_zombie(old) and _gone_or_zombie(idle)) and time.monotonic() < deadline:
        time.sleep(0.05)
    out = run_ranks(rank_fns.parent_pid, 2, timeout=60)
    assert out.ok, out.report()
    assert ranks.warm_server_pid() not in (None, old) and out.results == [ranks.warm_server_pid()] * 2
    # Not left a zombie. Its parent was the killed server, so it is an orphan that the system's
    # reaper collects in its own time (this machine's pid 1 polls, about once a second).
    _wait_until(lambda: _gone(idle))
    _assert_clean(out, workdirs)


def test_a_job_imports_from_the_callers_path_of_the_moment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         workdirs: list[str]) -> None:
    """Workers forked before the caller added a path (a plugin installed since) still find what
    a job names there, and put their own path back after it."""
    assert run_ranks(rank_fns.parent_pid, 2, timeout=60).ok  # the workers exist before the path
    (tmp_path / "late_plugin_fns.py").write_text("import sys\n\ndef where(rank, world):\n    return __file__, len(sys.path)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import late_plugin_fns

    out = run_ranks(late_plugin_fns.where, 2, timeout=60)
    assert out.ok, out.report()
    assert all(r[0] == str(tmp_path / "late_plugin_fns.py") for r in out.results)
    monkeypatch.undo()
    sys.modules.pop("late_plugin_fns", None)
    after = run_ranks(rank_fns.parent_pid, 2, timeout=60)
    assert after.ok and after.pids == out.pids  # the same workers, their own path back
    _assert_clean(after, workdirs)


def test_world_size_is_capped() -> None:
    with pytest.raises(ValueError, match="MAX_WORLD_SIZE"):
        run_ranks(rank_fns.parent_pid, ranks.MAX_WORLD_SIZE + 1, timeout=5)
    with pytest.raises(ValueError):
        run_ranks(rank_fns.parent_pid, 0, timeout=5)


_HARNESS_SCRIPT = """
import json, sys
from harness import ranks
from tests.ranks import rank_fns
if __name__ == "__main__":
    out = ranks.run_ranks(rank_fns.{fn}, 2, timeout=120)
    print(json.dumps({{"ok": out.ok, "server": ranks.warm_server_pid(), "pids": out.pids}}), flush=True)
"""


def _harness_process(tmp_path: Path, fn: str) -> subprocess.Popen:
    script = tmp_path / "harness_process.py"
    script.write_text(textwrap.dedent(_HARNESS_SCRIPT.format(fn=fn)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), *sys.path]),
           "TMPDIR": str(tmp_path)}
    return subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)


def test_nothing_outlives_the_harness_process(tmp_path: Path) -> None:
    """After a harness process exits, its fork server and ranks are gone, and so are the temp dirs."""
    proc = _harness_process(tmp_path, "parent_pid")
    out, _ = proc.communicate(timeout=300)
    import json

    report = json.loads(out.strip().splitlines()[-1])
    assert proc.returncode == 0 and report["ok"], out
    for pid in [report["server"], *report["pids"]]:
        _wait_gone(pid)
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(("graph-harness-ranks-", "pymp-"))]


def test_ranks_of_a_killed_harness_exit_and_clean_up(tmp_path: Path) -> None:
    """SIGKILL the harness mid-run: its ranks (children of the server) notice and leave no temp dir."""
    proc = _harness_process(tmp_path, "sleep_forever")
    deadline = time.monotonic() + 300
    while len(list(tmp_path.glob("graph-harness-ranks-*/rank*.pid"))) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, "ranks never started"
        time.sleep(0.1)
    workdir = next(tmp_path.glob("graph-harness-ranks-*"))
    pids = [int(p.read_text()) for p in sorted(workdir.glob("rank*.pid"))]
    assert len(pids) == 2
    proc.kill()
    proc.wait()
    for pid in pids:
        _wait_gone(pid)
    _wait_until(lambda: not workdir.exists())


def _wait_until(cond, limit: float = 30.0) -> None:
    deadline = time.monotonic() + limit
    while not cond():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def _wait_gone(pid: int) -> None:
    _wait_until(lambda: _gone_or_zombie(pid))


def _gone_or_zombie(pid: int) -> bool:
    """Gone, or a zombie whose parent (not us) has not reaped it yet: it runs nothing."""
    if _gone(pid):
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_an_interrupted_run_ends_its_ranks(workdirs: list[str]) -> None:
    """The item's time limit (pytest-timeout, SIGALRM) raises in the parent mid-run: no rank,
    no temp dir is left behind."""

    class Limit(BaseException):  # like pytest-timeout's Failed: not an Exception
        pass

    def on_alarm(signum, frame):
        raise Limit()

    assert run_ranks(rank_fns.parent_pid, 1, timeout=60).ok  # the warm server is up: ranks start in ms
    seen: list[int] = list(ranks.pool_pids())  # the run takes the idle worker, and forks one more
    real_start = multiprocessing.process.BaseProcess.start

    def start(self):
        real_start(self)
        seen.append(self.pid)

    previous = signal.signal(signal.SIGALRM, on_alarm)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(multiprocessing.process.BaseProcess, "start", start)
            signal.setitimer(signal.ITIMER_REAL, 3.0)
            with pytest.raises(Limit):
                run_ranks(rank_fns.skip_collective_on_rank1, 2, timeout=120)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert len(seen) == 2 and all(_gone(pid) for pid in seen), seen
    assert workdirs and not any(os.path.exists(d) for d in workdirs)


_SERVER_SCRIPT = """
import json, sys
import torch
from harness import ranks
from tests.ranks import rank_fns
if __name__ == "__main__":
    torch.set_num_threads({threads})
    out = ranks.run_ranks(rank_fns.parent_pid, 2, timeout=120)
    server = ranks.warm_server_pid()
    with open(f"/proc/{{server}}/cmdline", "rb") as f:
        cmdline = f.read().decode().split("\\0")
    print(json.dumps({{"ok": out.ok, "parents": out.results, "server": server, "cmdline": cmdline}}), flush=True)
"""


@pytest.mark.parametrize(("threads", "forked"), [(1, True), (2, False)])
def test_the_warm_server_is_forked_from_a_harness_process_with_one_thread(tmp_path: Path, threads: int,
                                                                         forked: bool) -> None:
    """A process with torch imported and one intra-op thread forks its warm server (no second
    import of torch); one whose thread pool may be running spawns a fresh interpreter instead."""
    script = tmp_path / "server.py"
    script.write_text(textwrap.dedent(_SERVER_SCRIPT.format(threads=threads)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), *sys.path])}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["ok"] and out["parents"] == [out["server"]] * 2
    spawned = any("multiprocessing.forkserver" in part for part in out["cmdline"])
    assert spawned is not forked, out["cmdline"]


def test_the_spawned_warm_servers_preload_imports_no_dynamo_and_all_the_emulated_device_needs() -> None:
    """No torch._dynamo; sympy yes, once, in the server: torch imports it (with DTensor) on the
    first operation on any tensor subclass, the emulated device's tensors included, so the
    server preloads it and no rank job pays it (test_scenario_ranks_import_no_dynamo_or_sympy)."""
    code = ("import sys\nimport harness.warm_start\n"
            f"print([m for m in {rank_fns.HEAVY_MODULES!r} if m in sys.modules])\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "['sympy']", done.stdout + done.stderr


@pytest.mark.parametrize("point_id", ["FULL-tp2-dp1-k1-cp1-mixed", "PIECEWISE-tp1-dp1-k0-cp2-mixed"])
def test_scenario_ranks_import_no_dynamo_or_sympy(point_id: str) -> None:
    """A warm rank costs milliseconds only if its job stays off torch._dynamo and sympy: the
    collectives' shape inference and CP's gather used to import them (1 to 2 s per rank)."""
    from harness.scenario import load_scenario_file
    from harness.scenario.cross import select
    from harness.resolve import resolve_item

    path = Path(__file__).resolve().parents[2] / "scenarios" / "cross_product" / "cross_product.yaml"
    points = load_scenario_file(path, combinations=lambda m, e: select(m, e, how="full"))
    item = resolve_item(next(p for p in points if p.id == point_id).scenario)
    assert item.world_size == 2
    outcome = run_ranks(rank_fns.scenario_rank_imports, item.world_size, args=(item,), timeout=300)
    assert outcome.ok, outcome.report()
    assert outcome.results == [[], []]

