"""Run a function on N real ranks (processes) joined by ``torch.distributed``.

Multi-rank scenarios (sequence, data and context parallel) need real collectives between real
processes: a single process pretending to be N ranks cannot hang in a collective, cannot
disagree with a peer about a shape, and cannot die halfway through. :func:`run_ranks` starts one
process per rank and turns every way a rank can go wrong into data (:class:`RanksOutcome`)
instead of a hung test session.

The package, one job per module:

* :mod:`.run`: :func:`run_ranks` and :func:`run_in_process`, the caller's side of one run;
* :mod:`.pool`: the warm rank workers, reused across runs (:func:`close_pool`, :func:`pool_pids`);
* :mod:`.server`: the warm fork server they are forked from (:func:`warm_server_pid`);
* :mod:`.supervise`: the watch over a run's processes (results, deaths, timeouts);
* :mod:`.stranded`: a run that can no longer finish because a rank has (a peer waits for it);
* :mod:`.stacks`: where a live rank stands, seen from outside (its Python stacks, its CPU time);
* :mod:`.protocol`: the job a rank receives and the files it leaves (log, ready mark, result);
* :mod:`.worker`: the rank's own side (a warm worker's loop, a spawned rank's one job);
* :mod:`.devices`: ranks on devices (process-group backend, start method, one device per rank);
* :mod:`.outcome`: :class:`RanksOutcome` and :class:`RankFailure`.

Design, and why:

* **Warm rank workers, reused across runs.** Starting an interpreter and importing torch costs
  seconds per rank; an item of two ranks paid it twice. A job is a whole rank: its own log, its
  own fresh process group (FileStore in the run's fresh temp dir), ``fn``, and the group
  destroyed again. ``warm=False`` spawns fresh interpreters instead, one run each: use it when
  ``env`` must be in place before torch is imported (in a warm rank torch is already imported),
  or when a job must not share a process with earlier ones. Consequence of both: ``fn`` must be
  importable by reference (module level), and a plain script that calls :func:`run_ranks` needs
  the usual ``if __name__ == "__main__":`` guard.
* **Crash isolation as with fresh processes.** A rank that raises exits after reporting (a
  half-used process group may block in its destructor), one that crashes is gone, and every
  worker of a run that failed is ended: its item fails alone, with its logs and tracebacks, and
  the next item runs on healthy workers.
* **A cap on the world.** At most :data:`MAX_WORLD_SIZE` ranks per run, and so at most as many
  workers in a pool: each is a process holding a model, and the shipped cross product needs at
  most dp 4 x tp 4.
* **FileStore rendezvous.** ``init_method="file://<fresh temp dir>/store"`` needs no TCP port, so
  parallel pytest-xdist workers never race for one. The temp dir is removed in every case.
* **No torch at import.** ``harness.ranks`` does not import torch at module level, so a spawned
  rank applies ``env`` before torch is imported.
"""

from __future__ import annotations

from .devices import device_count, process_group_backend, rank_device, start_method, too_few_devices
from .outcome import FailureKind, RankFailure, RanksOutcome
from .pool import close_pool, pool_pids
from .protocol import SHM_DIR, run_dir_root
from .run import GLOO_ENV, MAX_WORLD_SIZE, START_TIMEOUT_S, run_in_process, run_ranks
from .server import warm_server_pid

__all__ = ["GLOO_ENV", "MAX_WORLD_SIZE", "SHM_DIR", "START_TIMEOUT_S", "FailureKind", "RankFailure", "RanksOutcome",
           "close_pool", "device_count", "pool_pids", "process_group_backend", "rank_device", "run_dir_root",
           "run_in_process", "run_ranks", "start_method", "too_few_devices", "warm_server_pid"]
