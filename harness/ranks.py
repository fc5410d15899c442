"""Run a function on N real ranks (processes) joined by ``torch.distributed``.

Multi-rank scenarios (sequence, data and context parallel) need real collectives between real
processes: a single process pretending to be N ranks cannot hang in a collective, cannot
disagree with a peer about a shape, and cannot die halfway through. :func:`run_ranks` starts one
process per rank and turns every way a rank can go wrong into data (:class:`RanksOutcome`)
instead of a hung test session.

Design, and why:

* **spawn, not fork.** Forking a process that already runs torch's thread pools can deadlock the
  child; every rank is a fresh interpreter (``multiprocessing`` "spawn" context). Consequence:
  ``fn`` must be importable by reference (module level), and a plain script that calls
  :func:`run_ranks` needs the usual ``if __name__ == "__main__":`` guard.
* **FileStore rendezvous.** ``init_method="file://<fresh temp dir>/store"`` needs no TCP port, so
  parallel pytest-xdist workers never race for one.
* **Results through files, not a queue.** Each rank pickles its outcome to
  ``rank<r>.result.tmp`` and ``os.replace``-s it to ``rank<r>.result``. A rename is atomic, so a
  rank that dies mid-write leaves no result (it is a *crash*), a result of several MB costs
  nothing special, and there is no "joined before draining the queue" deadlock. An exception is
  sent back as formatted text, so an exception that does not pickle still reports.
* **Logs per rank.** The child points file descriptors 1 and 2 at ``rank<r>.log`` (C-level
  output from gloo/NCCL/HCCL is caught too); the outcome carries the tail of each log.
* **Nobody is left behind.** Once one rank has failed the others get ``grace`` seconds to
  finish (a peer stuck in a collective never will), then every live rank is terminated, killed
  after a short wait, and joined (reaped: no zombie). The temp dir is removed in every case.
  Each rank also watches its parent and, if orphaned (parent SIGKILLed), removes the temp dir
  and exits.
* **Env before torch.** ``harness.ranks`` does not import torch at module level and ``fn`` and
  ``args`` are unpickled inside the rank, after ``env`` is applied, so ``env`` (HCCL_*, NCCL_*,
  OMP_*) is in place before torch or the module of ``fn`` is imported in the rank.
"""

from __future__ import annotations

import datetime
import multiprocessing
import multiprocessing.connection
from multiprocessing.process import BaseProcess
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Sequence

__all__ = ["RankFailure", "RanksOutcome", "run_ranks", "run_in_process"]

FailureKind = Literal["exception", "crash", "timeout"]

LOG_TAIL_BYTES = 20_000
"""How much of each rank's log the outcome keeps (the end of it: where the error is)."""

KILL_GRACE_S = 2.0
"""Time between SIGTERM and SIGKILL when ending a rank."""

STARTUP_TIMEOUT_S = 300.0
"""How long the ranks may take to start (interpreter, ``import torch``, process group) before
``timeout`` starts counting: start-up time depends on machine load, not on ``fn``."""

_POLL_S = 0.1
"""How often the parent looks for a result file from a rank that is still alive."""


@dataclass(frozen=True)
class RankFailure:
    """Why one rank did not return a result.

    ``kind`` is ``"exception"`` (``fn`` or the rank's setup raised; ``traceback`` holds the
    formatted traceback), ``"crash"`` (the process exited without reporting: segfault,
    ``os._exit``, killed; ``message`` holds the exit code) or ``"timeout"`` (still running at the
    deadline, or ended after another rank failed).
    """

    rank: int
    kind: FailureKind
    message: str
    traceback: str | None = None
    log: str = ""
    exitcode: int | None = None


@dataclass
class RanksOutcome:
    """What a multi-rank run produced: per-rank results (``None`` where a rank failed)."""

    ok: bool
    results: list[Any | None]
    failures: list[RankFailure]
    duration: float
    logs: list[str] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)
    startup: float = 0.0  # seconds until every rank was ready (process group up); in duration

    def report(self) -> str:
        """Human-readable account of the failures, with each failed rank's log tail."""
        if self.ok:
            return f"all {len(self.results)} ranks ok in {self.duration:.1f}s"
        parts = [f"{len(self.failures)} of {len(self.results)} ranks failed ({self.duration:.1f}s)"]
        for f in self.failures:
            parts.append(f"--- rank {f.rank}: {f.kind}: {f.message}")
            if f.traceback:
                parts.append(f.traceback.rstrip())
            if f.log.strip():
                parts.append(f"--- rank {f.rank} log (tail):\n{f.log.rstrip()}")
        return "\n".join(parts)


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *,
    args: Sequence[Any] = (),
    timeout: float,
    backend: str = "gloo",
    env: dict[str, str] | None = None,
    grace: float = 5.0,
) -> RanksOutcome:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` spawned processes, one per rank.

    Each rank initialises a ``torch.distributed`` process group (``backend``, FileStore in a fresh
    temp dir), runs ``fn`` with one intra-op thread, destroys the group and sends back the
    (picklable) return value. ``timeout`` is wall-clock seconds counted from the moment every
    rank is ready (its process group initialised), so a loaded machine's slow interpreter start
    and ``import torch`` never eat into it; start-up itself may take up to
    :data:`STARTUP_TIMEOUT_S`. After the
    first failure the remaining ranks get ``grace`` seconds before they are ended. ``env`` is set
    in every rank before torch is imported there.

    Raises only for caller errors (bad ``world_size``, ``fn``/``args`` that do not pickle);
    everything that goes wrong inside a rank is reported in the returned outcome.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    payload = pickle.dumps((fn, tuple(args)))  # fails here, clearly, if fn is not importable
    # The rank's group timeout is a last resort (e.g. our own parent gone); the parent's
    # deadline should always fire first, so give gloo/NCCL generously more.
    group_timeout_s = timeout + grace + 60.0 + STARTUP_TIMEOUT_S
    ctx = multiprocessing.get_context("spawn")
    workdir = tempfile.mkdtemp(prefix="graph-harness-ranks-")
    procs: list[BaseProcess] = []
    start = time.monotonic()
    try:
        for rank in range(world_size):
            p = ctx.Process(
                target=_rank_main,
                args=(payload, rank, world_size, workdir, backend, dict(env or {}), group_timeout_s, os.getpid()),
                name=f"graph-harness-rank{rank}",
            )
            p.start()
            procs.append(p)
        results, failures, ready_at = _supervise(procs, workdir, start, timeout, grace)
        _end_all(procs)
        logs = [_log_tail(workdir, r) for r in range(world_size)]
        failures = [
            RankFailure(f.rank, f.kind, f.message, f.traceback, logs[f.rank], f.exitcode)
            for f in sorted(failures, key=lambda f: f.rank)
        ]
        return RanksOutcome(
            ok=not failures,
            results=results,
            failures=failures,
            duration=time.monotonic() - start,
            logs=logs,
            pids=[p.pid for p in procs],
            startup=(ready_at if ready_at is not None else time.monotonic()) - start,
        )
    finally:
        _end_all(procs)  # also on KeyboardInterrupt / unexpected errors in the parent
        for p in procs:
            try:
                p.close()
            except ValueError:  # still running: cannot happen after _end_all, but never mask
                pass
        shutil.rmtree(workdir, ignore_errors=True)


def run_in_process(
    fn: Callable[..., Any],
    *,
    args: Sequence[Any] = (),
    process_group: bool = False,
    backend: str = "gloo",
) -> RanksOutcome:
    """Run ``fn(0, 1, *args)`` in the current process: rank 0 of a world of 1, no spawn.

    For single-rank variants of multi-rank scenarios and for debugging (breakpoints, no start-up
    cost). No timeout can be enforced and a crash takes the caller down; logs are not captured
    (``logs`` is ``[""]``). By default no process group is created, because most single-rank code
    paths skip collectives when ``world_size == 1``; pass ``process_group=True`` when ``fn`` calls
    collectives anyway: a gloo world of one (FileStore in a temp dir) is created and destroyed
    around the call, unless a default group already exists, which is then left alone.
    """
    start = time.monotonic()
    workdir: str | None = None
    created = False
    try:
        if process_group:
            import torch.distributed as dist

            if not dist.is_initialized():
                workdir = tempfile.mkdtemp(prefix="graph-harness-ranks-")
                dist.init_process_group(backend, init_method=f"file://{workdir}/store", rank=0, world_size=1)
                created = True
        result = fn(0, 1, *args)
    except Exception as exc:  # noqa: BLE001 - reported, like a rank's exception
        failure = RankFailure(0, "exception", _describe(exc), traceback.format_exc())
        return RanksOutcome(False, [None], [failure], time.monotonic() - start, logs=[""], pids=[os.getpid()])
    finally:
        if created:
            import torch.distributed as dist

            dist.destroy_process_group()
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
    return RanksOutcome(True, [result], [], time.monotonic() - start, logs=[""], pids=[os.getpid()])


# --- parent side -------------------------------------------------------------------------------


def _supervise(
    procs: list[BaseProcess], workdir: str, start: float, timeout: float, grace: float
) -> tuple[list[Any | None], list[RankFailure], float | None]:
    """Wait for every rank to report or die; stop at the deadline (``timeout`` after every rank
    is ready) or ``grace`` after a failure. Also returns when the ranks were all ready."""
    n = len(procs)
    results: list[Any | None] = [None] * n
    failures: list[RankFailure] = []
    pending = set(range(n))
    first_failed: int | None = None
    ready_at: float | None = None
    deadline = start + STARTUP_TIMEOUT_S + timeout
    stop_at = deadline
    while pending:
        now = time.monotonic()
        if ready_at is None and all(os.path.exists(_ready_path(workdir, r)) for r in range(n)):
            ready_at = now
            deadline = now + timeout
            stop_at = min(stop_at, deadline)
        if now >= stop_at:
            break
        multiprocessing.connection.wait(
            [procs[r].sentinel for r in pending], timeout=min(_POLL_S, stop_at - now)
        )
        for r in sorted(pending):
            p = procs[r]
            alive = p.is_alive()
            path = _result_path(workdir, r)
            if alive and not os.path.exists(path):
                continue
            record = _read_result(path) if os.path.exists(path) else None
            if record is not None and record[0] == "ok":
                if alive:
                    continue  # reported; let it exit on its own (or be ended with the rest)
                results[r] = record[1]
            elif record is not None:
                _, message, tb = record
                failures.append(RankFailure(r, "exception", message, tb, exitcode=p.exitcode))
            else:
                code = p.exitcode
                failures.append(RankFailure(r, "crash", _exit_message(code), exitcode=code))
            pending.discard(r)
            if record is None or record[0] != "ok":
                if first_failed is None:
                    first_failed = r
                    stop_at = min(deadline, time.monotonic() + grace)
    for r in sorted(pending):
        path = _result_path(workdir, r)
        record = _read_result(path) if os.path.exists(path) else None
        if record is not None and record[0] == "ok":
            results[r] = record[1]  # reported, but slow to exit: the result stands
            continue
        if record is not None:
            failures.append(RankFailure(r, "exception", record[1], record[2]))
            continue
        msg = (
            f"ended after rank {first_failed} failed (grace {grace:g}s)"
            if first_failed is not None and time.monotonic() < deadline
            else f"did not finish within the {timeout:g}s timeout"
            if ready_at is not None
            else f"the ranks were not all ready within the {STARTUP_TIMEOUT_S:g}s start-up limit"
        )
        failures.append(RankFailure(r, "timeout", msg))
    return results, failures, ready_at


def _end_all(procs: list[BaseProcess]) -> None:
    """Terminate, then kill, every live rank, and reap them all (no zombies)."""
    live = [p for p in procs if _alive(p)]
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


def _alive(p: BaseProcess) -> bool:
    try:
        return p.is_alive()
    except ValueError:  # closed process object
        return False


def _read_result(path: str) -> tuple[Any, ...]:
    try:
        with open(path, "rb") as f:
            record = pickle.load(f)
    except Exception as exc:  # noqa: BLE001 - e.g. the result's class is not importable here
        return ("error", f"result could not be read in the parent: {_describe(exc)}", traceback.format_exc())
    return record


def _exit_message(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name} (exit code {code}) without reporting a result"
    return f"exited with code {code} without reporting a result"


def _log_path(workdir: str, rank: int) -> str:
    return os.path.join(workdir, f"rank{rank}.log")


def _ready_path(workdir: str, rank: int) -> str:
    return os.path.join(workdir, f"rank{rank}.ready")


def _result_path(workdir: str, rank: int) -> str:
    return os.path.join(workdir, f"rank{rank}.result")


def _log_tail(workdir: str, rank: int) -> str:
    try:
        with open(_log_path(workdir, rank), "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - LOG_TAIL_BYTES))
            data = f.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return text if size <= LOG_TAIL_BYTES else "[...]\n" + text


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


# --- rank side ---------------------------------------------------------------------------------


def _rank_main(
    payload: bytes,
    rank: int,
    world_size: int,
    workdir: str,
    backend: str,
    env: dict[str, str],
    group_timeout_s: float,
    parent_pid: int,
) -> None:
    """Entry point of a spawned rank: log redirection, env, process group, ``fn``, result file."""
    log_fd = os.open(_log_path(workdir, rank), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True)  # a print survives a later os._exit
        except (AttributeError, ValueError):
            pass
    threading.Thread(target=_watch_parent, args=(parent_pid, workdir), daemon=True).start()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.update(env)
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)  # several ranks share few cores
        fn, args = pickle.loads(payload)
        dist.init_process_group(
            backend,
            init_method=f"file://{workdir}/store",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=group_timeout_s),
        )
        open(_ready_path(workdir, rank), "wb").close()  # the parent's timeout starts now
        result = fn(rank, world_size, *args)
        dist.destroy_process_group()
        data = pickle.dumps(("ok", result), protocol=pickle.HIGHEST_PROTOCOL)
    except BaseException as exc:  # noqa: BLE001 - SystemExit from fn is a failure too
        tb = traceback.format_exc()
        sys.stderr.write(tb)
        _write_result(workdir, rank, pickle.dumps(("error", _describe(exc), tb)))
        sys.stdout.flush()
        sys.stderr.flush()
        # Skip interpreter teardown: a half-used process group may block in its destructor.
        os._exit(1)
    _write_result(workdir, rank, data)


def _write_result(workdir: str, rank: int, data: bytes) -> None:
    path = _result_path(workdir, rank)
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)  # atomic: the parent sees all of it or nothing


def _watch_parent(parent_pid: int, workdir: str) -> None:
    """Exit if the parent goes away (SIGKILLed harness): no orphan rank stuck in a collective.

    The parent's own cleanup cannot run then, so the orphan removes the temp dir on its way out.
    """
    while True:
        if os.getppid() != parent_pid:
            shutil.rmtree(workdir, ignore_errors=True)
            os._exit(70)
        time.sleep(1.0)
