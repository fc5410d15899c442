"""The rank's side: what runs inside a rank process, a spawned one-job rank or a warm worker.

* **Env before the process group.** ``fn`` and ``args`` are unpickled inside the rank, after the
  job's ``env`` is applied, so ``env`` (HCCL_*, NCCL_*) is in place before the process group is
  created and before the module of ``fn`` is imported (unless the worker already has it); in a
  spawned rank, also before torch is imported. A worker puts its environment back after each job.
* **A hung rank says where it hangs.** :mod:`faulthandler` writes every thread's Python stack
  into the rank's log on ``SIGUSR1``, which the harness sends before it ends a rank that ran out
  of time.
* **Nobody is left behind.** Each rank watches the harness process (a pidfd: a worker's parent
  is the fork server, not the harness) and, if the harness dies (SIGKILLed) or exits, removes
  its run's temp dir and exits.
"""

from __future__ import annotations

import datetime
import faulthandler
import io
import multiprocessing.connection
import os
import pickle
import select
import shutil
import signal
import sys
import threading
import time
import traceback
from typing import cast

from .devices import group_device_type, rank_device
from .protocol import Job, describe, finished_path, log_path, ready_path, write_result

__all__ = ["rank_main", "worker_main"]


def rank_main(job_bytes: bytes, parent_pid: int) -> None:
    """Entry point of a spawned rank (``warm=False``): one job, then exit."""
    job = pickle.loads(job_bytes)  # fn and args stay pickled until env is in place
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.update(job.env)  # before torch is imported
    _start_rank(parent_pid)
    ok = _run_job(job)
    # Skip interpreter teardown: after a failure a half-used process group may block in its
    # destructor, and after a success it frees a heap nobody reads while the parent waits.
    os._exit(0 if ok else 1)


def worker_main(conn: multiprocessing.connection.Connection, parent_pid: int) -> None:
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


def _run_job(job: Job) -> bool:
    """One rank's job (its env already set): log redirection, ready file, process group, ``fn``,
    result file."""
    _current_workdir[0] = job.workdir
    log_fd = os.open(log_path(job.workdir, job.rank), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log_fd, 1)  # fds, not sys.stdout: C-level output (gloo, faulthandler) lands there too
    os.dup2(log_fd, 2)
    os.close(log_fd)
    for stream in (sys.stdout, sys.stderr):
        try:
            cast(io.TextIOWrapper, stream).reconfigure(line_buffering=True)  # a print survives a later os._exit
        except (AttributeError, ValueError):
            pass
    try:
        import torch.distributed as dist

        open(ready_path(job.workdir, job.rank), "wb").close()  # started: the run's timeout counts from here
        fn, args = pickle.loads(job.payload)
        device = group_device_type(job.backend)
        if device is not None:  # its own device before its group: NCCL refuses two ranks on one GPU
            rank_device(device)
        dist.init_process_group(
            job.backend,
            init_method=f"file://{job.workdir}/store",
            rank=job.rank,
            world_size=job.world_size,
            timeout=datetime.timedelta(seconds=job.group_timeout_s),
        )
        result = fn(job.rank, job.world_size, *args)
        open(finished_path(job.workdir, job.rank), "wb").close()  # a peer still in a collective waits in vain
        if job.world_size > 1:
            dist.barrier()  # a fast rank must not close its connections while a peer still sets up
        dist.destroy_process_group()
        data = pickle.dumps(("ok", result), protocol=pickle.HIGHEST_PROTOCOL)
    except BaseException as exc:  # noqa: BLE001 - SystemExit from fn is a failure too
        tb = traceback.format_exc()
        sys.stderr.write(tb)
        sys.stdout.flush()
        sys.stderr.flush()
        write_result(job.workdir, job.rank, pickle.dumps(("error", describe(exc), tb)))
        return False
    sys.stdout.flush()
    sys.stderr.flush()
    write_result(job.workdir, job.rank, data)
    return True


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
