"""Shared helpers for tests/model (imported as a module; unique name to avoid clashes): batch building (with the dummy-request padding fix)."""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import Tensor

from harness.model import DecoderLM, ModelConfig, PagedKVCache, build_model, make_eager_attend


@dataclasses.dataclass
class Batch:
    input_ids: Tensor
    positions: Tensor
    slot_mapping: Tensor
    cum_q: list[int]
    kv_lens: list[int]
    block_table: Tensor

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])


def make_batch(
    cache: PagedKVCache,
    requests: list[tuple[object, list[int], int]],
    *,
    pad_to: int | None = None,
) -> Batch:
    """Batch of ``(req_id, new_tokens, start_position)``; allocates blocks as needed.

    With ``pad_to``, padded rows get token 0, position 0, slot -1, and one dummy request
    (KV length 0, zero block-table row) absorbs them so that cum_q[-1] == T (strict contract).
    """
    cfg = cache.config
    alloc = cache.allocator
    ids: list[int] = []
    pos: list[int] = []
    slots: list[int] = []
    cum_q: list[int] = []
    kv_lens: list[int] = []
    for req, toks, start in requests:
        total = start + len(toks)
        alloc.allocate(req, total)
        ids += toks
        positions = list(range(start, total))
        pos += positions
        slots += alloc.slots(req, positions)
        cum_q.append(len(ids))
        kv_lens.append(total)
    num_rows = len(requests)
    if pad_to is not None and pad_to > len(ids):
        n = pad_to - len(ids)
        ids += [0] * n
        pos += [0] * n
        slots += [-1] * n
        cum_q.append(pad_to)
        kv_lens.append(0)
        num_rows += 1
    table = alloc.block_table([r for r, _, _ in requests], cfg.max_blocks_per_seq, num_rows=num_rows)
    return Batch(
        torch.tensor(ids, dtype=torch.int64),
        torch.tensor(pos, dtype=torch.int64),
        torch.tensor(slots, dtype=torch.int64),
        cum_q,
        kv_lens,
        table,
    )


def run_batch(model: DecoderLM, cache: PagedKVCache, batch: Batch, fia=None) -> Tensor:
    attend = make_eager_attend(model.config, batch.cum_q, batch.kv_lens, batch.block_table, fia=fia)
    return model(batch.input_ids, batch.positions, batch.slot_mapping, cache, attend)


def tiny_reference_fia(query, key, value, *, actual_seq_lengths, actual_seq_lengths_kv,
                       block_table, block_size, num_heads, num_key_value_heads, scale,
                       input_layout="TND", sparse_mode=3, softmax_lse_flag=False):
    """A private, independent dense reference of FIA (TND, paged, causal) for cross-checks."""
    assert input_layout == "TND" and sparse_mode == 3
    t = query.shape[0]
    out = torch.zeros(query.shape, dtype=torch.float32)
    group = num_heads // num_key_value_heads
    start = 0
    for i, end in enumerate(actual_seq_lengths):
        kv = actual_seq_lengths_kv[i]
        if end > start and kv > 0:
            nblk = math.ceil(kv / block_size)
            ids = block_table[i, :nblk].long()
            k = key[ids].reshape(-1, key.shape[2], key.shape[3])[:kv].float()
            v = value[ids].reshape(-1, value.shape[2], value.shape[3])[:kv].float()
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
            q = query[start:end].float()
            s = torch.einsum("qnd,knd->nqk", q, k) * scale
            qlen = end - start
            mask = torch.arange(kv)[None, :] > (torch.arange(qlen)[:, None] + kv - qlen)
            s = s.masked_fill(mask, float("-inf"))
            out[start:end] = torch.einsum("nqk,knd->qnd", torch.softmax(s, -1), v)
        start = end
    return out.to(query.dtype), torch.zeros(t, num_heads, 1)


SMALL = dict(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
             vocab_size=256, max_model_len=256, block_size=8, num_blocks=96)


def small_model(kind: str = "random", dtype: str = "float32", **over) -> DecoderLM:
    return build_model(ModelConfig(kind=kind, dtype=dtype, **{**SMALL, **over}))
