"""Random scenarios, run end to end: find the inputs the harness accepts but cannot run.

A scenario file is either refused on load with a located error, or it runs to a verdict of the
four checks. Anything else is a harness bug: a crash (``harness error``), a rank that raises or
hangs (``execution failed``), or a run in which nothing was compared. This script writes
``--count`` random scenarios (seeded: the same ``--seed`` gives the same files), collects each
exactly as pytest does (:func:`harness.collection.collect_points`), runs what collects through
:func:`harness.session.run_point`, and sorts the outcomes:

* ``refused``: a collection error (the message is kept: it should name the file, line and field);
* ``passed``, ``skipped``: fine;
* ``check failed``: a check's verdict. No fix is switched off here, so each is a false
  failure of the harness or a real pipeline bug: read every one;
* ``harness bug``: crashes, rank exceptions and timeouts, runs with no step. Each is kept with
  its file, to rerun under pytest.

The space is the shipped features' (SP, DP with its three batch kinds, MTP, CP), every mode and
stack, attention backend, compilation mode and async scheduling, small random models and KV
caches, and request workloads with arrivals and repeats. Every item gets a 60 s limit, so a hang
costs a minute, not the default ten.

    .venv/bin/python benchmarks/fuzz.py --count 150 --seed 1     # writes reports/fuzz/
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
ATTENTION_BACKENDS = ("ascend", "ascend_mla", "ascend_sfa", "flash_attn_3", "flash_attn_2", "flashinfer",
                      "no_full_graphs")
COMPILATION_MODES = ("VLLM_COMPILE", "NONE", "STOCK_TORCH_COMPILE", "DYNAMO_TRACE_ONCE")
STACKS = ("v0.15.0rc1", "v0.18.0", "v0.23.0", "main", "main+pr16623", "harness-compose")
BUG_PREFIXES = ("harness error", "execution", "nothing was compared")  # execution: a rank raised or hung


def graph_extras(rng: random.Random) -> str:
    """The graph section's engine and scheduling settings, each left at its default half the time."""
    extras = []
    if rng.random() < 0.3:
        extras.append(f"attention_backend: {rng.choice(ATTENTION_BACKENDS)}")
    if rng.random() < 0.2:
        extras.append(f"compilation_mode: {rng.choice(COMPILATION_MODES)}")
    if rng.random() < 0.3:
        extras.append("async_scheduling: true")
    if rng.random() < 0.2:
        extras.append("platform: gpu")
    return "".join(f", {e}" for e in extras)


def random_scenario(rng: random.Random, name: str) -> str:
    """One scenario file's text; most are valid, some are refused on purpose (the errors are
    part of what this looks at)."""
    heads = rng.choice([1, 2, 4, 4, 8, 8])
    kv_heads = rng.choice([h for h in (1, 2, 4, 8) if h <= heads and heads % h == 0])
    block_size = rng.choice([1, 2, 4, 8, 16])
    num_blocks = rng.choice([3, 4, 6, 8, 16, 64, 64])
    max_model_len = max(1, min(rng.choice([8, 12, 16, 24, 32, 64, 64]), (num_blocks - 1) * block_size))
    features = {}
    if rng.random() < 0.35:
        features["sp"] = {"tp": rng.choice([2, 4])}
    if rng.random() < 0.35:
        features["dp"] = {"size": rng.choice([2, 4]), "batches": rng.choice(["equal", "unequal", "idle"])}
    if rng.random() < 0.4:
        features["mtp"] = {"k": rng.choice([1, 2, 3])}
    if rng.random() < 0.25 and "sp" not in features:
        features["cp"] = {"size": 2}
    sizes = sorted(rng.sample([1, 2, 3, 4, 6, 8, 12, 16, 24, 32], rng.randint(1, 5)))
    requests = [
        f"    - {{prompt_len: {rng.randint(1, 10)}, output_len: {rng.randint(1, 8)}, "
        f"arrival_step: {rng.randint(0, 3)}, repeat: {rng.randint(1, 3)}}}\n"
        for _ in range(rng.randint(1, 4))
    ]
    lines = [
        f"name: {name}",
        "timeout_s: 60",
        f"model: {{kind: random, layers: {rng.choice([1, 2])}, hidden_size: {rng.choice([8, 16, 32, 33, 64])}, "
        f"num_heads: {heads}, num_kv_heads: {kv_heads}, head_dim: {rng.choice([2, 4, 8])}, "
        f"block_size: {block_size}, num_blocks: {num_blocks}, max_model_len: {max_model_len}, "
        f"dtype: {rng.choice(['float32', 'bfloat16'])}}}",
        f"graph: {{mode: {rng.choice(MODES)}, capture_sizes: {sizes}, max_num_seqs: {rng.choice([1, 2, 4, 8])}"
        f"{graph_extras(rng)}}}",
        f"steps: {rng.choice([4, 8, 16])}",
    ]
    if rng.random() < 0.5:
        lines.append(f"stack: {rng.choice(STACKS)}")
    if features:
        lines.append("features: {" + ", ".join(
            f"{key}: {{{', '.join(f'{k}: {v}' for k, v in settings.items())}}}" for key, settings in features.items()) + "}")
    lines.append(f"workload:\n  max_num_batched_tokens: {rng.choice([8, 16, 32, 512, 512])}\n  requests:")
    return "\n".join(lines) + "\n" + "".join(requests)


def classify(outcome: str, verdict: str) -> str:
    if outcome == "failed":
        return "harness bug" if verdict.startswith(BUG_PREFIXES) else "check failed"
    return outcome


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default=str(ROOT / "reports" / "fuzz"))
    args = parser.parse_args(argv)

    from harness.collection import collect_points
    from harness.scenario import ScenarioError
    from harness.session import run_point

    torch.set_num_threads(1)  # as the plugin runs items
    out = Path(args.out)
    files = out / "scenarios"
    files.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    rows: list[dict] = []
    started = time.perf_counter()
    for i in range(args.count):
        name = f"fuzz{args.seed}_{i}"
        path = files / f"{name}.yaml"
        path.write_text(random_scenario(rng, name))
        try:
            items = collect_points(path)
        except ScenarioError as error:
            rows.append({"file": str(path), "kind": "refused", "verdict": str(error).splitlines()[0]})
            continue
        for item_id, point, resolution in items:
            result = run_point(point, backend="emulated", resolution=resolution)
            rows.append({"file": str(path), "item": item_id, "kind": classify(result.outcome, result.verdict),
                         "verdict": result.verdict, "seconds": round(result.duration, 2)})
        print(f"[{i + 1}/{args.count}] {rows[-1]['kind']}: {path.name}", flush=True)
    counts = collections.Counter(row["kind"] for row in rows)
    (out / "fuzz.json").write_text(json.dumps({"seed": args.seed, "count": args.count, "counts": counts,
                                               "seconds": round(time.perf_counter() - started, 1),
                                               "rows": rows}, indent=2))
    print("\n" + ", ".join(f"{n} {kind}" for kind, n in counts.most_common()))
    for row in rows:
        if row["kind"] in ("harness bug", "check failed"):
            print(f"{row['kind']}: {row['file']}: {row['verdict'][:300]}")
    print(f"written: {out / 'fuzz.json'}")
    return 1 if counts["harness bug"] else 0


if __name__ == "__main__":
    sys.exit(main())
