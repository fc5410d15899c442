"""One multi-rank run from the caller's side: :func:`run_ranks` (N rank processes) and
:func:`run_in_process` (rank 0 of a world of one, in the caller's process)."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import shutil
import sys
import tempfile
import time
import traceback
from multiprocessing.process import BaseProcess
from typing import Callable, Sequence, TypeVar

from harness.engine import RUN_DIR_ENV  # every rank is told its run's temp dir

from .devices import group_start_method, rank_env
from .outcome import RankFailure, RanksOutcome
from .pool import POOL, Worker
from .protocol import Job, describe, log_tail, run_dir_root, without_stacks
from .stacks import dump_stacks
from .supervise import end_all, end_and_close, supervise
from .worker import rank_main

__all__ = ["GLOO_ENV", "MAX_WORLD_SIZE", "START_TIMEOUT_S", "run_in_process", "run_ranks"]

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

_R = TypeVar("_R")  # what ``fn`` returns: each rank's result, pickled back


def run_ranks(
    fn: Callable[..., _R],
    world_size: int,
    *,
    args: Sequence[object] = (),
    timeout: float,
    backend: str = "gloo",
    env: dict[str, str] | None = None,
    grace: float = 5.0,
    warm: bool = True,
    start_timeout: float = START_TIMEOUT_S,
) -> RanksOutcome[_R]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` ranks, one process each.

    Each rank initialises a ``torch.distributed`` process group (``backend``, FileStore in a fresh
    temp dir), runs ``fn`` with one intra-op thread, destroys the group and sends back the
    (picklable) return value. ``timeout`` is wall-clock seconds for the run, counted from the
    moment every rank is up; start-up (a warm worker taking the job, forking a new one from the
    warm server, or with ``warm=False`` spawning an interpreter and importing torch) has its own
    limit, ``start_timeout``. After the first failure the remaining ranks get ``grace`` seconds
    before they are ended. ``env`` (with :data:`GLOO_ENV`, :data:`RUN_DIR_ENV` and the rank's
    ``LOCAL_RANK``) is set in every rank before its process group is created
    (with ``warm=False`` also before torch is imported there). A ``backend`` that uses a device
    (``nccl``, ``hccl``, ``cpu:gloo,cuda:nccl``: :mod:`harness.ranks.devices`) spawns its ranks
    whatever ``warm`` says, and each rank makes device ``LOCAL_RANK`` its own before its group.

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
    warm = warm and group_start_method(backend) == "forkserver"  # a device's ranks: never forked
    workdir = tempfile.mkdtemp(prefix="graph-harness-ranks-", dir=run_dir_root())
    job_env = {**GLOO_ENV, **(env or {}), RUN_DIR_ENV: workdir}
    jobs = [Job(payload, rank, world_size, workdir, backend, {**job_env, **rank_env(rank)}, group_timeout_s,
                tuple(sys.path))
            for rank in range(world_size)]
    procs: list[BaseProcess] = []
    workers: list[Worker] = []
    healthy = False
    start = time.monotonic()
    ready_at: list[float] = []
    try:
        try:
            if warm:
                workers = POOL.take(world_size, fn)
                procs = [w.process for w in workers]
                for worker, job in zip(workers, jobs):
                    worker.send(job)
            else:
                ctx = multiprocessing.get_context("spawn")
                for job in jobs:
                    p = ctx.Process(target=rank_main, args=(pickle.dumps(job), os.getpid()),
                                    name=f"graph-harness-rank{job.rank}")
                    p.start()
                    procs.append(p)
        except Exception as exc:  # noqa: BLE001 - e.g. the warm server died while preloading
            return _not_started(procs, world_size, exc, time.monotonic() - start)
        over: set[int] = set()
        results, failures = supervise(procs, workdir, start + start_timeout, timeout, grace, ready_at,
                                      [w.conn for w in workers] if warm else None, over)
        stacks = dump_stacks(procs, workdir, [f.rank for f in failures if f.kind == "timeout"])
        healthy = warm and not failures and len(over) == world_size  # each worker waits for a job
        if not healthy:
            end_all(procs)
        logs = [without_stacks(log_tail(workdir, r)) for r in range(world_size)]
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
            POOL.give_back(workers)  # every rank reported: each worker waits for its next job
        else:  # also on KeyboardInterrupt / an item's time limit / unexpected errors in the parent
            for worker in workers:
                worker.conn.close()
            end_and_close(procs)
        shutil.rmtree(workdir, ignore_errors=True)


def run_in_process(
    fn: Callable[..., _R],
    *,
    args: Sequence[object] = (),
    process_group: bool = False,
    backend: str = "gloo",
) -> RanksOutcome[_R]:
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
        failure = RankFailure(0, "exception", describe(exc), traceback.format_exc())
        return RanksOutcome(False, [None], [failure], time.monotonic() - start, logs=[""], pids=[os.getpid()])
    finally:
        if created:
            import torch.distributed as dist

            dist.destroy_process_group()
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
    return RanksOutcome(True, [result], [], time.monotonic() - start, logs=[""], pids=[os.getpid()])


def _not_started(procs: list[BaseProcess], world_size: int, exc: Exception, duration: float) -> RanksOutcome[_R]:
    """Every rank failed: the run's processes could not all be started or given their jobs (the
    caller's ``finally`` ends those that were)."""
    message = f"could not start the run's {world_size} ranks: {describe(exc)}"
    failures = [RankFailure(r, "crash", message, traceback.format_exc()) for r in range(world_size)]
    return RanksOutcome(False, [None] * world_size, failures, duration, logs=[""] * world_size,
                        pids=[p.pid for p in procs])
