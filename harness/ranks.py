"""Run a function on N real ranks (processes) joined by ``torch.distributed``.

Multi-rank scenarios (sequence, data and context parallel) need real collectives between real
processes: a single process pretending to be N ranks cannot hang in a collective, cannot
disagree with a peer about a shape, and cannot die halfway through. :func:`run_ranks` starts one
process per rank and turns every way a rank can go wrong into data (:class:`RanksOutcome`)
instead of a hung test session.

Design, and why:

* **Warm rank workers, reused across runs.** Starting an interpreter and importing torch costs
  seconds per rank; an item of two ranks paid it twice. By default a run's ranks are *workers*
  of a pool kept by the harness process (one pool per pytest process or xdist worker): each
  worker is forked once from a ``multiprocessing`` *forkserver* that has imported torch and
  the rank job's modules (:mod:`harness.rank_preload`), then runs one job after another. The
  server is itself a fork of the harness process where that is safe (torch imported with one
  intra-op thread, no process group, the stdlib's server protocol as known: see
  :func:`_fork_warm_server`), so it costs a fork, not a second interpreter importing torch;
  elsewhere it is spawned, with :mod:`harness.warm_start` as its preload. A job is a whole
  rank: its own log, its own fresh process group (FileStore in the run's fresh temp dir),
  ``fn``, and the group destroyed again. Reuse is what makes a rank cheap: a forked process pays the fork, a
  copy of every page of the server's heap it touches and its exit, and starts with cold caches
  (shape inference, torch's dispatch, Python's own); measured on 30 cross-product jobs, a reused
  worker spends 31% less CPU in the job itself. The server never runs torch code, so forking it
  is safe (forking a process whose thread pools are running could deadlock the child). If the
  server dies, the next start brings up a new one (spawned).
* **Crash isolation as with fresh processes.** Only a run in which every rank reported a result
  gives its workers back to the pool. A rank that raises exits after reporting (a half-used
  process group may block in its destructor), one that crashes is gone, and every worker of a
  run that failed, timed out or was interrupted is ended and replaced by a fresh fork on
  demand: its item fails alone, with its logs and tracebacks, and the next item runs on healthy
  workers. ``warm=False`` spawns fresh interpreters instead, one run each (the old way): use it
  when ``env`` must be in place before torch is imported (in a warm rank torch is already
  imported), or when a job must not share a process with earlier ones. :func:`close_pool` ends
  the idle workers. Consequence of both: ``fn`` must be importable by reference (module
  level), and a plain script that calls :func:`run_ranks` needs the usual
  ``if __name__ == "__main__":`` guard.
* **The timeout excludes start-up.** Each rank touches ``rank<r>.ready`` once it runs with
  torch imported; ``timeout`` counts from the moment every rank is ready, so a loaded machine
  (or the first start of the fork server) cannot eat a run's budget. Start-up has its own,
  generous limit (``start_timeout``).
* **A cap on the world.** At most :data:`MAX_WORLD_SIZE` ranks per run, and so at most as many
  workers in a pool: each is a process holding a model, and the shipped cross product needs at
  most dp 4 x tp 4.
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
  Each rank also watches the harness process (a pidfd: a worker's parent is the server, not
  the harness) and, if the harness dies (SIGKILLed) or exits, removes its run's temp dir and
  exits. The fork server exits with the harness process (multiprocessing closes its "alive"
  pipe).
* **Env before the process group.** ``harness.ranks`` does not import torch at module level and
  ``fn`` and ``args`` are unpickled inside the rank, after ``env`` is applied, so ``env``
  (HCCL_*, NCCL_*) is in place before the process group is created and before the module of
  ``fn`` is imported (unless the worker already has it); with ``warm=False``, also before
  torch is imported. A worker puts its environment back after each job.
"""

from __future__ import annotations

import datetime
import faulthandler
import gc
import importlib
import multiprocessing
import multiprocessing.connection
from multiprocessing.process import BaseProcess
import os
import pickle
import select
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Sequence

from harness.engine import RUN_DIR_ENV  # every rank is told its run's temp dir

__all__ = ["MAX_WORLD_SIZE", "RankFailure", "RanksOutcome", "close_pool", "pool_pids", "run_ranks", "run_in_process",
           "warm_server_pid"]

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
"""Most ranks one run may have (dp 4 x tp 4, the largest world of the shipped cross product).

Also the most workers a pool holds: a pool grows to the largest world it has run. With
pytest-xdist every xdist worker has its own pool, so the machine holds at most
``xdist workers x MAX_WORLD_SIZE`` rank processes."""

GLOO_ENV = {"TORCH_GLOO_LAZY_INIT": "1"}
"""Set in every rank: a gloo process group connects a pair of ranks when they first exchange,
not every pair when the group is made. Every rank makes every group of every axis, most of
which never carry a message (the data goes through shared memory), and a full mesh of 16 ranks
is 120 connections; lazily, a 16-rank item ran 20% faster."""

START_TIMEOUT_S = 300.0
"""Default limit on start-up (fork or spawn, ``import torch``), kept apart from ``timeout``."""

WARM_PRELOAD = ("__main__", "harness.warm_start")
"""What a spawned warm fork server imports before it forks (plus the module of the first ``fn``)."""

FORKED_PRELOAD = ("harness.rank_preload",)
"""What this process imports before it forks the warm fork server (plus the module of ``fn``)."""


@dataclass(frozen=True)
class _Job:
    """One rank of one run, as sent to the process that runs it."""

    payload: bytes  # pickled (fn, args): unpickled in the rank, after env is applied
    rank: int
    world_size: int
    workdir: str
    backend: str
    env: dict[str, str]
    group_timeout_s: float
    sys_path: tuple[str, ...] = ()  # the caller's, where fn's module and plugins are found


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
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` ranks, one process each.

    Each rank initialises a ``torch.distributed`` process group (``backend``, FileStore in a fresh
    temp dir), runs ``fn`` with one intra-op thread, destroys the group and sends back the
    (picklable) return value. ``timeout`` is wall-clock seconds for the run, counted from the
    moment every rank is up; start-up (a warm worker taking the job, forking a new one from the
    warm server, or with ``warm=False`` spawning an interpreter and importing torch) has its own
    limit, ``start_timeout``. After the first failure the remaining ranks get ``grace`` seconds
    before they are ended. ``env`` (with :data:`GLOO_ENV` and :data:`RUN_DIR_ENV`) is set in
    every rank before its process group is created
    (with ``warm=False`` also before torch is imported there).

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
    workdir = tempfile.mkdtemp(prefix="graph-harness-ranks-", dir=_run_dir_root())
    job_env = {**GLOO_ENV, **(env or {}), RUN_DIR_ENV: workdir}
    jobs = [_Job(payload, rank, world_size, workdir, backend, job_env, group_timeout_s, tuple(sys.path))
            for rank in range(world_size)]
    procs: list[BaseProcess] = []
    workers: list[_Worker] = []
    healthy = False
    start = time.monotonic()
    ready_at: list[float] = []
    try:
        try:
            if warm:
                workers = _POOL.take(world_size, fn)
                procs = [w.process for w in workers]
                for worker, job in zip(workers, jobs):
                    worker.send(job)
            else:
                ctx = multiprocessing.get_context("spawn")
                for job in jobs:
                    p = ctx.Process(target=_rank_main, args=(pickle.dumps(job), os.getpid()),
                                    name=f"graph-harness-rank{job.rank}")
                    p.start()
                    procs.append(p)
        except Exception as exc:  # noqa: BLE001 - e.g. the warm server died while preloading
            return _not_started(procs, world_size, exc, time.monotonic() - start)
        over: set[int] = set()
        results, failures = _supervise(procs, workdir, start + start_timeout, timeout, grace, ready_at,
                                       [w.conn for w in workers] if warm else None, over)
        stacks = _dump_stacks(procs, workdir, [f.rank for f in failures if f.kind == "timeout"])
        healthy = warm and not failures and len(over) == world_size  # each worker waits for a job
        if not healthy:
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
        if healthy:
            _POOL.give_back(workers)  # every rank reported: each worker waits for its next job
        else:  # also on KeyboardInterrupt / an item's time limit / unexpected errors in the parent
            for worker in workers:
                worker.conn.close()
            _end_and_close(procs)
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


SHM_DIR = "/dev/shm"
SHM_MIN_FREE_BYTES = 1 << 30
"""A run's temp dir goes in :data:`SHM_DIR` (memory) when that has this much room."""


def _run_dir_root() -> str | None:
    """Where a run's temp dir goes: in memory (:data:`SHM_DIR`), where the ranks' shared-memory
    collectives then live (a page fault there costs a fraction of one in a file on disk), unless
    ``TMPDIR`` names a place of the user's choosing or :data:`SHM_DIR` is missing or small (a
    container's 64 MB default: a write to a mapped page of a full tmpfs kills the process).
    None: :mod:`tempfile`'s default."""
    if os.environ.get("TMPDIR"):
        return None
    try:
        stats = os.statvfs(SHM_DIR)
    except OSError:
        return None
    if stats.f_bavail * stats.f_frsize < SHM_MIN_FREE_BYTES or not os.access(SHM_DIR, os.W_OK | os.X_OK):
        return None
    return SHM_DIR


def _not_started(procs: list[BaseProcess], world_size: int, exc: Exception, duration: float) -> RanksOutcome:
    """Every rank failed: the run's processes could not all be started or given their jobs (the
    caller's ``finally`` ends those that were)."""
    message = f"could not start the run's {world_size} ranks: {_describe(exc)}"
    failures = [RankFailure(r, "crash", message, traceback.format_exc()) for r in range(world_size)]
    return RanksOutcome(False, [None] * world_size, failures, duration, logs=[""] * world_size,
                        pids=[p.pid for p in procs])


def warm_server_pid() -> int | None:
    """The pid of this process's warm fork server, None before the first warm run."""
    from multiprocessing import forkserver

    return forkserver._forkserver._forkserver_pid  # noqa: SLF001 - the stdlib has no public getter


def pool_pids() -> list[int]:
    """The pids of this process's idle warm workers (those a next run would take first)."""
    return [w.process.pid for w in _POOL.idle if w.process.pid is not None]


def close_pool() -> None:
    """End every idle warm worker; the next warm run forks new ones."""
    _POOL.close()


def _warm_context(fn: Callable[..., Any]) -> multiprocessing.context.BaseContext:
    """The forkserver context; the server (started on first use) preloads torch and ``fn``'s module.

    The preload list only matters when the server starts: later runs reuse the server, and a
    ``fn`` from a module it did not preload is imported in the worker (still no torch import).
    """
    ctx = multiprocessing.get_context("forkserver")
    if warm_server_pid() is None:
        module = getattr(fn, "__module__", None)
        ctx.set_forkserver_preload([*WARM_PRELOAD, module or "harness.warm_start"])
        _fork_warm_server([*FORKED_PRELOAD, *([module] if module and module != "__main__" else [])])
    return ctx


def _fork_warm_server(preload: list[str]) -> None:
    """Start multiprocessing's fork server as a fork of this process rather than a fresh
    interpreter: this process has imported torch already, so the server costs a fork instead
    of seconds of imports (per pytest process, or per xdist worker).

    Only when that is safe, which is when no torch thread pool can be running here: torch is
    imported with one intra-op thread (the pytest plugin sets it) and no process group exists.
    The server closes every descriptor it inherited but its own and never touches this
    process's objects. Only where the stdlib's server protocol is the one known here (Linux,
    CPython before 3.14, which added an authentication key). Otherwise the server is spawned as
    before."""
    from multiprocessing import connection, forkserver, resource_tracker, util

    server = forkserver._forkserver  # noqa: SLF001 - the stdlib's own server object
    if sys.platform != "linux" or sys.version_info >= (3, 14) or hasattr(server, "_forkserver_authkey"):
        return
    torch = sys.modules.get("torch")
    if torch is None or torch.get_num_threads() != 1:
        return
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return
    for name in preload:
        importlib.import_module(name)  # the server holds what a spawned one would import
    with server._lock:  # noqa: SLF001
        if server._forkserver_pid is not None:  # noqa: SLF001
            return
        resource_tracker.ensure_running()
        with socket.socket(socket.AF_UNIX) as listener:
            address = connection.arbitrary_address("AF_UNIX")
            listener.bind(address)
            if not util.is_abstract_socket_namespace(address):
                os.chmod(address, 0o600)
            listener.listen()
            alive_r, alive_w = os.pipe()  # the server exits once every holder of alive_w has
            forked: list[int] = []
            # From a thread of its own, so that the server's stack (which every rank's stack
            # dump shows) is that thread's few frames, not the caller's (a pytest session).
            forker = threading.Thread(target=_fork_server, args=(listener.fileno(), alive_r, forked))
            forker.start()
            forker.join()
            os.close(alive_r)
            if not forked:
                os.close(alive_w)
                return  # fork failed: the context spawns the server instead
            pid = forked[0]
        server._forkserver_address = address  # noqa: SLF001 - what ensure_running would set
        server._forkserver_alive_fd = alive_w  # noqa: SLF001
        server._forkserver_pid = pid  # noqa: SLF001


def _fork_server(listener_fd: int, alive_r: int, forked: list[int]) -> None:
    try:
        pid = os.fork()
    except OSError:
        return
    if pid == 0:
        _serve_forks(listener_fd, alive_r)
    forked.append(pid)


def _serve_forks(listener_fd: int, alive_r: int) -> None:
    """The forked server's whole life: drop what it inherited, then the stdlib's server loop."""
    code = 1
    try:
        _close_fds_except({0, 1, 2, listener_fd, alive_r})
        # Fresh streams on the descriptors: this process's may be pytest's capture objects
        # (no file descriptor), and a rank writes its log and stack dumps through fds 1 and 2.
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - lives as long as the process
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        signal.signal(signal.SIGALRM, signal.SIG_DFL)  # an item's time limit is not the server's
        gc.collect()
        gc.freeze()  # ranks' collections never walk (and so copy) the inherited heap
        from multiprocessing import forkserver

        forkserver.main(listener_fd, alive_r, [])  # the preload is imported already
        code = 0
    except SystemExit:  # the loop's way out: every client is gone
        code = 0
    finally:
        os._exit(code)


def _close_fds_except(keep: set[int]) -> None:
    try:
        open_fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        open_fds = list(range(3, 1024))
    for fd in open_fds:
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


@dataclass(eq=False)
class _Worker:
    """A warm rank process and the harness's end of its job pipe."""

    process: BaseProcess
    conn: multiprocessing.connection.Connection

    def send(self, job: _Job) -> None:
        self.conn.send_bytes(pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL))


def _end_workers(workers: list[_Worker]) -> None:
    for worker in workers:
        worker.conn.close()  # a worker waiting for a job reads EOF and exits
    _end_and_close([worker.process for worker in workers])


class _Pool:
    """This process's idle warm workers. ``take`` hands out ``n`` of them, forking new ones
    from the warm server when there are too few; only a run whose every rank reported gives
    its workers back (``give_back``); every other run's workers are ended by the caller."""

    def __init__(self) -> None:
        self.idle: list[_Worker] = []
        self.owner = os.getpid()  # a pool is not inherited: a forked child starts its own

    def take(self, n: int, fn: Callable[..., Any]) -> list[_Worker]:
        if self.owner != os.getpid():
            self.idle, self.owner = [], os.getpid()
        alive = [worker for worker in self.idle if _alive(worker.process)]
        _end_workers([worker for worker in self.idle if worker not in alive])  # died idle (killed): reap
        self.idle = []
        while len(alive) < n:
            try:
                alive.append(self._start(fn))
            except BaseException:
                self.idle = alive
                raise
        self.idle = alive[n:]
        return alive[:n]

    def give_back(self, workers: list[_Worker]) -> None:
        self.idle[:0] = workers  # first in line again: the busiest workers have the warmest caches

    def close(self) -> None:
        workers, self.idle = self.idle, []
        _end_workers(workers)

    @staticmethod
    def _start(fn: Callable[..., Any]) -> _Worker:
        ctx = _warm_context(fn)
        ours, theirs = ctx.Pipe()
        process = ctx.Process(target=_worker_main, args=(theirs, os.getpid()), name="graph-harness-rank",
                              daemon=True)  # daemon: multiprocessing ends it at exit, never waits for it
        try:
            process.start()
        finally:
            theirs.close()
        return _Worker(process, ours)


_POOL = _Pool()


# --- parent side -------------------------------------------------------------------------------


def _supervise(
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
    results: list[Any | None] = [None] * n
    failures: list[RankFailure] = []
    pending = set(range(n))
    first_failed: int | None = None
    closed: set[int] = set()
    over = set() if over is None else over
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
        waitables: list[Any] = [procs[r].sentinel for r in pending]
        if conns is not None:
            waitables += [conns[r] for r in pending if r not in closed]
        for woke in multiprocessing.connection.wait(waitables, timeout=min(poll, stop_at - now)):
            if not isinstance(woke, int):  # a worker's "job over" (or EOF: it died; its sentinel says so)
                r = conns.index(woke)  # type: ignore[union-attr]
                try:
                    woke.recv_bytes()
                    over.add(r)
                except (EOFError, OSError):
                    closed.add(r)
        for r in sorted(pending):
            p = procs[r]
            alive = p.is_alive()
            path = _result_path(workdir, r)
            if alive and not os.path.exists(path):
                continue
            record = _read_result(path) if os.path.exists(path) else None
            if record is not None and record[0] == "ok":
                if alive and r not in over:
                    continue  # reported; let it exit or end its job (or be ended with the rest)
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


def _end_and_close(procs: list[BaseProcess]) -> None:
    """:func:`_end_all`, then release each process object's resources."""
    _end_all(procs)
    for p in procs:
        try:
            p.close()
        except ValueError:  # still running: cannot happen after _end_all, but never mask
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


def _rank_main(job_bytes: bytes, parent_pid: int) -> None:
    """Entry point of a spawned rank (``warm=False``): one job, then exit."""
    job = pickle.loads(job_bytes)  # fn and args stay pickled until env is in place
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.update(job.env)  # before torch is imported
    _start_rank(parent_pid)
    ok = _run_job(job)
    # Skip interpreter teardown: after a failure a half-used process group may block in its
    # destructor, and after a success it frees a heap nobody reads while the parent waits.
    os._exit(0 if ok else 1)


def _worker_main(conn: multiprocessing.connection.Connection, parent_pid: int) -> None:
    """Entry point of a warm worker: jobs one after another until the pipe closes.

    After each job it says so on ``conn`` (its result file holds the result). A job that
    failed ends the worker: whatever the failure left behind (a process group a peer still
    waits on, a half-finished collective) dies with it."""
    _start_rank(parent_pid)
    devnull = os.open(os.devnull, os.O_WRONLY)
    while True:
        try:
            job = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):  # the harness closed the pool, or is gone
            os._exit(0)
        saved = {name: os.environ.get(name) for name in job.env}
        os.environ.update(job.env)
        # The caller's import path, as a spawned rank gets it: a worker forked before the caller
        # added a path (a feature plugin installed since) would not find what a job names.
        saved_path = sys.path[:]
        if job.sys_path:
            sys.path[:] = job.sys_path
        ok = _run_job(job)
        if not ok:
            os._exit(1)
        sys.path[:] = saved_path
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        os.dup2(devnull, 1)  # the run's log is the run's; its temp dir is about to go
        os.dup2(devnull, 2)
        _current_workdir[0] = None
        conn.send_bytes(b"done")


_current_workdir: list[str | None] = [None]
"""The temp dir of the job this rank runs now (removed if the harness dies mid-job)."""


def _start_rank(parent_pid: int) -> None:
    """Once per rank process: stack dumps on request, the harness watch, one intra-op thread."""
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)  # the parent asks on a timeout
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)  # several ranks share few cores


def _run_job(job: _Job) -> bool:
    """One rank's job (its env already set): log redirection, ready file, process group, ``fn``,
    result file."""
    _current_workdir[0] = job.workdir
    log_fd = os.open(_log_path(job.workdir, job.rank), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log_fd, 1)  # fds, not sys.stdout: C-level output (gloo, faulthandler) lands there too
    os.dup2(log_fd, 2)
    os.close(log_fd)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True)  # a print survives a later os._exit
        except (AttributeError, ValueError):
            pass
    try:
        import torch.distributed as dist

        open(_ready_path(job.workdir, job.rank), "wb").close()  # started: the run's timeout counts from here
        fn, args = pickle.loads(job.payload)
        dist.init_process_group(
            job.backend,
            init_method=f"file://{job.workdir}/store",
            rank=job.rank,
            world_size=job.world_size,
            timeout=datetime.timedelta(seconds=job.group_timeout_s),
        )
        result = fn(job.rank, job.world_size, *args)
        if job.world_size > 1:
            dist.barrier()  # a fast rank must not close its connections while a peer still sets up
        dist.destroy_process_group()
        data = pickle.dumps(("ok", result), protocol=pickle.HIGHEST_PROTOCOL)
    except BaseException as exc:  # noqa: BLE001 - SystemExit from fn is a failure too
        tb = traceback.format_exc()
        sys.stderr.write(tb)
        sys.stdout.flush()
        sys.stderr.flush()
        _write_result(job.workdir, job.rank, pickle.dumps(("error", _describe(exc), tb)))
        return False
    sys.stdout.flush()
    sys.stderr.flush()
    _write_result(job.workdir, job.rank, data)
    return True


def _write_result(workdir: str, rank: int, data: bytes) -> None:
    path = _result_path(workdir, rank)
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)  # atomic: the parent sees all of it or nothing


def _watch_parent(parent_pid: int) -> None:
    """Exit if the harness process goes away (SIGKILLed): no orphan rank stuck in a collective.

    A warm rank's parent is the fork server, not the harness, so the rank watches the harness's
    pid itself: through a pidfd (readable once that process has exited; no pid-reuse race),
    else by polling. The harness's own cleanup cannot run then, so the orphan removes the temp
    dir of the job it runs on its way out.
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
    workdir = _current_workdir[0]
    if workdir is not None:
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
