"""A run that can no longer finish because a rank has: found in seconds, not at the timeout.

Once a rank's function has returned (its ``finished`` mark, :mod:`harness.ranks.protocol`) it
joins no collective but the end-of-job barrier, so a peer that still waits in a collective that
needs it waits forever: DP ranks that skip the per-step sync, one of them idle, left rank 0 in
``check_agreement`` for the item's whole time limit (8 minutes) while rank 1 sat in the barrier.
The emulator's collectives notice a *dead* peer in 0.2 s, but a finished warm worker is alive.

The harness cannot see inside a collective (gloo, NCCL, HCCL, the emulator's shared memory), but
it can see that nobody can move any more: at least one rank has finished, and every rank that has
not

* is idle: its process used at most :data:`IDLE_CPU_S` of CPU over the last
  :data:`IDLE_WINDOW_S`, counted from the latest finish the watch has seen (a rank that waited for
  a peer which has just returned from their common collective gets the whole window to notice it
  on a loaded machine). A rank that computes, however slowly, uses CPU and may yet reach the
  collective a live peer waits in, so while one does, nobody is failed; and
* waits in the runtime: the innermost frame of its job's Python stack (dumped on ``SIGUSR1``) is
  torch's or an engine's (a collective, a wait, a synchronize), not its own code (a sleep).

Then the run is hung: each waiting rank fails as ``"hang"``, its stack as the traceback, its
message naming the line it waits at and the ranks that finished; the finished ranks, parked in
the end-of-job barrier, are ended with it. A look that finds a rank in its own code closes the
dump in that rank's log (it runs on) and is not repeated until a rank has used CPU again.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess

from . import worker
from .outcome import RankFailure
from .protocol import finished_path
from .stacks import Frame, cpu_seconds, dump_stacks, end_dump, job_frames, runtime_frame, where

__all__ = ["IDLE_CPU_S", "IDLE_WINDOW_S", "StrandWatch", "finished_marks"]

IDLE_WINDOW_S = 2.0
"""How long every unfinished rank must have been idle before the harness looks at their stacks."""

IDLE_CPU_S = 0.05
"""Most CPU seconds a rank may use in :data:`IDLE_WINDOW_S` and still count as idle (a rank in the
emulator's collectives wakes every 0.2 s to look for dead peers: microseconds each time)."""

_JOB_FUNCTION = worker._run_job.__name__  # the frame below which a rank's stack is its job's


def finished_marks(workdir: str, ranks: set[int]) -> dict[int, float]:
    """Which of ``ranks`` have finished their function: rank -> when (wall clock)."""
    marks: dict[int, float] = {}
    for r in ranks:
        try:
            marks[r] = os.stat(finished_path(workdir, r)).st_mtime
        except OSError:
            pass
    return marks


@dataclass
class StrandWatch:
    """The watch over one run: call :meth:`check` on every turn of the supervision loop."""

    procs: list[BaseProcess]
    workdir: str
    _idle_since: dict[int, tuple[float, float]] = field(default_factory=dict)  # rank -> (since, CPU then)
    _looked: set[int] = field(default_factory=set)  # looked at in their current idle stretch
    _finish_seen: dict[int, float] = field(default_factory=dict)  # rank -> when this watch saw it finished

    def check(self, pending: set[int], now: float) -> list[RankFailure]:
        """The ``"hang"`` failures of the ranks of ``pending`` (not yet done) that wait for a
        finished peer, once every unfinished one does; else nothing."""
        finished = finished_marks(self.workdir, pending)
        waiting = sorted(r for r in pending if r not in finished)
        if not finished or not waiting:
            return []
        for r in finished:
            self._finish_seen.setdefault(r, now)
        latest_finish = max(self._finish_seen[r] for r in finished)
        everyone_idle = True
        for r in waiting:
            cpu = cpu_seconds(self.procs[r].pid)
            if cpu is None:  # gone (its sentinel will say so), or no /proc here: no verdict
                return []
            since = self._idle_since.get(r)
            if since is None or cpu - since[1] > IDLE_CPU_S:  # it works: its idle stretch starts again
                self._idle_since[r] = (now, cpu)
                self._looked.discard(r)
                everyone_idle = False
            elif now - max(since[0], latest_finish) < IDLE_WINDOW_S:
                everyone_idle = False
        if not everyone_idle or self._looked.issuperset(waiting):
            return []
        stacks = dump_stacks(self.procs, self.workdir, waiting)
        frames = {r: job_frames(stacks.get(r, ""), _JOB_FUNCTION, worker.__file__) for r in waiting}
        if not all(frames[r] and runtime_frame(frames[r][0]) for r in waiting):
            for r in waiting:  # one is in its own code (a sleep?): it may yet move
                end_dump(self.workdir, r)
            self._looked.update(waiting)
            return []
        return [RankFailure(r, "hang", _message(r, frames[r], finished, waiting), stacks[r], at=time.time())
                for r in waiting]


def finished_message(waited_for: list[int], why: str) -> str:
    """What a finished rank that was ended in the end-of-job barrier was doing."""
    return (f"finished its job (its function returned), then waited in the end-of-job barrier for "
            f"{_ranks(waited_for)}, {why}; ended")


def _message(rank: int, frames: list[Frame], finished: dict[int, float], waiting: list[int]) -> str:
    done = sorted(finished)
    age = max(0.0, time.time() - max(finished.values()))
    if len(done) == 1:
        peers = f"{_ranks(done)} finished its job {age:.1f}s earlier (its function returned; it waits"
    else:
        peers = f"{_ranks(done)} finished their jobs {age:.1f}s earlier (their functions returned; they wait"
    text = f"waits at {where(frames)} in a collective that can never complete: {peers} in the end-of-job barrier)"
    others = [r for r in waiting if r != rank]
    if others:
        text += f"; {_ranks(others)} {'waits' if len(others) == 1 else 'wait'} too, none computing"
    return text


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
