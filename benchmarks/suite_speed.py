"""How fast the scenario suite runs, in units of ``python -c "import torch"`` measured in the same run.

These machines are shared and noisy, so every figure is a ratio to the cost of a fresh interpreter
importing torch, measured in the same run (at the start and again at the end, median of all), in
wall-clock time and in CPU time (user + sys; the CPU ratio moves less when other jobs load the
machine). Issue 8's targets: a single-rank item's median < 0.1x, a 40-layer stream-budget item
< 2x, a two-rank item's median < 1x, ``make scenarios`` < 15x.

What it runs, all in this process unless said otherwise (one torch thread, as the pytest plugin):

* **single-rank items**: every single-rank item of ``scenarios/decode_buckets.yaml`` and the MTP
  items of ``scenarios/features/feature_matrix.yaml``, through :func:`harness.session.run_point`
  (the same call the pytest item makes, checks included), after one untimed item (a process's
  first item pays one-off costs: lazy imports, op registration, allocator warm-up);
* **40-layer stream-budget items**: the three items of ``stream_budget_policies.yaml`` and
  ``known_bad/stream_budget_none.yaml`` (1,763 to 2,091 captures each);
* ``--two-rank``: two-rank items of the feature matrix (SP, DP, CP), run as the suite runs them
  (:mod:`harness.ranks`: whatever rank processes it provides);
* ``--commands``: ``make scenarios`` and ``make test`` as whole commands, in a subprocess
  (minutes; their output goes to ``reports/bench-scenarios.log`` and ``reports/bench-test.log``);
  ``--nightly``: ``make nightly``, the full cross product (tens of minutes; ``bench-nightly.log``).

Usage (repository root)::

    .venv/bin/python benchmarks/suite_speed.py            # single-rank + 40-layer, ~1-2 min
    .venv/bin/python benchmarks/suite_speed.py --quick    # fewer items and import runs
    .venv/bin/python benchmarks/suite_speed.py --two-rank --commands
    .venv/bin/python benchmarks/suite_speed.py --no-items --nightly   # the full cross product

It prints a markdown table and writes ``reports/bench-suite.json`` (``--out`` to change).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SINGLE_RANK_FILES = ("scenarios/decode_buckets.yaml", "scenarios/features/feature_matrix.yaml")
BUDGET_ITEMS = (
    ("scenarios/features/stream_budget_policies.yaml", "PIECEWISE-v0.18.0"),
    ("scenarios/features/stream_budget_policies.yaml", "FULL-v0.23.0"),
    ("scenarios/known_bad/stream_budget_none.yaml", ""),
)
TWO_RANK_ITEMS = ("FULL-sp2-uniform", "FULL-dp2-uniform", "FULL-cp2-uniform")
COMMANDS = (("make scenarios", ["make", "scenarios"]), ("make test", ["make", "test"]))
NIGHTLY = ("make nightly", ["make", "nightly"])  # the full cross product: 4,200 items
TARGETS = {"make scenarios": "< 15x", "make test": "< 3 min", "make nightly": "< 15 min"}


@dataclass
class Timing:
    """One measured thing: wall and CPU seconds per run, and what each run returned."""

    name: str
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def wall_median(self) -> float:
        return statistics.median(self.wall)

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_command(timing: Timing, argv: list[str], *, env: dict[str, str] | None = None,
                 log: Path | None = None) -> int:
    """Run ``argv`` once as a whole process; append its wall and CPU (its children's) seconds.

    Its output goes to ``log`` (or nowhere), so a failing suite can be read afterwards.
    """
    cpu0, start = _children_cpu(), time.perf_counter()
    with open(log if log is not None else os.devnull, "w", encoding="utf-8") as sink:
        done = subprocess.run(argv, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT)
    timing.wall.append(time.perf_counter() - start)
    timing.cpu.append(_children_cpu() - cpu0)
    return done.returncode


def time_torch_import(timing: Timing, runs: int) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for _ in range(runs):
        time_command(timing, [sys.executable, "-c", "import torch"], env=env)


def time_point(timing: Timing, point) -> None:
    """One scenario item in this process, through the call the pytest item makes."""
    from harness.session import run_point

    # CPU: this process, plus rank processes reaped meanwhile (live warm ranks are not counted).
    cpu0, start = time.process_time() + _children_cpu(), time.perf_counter()
    result = run_point(point, backend="emulated")
    timing.wall.append(time.perf_counter() - start)
    timing.cpu.append(time.process_time() + _children_cpu() - cpu0)
    captured = result.record.graphs_captured if result.record is not None else 0
    timing.notes.append(f"{point.display_name}: {result.outcome}, {captured} graphs")


def points(path: str, ids=None):
    from harness.scenario import load_scenario_file

    found = load_scenario_file(ROOT / path)
    return [p for p in found if ids is None or p.id in ids]


def single_rank_points(quick: bool):
    from harness.resolve import PointSkipped, resolve_item

    chosen = []
    for path in SINGLE_RANK_FILES:
        for point in points(path):
            if point.scenario.expect.outcome == "skip":
                continue
            try:
                if resolve_item(point.scenario).world_size != 1:
                    continue
            except PointSkipped:
                continue
            chosen.append(point)
    return chosen[::3] if quick else chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer items and import runs")
    parser.add_argument("--two-rank", action="store_true", help="also time two-rank items")
    parser.add_argument("--commands", action="store_true", help="also time `make scenarios` and `make test`")
    parser.add_argument("--nightly", action="store_true",
                        help="also time `make nightly` (the full cross product; tens of minutes)")
    parser.add_argument("--no-budget", action="store_true", help="skip the 40-layer stream-budget items")
    parser.add_argument("--no-items", action="store_true", help="time only the whole commands")
    parser.add_argument("--make-args", default="",
                        help="extra make arguments for --commands, e.g. 'VENV=/path/.venv -o /path/.venv/.installed'")
    parser.add_argument("--out", default="reports/bench-suite.json")
    args = parser.parse_args(argv)
    import_runs = 3 if args.quick else 5

    unit = Timing('python -c "import torch"')
    time_torch_import(unit, import_runs)

    import torch

    torch.set_num_threads(1)  # as the pytest plugin sets it
    harness_import = Timing("import harness (in process, after torch)")
    cpu0, start = time.process_time(), time.perf_counter()
    import harness.session  # noqa: F401 - timed: the harness's own import cost
    harness_import.wall.append(time.perf_counter() - start)
    harness_import.cpu.append(time.process_time() - cpu0)

    rows: list[tuple[Timing, str]] = [(harness_import, "")]
    if not args.no_items:
        chosen = single_rank_points(args.quick)
        first = Timing("first single-rank item in the process (untimed in the median)")
        time_point(first, chosen[0])
        single = Timing(f"single-rank item ({len(chosen)} items, median)")
        for point in chosen:
            time_point(single, point)
        rows += [(first, ""), (single, "< 0.1x")]

    if not args.no_budget and not args.no_items:
        for path, ident in BUDGET_ITEMS:
            budget = Timing(f"40-layer stream-budget item {Path(path).stem}[{ident}]" if ident
                            else f"40-layer stream-budget item {Path(path).stem}")
            for point in points(path, {ident}):
                time_point(budget, point)
            rows.append((budget, "< 2x"))

    if args.two_rank and not args.no_items:
        pairs = Timing(f"two-rank item ({len(TWO_RANK_ITEMS)} items, median)")
        for point in points("scenarios/features/feature_matrix.yaml", set(TWO_RANK_ITEMS)):
            time_point(pairs, point)
        rows.append((pairs, "< 1x"))

    commands = [*(COMMANDS if args.commands else ()), *((NIGHTLY,) if args.nightly else ())]
    if commands:
        for label, command in commands:
            whole = Timing(f"`{label}` (whole command)")
            log = ROOT / "reports" / f"bench-{command[-1]}.log"
            log.parent.mkdir(exist_ok=True)
            code = time_command(whole, [*command, *args.make_args.split()], log=log)
            whole.notes.append(f"exit status {code} (output: {log.relative_to(ROOT)})")
            rows.append((whole, TARGETS[label]))

    time_torch_import(unit, import_runs)  # again at the end: the machine's load drifts
    print_table(unit, rows)
    write_json(Path(args.out), unit, rows)
    return 0


def print_table(unit: Timing, rows: list[tuple[Timing, str]]) -> None:
    print(f"unit: {unit.name}: median {unit.wall_median:.2f} s wall, {unit.cpu_median:.2f} s CPU "
          f"({len(unit.wall)} runs, wall {min(unit.wall):.2f} ... {max(unit.wall):.2f} s)\n")
    print("| measure | wall (median) | CPU (median) | wall / import | CPU / import | target |")
    print("|---|---|---|---|---|---|")
    for timing, target in rows:
        print(f"| {timing.name} | {timing.wall_median:.3f} s | {timing.cpu_median:.3f} s | "
              f"{timing.wall_median / unit.wall_median:.3f}x | {timing.cpu_median / unit.cpu_median:.3f}x | "
              f"{target} |")
    unexpected = [n for t, _ in rows for n in t.notes
                  if ": failed" in n or ("exit status" in n and "exit status 0" not in n)]
    if unexpected:
        print("\nitems that did not end as the suite expects (their times say little):")
        for note in unexpected:
            print(f"  {note}")


def write_json(path: Path, unit: Timing, rows: list[tuple[Timing, str]]) -> None:
    path = path if path.is_absolute() else ROOT / path
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "unit": asdict(unit) | {"wall_median": unit.wall_median, "cpu_median": unit.cpu_median},
        "rows": [
            asdict(t) | {"target": target, "wall_median": t.wall_median, "cpu_median": t.cpu_median,
                         "wall_ratio": t.wall_median / unit.wall_median,
                         "cpu_ratio": t.cpu_median / unit.cpu_median}
            for t, target in rows
        ],
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
    }
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")


if __name__ == "__main__":
    sys.exit(main())
