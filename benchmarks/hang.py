"""How fast an item whose rank ends while a peer waits for it in a collective fails, in units of
``python -c "import torch"`` measured in the same run.

The item is every point of ``scenarios/known_bad/dp_idle_no_sync.yaml`` (DP without its sync, one
rank idle: that rank's job ends at once while the busy rank waits for it in
``check_agreement``). Before the harness looked for this (:mod:`harness.ranks.stranded`) such an
item failed only by its rank timeout, 480 s under the default item limit (8 minutes). Target: each
point fails as a ``hang`` within :data:`TARGET_X` x ``import torch`` (the detection itself waits
:data:`harness.ranks.stranded.IDLE_WINDOW_S` of idleness, then reads the ranks' stacks).

Each point runs through :func:`harness.session.run_point`, as the pytest item does, after one
untimed point (a process's first item pays one-off costs: lazy imports, the warm fork server).
The time of an item is its ``duration`` (rank start-up included; warm ranks start in
milliseconds). Exit status 1 when a point fails otherwise than as a hang, or slower than the
target.

Usage (repository root)::

    .venv/bin/python benchmarks/hang.py            # the points 3 times each, ~30 s
    .venv/bin/python benchmarks/hang.py --repeat 1
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SCENARIO = ROOT / "scenarios" / "known_bad" / "dp_idle_no_sync.yaml"
TARGET_X = 3.0
"""Most time-to-fail of one point, in units of ``import torch`` (an idle 2-core machine of this
project imports torch in 1.5 to 2.5 s; an item that fails as a hang took 2.4 s, 1.1x, on 2026-12-04)."""


def import_torch_s(runs: int = 3) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch"], check=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs of each point (the median counts)")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(1)  # as the pytest plugin: the warm fork server is then forked, not spawned
    from harness.scenario import load_scenario_file
    from harness.session import XFAILED, run_point

    unit = import_torch_s()
    points = load_scenario_file(SCENARIO)
    run_point(points[0], backend="emulated")  # untimed: one-off costs of a process's first item
    ok = True
    print(f"unit: python -c 'import torch' = {unit:.2f} s (median of 3)")
    print("| point | time to fail (median) | x import torch | target | verdict |")
    print("|---|---|---|---|---|")
    for point in points:
        times, summaries = [], set()
        for _ in range(args.repeat):
            result = run_point(point, backend="emulated")
            execution = result.checks.get("execution")
            summary = execution.summary if execution else result.verdict
            hang = result.outcome == XFAILED and summary.startswith("rank 0 hang:")
            ok &= hang
            summaries.add(summary.split(":", 1)[0] if hang else summary)
            times.append(result.duration)
        median = statistics.median(times)
        within = median <= TARGET_X * unit
        ok &= within
        print(f"| {point.id} | {median:.2f} s | {median / unit:.2f}x | <= {TARGET_X:g}x "
              f"{'(met)' if within else '(MISSED)'} | {'; '.join(sorted(summaries))} |")
    print(f"unit again: {import_torch_s():.2f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
