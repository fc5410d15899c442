"""Test helpers for harness.ops: batch builders and an independent dense attention.

The naive attention below deliberately shares no code with ``harness.ops.reference``: it walks
the block table position by position and does the softmax in float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from itertools import accumulate
from typing import Any

import torch
from torch import Tensor


@dataclass
class Batch:
    """A packed TND batch over a shared paged KV cache."""

    query: Tensor  # [T, N, D]
    key: Tensor  # [num_blocks, block_size, N_kv, D]
    value: Tensor
    block_table: Tensor  # int32 [B, max_blocks]
    q_lens: list[int]
    kv_lens: list[int]
    num_heads: int
    num_kv_heads: int
    block_size: int
    scale: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def cum_q(self) -> list[int]:
        return list(accumulate(self.q_lens))

    @property
    def T(self) -> int:
        return self.query.shape[0]

    def kwargs(self, *, sparse_mode: int = 3, softmax_lse_flag: bool = True, **over: Any) -> dict[str, Any]:
        """Keyword arguments for the FIA wrappers / ops."""
        kw: dict[str, Any] = dict(
            actual_seq_lengths=self.cum_q,
            actual_seq_lengths_kv=list(self.kv_lens),
            block_table=self.block_table,
            block_size=self.block_size,
            num_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads,
            scale=self.scale,
            input_layout="TND",
            sparse_mode=sparse_mode,
            softmax_lse_flag=softmax_lse_flag,
        )
        kw.update(over)
        return kw

    def request(self, i: int) -> Batch:
        """Request ``i`` alone: its query rows and block-table row, the same cache."""
        start = sum(self.q_lens[:i])
        return replace(
            self,
            query=self.query[start : start + self.q_lens[i]].clone(),
            block_table=self.block_table[i : i + 1].clone(),
            q_lens=[self.q_lens[i]],
            kv_lens=[self.kv_lens[i]],
        )

    def padded(self, pad: int) -> Batch:
        """The same batch with ``pad`` garbage query rows appended (metadata unchanged)."""
        junk = torch.randn(pad, *self.query.shape[1:], generator=torch.Generator().manual_seed(99))
        return replace(self, query=torch.cat([self.query, junk.to(self.query.dtype)]))


def make_batch(
    q_lens: list[int],
    kv_lens: list[int],
    *,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int = 16,
    block_size: int = 4,
    max_blocks: int | None = None,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> Batch:
    """Random batch; each request owns distinct, shuffled cache blocks."""
    gen = torch.Generator().manual_seed(seed)
    need = [max(1, -(-k // block_size)) for k in kv_lens]
    max_blocks = max_blocks or max(need)
    num_blocks = sum(need) + 3  # a few blocks nobody uses
    perm = torch.randperm(num_blocks, generator=gen)
    table = torch.zeros(len(q_lens), max_blocks, dtype=torch.int32)
    used = 0
    for r, n in enumerate(need):
        table[r, :n] = perm[used : used + n].to(torch.int32)
        used += n
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    return Batch(
        query=torch.randn(sum(q_lens), num_heads, head_dim, generator=gen).to(dtype),
        key=torch.randn(*shape, generator=gen).to(dtype),
        value=torch.randn(*shape, generator=gen).to(dtype),
        block_table=table,
        q_lens=list(q_lens),
        kv_lens=list(kv_lens),
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        block_size=block_size,
        scale=1.0 / math.sqrt(head_dim),
    )


def naive_attention(batch: Batch, *, causal: bool) -> tuple[Tensor, Tensor]:
    """Dense float64 attention: ``(out [T, N, D], lse [T, N])``; empty rows give 0 / -inf."""
    T, N, D = batch.query.shape
    out = torch.zeros(T, N, D, dtype=torch.float64)
    lse = torch.full((T, N), float("-inf"), dtype=torch.float64)
    group = batch.num_heads // batch.num_kv_heads
    start = 0
    for r, (q_len, kv_len) in enumerate(zip(batch.q_lens, batch.kv_lens)):
        positions = range(kv_len)
        blocks = [int(batch.block_table[r, p // batch.block_size]) for p in positions]
        offs = [p % batch.block_size for p in positions]
        for j in range(q_len):
            row = start + j
            visible = kv_len - q_len + j + 1 if causal else kv_len
            if visible <= 0:
                continue
            for h in range(N):
                kh = h // group
                k = torch.stack([batch.key[blocks[p], offs[p], kh] for p in range(visible)]).double()
                v = torch.stack([batch.value[blocks[p], offs[p], kh] for p in range(visible)]).double()
                s = (k @ batch.query[row, h].double()) * batch.scale
                lse[row, h] = torch.logsumexp(s, 0)
                out[row, h] = torch.softmax(s, 0) @ v
        start += q_len
    return out, lse
