"""Asking a live rank where it stands, from the outside: its Python stacks and its CPU time.

A rank registers :mod:`faulthandler` on ``SIGUSR1`` (:mod:`harness.ranks.worker`), so the
harness can have every thread's Python stack written into the rank's log without stopping it.
The dump's frames name the function and line a rank is in (a hang in a collective names the
collective and the line that called it). ``/proc/<pid>/stat`` says how much CPU it has used:
a rank that waits uses (almost) none, one that computes does.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import time
from dataclasses import dataclass
from functools import lru_cache
from multiprocessing.process import BaseProcess

from .protocol import STACK_MARKER, STACKS_END, log_path, read_from

__all__ = ["Frame", "STACK_DUMP_WAIT_S", "alive", "cpu_seconds", "dump_stacks", "end_dump", "job_frames", "runtime_frame", "short_path",
           "where"]

STACK_DUMP_WAIT_S = 1.0
"""How long a rank gets to write its stacks (:mod:`faulthandler`) before the harness goes on."""

_FRAME = re.compile(r'^\s*File "(?P<file>.*)", line (?P<line>\d+) in (?P<function>.+)$')
_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+")


@dataclass(frozen=True)
class Frame:
    """One line of a :mod:`faulthandler` dump."""

    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{short_path(self.file)}:{self.line} in {self.function}"


def dump_stacks(procs: list[BaseProcess], workdir: str, ranks: list[int]) -> dict[int, str]:
    """Ask each live rank of ``ranks`` for its Python stacks (SIGUSR1); return what each wrote
    within :data:`STACK_DUMP_WAIT_S`, by rank. Each dump is preceded in the rank's log by
    :data:`~harness.ranks.protocol.STACK_MARKER`."""
    asked: dict[int, int] = {}
    for r in ranks:
        pid = procs[r].pid
        if not alive(procs[r]) or pid is None:
            continue
        path = log_path(workdir, r)
        try:
            with open(path, "a") as log:
                log.write("\n" + STACK_MARKER)
            asked[r] = os.path.getsize(path)
            os.kill(pid, signal.SIGUSR1)
        except OSError:  # gone meanwhile
            asked.pop(r, None)
    stacks: dict[int, str] = {}
    seen = dict.fromkeys(asked, -1)
    limit = time.monotonic() + STACK_DUMP_WAIT_S
    while asked and time.monotonic() < limit:
        time.sleep(0.05)
        for r, size in list(asked.items()):
            text = read_from(log_path(workdir, r), size)
            if text and len(text) == seen[r]:  # written, and no longer growing
                stacks[r] = text.rstrip()
                del asked[r]
            seen[r] = len(text)
    for r, size in asked.items():  # partial, or nothing: say what there is
        text = read_from(log_path(workdir, r), size).rstrip()
        if text:
            stacks[r] = text
    return stacks


def end_dump(workdir: str, rank: int) -> None:
    """Close a dump that is not the rank's last word (it runs on): the log keeps what follows."""
    try:
        with open(log_path(workdir, rank), "a") as log:
            log.write(STACKS_END)
    except OSError:
        pass


def job_frames(dump: str, job_function: str, job_file: str) -> list[Frame]:
    """The frames of the thread that runs the rank's job (the one whose stack holds
    ``job_function`` of ``job_file``), innermost first, down to that function (excluded).
    Empty when no thread does (the dump is cut, or the rank is between jobs)."""
    threads: list[list[Frame]] = []
    for line in dump.splitlines():
        if _THREAD.match(line):
            threads.append([])
        elif threads and (m := _FRAME.match(line)):
            threads[-1].append(Frame(m["file"], int(m["line"]), m["function"].strip()))
    for frames in threads:
        for i, frame in enumerate(frames):
            if frame.function == job_function and _same_file(frame.file, job_file):
                return frames[:i]
    return []


def runtime_frame(frame: Frame) -> bool:
    """A frame of the runtime rather than of the job's own code: torch (a collective, a wait,
    an op) or the harness's engines (their collectives and synchronisation)."""
    return any(_under(frame.file, root) for root in _runtime_roots())


def where(frames: list[Frame]) -> str:
    """Where a rank stands, in words: the innermost line of its own code, and the runtime call
    it is in (``harness/features/dp.py:105 in check_agreement (in torch/...:5356 in barrier)``)."""
    if not frames:
        return "an unknown place (no stack)"
    own = next((f for f in frames if not runtime_frame(f)), None)
    if own is None:
        return str(frames[0])
    return str(own) if own is frames[0] else f"{own} (in {frames[0]})"


def cpu_seconds(pid: int | None) -> float | None:
    """CPU time (user + system, every thread) that process ``pid`` has used; None where it
    cannot be read (gone, or no ``/proc``)."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / _clock_ticks()  # utime, stime (fields 14, 15)


def short_path(path: str) -> str:
    """``harness/features/dp.py`` and ``torch/distributed/...`` rather than absolute paths."""
    for root in _package_parents():
        if _under(path, root):
            return os.path.relpath(path, root)
    return path


@lru_cache(maxsize=1)
def _clock_ticks() -> int:
    return os.sysconf("SC_CLK_TCK")


@lru_cache(maxsize=1)
def _runtime_roots() -> tuple[str, ...]:
    engine = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "engine")
    return (*(root for root in (_package_dir("torch"), _package_dir("torch_npu")) if root), engine)


@lru_cache(maxsize=1)
def _package_parents() -> tuple[str, ...]:
    harness_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
    torch_dir = _package_dir("torch")
    return (harness_parent, *((os.path.dirname(torch_dir),) if torch_dir else ()))


def _package_dir(name: str) -> str | None:
    """A package's directory, found without importing it (torch_npu must never be imported here)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.realpath(next(iter(spec.submodule_search_locations)))


def _under(path: str, root: str) -> bool:
    real = os.path.realpath(path)
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def _same_file(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def alive(p: BaseProcess) -> bool:
    try:
        return p.is_alive()
    except ValueError:  # closed process object
        return False
