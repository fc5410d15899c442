"""Rank start-up and cross-product item cost by world size, in units of `import torch`.

Run: ``python benchmarks/ranks.py [--items]``. Machines here are noisy, so every figure is a
ratio to the cost of ``python -c "import torch"`` measured in the same run (median of three).

* start-up: ``run_ranks`` of a function that only joins the process group and returns, cold
  (``warm=False``: spawn, interpreter + torch import per rank) and warm (the pool's workers,
  forked once from the warm server and reused), for 1, 2, 4 ranks; the first warm run, which
  starts the server and forks the workers, is reported apart.
* ``--items``: one cross-product item per world size (1, 2, 4, 8, 16 ranks), run through
  :func:`harness.session.run_point` as pytest would, after one warm-up item.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import ranks  # noqa: E402

ITEMS = {  # world size -> a cross-product point of that size
    1: "FULL-tp1-dp1-k0-cp1-uniform_decode",
    2: "FULL-tp1-dp2_idle-k0-cp1-mixed",
    4: "FULL-tp4-dp1-k1-cp1-prefill_only",
    8: "FULL-tp2-dp4_idle-k0-cp1-above_bucket",
    16: "FULL-tp4-dp4_idle-k1-cp1-single",
}


def import_torch_s() -> float:
    runs = []
    for _ in range(3):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch"], check=True)
        runs.append(time.perf_counter() - t)
    return statistics.median(runs)


def joined(rank: int, world_size: int) -> int:
    return rank


def start_cost(world: int, warm: bool) -> float:
    t = time.perf_counter()
    out = ranks.run_ranks(joined, world, timeout=120, warm=warm)
    assert out.ok, out.report()
    return time.perf_counter() - t


def main() -> None:
    unit = import_torch_s()
    print(f"unit: python -c 'import torch' = {unit:.2f} s (median of 3)")
    t = time.perf_counter()
    start_cost(1, warm=True)
    print(f"warm server and first worker start (once per process): {time.perf_counter() - t:.2f} s "
          f"= {(time.perf_counter() - t) / unit:.2f}x")
    for world in (1, 2, 4):
        cold = start_cost(world, warm=False)
        start_cost(world, warm=True)  # forks the workers this world adds to the pool
        warm = statistics.median(start_cost(world, warm=True) for _ in range(3))
        print(f"{world} rank(s): cold {cold:.2f} s = {cold / unit:.2f}x, warm {warm:.3f} s = {warm / unit:.3f}x")
    if "--items" in sys.argv:
        from harness.pytest_matrix import unsupported
        from harness.scenario import load_scenario_file
        from harness.scenario.cross import select
        from harness.resolve import resolve_item
        from harness.session import run_point

        path = Path(__file__).resolve().parents[1] / "scenarios" / "cross_product" / "cross_product.yaml"
        points = {p.id: p for p in load_scenario_file(
            path, combinations=lambda m, e: select(m, e, how="full", restrict={"graph.mode": ["FULL"]}))}
        run_point(points[ITEMS[1]])  # warm-up: lazy imports of the single-rank path
        for world, point_id in ITEMS.items():
            point = points[point_id]
            assert resolve_item(point.scenario).world_size == world, point_id
            result = run_point(point)
            print(f"world {world:2d} {point_id}: {result.duration:.2f} s = {result.duration / unit:.2f}x "
                  f"({result.outcome})")
    print(f"unit again: {import_torch_s():.2f} s")


if __name__ == "__main__":
    main()
