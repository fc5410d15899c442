"""What one collective costs a rank: gloo (``_c10d_functional``) against the emulator's shared memory.

Run: ``python benchmarks/collectives.py [--iters N] [--worlds 2,4,8]``. For each world size, the
ranks of one :func:`harness.ranks.run_ranks` run (warm workers, one intra-op thread, as a
scenario item runs them) issue the collectives a scenario rank issues most, on the world group:

* ``all_gather``: ``all_gather_into_tensor_out`` of ``[3, 32]`` float32 (SP's gather of the
  normed hidden, 3 rows per rank);
* ``reduce_scatter``: ``reduce_scatter_tensor_out`` of ``[2 x world, 32]`` float32 (SP's
  reduce-scatter after o_proj);
* ``all_reduce``: ``all_reduce_`` max of ``[3]`` int64 (the DP step agreement).

Each family runs ``--iters`` of each op after 20 untimed ones. Per rank it records the process's
CPU time (``time.process_time``: every thread, gloo's included) and the wall time, both divided
by the number of collectives; the table shows the median over ranks, and the ratio of the two
families in the same run (the machine's load moves both). Writes ``reports/bench-collectives.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

OPS = ("all_gather", "reduce_scatter", "all_reduce")
WARMUP = 20


def measure(rank: int, world: int, family: str, iters: int) -> dict[str, tuple[float, float]]:
    """On one rank: CPU and wall seconds per collective, by op, for one family."""
    import torch
    import torch.distributed as dist

    from harness.engine.emulated.collectives import OPS as SHARED_MEMORY

    ops = SHARED_MEMORY if family == "shared memory" else torch.ops._c10d_functional
    name = dist.group.WORLD.group_name
    hidden = torch.randn(3, 32)
    gathered = torch.empty(3 * world, 32)
    partial = torch.randn(2 * world, 32)
    scattered = torch.empty(2, 32)
    shape = torch.tensor([5, 0, 1], dtype=torch.int64)

    calls = {
        "all_gather": lambda: ops.wait_tensor(ops.all_gather_into_tensor_out(hidden, world, name, out=gathered)),
        "reduce_scatter": lambda: ops.wait_tensor(
            ops.reduce_scatter_tensor_out(partial, "sum", world, name, out=scattered)),
        "all_reduce": lambda: ops.wait_tensor(ops.all_reduce_(shape, "max", name)),
    }
    result = {}
    for op, call in calls.items():
        for _ in range(WARMUP):
            call()
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(iters):
            call()
        result[op] = ((time.process_time() - cpu) / iters, (time.perf_counter() - wall) / iters)
    return result


def run(world: int, family: str, iters: int) -> dict[str, dict[str, float]]:
    from harness.ranks import run_ranks

    outcome = run_ranks(measure, world, args=(family, iters), timeout=600)
    if not outcome.ok:
        raise SystemExit(outcome.report())
    return {op: {"cpu_us": 1e6 * statistics.median(r[op][0] for r in outcome.results),
                 "wall_us": 1e6 * statistics.median(r[op][1] for r in outcome.results)} for op in OPS}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--worlds", default="2,4,8")
    parser.add_argument("--out", default="reports/bench-collectives.json")
    args = parser.parse_args(argv)
    worlds = [int(w) for w in args.worlds.split(",")]
    rows = []
    print("| ranks | op | gloo CPU / wall per collective | shared memory CPU / wall | CPU ratio |")
    print("|---|---|---|---|---|")
    for world in worlds:
        gloo, shm = run(world, "gloo", args.iters), run(world, "shared memory", args.iters)
        for op in OPS:
            g, s = gloo[op], shm[op]
            rows.append({"world": world, "op": op, "gloo": g, "shared_memory": s})
            print(f"| {world} | {op} | {g['cpu_us']:.0f} / {g['wall_us']:.0f} us | {s['cpu_us']:.0f} / "
                  f"{s['wall_us']:.0f} us | {g['cpu_us'] / s['cpu_us']:.0f}x |")
    out = ROOT / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"iters": args.iters, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
