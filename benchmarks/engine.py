#!/usr/bin/env python
"""Benchmark of the emulated capture/replay engine (CPU). Prints a markdown table, writes JSON.

    .venv/bin/python benchmarks/engine.py [--quick] [--out reports/bench-engine.json]

Measures, all in one run (ratios are only meaningful within one run: machines are noisy):

* ``capture``: seconds to capture one FULL decoder graph per bucket (per-layer ExternalEvent +
  task group + FIA ``.out``, one shared pool, largest bucket first, as vLLM Ascend captures);
* ``replay_per_op``: µs per recorded op of a replay, from graphs of chained elementwise ops of
  different lengths on tiny tensors (slope of replay time against op count, and time / ops);
* ``replay_vs_eager``: one decode step of the decoder, replay (with the per-layer host-parameter
  updates and event records) against the same step run eagerly, same shapes, interleaved;
* ``memory``: bytes each captured graph holds and each pool reserves (``memory_report()``,
  ``NPUGraph.bytes_held``), shared pool against one pool per graph.

Every figure is the median of repeats timed with ``time.perf_counter``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from harness.engine import load  # noqa: E402
from harness.model import ModelConfig, PagedKVCache, build_model, make_eager_attend  # noqa: E402
from harness.ops import register_updatable_ops  # noqa: E402
from harness.ops.attention import AttentionHeads, capture_task_group, fia_kwargs, update_layers  # noqa: E402

CFG = ModelConfig(kind="random", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
                  vocab_size=512, block_size=16, num_blocks=65, max_model_len=256, seed=0)
MAX_BLOCKS = CFG.max_model_len // CFG.block_size


def median_time(fn, reps: int) -> float:
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


# -- a decoder FULL graph, captured and replayed with the engine API ------------------------------
class DecoderGraph:
    def __init__(self, npu, model, cache, T: int) -> None:
        self.npu, self.model, self.cache, self.T = npu, model, cache, T
        self.ids = torch.zeros(T, dtype=torch.int64)
        self.pos = torch.zeros(T, dtype=torch.int64)
        self.slots = torch.full((T,), -1, dtype=torch.int64)
        self.table = torch.zeros(T, MAX_BLOCKS, dtype=torch.int32)
        self.layers: list[tuple] = []
        self.update_stream = npu.Stream()

    def lists(self, n: int, kv_len: int) -> tuple[list[int], list[int]]:
        """n decode requests of KV length kv_len, plus one dummy request so that [-1] == T."""
        q = list(range(1, n + 1)) + ([self.T] if n < self.T else [])
        kv = [kv_len] * n + ([0] if n < self.T else [])
        return q, kv

    def kwargs(self, q, kv) -> dict:
        heads = AttentionHeads(CFG.block_size, CFG.num_heads, CFG.num_kv_heads, self.model.attention_scale)
        return fia_kwargs(heads, q, kv, self.table)

    def fill(self, n: int, kv_len: int) -> None:
        """n requests, request i owning blocks 1 + i*4 .. 4 + i*4, decoding position kv_len - 1."""
        self.ids.zero_()
        self.ids[:n] = torch.arange(1, n + 1)
        self.pos.zero_()
        self.pos[:n] = kv_len - 1
        self.slots.fill_(-1)
        self.table.zero_()
        for i in range(n):
            self.table[i, :4] = torch.arange(1 + 4 * (i % 16), 5 + 4 * (i % 16))
            p = kv_len - 1
            self.slots[i] = int(self.table[i, p // CFG.block_size]) * CFG.block_size + p % CFG.block_size

    def capture(self, pool, n: int, kv_len: int):
        npu = self.npu
        q, kv = self.lists(n, kv_len)
        self.fill(n, kv_len)

        def attend(layer, query, k, v):
            task = capture_task_group(npu, query, k, v, self.kwargs(q, kv))
            self.layers.append(task)
            return task.out

        self.graph = npu.NPUGraph()
        with npu.graph(self.graph, pool=pool):
            self.logits = self.model(self.ids, self.pos, self.slots, self.cache, attend)

    def replay(self, n: int, kv_len: int) -> torch.Tensor:
        npu = self.npu
        q, kv = self.lists(n, kv_len)
        self.graph.replay()
        caches = list(zip(self.cache.key_cache, self.cache.value_cache))
        update_layers(npu, self.update_stream, self.layers, caches, self.kwargs(q, kv))
        npu.synchronize()
        return self.logits

    def eager(self, n: int, kv_len: int) -> torch.Tensor:
        """The same step eagerly: same static tensors, unpadded host lists for the n requests."""
        attend = make_eager_attend(CFG, list(range(1, n + 1)), [kv_len] * n, self.table[:n])
        return self.model(self.ids[:n], self.pos[:n], self.slots[:n], self.cache, attend)


def bench_capture(npu, buckets: list[int], reps: int) -> dict:
    per_bucket: dict[int, list[float]] = {T: [] for T in buckets}
    nodes: dict[int, int] = {}
    model = build_model(CFG)
    npu.reset_device()  # one untimed capture first: the process's first capture pays one-off setup
    DecoderGraph(npu, model, PagedKVCache(CFG), max(buckets)).capture(npu.graph_pool_handle(), 1, 8)
    for _ in range(reps):
        npu.reset_device()
        cache = PagedKVCache(CFG)
        pool = npu.graph_pool_handle()
        for T in sorted(buckets, reverse=True):
            g = DecoderGraph(npu, model, cache, T)
            t0 = time.perf_counter()
            g.capture(pool, max(1, T - 1), 8)
            per_bucket[T].append(time.perf_counter() - t0)
            nodes[T] = len(g.graph.nodes)
    return {str(T): {"seconds": statistics.median(v), "nodes": nodes[T]} for T, v in per_bucket.items()}


def bench_replay_per_op(npu, op_counts: list[int], reps: int) -> dict:
    npu.reset_device()
    x = torch.ones(8)
    times = {}
    for n in op_counts:
        g = npu.NPUGraph()
        with npu.graph(g):
            y = x
            for _ in range(n):
                y = y * 1.0001
        recorded = len(g.nodes)

        def replay():
            g.replay()
            npu.synchronize()

        replay()  # first replay outside the timing
        times[n] = (recorded, median_time(replay, reps))
    (r_lo, t_lo), (r_hi, t_hi) = times[min(times)], times[max(times)]
    slope = (t_hi - t_lo) / (r_hi - r_lo)
    return {
        "graphs": {str(n): {"recorded_ops": r, "replay_seconds": t, "us_per_op": t / r * 1e6} for n, (r, t) in times.items()},
        "us_per_op_slope": slope * 1e6,
        "fixed_cost_us": (t_lo - slope * r_lo) * 1e6,
    }


def bench_replay_vs_eager(npu, T: int, n: int, kv_len: int, reps: int) -> dict:
    npu.reset_device()
    register_updatable_ops(npu)
    model = build_model(CFG)
    cache = PagedKVCache(CFG)
    g = DecoderGraph(npu, model, cache, T)
    g.capture(npu.graph_pool_handle(), n, kv_len)
    g.fill(n, kv_len)
    replayed = g.replay(n, kv_len)[:n].clone()
    eager = g.eager(n, kv_len)
    assert torch.equal(replayed, eager), "replay differs from eager: the benchmark would time a wrong graph"
    replay_s, eager_s = [], []
    for _ in range(reps):  # interleaved, so drift hits both alike
        t0 = time.perf_counter()
        g.replay(n, kv_len)
        replay_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        g.eager(n, kv_len)
        eager_s.append(time.perf_counter() - t0)
    r, e = statistics.median(replay_s), statistics.median(eager_s)
    return {"T": T, "requests": n, "kv_len": kv_len, "recorded_ops": len(g.graph.nodes), "replay_seconds": r,
            "eager_seconds": e, "replay_over_eager": r / e, "bitwise_equal": True}


def bench_memory(npu, buckets: list[int]) -> dict:
    model = build_model(CFG)
    out = {}
    for layout in ("shared", "separate"):
        npu.reset_device()
        cache = PagedKVCache(CFG)
        shared = npu.graph_pool_handle() if layout == "shared" else None
        graphs = {}
        for T in sorted(buckets, reverse=True):
            g = DecoderGraph(npu, model, cache, T)
            g.capture(shared if layout == "shared" else npu.graph_pool_handle(), max(1, T - 1), 8)
            graphs[T] = g
        report = npu.memory_report()
        out[layout] = {
            "bytes_held_per_graph": {str(T): g.graph.bytes_held for T, g in graphs.items()},
            "pools": {name: p["bytes_reserved"] for name, p in report.items()},
            "bytes_reserved_total": sum(p["bytes_reserved"] for p in report.values()),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats and buckets (about 10 s)")
    parser.add_argument("--out", default="reports/bench-engine.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # op-level overhead is what is measured; threads only add noise
    npu = load("emulated")
    register_updatable_ops(npu)
    buckets = [1, 4, 16] if args.quick else [1, 2, 4, 8, 16, 32]
    reps = 3 if args.quick else 7
    started = time.perf_counter()
    results = {
        "capture": bench_capture(npu, buckets, reps=1 if args.quick else 3),
        "replay_per_op": bench_replay_per_op(npu, [10, 100, 1000] if args.quick else [10, 100, 1000, 3000],
                                             reps=reps * 3),
        "replay_vs_eager": bench_replay_vs_eager(npu, T=8, n=5, kv_len=40, reps=10 if args.quick else 40),
        "memory": bench_memory(npu, buckets),
    }
    npu.reset_device()
    meta = {"mode": "quick" if args.quick else "full", "seconds": time.perf_counter() - started,
            "torch": torch.__version__, "python": platform.python_version(), "cpus": os.cpu_count(),
            "threads": torch.get_num_threads(), "model": {k: getattr(CFG, k) for k in
                                                          ("num_layers", "hidden_size", "num_heads", "head_dim")}}
    report = {"meta": meta, **results}
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))
    print(markdown(report))
    print(f"\nwrote {path} ({meta['seconds']:.1f} s)")
    return 0


def markdown(r: dict) -> str:
    lines = [f"Engine benchmark ({r['meta']['mode']}, torch {r['meta']['torch']}, {r['meta']['threads']} thread)", "",
             "| measure | value |", "|---|---|"]
    for T, c in r["capture"].items():
        lines.append(f"| capture, FULL decoder graph, bucket T={T} ({c['nodes']} nodes) | {c['seconds'] * 1e3:.1f} ms |")
    rp = r["replay_per_op"]
    for n, g in rp["graphs"].items():
        lines.append(f"| replay, {g['recorded_ops']}-op graph | {g['replay_seconds'] * 1e6:.0f} µs ({g['us_per_op']:.2f} µs/op) |")
    lines.append(f"| replay cost per recorded op (slope) | {rp['us_per_op_slope']:.2f} µs/op "
                 f"(+ {rp['fixed_cost_us']:.0f} µs fixed) |")
    e = r["replay_vs_eager"]
    lines.append(f"| decode step T={e['T']} ({e['requests']} reqs, kv {e['kv_len']}, {e['recorded_ops']} nodes): "
                 f"replay + updates / eager | {e['replay_seconds'] * 1e3:.2f} ms / {e['eager_seconds'] * 1e3:.2f} ms "
                 f"= {e['replay_over_eager']:.2f}x |")
    for layout, m in r["memory"].items():
        per = ", ".join(f"T={T}: {b / 1024:.1f}" for T, b in m["bytes_held_per_graph"].items())
        lines.append(f"| memory, {layout} pool(s): KiB held per graph | {per} |")
        lines.append(f"| memory, {layout} pool(s): KiB reserved in total ({len(m['pools'])} pool(s)) | "
                     f"{m['bytes_reserved_total'] / 1024:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
