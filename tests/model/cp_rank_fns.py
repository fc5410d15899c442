"""Per-rank functions for the context-parallel tests, and a small local spawn launcher.

Imported by spawned children (``torch.multiprocessing`` "spawn" re-imports this module by
name), so it must stay importable on its own: the launcher puts its directory on ``sys.path``.
"""

from __future__ import annotations

import io
import os
import sys
import traceback
from typing import Any, Callable

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(_HERE))


def _child(rank: int, world: int, store_path: str, fn: Callable[..., Any], args: tuple, queue) -> None:
    for p in (_HERE, _ROOT):
        if p not in sys.path:
            sys.path.insert(0, p)
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        store = dist.FileStore(store_path, world)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
        try:
            result = fn(rank, world, dist.group.WORLD, *args)
        finally:
            dist.destroy_process_group()
        buf = io.BytesIO()  # bytes, not shared-memory tensors: the child exits right after
        torch.save(result, buf)
        queue.put((rank, "ok", buf.getvalue()))
    except BaseException:  # report to the parent instead of hanging it
        queue.put((rank, "error", traceback.format_exc()))


def launch(fn: Callable[..., Any], world: int, tmp_path: Any, *args: Any, timeout: float = 120.0) -> list[Any]:
    """Run ``fn(rank, world, group, *args)`` in ``world`` spawned gloo processes (FileStore in
    ``tmp_path``); return the per-rank results in rank order. Raises if a rank fails."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    store_path = os.path.join(str(tmp_path), "cp_filestore")
    procs = [
        ctx.Process(target=_child, args=(r, world, store_path, fn, args, queue), daemon=True)
        for r in range(world)
    ]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors: list[str] = []
    import queue as queue_mod
    import time

    deadline = time.monotonic() + timeout
    try:
        while len(results) < world and not errors:
            try:
                rank, status, payload = queue.get(timeout=0.5)
            except queue_mod.Empty:
                dead = [i for i, p in enumerate(procs) if p.exitcode not in (None, 0)]
                if dead:
                    errors.append(f"rank(s) {dead} died (exit codes "
                                  f"{[procs[i].exitcode for i in dead]}) without a result")
                elif time.monotonic() > deadline:
                    errors.append(f"timed out after {timeout}s with results from {sorted(results)}")
                continue
            if status == "ok":
                results[rank] = torch.load(io.BytesIO(payload), weights_only=False)
            else:
                errors.append(f"rank {rank}:\n{payload}")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    if errors:
        raise RuntimeError("CP rank failed:\n" + "\n".join(errors))
    return [results[r] for r in range(world)]


# --------------------------------------------------------------------------- the CP model run

SMALL = dict(kind="random", dtype="float32", num_layers=2, hidden_size=64, num_heads=4,
             num_kv_heads=2, head_dim=16, vocab_size=256, max_model_len=256, block_size=4,
             num_blocks=64)

#: (req_id, prompt). Prompts long enough to span several local blocks on each rank.
PROMPTS = [("a", [11, 23, 5, 7, 101, 42, 9]), ("b", [3, 250, 17])]
DECODE_STEPS = 4
#: Decode steps whose T (2 tokens) is padded to this bucket (exercises zero-padded cp_seq_len).
PAD_STEP, PAD_TO = 2, 4


def run_decoder(cp: int, rank: int, group: Any, *, capture_step: int | None = None,
                gather: str = "functional") -> dict[str, Any]:
    """Prefill + DECODE_STEPS greedy decode steps of two requests.

    ``cp == 1`` (group ignored): the plain single-rank model (make_eager_attend, normal
    metadata). ``cp > 1``: CP attention on this rank's shard. With ``capture_step`` (CP only),
    that step's forward is also captured with the emulated engine and replayed; the replayed
    logits / cache are compared with the eager ones.
    """
    from harness.model import PagedKVCache, build_model, make_eager_attend
    from harness.model.config import ModelConfig
    from harness.model.context_parallel import build_cp_metadata, cp_local_capacity, make_cp_attend

    from harness.engine import load

    cfg = ModelConfig(**SMALL)
    device = load("emulated").device  # the run lives on the emulated NPU, as the pipeline's does
    model = build_model(cfg, device)
    cache = PagedKVCache(cfg, device)
    alloc = cache.allocator
    seqs = {r: list(p) for r, p in PROMPTS}
    done = {r: 0 for r, _ in PROMPTS}  # tokens already in the cache
    all_logits: list[torch.Tensor] = []
    tokens: list[list[int]] = []
    capture_info: dict[str, Any] = {}

    for step in range(DECODE_STEPS + 1):
        reqs = [r for r, _ in PROMPTS]
        query_lens, seq_lens, positions, ids, rows = [], [], [], [], []
        for r in reqs:
            new = seqs[r][done[r]:]
            total = done[r] + len(new)
            alloc.allocate(r, cp_local_capacity(total, cp))
            query_lens.append(len(new))
            seq_lens.append(total)
            positions += list(range(done[r], total))
            ids += new
        n = len(ids)
        T = PAD_TO if (step == PAD_STEP and PAD_TO > n) else n
        table_rows = [alloc.blocks(r) for r in reqs]
        width = cfg.max_blocks_per_seq
        table_rows = [b + [0] * (width - len(b)) for b in table_rows]
        input_ids = torch.tensor(ids + [0] * (T - n), dtype=torch.int64, device=device)
        pos_t = torch.tensor(positions + [0] * (T - n), dtype=torch.int64, device=device)
        if cp == 1:
            slots = []
            for r, q, s in zip(reqs, query_lens, seq_lens):
                slots += alloc.slots(r, range(s - q, s))
            cum = [sum(query_lens[: i + 1]) for i in range(len(reqs))]
            kv = list(seq_lens)
            num_rows = len(reqs)
            if T > n:
                cum.append(T)
                kv.append(0)
                num_rows += 1
                slots += [-1] * (T - n)
            table = alloc.block_table(reqs, width, num_rows=num_rows, device=device)
            attend = make_eager_attend(cfg, cum, kv, table)
            slot_t = torch.tensor(slots, dtype=torch.int64, device=device)
        else:
            meta = build_cp_metadata(query_lens, seq_lens, positions, table_rows,
                                     block_size=cfg.block_size, cp=cp, rank=rank,
                                     num_tokens_padded=T)
            attend = make_cp_attend(cfg, cp, rank, group, meta, block_table=meta.block_table_tensor(device),
                                    gather=gather)
            slot_t = meta.slot_mapping_tensor(device)
        if capture_step is not None and step == capture_step and cp > 1:
            capture_info = _capture_and_compare(model, cache, input_ids, pos_t, slot_t, attend)
        logits = model(input_ids, pos_t, slot_t, cache, attend)[:n].cpu()
        all_logits.append(logits)
        # greedy: the next token of each request from its last query row
        ends = [sum(query_lens[: i + 1]) - 1 for i in range(len(reqs))]
        nxt = [int(logits[e].argmax()) for e in ends]
        tokens.append(nxt)
        for r, q, t_ in zip(reqs, query_lens, nxt):
            done[r] += q
            seqs[r].append(t_)
    return {"logits": all_logits, "tokens": tokens, "capture": capture_info}


def _capture_and_compare(model, cache, input_ids, positions, slots, attend) -> dict[str, Any]:
    """Capture this step's forward with the emulated engine, replay it, compare with eager.

    Order: snapshot the cache; eager forward (writes this step's K/V) -> logits_e, cache_e;
    restore the snapshot; capture (no side effect) ; replay -> logits_r, cache_r.
    """
    from harness.engine import load

    npu = load("emulated")
    npu.reset_device()
    snapshot = [t.clone() for t in (*cache.key_cache, *cache.value_cache)]

    def restore() -> None:
        for t, s in zip((*cache.key_cache, *cache.value_cache), snapshot):
            t.copy_(s)

    eager = model(input_ids, positions, slots, cache, attend).clone()
    cache_e = [t.clone() for t in (*cache.key_cache, *cache.value_cache)]
    restore()
    info: dict[str, Any] = {}
    g = npu.NPUGraph()
    try:
        with npu.graph(g):
            out = model(input_ids, positions, slots, cache, attend)
    except Exception as exc:  # report exactly what happens
        info["capture_error"] = f"{type(exc).__name__}: {exc}"
        restore()
        return info
    names = [n.name for n in g.nodes if hasattr(n, "func")]
    info["comm_nodes"] = [n for n in names if n.startswith("_c10d_functional")]
    info["fia_nodes"] = [n for n in names if "fused_infer" in n]
    info["cache_untouched_by_capture"] = all(
        torch.equal(t, s) for t, s in zip((*cache.key_cache, *cache.value_cache), snapshot))
    info["stream_usage"] = npu.stream_usage()
    g.replay()
    npu.synchronize()
    info["replay_equal"] = bool(torch.equal(out, eager))
    info["replay_max_abs_diff"] = float((out - eager).abs().max())
    info["cache_equal"] = all(
        torch.equal(a, b) for a, b in zip((*cache.key_cache, *cache.value_cache), cache_e))
    # a second replay (the same inputs) must give the same bits again
    g.replay()
    npu.synchronize()
    info["second_replay_equal"] = bool(torch.equal(out, eager))
    # leave the cache as eager left it (the caller runs eager next, idempotently)
    return info


def cp_worker(rank: int, world: int, group: Any, capture_step: int | None = None) -> dict[str, Any]:
    """Launcher entry: the CP run on this rank (cp = world size), once per gather form."""
    return {g: run_decoder(world, rank, group, capture_step=capture_step, gather=g)
            for g in ("functional", "out")}
