"""Run a function on N real ranks (processes) joined by ``torch.distributed``.

Multi-rank scenarios (sequence, data and context parallel) need real collectives between real
processes: a single process pretending to be N ranks cannot hang in a collective, cannot
disagree with a peer about a shape, and cannot die halfway through. :func:`run_ranks` starts one
process per rank and turns every way a rank can go wrong into data (:class:`RanksOutcome`)
instead of a hung test session.

Design, and why:

* **A warm fork server, not a fresh interpreter per rank.** Starting an interpreter and
  importing torch costs seconds per rank; an item of two ranks paid it twice. By default ranks
  come from a ``multiprocessing`` *forkserver*: one server per harness process (per pytest-xdist
  worker), started on first use, that has imported torch, :mod:`harness.warm_start` and the
  module of ``fn`` and then forks one fresh rank per request. Every item still gets brand-new
  rank processes and a brand-new process group, so crash isolation is exactly that of a
  fresh process: a rank that raises, crashes or hangs takes nothing with it but its own item.
  The server never runs torch code, so forking it is safe (forking a process whose thread
  pools are running could deadlock the child). If the server dies, the next run starts a new
  one. ``warm=False`` spawns fresh interpreters instead (the old way): use it when ``env``
  must be in place before torch is imported (in a warm rank torch is already imported).
  Consequence of both: ``fn`` must be importable by reference (module level), and a plain
  script that calls :func:`run_ranks` needs the usual ``if __name__ == "__main__":`` guard.
* **The timeout excludes start-up.** Each rank touches ``rank<r>.ready`` once it runs with
  torch imported; ``timeout`` counts from the moment every rank is ready, so a loaded machine
  (or the first start of the fork server) cannot eat a run's budget. Start-up has its own,
  generous limit (``start_timeout``).
* **A cap on the world.** At most :data:`MAX_WORLD_SIZE` ranks per run: each rank is a process
  holding a model, and the shipped cross product needs at most dp 4 x tp 4.
* **FileStore rendezvous.** ``init_method="file://<fresh temp dir>/store"`` needs no TCP port, so
  parallel pytest-xdist workers never race for one.
* **Results through files, not a queue.** Each rank pickles its outcome to
  ``rank<r>.result.tmp`` and ``os.replace``-s it to ``rank<r>.result``. A rename is atomic, so a
  rank that dies mid-write leaves no result (it is a *crash*), a result of several MB costs
  nothing special, and there is no "joined before draining the queue" deadlock. An exception is
  sent back as formatted text, so an exception that does not pickle still reports.
* **Logs per rank.** The child points file descriptors 1 and 2 at ``rank<r>.log`` (C-level
  output from gloo/NCCL/HCCL is caught too); the outcome carries the tail of each log.
* **A hung rank says where it hangs.** Before a rank that ran out of time is ended, it is
  sent ``SIGUSR1``, on which :mod:`faulthandler` writes every thread's Python stack into its
  log; the failure's ``traceback`` is that dump (a hang in a collective names the collective
  and the harness line that called it).
* **Nobody is left behind.** Once one rank has failed the others get ``grace`` seconds to
  finish (a peer stuck in a collective never will), then every live rank is terminated, killed
  after a short wait, and joined (reaped: no zombie). The temp dir is removed in every case.
  Each rank also watches the harness process (a pidfd: a forked rank's parent is the server,
  not the harness) and, if the harness dies (SIGKILLed), removes the temp dir and exits. The
  fork server exits with the harness process (multiprocessing closes its "alive" pipe).
* **Env before the process group.** ``harness.ranks`` does not import torch at module level and
  ``fn`` and ``args`` are unpickled inside the rank, after ``env`` is applied, so ``env``
  (HCCL_*, NCCL_*) is in place before the process group is created and before the module of
  ``fn`` is imported (unless the warm server preloaded it); with ``warm=False``, also before
  torch is imported.
"""

from __future__ import annotations

import datetime
import faulthandler
import multiprocessing
import multiprocessing.connection
from multiprocessing.process import BaseProcess
import os
import pickle
import select
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Sequence

__all__ = ["MAX_WORLD_SIZE", "RankFailure", "RanksOutcome", "run_ranks", "run_in_process", "warm_server_pid"]

FailureKind = Literal["exception", "crash", "timeout"]

LOG_TAIL_BYTES = 20_000
"""How much of each rank's log the outcome keeps (the end of it: where the error is)."""

KILL_GRACE_S = 2.0
"""Time between SIGTERM and SIGKILL when ending a rank."""

STACK_DUMP_WAIT_S = 1.0
"""How long a timed-out rank gets to write its stacks (:mod:`faulthandler`) before it is ended."""

_STACK_MARKER = "--- graph-harness: the rank's Python stacks when it ran out of time ---\n"

_POLL_S = 0.1
"""How often the parent looks for a result file from a rank that is still alive."""

MAX_WORLD_SIZE = 16
"""Most ranks one run may start (dp 4 x tp 4, the largest world of the shipped cross product).

A cap, not a pool size: each run forks exactly ``world_size`` ranks and ends them all. With
pytest-xdist every worker runs its own items, so the machine sees at most
``workers x MAX_WORLD_SIZE`` ranks at a time."""

START_TIMEOUT_S = 300.0
"""Default limit on start-up (fork or spawn, ``import torch``), kept apart from ``timeout``."""

WARM_PRELOAD = ("__main__", "harness.warm_start")
"""What the warm fork server imports before it forks (plus the module of the first ``fn``)."""


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
    at: float = float("inf")
    """Wall-clock time of the failure (its result file's mtime, or when a crash was seen)."""


@dataclass
class RanksOutcome:
    """What a multi-rank run produced: per-rank results (``None`` where a rank failed)."""

    ok: bool
    results: list[Any | None]
    failures: list[RankFailure]
    duration: float
    logs: list[str] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)
    startup: float = 0.0
    """Seconds from the first start until every rank was ready (not counted in ``timeout``)."""

    @property
    def root_cause(self) -> RankFailure | None:
        """The failure that came first: the others are often its victims (a peer's collective
        reset, a timeout after the grace)."""
        return min(self.failures, key=lambda f: (f.at, f.rank)) if self.failures else None

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
    warm: bool = True,
    start_timeout: float = START_TIMEOUT_S,
) -> RanksOutcome:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` fresh processes, one per rank.

    Each rank initialises a ``torch.distributed`` process group (``backend``, FileStore in a fresh
    temp dir), runs ``fn`` with one intra-op thread, destroys the group and sends back the
    (picklable) return value. ``timeout`` is wall-clock seconds for the run, counted from the
    moment every rank is up; start-up (forking from the warm server, or with ``warm=False``
    spawning an interpreter and importing torch) has its own limit, ``start_timeout``. After
    the first failure the remaining ranks get ``grace`` seconds before they are ended. ``env``
    is set in every rank before its process group is created (with ``warm=False`` also before
    torch is imported there).

    Raises only for caller errors (``world_size`` outside 1..:data:`MAX_WORLD_SIZE`,
    ``fn``/``args`` that do not pickle); everything that goes wrong inside a rank is reported
    in the returned outcome.
    """
    if not 1 <= world_size <= MAX_WORLD_SIZE:
        raise ValueError(f"world_size must be between 1 and MAX_WORLD_SIZE {MAX_WORLD_SIZE}, got {world_size}")
    payload = pickle.dumps((fn, tuple(args)))  # fails here, clearly, if fn is not importable
    # The rank's group timeout is a last resort (e.g. our own parent gone); the parent's
    # deadline should always fire first, so give gloo/NCCL generously more.
    group_timeout_s = timeout + grace + 60.0
    ctx = _warm_context(fn) if warm else multiprocessing.get_context("spawn")
    workdir = tempfile.mkdtemp(prefix="graph-harness-ranks-")
    procs: list[BaseProcess] = []
    start = time.monotonic()
    ready_at: list[float] = []
    try:
        for rank in range(world_size):
            p = ctx.Process(
                target=_rank_main,
                args=(payload, rank, world_size, workdir, backend, dict(env or {}), group_timeout_s, os.getpid()),
                name=f"graph-harness-rank{rank}",
            )
            try:
                p.start()
            except Exception as exc:  # noqa: BLE001 - e.g. the warm server died while preloading
                return _not_started(procs, world_size, exc, time.monotonic() - start)
            procs.append(p)
        results, failures = _supervise(procs, workdir, start + start_timeout, timeout, grace, ready_at)
        stacks = _dump_stacks(procs, workdir, [f.rank for f in failures if f.kind == "timeout"])
        _end_all(procs)
        logs = [_log_tail(workdir, r).partition("\n" + _STACK_MARKER)[0] for r in range(world_size)]
        failures = [
            RankFailure(f.rank, f.kind, f.message, f.traceback or stacks.get(f.rank), logs[f.rank], f.exitcode, f.at)
            for f in sorted(failures, key=lambda f: f.rank)
        ]
        return RanksOutcome(
            ok=not failures,
            results=results,
            failures=failures,
            duration=time.monotonic() - start,
            logs=logs,
            pids=[p.pid for p in procs],
            startup=(ready_at[0] if ready_at else time.monotonic()) - start,
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


def _not_started(procs: list[BaseProcess], world_size: int, exc: Exception, duration: float) -> RanksOutcome:
    """Every rank failed: one could not even be started (the caller's ``finally`` ends the others)."""
    message = f"could not start rank {len(procs)}: {_describe(exc)}"
    failures = [RankFailure(r, "crash", message, traceback.format_exc()) for r in range(world_size)]
    return RanksOutcome(False, [None] * world_size, failures, duration, logs=[""] * world_size,
                        pids=[p.pid for p in procs])


def warm_server_pid() -> int | None:
    """The pid of this process's warm fork server, None before the first warm run."""
    from multiprocessing import forkserver

    return forkserver._forkserver._forkserver_pid  # noqa: SLF001 - the stdlib has no public getter


def _warm_context(fn: Callable[..., Any]) -> multiprocessing.context.BaseContext:
    """The forkserver context; the server (started on first use) preloads torch and ``fn``'s module.

    The preload list only matters when the server starts: later runs reuse the server, and a
    ``fn`` from a module it did not preload is imported in the forked rank (still no torch import).
    """
    ctx = multiprocessing.get_context("forkserver")
    if warm_server_pid() is None:
        ctx.set_forkserver_preload([*WARM_PRELOAD, getattr(fn, "__module__", None) or "harness.warm_start"])
    return ctx


# --- parent side -------------------------------------------------------------------------------


def _supervise(
    procs: list[BaseProcess], workdir: str, start_deadline: float, timeout: float, grace: float,
    ready_at: list[float],
) -> tuple[list[Any | None], list[RankFailure]]:
    """Wait for every rank to report or die; stop at the deadline or ``grace`` after a failure.

    Until every rank is ready the limit is ``start_deadline``; the moment the last one is, the
    run's deadline becomes ``now + timeout`` (its time is appended to ``ready_at``).
    """
    n = len(procs)
    results: list[Any | None] = [None] * n
    failures: list[RankFailure] = []
    pending = set(range(n))
    first_failed: int | None = None
    deadline = start_deadline
    stop_at = deadline
    while pending:
        now = time.monotonic()
        if not ready_at and all(os.path.exists(_ready_path(workdir, r)) for r in range(n)):
            ready_at.append(now)
            deadline = now + timeout
            stop_at = deadline if first_failed is None else min(stop_at, deadline)
        if now >= stop_at:
            break
        poll = _POLL_S if ready_at else _POLL_S / 10  # a warm start takes milliseconds: notice it soon
        multiprocessing.connection.wait([procs[r].sentinel for r in pending], timeout=min(poll, stop_at - now))
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
                failures.append(RankFailure(r, "exception", message, tb, exitcode=p.exitcode, at=_mtime(path)))
            else:
                code = p.exitcode
                failures.append(RankFailure(r, "crash", _exit_message(code), exitcode=code, at=time.time()))
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
            failures.append(RankFailure(r, "exception", record[1], record[2], at=_mtime(path)))
            continue
        if first_failed is not None and time.monotonic() < deadline:
            msg = f"ended after rank {first_failed} failed (grace {grace:g}s)"
        elif not ready_at:
            msg = "did not start within the start-up limit" + (
                "" if os.path.exists(_ready_path(workdir, r)) else " (never became ready)")
        else:
            msg = f"did not finish within the {timeout:g}s timeout"
        failures.append(RankFailure(r, "timeout", msg))
    return results, failures


def _dump_stacks(procs: list[BaseProcess], workdir: str, ranks: list[int]) -> dict[int, str]:
    """Ask each live rank of ``ranks`` for its Python stacks (SIGUSR1, see :func:`_rank_main`);
    return what each wrote within :data:`STACK_DUMP_WAIT_S`, by rank."""
    asked: dict[int, int] = {}
    for r in ranks:
        if not _alive(procs[r]) or procs[r].pid is None:
            continue
        path = _log_path(workdir, r)
        try:
            with open(path, "a") as log:
                log.write("\n" + _STACK_MARKER)
            asked[r] = os.path.getsize(path)
            os.kill(procs[r].pid, signal.SIGUSR1)
        except OSError:  # gone meanwhile
            asked.pop(r, None)
    stacks: dict[int, str] = {}
    seen = dict.fromkeys(asked, -1)
    limit = time.monotonic() + STACK_DUMP_WAIT_S
    while asked and time.monotonic() < limit:
        time.sleep(0.05)
        for r, size in list(asked.items()):
            text = _read_from(_log_path(workdir, r), size)
            if text and len(text) == seen[r]:  # written, and no longer growing
                stacks[r] = text.rstrip()
                del asked[r]
            seen[r] = len(text)
    for r, size in asked.items():  # partial, or nothing: say what there is
        text = _read_from(_log_path(workdir, r), size).rstrip()
        if text:
            stacks[r] = text
    return stacks


def _read_from(path: str, offset: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(LOG_TAIL_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return ""


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


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return time.time()


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


def _result_path(workdir: str, rank: int) -> str:
    return os.path.join(workdir, f"rank{rank}.result")


def _ready_path(workdir: str, rank: int) -> str:
    return os.path.join(workdir, f"rank{rank}.ready")


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
    """Entry point of a rank: log redirection, env, ready file, process group, ``fn``, result file."""
    log_fd = os.open(_log_path(workdir, rank), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True)  # a print survives a later os._exit
        except (AttributeError, ValueError):
            pass
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)  # the parent asks on a timeout
    threading.Thread(target=_watch_parent, args=(parent_pid, workdir), daemon=True).start()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.update(env)
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)  # several ranks share few cores
        open(_ready_path(workdir, rank), "wb").close()  # started: the run's timeout counts from here
        fn, args = pickle.loads(payload)
        dist.init_process_group(
            backend,
            init_method=f"file://{workdir}/store",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=group_timeout_s),
        )
        result = fn(rank, world_size, *args)
        if world_size > 1:
            dist.barrier()  # a fast rank must not close its connections while a peer still sets up
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
    sys.stdout.flush()
    sys.stderr.flush()
    # Reported: exit now. Interpreter teardown frees a heap nobody reads and would keep the
    # parent, which waits for every rank's exit, waiting a few hundred ms per item.
    os._exit(0)


def _write_result(workdir: str, rank: int, data: bytes) -> None:
    path = _result_path(workdir, rank)
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)  # atomic: the parent sees all of it or nothing


def _watch_parent(parent_pid: int, workdir: str) -> None:
    """Exit if the harness process goes away (SIGKILLed): no orphan rank stuck in a collective.

    A warm rank's parent is the fork server, not the harness, so the rank watches the harness's
    pid itself: through a pidfd (readable once that process has exited; no pid-reuse race),
    else by polling. The harness's own cleanup cannot run then, so the orphan removes the temp
    dir on its way out.
    """
    try:
        fd = os.pidfd_open(parent_pid)
    except ProcessLookupError:
        fd = None  # already gone
    except (AttributeError, OSError):  # no pidfd here: poll
        while _pid_alive(parent_pid):
            time.sleep(1.0)
        fd = None
    if fd is not None:
        select.select([fd], [], [])
    shutil.rmtree(workdir, ignore_errors=True)
    os._exit(70)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
