"""Pieces are graph-safe: recorded under an aten recorder they replay with new inputs."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from harness.model import PagedKVCache, make_eager_attend
from model_helpers import make_batch, run_batch, small_model

BANNED = ("_local_scalar_dense", "nonzero", "masked_select", "item", "bernoulli", "rand", "normal")


class Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        assert not any(b in name for b in BANNED), f"graph-unsafe op {func}"
        out = func(*args, **kwargs)
        self.ops.append((func, args, kwargs, out))
        return out

    def replay(self):
        for func, args, kwargs, out in self.ops:
            new = func(*args, **kwargs)
            if isinstance(out, torch.Tensor) and new.data_ptr() != out.data_ptr():
                out.copy_(new)


@pytest.mark.parametrize("kind", ["random", "canary"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_pieces_record_and_replay(kind, dtype):
    model = small_model(kind, dtype)
    cfg = model.config
    T = 8
    cache = PagedKVCache(cfg)
    ref_cache = PagedKVCache(cfg)
    # static buffers, as a graph runner keeps them
    ids = torch.zeros(T, dtype=torch.int64)
    pos = torch.zeros(T, dtype=torch.int64)
    slots = torch.full((T,), -1, dtype=torch.int64)
    attn_in = [torch.zeros(T, cfg.num_heads, cfg.head_dim, dtype=cfg.torch_dtype) for _ in range(cfg.num_layers)]
    recs, outs = [], []
    residual = torch.zeros(T, cfg.hidden_size, dtype=cfg.torch_dtype)
    for i in range(model.num_pieces):
        rec = Recorder()
        inputs = (ids,) if i == 0 else (attn_in[i - 1], residual)
        with rec:
            o = model.piece(i, inputs, pos, slots, cache)
        if i < cfg.num_layers:
            residual = o[1]
        recs.append(rec)
        outs.append(o)
    cache.zero_()

    # replay two different steps; eager attention between pieces, as PIECEWISE does
    for c in (cache, ref_cache):
        c.allocator.allocate("p", 12)
    steps = [[("p", [5, 6, 7, 8, 9, 10, 11, 12], 0)], [("p", [3, 4], 8), ("q", [1, 2, 3], 0)]]
    for reqs in steps:
        batch = make_batch(ref_cache, reqs, pad_to=T)
        make_batch(cache, reqs, pad_to=T)  # same allocations in the replayed cache
        expect = run_batch(model, ref_cache, batch)
        ids.copy_(batch.input_ids)
        pos.copy_(batch.positions)
        slots.copy_(batch.slot_mapping)
        attend = make_eager_attend(cfg, batch.cum_q, batch.kv_lens, batch.block_table)
        for i in range(model.num_pieces):
            recs[i].replay()
            if i < cfg.num_layers:
                attn_in[i].copy_(attend(i, outs[i][0], cache.key_cache[i], cache.value_cache[i]))
        got = outs[-1][0]
        assert torch.equal(got, expect)
        for a, b in zip(cache.key_cache + cache.value_cache, ref_cache.key_cache + ref_cache.value_cache):
            assert torch.equal(a[1:], b[1:])
