"""The pool of warm rank workers kept by the harness process (one pool per pytest process or
xdist worker).

A run's ranks are by default *workers* forked once from the warm fork server
(:mod:`harness.ranks.server`) that run one job after another. Reuse is what makes a rank cheap: a
forked process pays the fork, a copy of every page of the server's heap it touches and its exit,
and starts with cold caches (shape inference, torch's dispatch, Python's own); measured on 30
cross-product jobs, a reused worker spends 31% less CPU in the job itself.

Crash isolation as with fresh processes: only a run in which every rank reported a result gives
its workers back (:meth:`Pool.give_back`); every worker of a run that failed, timed out or was
interrupted is ended by the caller and replaced by a fresh fork on demand. A pool grows to the
largest world it has run (at most :data:`harness.ranks.MAX_WORLD_SIZE`).
"""

from __future__ import annotations

import multiprocessing.connection
import os
import pickle
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import Callable

from .protocol import Job
from .server import warm_context
from .stacks import alive
from .supervise import end_and_close
from .worker import worker_main

__all__ = ["POOL", "Pool", "Worker", "close_pool", "pool_pids"]


@dataclass(eq=False)
class Worker:
    """A warm rank process and the harness's end of its job pipe."""

    process: BaseProcess
    conn: multiprocessing.connection.Connection

    def send(self, job: Job) -> None:
        self.conn.send_bytes(pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL))


def _end_workers(workers: list[Worker]) -> None:
    for worker in workers:
        worker.conn.close()  # a worker waiting for a job reads EOF and exits
    end_and_close([worker.process for worker in workers])


class Pool:
    """This process's idle warm workers. ``take`` hands out ``n`` of them, forking new ones
    from the warm server when there are too few; only a run whose every rank reported gives
    its workers back (``give_back``); every other run's workers are ended by the caller."""

    def __init__(self) -> None:
        self.idle: list[Worker] = []
        self.owner = os.getpid()  # a pool is not inherited: a forked child starts its own

    def take(self, n: int, fn: Callable[..., object]) -> list[Worker]:
        if self.owner != os.getpid():
            self.idle, self.owner = [], os.getpid()
        live = [worker for worker in self.idle if alive(worker.process)]
        _end_workers([worker for worker in self.idle if worker not in live])  # died idle (killed): reap
        self.idle = []
        while len(live) < n:
            try:
                live.append(self._start(fn))
            except BaseException:
                self.idle = live
                raise
        self.idle = live[n:]
        return live[:n]

    def give_back(self, workers: list[Worker]) -> None:
        self.idle[:0] = workers  # first in line again: the busiest workers have the warmest caches

    def close(self) -> None:
        workers, self.idle = self.idle, []
        _end_workers(workers)

    @staticmethod
    def _start(fn: Callable[..., object]) -> Worker:
        ctx = warm_context(fn)
        ours, theirs = ctx.Pipe()
        process = ctx.Process(target=worker_main, args=(theirs, os.getpid()), name="graph-harness-rank",
                              daemon=True)  # daemon: multiprocessing ends it at exit, never waits for it
        try:
            process.start()
        finally:
            theirs.close()
        return Worker(process, ours)


POOL = Pool()


def pool_pids() -> list[int]:
    """The pids of this process's idle warm workers (those a next run would take first)."""
    return [w.process.pid for w in POOL.idle if w.process.pid is not None]


def close_pool() -> None:
    """End every idle warm worker; the next warm run forks new ones."""
    POOL.close()
