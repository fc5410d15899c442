"""What the harness and a rank exchange: the job sent to the rank, and the files the rank leaves
in its run's temp dir (its log, its ready mark, its result).

* **Results through files, not a queue.** Each rank pickles its outcome to
  ``rank<r>.result.tmp`` and ``os.replace``-s it to ``rank<r>.result``. A rename is atomic, so a
  rank that dies mid-write leaves no result (it is a *crash*), a result of several MB costs
  nothing special, and there is no "joined before draining the queue" deadlock. An exception is
  sent back as formatted text, so an exception that does not pickle still reports.
* **Logs per rank.** The rank points file descriptors 1 and 2 at ``rank<r>.log`` (C-level
  output from gloo/NCCL/HCCL is caught too); the outcome carries the tail of each log.
* **Marks.** ``rank<r>.ready`` once the rank runs with torch imported (the run's timeout counts
  from there); ``rank<r>.finished`` once its function has returned (from then on it joins no
  collective but the end-of-job barrier: a peer that waits for it in one waits forever).
* **Where the temp dir lives.** In memory (:data:`SHM_DIR`) where there is room: the emulator's
  shared-memory collectives keep their files there too.
"""

from __future__ import annotations

import os
import pickle
import time
import traceback
from dataclasses import dataclass
from typing import Any

__all__ = ["Job", "LOG_TAIL_BYTES", "SHM_DIR", "SHM_MIN_FREE_BYTES", "STACKS_END", "STACK_MARKER", "describe",
           "finished_path", "log_path", "log_tail", "mtime", "read_from", "read_result", "ready_path", "result_path",
           "run_dir_root", "without_stacks", "write_result"]

LOG_TAIL_BYTES = 20_000
"""How much of each rank's log the outcome keeps (the end of it: where the error is)."""

STACK_MARKER = "--- graph-harness: the rank's Python stacks when it ran out of time ---\n"
"""Written into a rank's log before it is asked for its stacks: the log the outcome keeps ends
here (the dump is the failure's traceback, not repeated in the log)..."""

STACKS_END = "--- graph-harness: end of the rank's stacks (it ran on) ---\n"
"""... unless the dump was followed by this line: the harness looked and the rank ran on (see
:func:`without_stacks`)."""

SHM_DIR = "/dev/shm"
SHM_MIN_FREE_BYTES = 1 << 30
"""A run's temp dir goes in :data:`SHM_DIR` (memory) when that has this much room."""


@dataclass(frozen=True)
class Job:
    """One rank of one run, as sent to the process that runs it."""

    payload: bytes  # pickled (fn, args): unpickled in the rank, after env is applied
    rank: int
    world_size: int
    workdir: str
    backend: str
    env: dict[str, str]
    group_timeout_s: float
    sys_path: tuple[str, ...] = ()  # the caller's, where fn's module and plugins are found


def log_path(workdir: str, rank: int) -> str:
    return os.path.join(workdir, f"rank{rank}.log")


def result_path(workdir: str, rank: int) -> str:
    return os.path.join(workdir, f"rank{rank}.result")


def ready_path(workdir: str, rank: int) -> str:
    return os.path.join(workdir, f"rank{rank}.ready")


def finished_path(workdir: str, rank: int) -> str:
    return os.path.join(workdir, f"rank{rank}.finished")


def write_result(workdir: str, rank: int, data: bytes) -> None:
    path = result_path(workdir, rank)
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)  # atomic: the parent sees all of it or nothing


def read_result(path: str) -> tuple[Any, ...]:  # unpickled: the value is whatever the rank's fn returned
    """``("ok", value)`` or ``("error", message, traceback)``."""
    try:
        with open(path, "rb") as f:
            record = pickle.load(f)
    except Exception as exc:  # noqa: BLE001 - e.g. the result's class is not importable here
        return ("error", f"result could not be read in the parent: {describe(exc)}", traceback.format_exc())
    return record


def log_tail(workdir: str, rank: int) -> str:
    try:
        with open(log_path(workdir, rank), "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - LOG_TAIL_BYTES))
            data = f.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return text if size <= LOG_TAIL_BYTES else "[...]\n" + text


def without_stacks(log: str) -> str:
    """A rank's log without the stack dumps the harness asked for: each dump from its
    :data:`STACK_MARKER` to its :data:`STACKS_END`, and a last one that has no end."""
    kept: list[str] = []
    rest = log
    while True:
        head, marker, tail = rest.partition("\n" + STACK_MARKER)
        kept.append(head)
        if not marker:
            break
        _, end, rest = tail.partition(STACKS_END)
        if not end:
            break
    return "".join(kept)


def read_from(path: str, offset: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(LOG_TAIL_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return ""


def mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return time.time()


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def run_dir_root() -> str | None:
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
