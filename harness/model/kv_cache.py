"""Paged KV cache: per-layer block tensors allocated once, a block allocator, a graph-safe write.

Layout (FIA's paged layout): ``key_cache[l]`` and ``value_cache[l]`` are
``[num_blocks, block_size, num_kv_heads, head_dim]``. Token slot ``s`` is block ``s // block_size``,
offset ``s % block_size``.

Block 0 is the **null block**: it is never handed to a request. Zeroed block-table rows (padded /
dummy requests) point at it, and padded tokens (slot ``-1``) write into its first slot
(:data:`SCRATCH_SLOT`), so they never touch a real request's blocks. Its contents are
therefore garbage and must never be attended to (their KV length is 0).

The cache tensors are allocated exactly once in :class:`PagedKVCache` and only ever written in
place, because captured graphs bind them by address.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor

from harness.model.config import ModelConfig

#: The reserved null block.
NULL_BLOCK = 0
#: Where slot ``-1`` (a padded token) writes: the first slot of the null block.
SCRATCH_SLOT = 0


class OutOfBlocksError(RuntimeError):
    """The allocator has no free block left."""


class BlockAllocator:
    """Hands out cache blocks ``1 .. num_blocks-1`` to requests, lowest free id first.

    Deterministic: the same sequence of ``allocate``/``free`` calls gives the same block ids.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks: need >= 2 (block 0 is reserved), got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size: expected a positive int, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: list[int] = list(range(1, num_blocks))  # kept sorted ascending
        self._owned: dict[object, list[int]] = {}

    # ------------------------------------------------------------------ allocation
    @property
    def num_free(self) -> int:
        """Blocks no request holds (block 0 is never free: it is reserved)."""
        return len(self._free)

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` tokens."""
        return -(-max(num_tokens, 0) // self.block_size)

    def allocate(self, req_id: object, num_tokens_total: int) -> list[int]:
        """Make ``req_id`` own enough blocks for ``num_tokens_total`` tokens; return its blocks.

        A request that already holds blocks keeps them and is extended (never shrunk), so a
        decode loop can call this every step with the new total length.
        """
        if num_tokens_total < 0:
            raise ValueError(f"num_tokens_total: expected >= 0, got {num_tokens_total}")
        owned = self._owned.setdefault(req_id, [])
        missing = self.blocks_needed(num_tokens_total) - len(owned)
        if missing > len(self._free):
            raise OutOfBlocksError(
                f"request {req_id!r} needs {missing} more block(s) for {num_tokens_total} tokens, "
                f"only {len(self._free)} free of {self.num_blocks - 1}"
            )
        if missing > 0:
            owned.extend(self._free[:missing])
            del self._free[:missing]
        return list(owned)

    def free(self, req_id: object) -> None:
        """Return ``req_id``'s blocks to the free pool (unknown ids are ignored)."""
        blocks = self._owned.pop(req_id, [])
        if blocks:
            self._free = sorted(self._free + blocks)

    def reset(self) -> None:
        """Free everything."""
        self._free = list(range(1, self.num_blocks))
        self._owned.clear()

    # ------------------------------------------------------------------ queries
    def blocks(self, req_id: object) -> list[int]:
        """Blocks owned by ``req_id`` in sequence order (empty if none)."""
        return list(self._owned.get(req_id, []))

    def slot(self, req_id: object, position: int) -> int:
        """Cache slot of token ``position`` of ``req_id`` (its blocks must cover it)."""
        owned = self._owned.get(req_id, [])
        index, offset = divmod(position, self.block_size)
        if position < 0 or index >= len(owned):
            raise IndexError(
                f"position {position} of request {req_id!r} is not covered by its "
                f"{len(owned)} block(s)"
            )
        return owned[index] * self.block_size + offset

    def slots(self, req_id: object, positions: Iterable[int]) -> list[int]:
        """Cache slots of several positions of ``req_id``."""
        return [self.slot(req_id, p) for p in positions]

    def block_table(
        self,
        req_ids: Sequence[object],
        max_blocks: int,
        *,
        num_rows: int | None = None,
        device: torch.device | str = "cpu",
    ) -> Tensor:
        """int32 ``[num_rows, max_blocks]`` block table, one row per request, zero-padded.

        Rows past ``len(req_ids)`` (padded / dummy requests) are all zeros (the null block).
        """
        return make_block_table(
            [self._owned.get(r, []) for r in req_ids], max_blocks, num_rows=num_rows, device=device
        )


def make_block_table(
    rows: Sequence[Sequence[int]],
    max_blocks: int,
    *,
    num_rows: int | None = None,
    device: torch.device | str = "cpu",
) -> Tensor:
    """int32 ``[num_rows or len(rows), max_blocks]`` table from per-request block lists."""
    n = len(rows) if num_rows is None else num_rows
    if n < len(rows):
        raise ValueError(f"num_rows ({n}) < number of requests ({len(rows)})")
    table = torch.zeros((n, max_blocks), dtype=torch.int32)
    for i, row in enumerate(rows):
        if len(row) > max_blocks:
            raise ValueError(f"request {i} holds {len(row)} blocks, table width is {max_blocks}")
        if row:
            table[i, : len(row)] = torch.tensor(list(row), dtype=torch.int32)
    return table.to(device)


def write_kv(
    key_cache: Tensor,
    value_cache: Tensor,
    key: Tensor,
    value: Tensor,
    slot_mapping: Tensor,
) -> None:
    """Scatter this step's ``key``/``value`` ``[T, n_kv, D]`` into the paged caches, in place.

    Graph-safe: no host sync, no data-dependent shape, no boolean-mask indexing. Slot ``-1``
    (any negative slot) is redirected with ``torch.where`` to :data:`SCRATCH_SLOT` in the null
    block, then one ``index_copy_`` per cache writes all T rows into the flattened cache view
    (several padded rows may hit the scratch slot; which one wins does not matter).
    """
    slots = slot_mapping.to(torch.int64)
    slots = torch.where(slots < 0, torch.full_like(slots, SCRATCH_SLOT), slots)
    flat_k = key_cache.view(-1, key_cache.shape[-2], key_cache.shape[-1])
    flat_v = value_cache.view(-1, value_cache.shape[-2], value_cache.shape[-1])
    flat_k.index_copy_(0, slots, key.to(key_cache.dtype))
    flat_v.index_copy_(0, slots, value.to(value_cache.dtype))


class PagedKVCache:
    """Per-layer paged K/V tensors (allocated once, zero-initialised) plus a block allocator.

    Attributes:
        key_cache, value_cache: lists (one per layer) of
            ``[num_blocks, block_size, num_kv_heads, head_dim]`` tensors in ``config.torch_dtype``.
        allocator: the :class:`BlockAllocator` for blocks ``1 ..``.
    """

    def __init__(self, config: ModelConfig, device: torch.device | str = "cpu", num_kv_heads: int | None = None) -> None:
        """``num_kv_heads``: the heads this rank holds (a TP rank's share); all of ``config``'s
        when None. ``config`` stays the whole model's."""
        self.config = config
        self.device = torch.device(device)
        heads = config.num_kv_heads if num_kv_heads is None else num_kv_heads
        shape = (config.num_blocks, config.block_size, heads, config.head_dim)
        dtype = config.torch_dtype
        self.key_cache: list[Tensor] = [
            torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(config.num_layers)
        ]
        self.value_cache: list[Tensor] = [
            torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(config.num_layers)
        ]
        self.allocator = BlockAllocator(config.num_blocks, config.block_size)

    @property
    def num_layers(self) -> int:
        return len(self.key_cache)

    @property
    def block_size(self) -> int:
        return self.config.block_size

    def write(self, layer: int, key: Tensor, value: Tensor, slot_mapping: Tensor) -> None:
        """Graph-safe in-place write of layer ``layer``'s K/V rows (:func:`write_kv`, as the one
        op ``harness::reshape_and_cache``: one node in a graph; see :mod:`harness.model.kernels`)."""
        torch.ops.harness.reshape_and_cache.default(
            key, value, self.key_cache[layer], self.value_cache[layer], slot_mapping)

    def zero_(self) -> None:
        """Zero every cache tensor in place (addresses unchanged)."""
        for t in (*self.key_cache, *self.value_cache):
            t.zero_()

    def data_ptrs(self) -> list[int]:
        """Addresses of all cache tensors (keys then values), to check they never move."""
        return [t.data_ptr() for t in (*self.key_cache, *self.value_cache)]
