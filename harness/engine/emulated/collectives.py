"""The emulator's collectives: the rank processes of one host exchange tensors in shared memory.

Why not gloo: over loopback TCP a gloo collective costs a rank 0.2 ms of CPU with two ranks and
1 to 3.7 ms with four to eight on two cores (a worker thread, an event-loop thread, several
syscalls and thread wake-ups per message), against 30 to 60 us here
(``benchmarks/collectives.py``). A scenario item runs hundreds of small collectives per rank,
and gloo's threads were a quarter of the busy CPU of the pairwise cross product. Ranks on one host share memory;
vLLM's CPU backend exchanges through shared memory for the same reason
(``vllm/distributed/device_communicators/cpu_communicator.py``).

The ops are ``harness_comm::*`` with the signatures of their ``_c10d_functional`` namesakes
(``all_gather_into_tensor_out``, ``all_gather_into_tensor``, ``reduce_scatter_tensor_out``,
``all_reduce_``), so a capture records them as it records those: a mutating or functional node
whose ``group_name`` argument counts as a communication group, re-run on every replay. They are
synchronous: the result is complete when the op returns, so :data:`OPS`'s ``wait_tensor`` is the
identity. :data:`OPS` is what the emulated engine offers as its collectives
(``Capabilities.collective_ops``).

Where a group cannot use shared memory, an op issues its ``_c10d_functional`` namesake on the
process group instead (the same values up to the order of a sum): outside a run of
:func:`harness.ranks.run_ranks` (no ``RUN_DIR_ENV``), off Linux (no process-shared POSIX
semaphores), or for a message above :data:`SLOT_BYTES` (every member of a group has the same
message size, so every member takes the same path).

A group's memory (a file in the run's directory, in ``/dev/shm`` where it has room, mapped by
every member; its first member creates it):

* a header: the members' pids (for noticing a member that died);
* one POSIX semaphore per member, initialised process-shared;
* two halves of ``size`` slots, each slot a small header (operation, byte count, dtype) and its
  data.

One collective, on member ``r`` of ``n``: write the input into slot ``r`` of half ``g % 2``
(``g`` counts the group's collectives), post every other member's semaphore once, take ``n - 1``
posts from its own, check that every member issued the same operation, size and dtype, and compute the
result from all ``n`` slots in member order (bitwise the same result on every member). A member
cannot start collective ``g + 2``, which rewrites half ``g % 2``, until every member has posted
for ``g + 1``, i.e. finished reading ``g``; so two halves suffice and no second barrier is needed.
A wait that takes longer than :data:`WAIT_SLICE_S` looks for dead members and raises if one is.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os
import struct
import sys
import time
from types import SimpleNamespace
from typing import Any, cast

import torch
from torch import Tensor

from .. import RUN_DIR_ENV  # the run's own directory, shared by its ranks

__all__ = ["OPS", "NAMESPACE", "SLOT_BYTES", "CollectiveError", "SharedMemoryGroup", "available", "close_groups"]

NAMESPACE = "harness_comm"

SLOT_BYTES = 1 << 20
"""The largest message a member may put in one collective through shared memory. The file is
sparse (only the pages a run writes take memory), but a group of 16 may reach 2 x 16 slots; the
harness's messages are kilobytes."""

WAIT_SLICE_S = 0.2
"""How long a wait runs before it checks that the members it waits for are alive."""

ATTACH_TIMEOUT_S = 600.0
"""How long a member waits for the group's first member to create the group's memory."""

_MAGIC = 0x6768636F6D6D0002  # "ghcomm", layout version 2
_HEADER_BYTES = 4096  # magic, member count, then the members' pids
_PIDS_OFFSET = 16
_SEM_BYTES = 64  # sem_t is 32 bytes on Linux (x86-64 and aarch64); one cache line each
_SLOT_HEADER = struct.Struct("<qq16s")  # per member and half: operation code, byte count, dtype
_OPERATIONS = ("all_gather", "reduce_scatter", "all_reduce")


# -- POSIX semaphores, through ctypes -------------------------------------------------------------
class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _load_libc() -> Any:  # a CDLL, or None: its callers run only where available() said yes
    if sys.platform != "linux":  # unnamed process-shared semaphores: Linux (macOS has no sem_init)
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        for name in ("sem_init", "sem_post", "sem_timedwait"):
            getattr(libc, name)
    except (OSError, AttributeError):
        return None
    libc.sem_init.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint]
    libc.sem_post.argtypes = [ctypes.c_void_p]
    libc.sem_timedwait.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Timespec)]
    return libc


_libc = _load_libc()


def available() -> bool:
    """Whether this process's ranks can use shared memory (Linux, and inside a run of ranks)."""
    return _libc is not None and bool(os.environ.get(RUN_DIR_ENV))


class CollectiveError(RuntimeError):
    """The members of a group disagreed on a collective, or one of them died in it."""


# -- one group --------------------------------------------------------------------------------------
class SharedMemoryGroup:
    """This process's membership of one communication group (see the module docstring)."""

    def __init__(self, name: str, path: str, rank: int, size: int) -> None:
        if not 0 <= rank < size <= (_HEADER_BYTES - _PIDS_OFFSET) // 8:
            raise ValueError(f"communication group {name}: member {rank} of {size}")
        self.name, self.rank, self.size = name, rank, size
        self._generation = 0
        # Small things first, packed (a page fault each on first touch is what a run pays for
        # them); then the data slots, page-aligned, written only as far as a message reaches.
        self._sem_offset = _HEADER_BYTES
        self._slot_header_offset = self._sem_offset + size * _SEM_BYTES
        data_offset = _page_aligned(self._slot_header_offset + 2 * size * _SLOT_HEADER.size)
        total = data_offset + 2 * size * SLOT_BYTES
        self._mm = _map(path, rank, size, total, self._sem_offset)
        base = ctypes.addressof(ctypes.c_char.from_buffer(self._mm))
        self._sems = [ctypes.c_void_p(base + self._sem_offset + r * _SEM_BYTES) for r in range(size)]
        struct.pack_into("<q", self._mm, _PIDS_OFFSET + 8 * rank, os.getpid())
        # Every member's data slot as bytes: [half, member, SLOT_BYTES].
        self._slots = torch.frombuffer(self._mm, dtype=torch.uint8, offset=data_offset,
                                       count=2 * size * SLOT_BYTES).view(2, size, SLOT_BYTES)

    def close(self) -> None:
        del self._slots
        try:
            self._mm.close()
        except BufferError:  # a tensor view is still alive somewhere: the mapping goes with it
            pass

    # -- the exchange -------------------------------------------------------------------------------
    def exchange(self, operation: str, data: Tensor) -> Tensor:
        """Put ``data`` (contiguous) in this member's slot, wait for every member's, and return
        all slots' payloads as ``[size, nbytes]`` uint8 rows in member order."""
        nbytes = data.numel() * data.element_size()
        mine = (_OPERATIONS.index(operation), nbytes, str(data.dtype).encode().ljust(16, b"\0")[:16])
        which = self._generation & 1
        self._generation += 1
        headers = self._slot_header_offset + which * self.size * _SLOT_HEADER.size
        _SLOT_HEADER.pack_into(self._mm, headers + self.rank * _SLOT_HEADER.size, *mine)
        slots = self._slots[which]
        if nbytes:
            slots[self.rank, :nbytes].copy_(data.reshape(-1).view(torch.uint8))
        for r in range(self.size):
            if r != self.rank:
                _libc.sem_post(self._sems[r])
        self._take(self.size - 1, operation)
        for r in range(self.size):
            theirs = _SLOT_HEADER.unpack_from(self._mm, headers + r * _SLOT_HEADER.size)
            if theirs != mine:
                raise CollectiveError(
                    f"communication group {self.name}: member {self.rank} issued {_describe(mine)}, member {r} "
                    f"{_describe(theirs)} (collective #{self._generation - 1}); on a device the ranks would hang")
        return slots[:, :nbytes]

    def _take(self, count: int, operation: str) -> None:
        """Take ``count`` posts from this member's semaphore, checking on slow waits that the
        members are alive."""
        sem = self._sems[self.rank]
        deadline = _deadline(WAIT_SLICE_S)
        while count:
            if _libc.sem_timedwait(sem, ctypes.byref(deadline)) == 0:
                count -= 1
                continue
            err = ctypes.get_errno()
            if err == errno.EINTR:
                continue
            if err != errno.ETIMEDOUT:
                raise OSError(err, f"sem_timedwait in communication group {self.name}: {os.strerror(err)}")
            dead = self._dead_members()
            if dead:
                raise CollectiveError(
                    f"communication group {self.name}: member {dead[0]} (pid {self._pid(dead[0])}) exited "
                    f"while member {self.rank} waited in {operation}")
            deadline = _deadline(WAIT_SLICE_S)

    def _pid(self, rank: int) -> int:
        pid: int = struct.unpack_from("<q", self._mm, _PIDS_OFFSET + 8 * rank)[0]
        return pid

    def _dead_members(self) -> list[int]:
        return [r for r in range(self.size) if r != self.rank and self._pid(r) and not _pid_alive(self._pid(r))]


def _describe(header: tuple[int, int, bytes]) -> str:
    code, nbytes, dtype = header
    operation = _OPERATIONS[code] if 0 <= code < len(_OPERATIONS) else "?"
    return f"{operation} of {nbytes} bytes of {dtype.rstrip(bytes(1)).decode(errors='replace')}"


def _page_aligned(offset: int) -> int:
    return -(-offset // mmap.PAGESIZE) * mmap.PAGESIZE


def _deadline(seconds: float) -> _Timespec:
    now = time.time() + seconds  # sem_timedwait's clock is CLOCK_REALTIME
    return _Timespec(int(now), int((now % 1) * 1e9))


def _pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped by its parent, does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def _map(path: str, rank: int, size: int, total: int, sem_offset: int) -> mmap.mmap:
    """Member 0 creates the group's file (under a temporary name, renamed when its semaphores are
    initialised); the others wait for it to appear and map it."""
    if rank == 0:
        partial = f"{path}.{os.getpid()}.partial"
        fd = os.open(partial, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, total)
            mm = mmap.mmap(fd, total)
        finally:
            os.close(fd)
        struct.pack_into("<qq", mm, 0, _MAGIC, size)
        base = ctypes.addressof(ctypes.c_char.from_buffer(mm))
        for r in range(size):
            if _libc.sem_init(ctypes.c_void_p(base + sem_offset + r * _SEM_BYTES), 1, 0) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"sem_init: {os.strerror(err)}")
        os.rename(partial, path)
        return mm
    deadline = time.monotonic() + ATTACH_TIMEOUT_S
    pause = 0.0002
    while True:
        try:
            fd = os.open(path, os.O_RDWR)
            break
        except FileNotFoundError:
            if time.monotonic() > deadline:
                raise CollectiveError(f"{path}: the group's first member did not create it "
                                      f"within {ATTACH_TIMEOUT_S:g} s") from None
            time.sleep(pause)
            pause = min(pause * 2, 0.01)
    try:
        mm = mmap.mmap(fd, total)
    finally:
        os.close(fd)
    magic, members = struct.unpack_from("<qq", mm, 0)
    if magic != _MAGIC or members != size:
        raise CollectiveError(f"{path}: not a group of {size} members (magic {magic:#x}, {members} members)")
    return mm


# -- the groups of this process ------------------------------------------------------------------
_groups: dict[str, SharedMemoryGroup] = {}  # group name -> this process's membership
_groups_run: list[str] = [""]  # the run directory the groups above belong to


def _group(group_name: str, nbytes: int) -> SharedMemoryGroup | None:
    """The shared memory of ``group_name``, attached on first use; None where c10d must carry
    the collective (see the module docstring)."""
    run_dir = os.environ.get(RUN_DIR_ENV, "")
    if run_dir != _groups_run[0]:  # a new run in a reused worker: its groups are new
        close_groups()
        _groups_run[0] = run_dir
    if nbytes > SLOT_BYTES or _libc is None or not run_dir:  # see available()
        return None
    group = _groups.get(group_name)
    if group is None:
        import torch.distributed.distributed_c10d as c10d

        pg = c10d._resolve_process_group(cast("c10d.GroupName", group_name))  # as the _c10d_functional ops resolve it
        path = os.path.join(run_dir, "comm-" + "".join(c if c.isalnum() else "_" for c in group_name))
        group = _groups[group_name] = SharedMemoryGroup(group_name, path, pg.rank(), pg.size())
    return group


def close_groups() -> None:
    """Unmap every group of this process (a run's end; a warm worker's next run maps new ones)."""
    for group in _groups.values():
        group.close()
    _groups.clear()
    _groups_run[0] = ""


# -- the ops ------------------------------------------------------------------------------------------
_c10d = torch.ops._c10d_functional


def _reduce(rows: Tensor, reduce_op: str, out: Tensor) -> None:
    """Reduce the members' rows (uint8 ``[size, nbytes]``, read as ``out``'s dtype) into ``out``:
    one kernel over all members, so every member computes the same bits."""
    if not out.is_contiguous():
        result = torch.empty_like(out, memory_format=torch.contiguous_format)
        _reduce(rows, reduce_op, result)
        out.copy_(result)
        return
    values, flat = rows.view(out.dtype), out.view(-1)
    op = reduce_op.lower()
    if op == "sum":
        torch.sum(values, dim=0, out=flat)
    elif op == "avg":
        torch.div(torch.sum(values, dim=0), values.shape[0], out=flat)
    elif op == "max":
        torch.amax(values, dim=0, out=flat)
    elif op == "min":
        torch.amin(values, dim=0, out=flat)
    else:
        raise ValueError(f"unsupported reduce_op {reduce_op!r} (sum, avg, max, min)")


def _check_group_size(group: SharedMemoryGroup, group_size: int) -> None:
    if group_size != group.size:
        raise CollectiveError(f"communication group {group.name} has {group.size} members, the op says {group_size}")


def _all_gather_out(input: Tensor, group_size: int, group_name: str, *, out: Tensor) -> Tensor:
    data = input.contiguous()
    group = _group(group_name, data.numel() * data.element_size())
    if group is None:
        return cast(Tensor, _c10d.wait_tensor(_c10d.all_gather_into_tensor_out(input, group_size, group_name, out=out)))
    _check_group_size(group, group_size)
    if out.numel() != group_size * data.numel() or out.dtype != data.dtype:
        raise ValueError(f"all_gather_into_tensor_out: out {tuple(out.shape)} {out.dtype} cannot hold "
                         f"{group_size} x {tuple(data.shape)} {data.dtype}")
    rows = group.exchange("all_gather", data)
    if out.is_contiguous():
        out.view(-1).view(torch.uint8).view(group_size, -1).copy_(rows)
    else:
        out.copy_(rows.contiguous().view(data.dtype).view(out.shape))
    return out


def _all_gather(input: Tensor, group_size: int, group_name: str) -> Tensor:
    return _all_gather_out(input, group_size, group_name, out=_gathered_empty(input, group_size, group_name))


def _reduce_scatter_out(input: Tensor, reduce_op: str, group_size: int, group_name: str, *, out: Tensor) -> Tensor:
    data = input.contiguous()
    group = _group(group_name, data.numel() * data.element_size())
    if group is None:
        return cast(Tensor, _c10d.wait_tensor(_c10d.reduce_scatter_tensor_out(input, reduce_op, group_size, group_name, out=out)))
    _check_group_size(group, group_size)
    if data.shape[0] % group_size or out.numel() * group_size != data.numel():
        raise ValueError(f"reduce_scatter_tensor_out: {tuple(data.shape)} does not split into {group_size} "
                         f"parts of {tuple(out.shape)}")
    if out.dtype != data.dtype:
        raise ValueError(f"reduce_scatter_tensor_out: out is {out.dtype}, the input {data.dtype}")
    rows = group.exchange("reduce_scatter", data)
    chunk = rows.shape[1] // group_size
    _reduce(rows[:, group.rank * chunk:(group.rank + 1) * chunk], reduce_op, out)
    return out


def _all_reduce_(input: Tensor, reduce_op: str, group_name: str) -> Tensor:
    data = input.contiguous()
    group = _group(group_name, data.numel() * data.element_size())
    if group is None:
        return cast(Tensor, _c10d.wait_tensor(_c10d.all_reduce_(input, reduce_op, group_name)))
    _reduce(group.exchange("all_reduce", data), reduce_op, input)  # the rows are copies: input may take it
    return input


def _gathered_empty(input: Tensor, group_size: int, group_name: str) -> Tensor:
    """The output of an all-gather of ``input`` (uninitialised), on ``input``'s device: meta or CPU."""
    return input.new_empty((group_size * input.shape[0], *input.shape[1:]))


def _out_meta(*args: object, out: Tensor) -> Tensor:
    return out


def _all_reduce_meta(input: Tensor, reduce_op: str, group_name: str) -> Tensor:
    return input


_lib = torch.library.Library(NAMESPACE, "DEF")  # noqa: TOR901 (kept alive by this module)
_lib.define("all_gather_into_tensor_out(Tensor input, int group_size, str group_name, *, Tensor(a!) out) -> Tensor(a!)")
_lib.define("all_gather_into_tensor(Tensor input, int group_size, str group_name) -> Tensor")
_lib.define("reduce_scatter_tensor_out(Tensor input, str reduce_op, int group_size, str group_name, *, "
            "Tensor(a!) out) -> Tensor(a!)")
_lib.define("all_reduce_(Tensor(a!) input, str reduce_op, str group_name) -> Tensor(a!)")
for _name, _kernel, _meta in (
    ("all_gather_into_tensor_out", _all_gather_out, _out_meta),
    ("all_gather_into_tensor", _all_gather, _gathered_empty),
    ("reduce_scatter_tensor_out", _reduce_scatter_out, _out_meta),
    ("all_reduce_", _all_reduce_, _all_reduce_meta),
):
    _lib.impl(_name, _kernel, "CPU")
    _lib.impl(_name, _meta, "Meta")


def _synchronous(tensor: Tensor) -> Tensor:
    return tensor


_ops = getattr(torch.ops, NAMESPACE)

#: The emulator's collective ops, by the names of their ``_c10d_functional`` namesakes.
OPS = SimpleNamespace(
    all_gather_into_tensor_out=_ops.all_gather_into_tensor_out,
    all_gather_into_tensor=_ops.all_gather_into_tensor,
    reduce_scatter_tensor_out=_ops.reduce_scatter_tensor_out,
    all_reduce_=_ops.all_reduce_,
    wait_tensor=_synchronous,
)
