"""Helpers for tests/model/test_model_parallel.py: a tiny local 2-process gloo launcher and the
per-rank job (imported as a module by the spawned children; unique name to avoid clashes)."""

from __future__ import annotations

import os
import traceback
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from harness.model import DecoderLM, ModelConfig, PagedKVCache, make_eager_attend
from harness.model.parallel import ParallelContext, make_kv_cache, padded_num_tokens
from model_helpers import Batch, make_batch

SMALL = dict(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
             vocab_size=256, max_model_len=256, block_size=8, num_blocks=96)


# ------------------------------------------------------------------------------- launcher
def _entry(rank: int, fn: Callable[..., Any], world: int, store: str, outdir: str,
           args: tuple) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        result = fn(rank, world, *args)
        torch.save(result, os.path.join(outdir, f"rank{rank}.pt"))
    except BaseException:
        traceback.print_exc()
        raise
    finally:
        dist.destroy_process_group()


def run_ranks(fn: Callable[..., Any], tmp_path: Any, *args: Any, world: int = 2) -> list[Any]:
    """Run ``fn(rank, world, *args)`` in ``world`` spawned processes (gloo, FileStore under
    ``tmp_path``); return each rank's (torch.save-able) result, in rank order."""
    store = os.path.join(str(tmp_path), "store")
    outdir = str(tmp_path)
    mp.start_processes(_entry, args=(fn, world, store, outdir, args), nprocs=world,
                       start_method="spawn", join=True)
    return [torch.load(os.path.join(outdir, f"rank{r}.pt")) for r in range(world)]


# ------------------------------------------------------------------------------- model runs
def run(model: DecoderLM, cache: PagedKVCache, batch: Batch) -> torch.Tensor:
    attend = make_eager_attend(model.config, batch.cum_q, batch.kv_lens, batch.block_table,
                               parallel=model.parallel)
    return model(batch.input_ids, batch.positions, batch.slot_mapping, cache, attend)


def greedy(model: DecoderLM, prompt: list[int], steps: int) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy decode (T padded to a multiple of tp under SP, dummy request absorbs the pad)."""
    ctx = model.parallel
    cache = make_kv_cache(model.config, ctx)
    tokens, out, logits = list(prompt), [], []
    start, new = 0, list(prompt)
    for _ in range(steps):
        t = padded_num_tokens(len(new), ctx)
        batch = make_batch(cache, [("r", new, start)], pad_to=t)
        row = run(model, cache, batch)[len(new) - 1]
        nxt = int(torch.argmax(row))
        logits.append(row)
        out.append(nxt)
        tokens.append(nxt)
        start, new = len(tokens) - 1, [nxt]
    return out, logits


def two_step_batches(cache: PagedKVCache, pad_multiple: int) -> list[Batch]:
    """A mixed prefill batch (T=12) then a decode batch of 3 tokens padded to pad_multiple."""
    g = torch.Generator().manual_seed(7)
    a = torch.randint(1, 255, (7,), generator=g).tolist()
    b = torch.randint(1, 255, (5,), generator=g).tolist()
    first = make_batch(cache, [("a", a, 0), ("b", b, 0), ], pad_to=None)
    pad = -(-3 // pad_multiple) * pad_multiple
    second = make_batch(cache, [("a", [3], 7), ("b", [4], 5), ("c", [9], 0)], pad_to=pad)
    return [first, second]


def capture_and_replay(npu: Any, model: DecoderLM, ctx: ParallelContext) -> dict[str, Any]:
    """Capture the full forward once, replay it twice (second time with new token ids in the
    static input buffer) and compare with eager bitwise. Everything lives on ``npu``'s device."""
    model = DecoderLM(model.config, ctx).to(npu.device)  # the same seeded weights, on the device
    cache = make_kv_cache(model.config, ctx, npu.device)
    t = padded_num_tokens(5, ctx)  # 5 real tokens: 6 under SP (one padded row)
    batch = make_batch(cache, [("x", [11, 12, 13], 0), ("y", [21, 22], 0)], pad_to=t)
    ids, pos, slots = (x.to(npu.device) for x in (batch.input_ids, batch.positions, batch.slot_mapping))
    attend = make_eager_attend(model.config, batch.cum_q, batch.kv_lens, batch.block_table.to(npu.device),
                               parallel=ctx)
    eager1 = model(ids, pos, slots, cache, attend).clone()
    g = npu.NPUGraph()
    with npu.graph(g):
        out = model(ids, pos, slots, cache, attend)
    names = [n.name for n in g.nodes if hasattr(n, "func")]
    g.replay()
    npu.synchronize()
    replay1 = out.clone()
    ids.copy_(torch.tensor([31, 32, 33, 41, 42] + [0] * (t - 5), device=npu.device))
    g.replay()
    npu.synchronize()
    replay2 = out.clone()
    eager2 = model(ids, pos, slots, cache, attend).clone()
    return {
        "replay1_eq": torch.equal(replay1, eager1),
        "replay2_eq": torch.equal(replay2, eager2),
        "changed": not torch.equal(eager1, eager2),
        "streams_held": g.streams_held,
        "comm_ops": sorted({n for n in names if n.startswith("_c10d_functional")}),
        "num_comm_nodes": sum(n.startswith("_c10d_functional") and n != "_c10d_functional::wait_tensor"
                              for n in names),
        "group_name": ctx.group_name,
    }


def parallel_job(rank: int, world: int) -> dict[str, Any]:
    """Everything the 2-rank test checks, computed in one spawn."""
    from harness.engine import load

    group = dist.group.WORLD
    tp_ctx = ParallelContext.from_group(group)
    sp_ctx = ParallelContext.from_group(group, sequence_parallel=True)
    config = ModelConfig(kind="random", **SMALL)
    res: dict[str, Any] = {"rank": rank}

    models = {"single": DecoderLM(config), "tp": DecoderLM(config, tp_ctx),
              "sp": DecoderLM(config, sp_ctx)}
    res["local_q_rows"] = models["tp"].layers[0].qkv_sizes[0]
    for name, model in models.items():
        ctx = model.parallel
        cache = make_kv_cache(config, ctx)
        res[f"{name}_cache_heads"] = cache.key_cache[0].shape[2]
        res[f"{name}_logits"] = [run(model, cache, b).clone()
                                 for b in two_step_batches(cache, ctx.tp if ctx.sp else 1)]
        res[f"{name}_greedy"], _ = greedy(model, [5, 17, 42], 6)
        # piece contract: forward == composition of pieces (residual shapes recorded)
        cache2 = make_kv_cache(config, ctx)
        b = two_step_batches(cache2, 2)[0]
        attend = make_eager_attend(config, b.cum_q, b.kv_lens, b.block_table, parallel=ctx)
        outs = model.piece(0, (b.input_ids,), b.positions, b.slot_mapping, cache2)
        shapes = []
        for layer in range(config.num_layers):
            q, r = outs
            shapes.append((tuple(q.shape), tuple(r.shape)))
            a = attend(layer, q, cache2.key_cache[layer], cache2.value_cache[layer])
            outs = model.piece(layer + 1, (a, r), b.positions, b.slot_mapping, cache2)
        res[f"{name}_piece_shapes"] = shapes
        res[f"{name}_pieces_eq"] = torch.equal(outs[0], res[f"{name}_logits"][0])

    canary = ModelConfig(kind="canary", **SMALL)
    res["canary_tp_greedy"], _ = greedy(DecoderLM(canary, tp_ctx), [1, 2, 3, 4], 8)
    res["canary_sp_greedy"], _ = greedy(DecoderLM(canary, sp_ctx), [1, 2, 3, 4], 8)

    npu = load("emulated")
    npu.reset_device()
    res["capture_tp"] = capture_and_replay(npu, models["tp"], tp_ctx)
    res["capture_sp"] = capture_and_replay(npu, models["sp"], sp_ctx)
    return res
