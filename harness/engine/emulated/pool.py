"""Graph memory pools: where a capture's outputs and intermediates live.

The CUDA caching allocator's private pools, which torch_npu's NPU graphs share the design of
(``torch.cuda.graph_pool_handle``, ``torch.npu.graph_pool_handle``): graphs captured into one
pool (vLLM captures every bucket into one, largest first) draw their memory from it, and a block
is free again as soon as no tensor holds it, whether a graph still writes into it or not. That
is safe for the graphs, because replays never run at once and a graph's intermediates are dead
between its replays; it is unsafe for a caller who kept only a weak reference to a graph's
output (vLLM's ``weak_ref_tensors``) and reads it after another graph of the pool has replayed.
This module keeps exactly that rule: a block is held by the live device tensors on it
(:meth:`Block.hold`; the tape of a graph holds none), is offered to later allocations the
moment the last one is gone (also in the middle of a capture, as the allocator does), and is
never handed out while one lives. It counts the bytes each graph and each pool reserve.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import weakref
from dataclasses import dataclass, field
from typing import Sequence

import torch

_pool_ids = itertools.count(1)


@dataclass(frozen=True)
class PoolHandle:
    """Opaque handle returned by ``graph_pool_handle()`` and ``NPUGraph.pool()``."""

    id: int


@functools.cache  # looked up once per dtype: every allocation of a capture is poisoned
def _poison_value(dtype: torch.dtype) -> float | bool | int:
    if dtype.is_floating_point or dtype.is_complex:
        return float("nan")
    if dtype == torch.bool:
        return True
    return torch.iinfo(dtype).min


def _poison(t: torch.Tensor) -> None:
    """Fill fresh graph memory with values that cannot pass for real results."""
    t.fill_(_poison_value(t.dtype))


def nbytes_for(size: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype) -> int:
    """Bytes a tensor of this size and stride spans (0 if it has no element)."""
    if any(s == 0 for s in size):
        return 0
    extent = 1 + sum((s - 1) * st for s, st in zip(size, stride))
    return extent * dtype.itemsize


@dataclass(eq=False)
class Block:
    """One allocation of a pool, and how many live device tensors hold it."""

    storage: torch.UntypedStorage
    owner: str  # the graph that first allocated it
    pool: "MemoryPool | None" = None
    holders: int = 0

    @property
    def nbytes(self) -> int:
        return self.storage.nbytes()

    def hold(self, tensor: torch.Tensor) -> None:
        """``tensor`` lives on this block: the block is not free again until it is gone."""
        self.holders += 1
        if self.pool is not None:
            self.pool.watch(tensor, self)


@dataclass(eq=False)
class MemoryPool:
    """The blocks of one pool, and which of them later captures may reuse.

    The free list is kept sorted by ``(size, order freed)``, so best fit, first of equals, is a
    binary search: a 40-layer PIECEWISE run frees and reuses tens of thousands of blocks.
    """

    handle: PoolHandle
    blocks: list[Block] = field(default_factory=list)
    graph_bytes: dict[str, int] = field(default_factory=dict)
    _free: list[tuple[int, int, Block]] = field(default_factory=list)  # (nbytes, order, block)
    _free_ids: set[int] = field(default_factory=set)
    _order: "itertools.count[int]" = field(default_factory=itertools.count)
    _watched: dict[int, "weakref.ref[torch.Tensor]"] = field(default_factory=dict)
    _graph_blocks: dict[str, set[int]] = field(default_factory=dict)  # graph -> ids of the blocks it used

    @property
    def free(self) -> list[Block]:
        """Intermediates of finished captures, smallest first."""
        return [block for _, _, block in self._free]

    @property
    def bytes_reserved(self) -> int:
        return sum(b.nbytes for b in self.blocks)

    def allocate(self, size: Sequence[int], stride: Sequence[int], dtype: torch.dtype, graph: str,
                 nbytes: int | None = None) -> tuple[torch.Tensor, Block]:
        """A poisoned tensor of ``size``/``stride`` on a free block of the pool or a new one.

        ``nbytes`` is :func:`nbytes_for` of the same arguments, when the caller knows it."""
        size, stride = tuple(size), tuple(stride)
        need = nbytes_for(size, stride, dtype) if nbytes is None else nbytes
        block = self._take_free(need)
        if block is None:
            block = Block(torch.UntypedStorage(max(need, 1)), owner=graph, pool=self)
            self.blocks.append(block)
        tensor = torch.empty(0, dtype=dtype).set_(block.storage, 0, size, stride)
        _poison(tensor)
        used = self._graph_blocks.setdefault(graph, set())
        if id(block) not in used:  # a block the graph reuses (an intermediate that died) counts once
            used.add(id(block))
            self.graph_bytes[graph] = self.graph_bytes.get(graph, 0) + block.nbytes
        return tensor, block

    def _take_free(self, need: int) -> Block | None:
        at = bisect.bisect_left(self._free, (need, -1))
        if at == len(self._free):
            return None
        _, _, best = self._free.pop(at)
        self._free_ids.discard(id(best))
        return best

    def _offer(self, block: Block) -> None:
        if block.holders or id(block) in self._free_ids:
            return
        self._free_ids.add(id(block))
        bisect.insort(self._free, (block.nbytes, next(self._order), block), key=lambda e: e[:2])

    def watch(self, tensor: torch.Tensor, block: Block) -> None:
        """Free ``block`` for reuse once ``tensor`` and every other holder of it are gone."""

        def gone(ref: "weakref.ref[torch.Tensor]") -> None:
            self._watched.pop(id(ref), None)
            block.holders -= 1
            self._offer(block)

        ref = weakref.ref(tensor, gone)
        self._watched[id(ref)] = ref

    def release(self, blocks: list[Block]) -> None:
        """Offer the blocks no tensor holds (a capture's allocations it never handed out)."""
        for block in blocks:
            self._offer(block)

    def forget_graph(self, graph: str, blocks: list[Block]) -> None:
        """A graph reset or discarded: its blocks are free once no tensor holds them."""
        self.graph_bytes.pop(graph, None)
        self._graph_blocks.pop(graph, None)
        for block in blocks:
            self._offer(block)


class PoolRegistry:
    def __init__(self) -> None:
        self.pools: dict[int, MemoryPool] = {}

    def new_handle(self) -> PoolHandle:
        handle = PoolHandle(next(_pool_ids))
        self.pools[handle.id] = MemoryPool(handle)
        return handle

    def get(self, handle: PoolHandle | None) -> MemoryPool:
        if handle is None:
            handle = self.new_handle()
        if handle.id not in self.pools:
            self.pools[handle.id] = MemoryPool(handle)
        return self.pools[handle.id]

    def report(self) -> dict[str, dict[str, object]]:
        return {
            f"pool{p.handle.id}": {
                "bytes_reserved": p.bytes_reserved,
                "graphs": dict(p.graph_bytes),
            }
            for p in self.pools.values()
        }
