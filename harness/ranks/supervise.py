"""The harness's watch over one run's rank processes: wait for each to report or die, ask a hung
rank where it hangs, end whoever is left.

* **The timeout excludes start-up.** ``timeout`` counts from the moment every rank is ready, so
  a loaded machine (or the first start of the fork server) cannot eat a run's budget. Start-up
  has its own, generous limit.
* **A hung rank says where it hangs.** Before a rank that ran out of time is ended, it is sent
  ``SIGUSR1``, on which :mod:`faulthandler` writes every thread's Python stack into its log; the
  failure's ``traceback`` is that dump (a hang in a collective names the collective and the
  harness line that called it).
* **Nobody is left behind.** Once one rank has failed the others get ``grace`` seconds to
  finish (a peer stuck in a collective never will), then every live rank is terminated, killed
  after a short wait, and joined (reaped: no zombie).
"""

from __future__ import annotations

import multiprocessing.connection
import os
import signal
import time
from multiprocessing.process import BaseProcess
from typing import Any, Sequence, cast

from .outcome import RankFailure
from .protocol import mtime, read_result, ready_path, result_path
from .stacks import alive
from .stranded import StrandWatch, finished_marks, finished_message

__all__ = ["KILL_GRACE_S", "end_all", "end_and_close", "supervise"]

KILL_GRACE_S = 2.0
"""Time between SIGTERM and SIGKILL when ending a rank."""

_POLL_S = 0.1
"""How often the parent looks for a result file from a rank that is still alive."""


def supervise(
    procs: list[BaseProcess], workdir: str, start_deadline: float, timeout: float, grace: float,
    ready_at: list[float], conns: Sequence[multiprocessing.connection.Connection] | None = None,
    over: set[int] | None = None,
) -> tuple[list[Any | None], list[RankFailure]]:
    """Wait for every rank to report or die; stop at the deadline or ``grace`` after a failure.

    Until every rank is ready the limit is ``start_deadline``; the moment the last one is, the
    run's deadline becomes ``now + timeout`` (its time is appended to ``ready_at``). A rank is
    done once it has written its result and then either exited or, a warm worker (one with a
    connection in ``conns``), said on its connection that its job is over (its log complete;
    such ranks are added to ``over``).
    """
    n = len(procs)
    results: list[Any | None] = [None] * n  # unpickled: what the run's fn returned (its caller knows the type)
    failures: list[RankFailure] = []
    pending = set(range(n))
    first_failed: int | None = None
    closed: set[int] = set()
    over = set() if over is None else over
    deadline = start_deadline
    stop_at = deadline
    strands = StrandWatch(procs, workdir)
    while pending:
        now = time.monotonic()
        if not ready_at and all(os.path.exists(ready_path(workdir, r)) for r in range(n)):
            ready_at.append(now)
            deadline = now + timeout
            stop_at = deadline if first_failed is None else min(stop_at, deadline)
        if now >= stop_at:
            break
        poll = _POLL_S if ready_at else _POLL_S / 10  # a warm start takes milliseconds: notice it soon
        waitables: list[multiprocessing.connection.Connection | int] = [procs[r].sentinel for r in pending]
        if conns is not None:
            waitables += [conns[r] for r in pending if r not in closed]
        for woke in multiprocessing.connection.wait(waitables, timeout=min(poll, stop_at - now)):
            if not isinstance(woke, int):  # a worker's "job over" (or EOF: it died; its sentinel says so)
                r = conns.index(woke)  # type: ignore[union-attr]
                try:
                    cast(multiprocessing.connection.Connection, woke).recv_bytes()
                    over.add(r)
                except (EOFError, OSError):
                    closed.add(r)
        for r in sorted(pending):
            p = procs[r]
            is_alive = p.is_alive()
            path = result_path(workdir, r)
            if is_alive and not os.path.exists(path):
                continue
            record = read_result(path) if os.path.exists(path) else None
            if record is not None and record[0] == "ok":
                if is_alive and r not in over:
                    continue  # reported; let it exit or end its job (or be ended with the rest)
                results[r] = record[1]
            elif record is not None:
                _, message, tb = record
                failures.append(RankFailure(r, "exception", message, tb, exitcode=p.exitcode, at=mtime(path)))
            else:
                code = p.exitcode
                failures.append(RankFailure(r, "crash", _exit_message(code), exitcode=code, at=time.time()))
            pending.discard(r)
            if record is None or record[0] != "ok":
                if first_failed is None:
                    first_failed = r
                    stop_at = min(deadline, time.monotonic() + grace)
        if first_failed is None and ready_at and pending:
            hung = strands.check(pending, time.monotonic())
            if hung:
                failures.extend(hung)
                pending.difference_update(f.rank for f in hung)
                first_failed = hung[0].rank
        if first_failed is not None and len(finished_marks(workdir, pending)) == len(pending):
            break  # those left have finished and wait in the end-of-job barrier for a failed rank: no grace
    finished = finished_marks(workdir, pending)
    for r in sorted(pending):
        path = result_path(workdir, r)
        record = read_result(path) if os.path.exists(path) else None
        if record is not None and record[0] == "ok":
            results[r] = record[1]  # reported, but slow to exit: the result stands
            continue
        if record is not None:
            failures.append(RankFailure(r, "exception", record[1], record[2], at=mtime(path)))
            continue
        if r in finished and failures:
            msg = finished_message(sorted({f.rank for f in failures}), "which failed")
        elif r in finished:
            msg = finished_message(sorted(pending - finished.keys()), f"until the {timeout:g}s timeout")
        elif first_failed is not None and time.monotonic() < deadline:
            msg = f"ended after rank {first_failed} failed (grace {grace:g}s)"
        elif not ready_at:
            msg = "did not start within the start-up limit" + (
                "" if os.path.exists(ready_path(workdir, r)) else " (never became ready)")
        else:
            msg = f"did not finish within the {timeout:g}s timeout"
        failures.append(RankFailure(r, "timeout", msg))
    return results, failures


def end_all(procs: list[BaseProcess]) -> None:
    """Terminate, then kill, every live rank, and reap them all (no zombies)."""
    live = [p for p in procs if alive(p)]
    for p in live:
        p.terminate()
    limit = time.monotonic() + KILL_GRACE_S
    for p in live:
        p.join(max(0.0, limit - time.monotonic()))
    for p in live:
        if p.is_alive():
            p.kill()
    for p in procs:
        try:
            p.join()
        except ValueError:  # already closed
            pass


def end_and_close(procs: list[BaseProcess]) -> None:
    """:func:`end_all`, then release each process object's resources."""
    end_all(procs)
    for p in procs:
        try:
            p.close()
        except ValueError:  # still running: cannot happen after end_all, but never mask
            pass


def _exit_message(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name} (exit code {code}) without reporting a result"
    return f"exited with code {code} without reporting a result"
