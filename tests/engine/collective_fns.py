"""Rank functions for tests/engine/test_collectives.py (ranks import them by name)."""

from __future__ import annotations

import os
import time
from typing import Any

import torch
import torch.distributed as dist

from harness.engine.emulated import collectives
from harness.engine.emulated.collectives import OPS
from harness.model.parallel import collective_ops, use_collective_ops

C10D = torch.ops._c10d_functional


def _values(rank: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Distinct values per rank and element, exact in every dtype used here."""
    n = 1
    for s in shape:
        n *= s
    return (torch.arange(n, dtype=torch.float64).view(shape) * 0.25 + 100 * rank).to(dtype)


def every_op(rank: int, world: int, dtype_name: str) -> dict[str, Any]:
    """Each op of both families on the world group; returns both families' results."""
    dtype = getattr(torch, dtype_name)
    name = dist.group.WORLD.group_name
    out: dict[str, Any] = {"available": collectives.available()}
    for family, ops in (("shm", OPS), ("c10d", C10D)):
        x = _values(rank, (3, 4), dtype)
        gathered = torch.empty((3 * world, 4), dtype=dtype)
        ops.wait_tensor(ops.all_gather_into_tensor_out(x, world, name, out=gathered))
        functional = ops.wait_tensor(ops.all_gather_into_tensor(x, world, name))
        rows = _values(rank, (2 * world, 4), dtype)
        scattered = torch.empty((2, 4), dtype=dtype)
        ops.wait_tensor(ops.reduce_scatter_tensor_out(rows, "sum", world, name, out=scattered))
        reduced = {}
        for op in ("sum", "max", "min", "avg"):
            if op == "avg" and family == "c10d":
                continue  # gloo has no average
            t = _values(rank, (5,), dtype)
            ops.wait_tensor(ops.all_reduce_(t, op, name))
            reduced[op] = t
        out[family] = {"all_gather": gathered, "all_gather_functional": functional, "reduce_scatter": scattered,
                       **{f"all_reduce_{op}": t for op, t in reduced.items()}}
    out["groups"] = sorted(collectives._groups)
    out["files"] = sorted(os.listdir(os.environ[collectives.RUN_DIR_ENV]))
    return out


def large_message(rank: int, world: int) -> dict[str, Any]:
    """A message above the slot size goes through the process group instead, with the same result."""
    name = dist.group.WORLD.group_name
    n = collectives.SLOT_BYTES // 4 + 1
    x = torch.full((n,), float(rank + 1))
    OPS.all_reduce_(x, "sum", name)
    small = torch.full((4,), float(rank + 1))
    OPS.all_reduce_(small, "sum", name)
    return {"large": float(x[0]), "large_last": float(x[-1]), "small": float(small[0]),
            "shm_groups": sorted(collectives._groups)}


def mismatched(rank: int, world: int) -> None:
    """Rank 1 all-gathers twice as many rows as rank 0: a hang on a device, an error here."""
    name = dist.group.WORLD.group_name
    x = torch.ones((2 if rank == 1 else 1, 4))
    out = torch.empty((world * x.shape[0], 4))
    OPS.all_gather_into_tensor_out(x, world, name, out=out)


def mismatched_dtype(rank: int, world: int) -> None:
    """The same byte count in another dtype: the sum would read one member's bits as the other's."""
    name = dist.group.WORLD.group_name
    OPS.all_reduce_(torch.ones(4, dtype=torch.int32 if rank == 1 else torch.float32), "sum", name)


def dies_in_a_collective(rank: int, world: int) -> float:
    """Both ranks exchange once (so each knows the other's pid); then rank 1 dies and rank 0
    waits for it in the next collective. Returns how long rank 0 waited."""
    name = dist.group.WORLD.group_name
    OPS.all_reduce_(torch.ones(2), "sum", name)
    if rank == 1:
        time.sleep(0.3)
        os._exit(3)
    started = time.monotonic()
    try:
        OPS.all_reduce_(torch.ones(2), "sum", name)
    except collectives.CollectiveError as error:
        raise RuntimeError(f"after {time.monotonic() - started:.2f} s: {error}") from None
    return time.monotonic() - started


def sp_capture_and_replay(rank: int, world: int) -> dict[str, Any]:
    """An SP forward of the decoder through the shared-memory family: eager, captured, replayed;
    and the same forward through c10d (gloo)."""
    from harness.engine import load
    from harness.model import DecoderLM, ModelConfig, make_eager_attend
    from harness.model.parallel import ParallelContext, make_kv_cache, padded_num_tokens
    from tests.model.model_helpers import make_batch

    config = ModelConfig(kind="random", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
                         vocab_size=256, max_model_len=256, block_size=8, num_blocks=96)
    ctx = ParallelContext.from_group(dist.group.WORLD, sequence_parallel=True)
    npu = load("emulated")
    npu.reset_device()
    model = DecoderLM(config, ctx).to(npu.device)
    result: dict[str, Any] = {}
    for family, ops in (("c10d", None), ("shm", OPS)):
        use_collective_ops(ops)
        try:
            cache = make_kv_cache(config, ctx, npu.device)
            t = padded_num_tokens(5, ctx)
            batch = make_batch(cache, [("x", [11, 12, 13], 0), ("y", [21, 22], 0)], pad_to=t)
            attend = make_eager_attend(config, batch.cum_q, batch.kv_lens, batch.block_table.to(npu.device),
                                       parallel=ctx)
            args = tuple(t.to(npu.device) for t in (batch.input_ids, batch.positions, batch.slot_mapping))
            eager = model(*args, cache, attend).cpu()
            graph = npu.NPUGraph()
            with npu.graph(graph):
                out = model(*args, cache, attend)
            graph.replay()
            npu.synchronize()
            result[family] = {"eager": eager, "replay": out.cpu(), "streams": graph.streams_held,
                              "namespaces": sorted({n.func.namespace for n in graph.nodes if hasattr(n, "func")}),
                              "family": collective_ops() is (OPS if ops else C10D)}
            graph.reset()
        finally:
            use_collective_ops(None)
    return result


def run_dir(rank: int, world: int) -> str:
    """The run directory this rank was given."""
    return os.environ[collectives.RUN_DIR_ENV]
