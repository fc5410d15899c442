"""``graph-harness conformance``: the harness's start-up decisions against upstream's executed ones.

For seeded random scenario points (graph mode, capture sizes, ``max_capture_size``,
``max_num_seqs``, ``max_num_batched_tokens``, speculative ``k``), the harness resolves each
point as a run does (:func:`harness.resolve.resolve_item`, then its
:class:`~harness.graph.dispatcher.Dispatcher`), and upstream answers the same point in its own
venv by executing vLLM's config and vLLM Ascend's platform and model runner
(:mod:`harness.upstream.worker`, one long-lived process). Rules compared, per point:

* ``start-up``: both start, or both refuse;
* ``graph mode``: the mode the model runner settles on;
* ``capture sizes``: the sizes after every platform and runner rule;
* ``dispatcher keys``: the FULL and PIECEWISE batch descriptors.

A difference listed in :data:`RECORDED` (with why) is reported and does not fail the run; any
other fails it (exit 1). This room (``harness/upstream/``) is imported by nothing on the
default path: ``make scenarios`` and ``make test`` never need the upstream venv.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from harness.plain import JsonObject

__all__ = ["Difference", "Report", "RULES", "random_points", "harness_answer", "compare", "run"]

ROOT = Path(__file__).resolve().parents[2]
VENVS = ROOT / ".venv-upstream"
WORKER = Path(__file__).with_name("worker.py")
SETUP = "make upstream"
RULES = ("start-up", "graph mode", "capture sizes", "dispatcher keys")
MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
#: Where upstream decides each rule, for the report (v0.23: vLLM 0.23.0, vLLM Ascend 0.23.0.post1).
DECIDED_BY = {
    "start-up": "vllm EngineArgs.create_engine_config (SchedulerConfig, CompilationConfig, VllmConfig "
                "post-init; vllm_ascend NPUPlatform.check_and_update_config) and vllm_ascend "
                "NPUModelRunner._check_and_update_cudagraph_mode",
    "graph mode": "vllm CompilationConfig.resolve_cudagraph_mode_and_sizes, called by vllm_ascend "
                  "NPUModelRunner._check_and_update_cudagraph_mode",
    "capture sizes": "vllm VllmConfig._set_cudagraph_sizes, vllm_ascend NPUPlatform.check_and_update_config, "
                     "vllm CompilationConfig.adjust_cudagraph_sizes_for_spec_decode",
    "dispatcher keys": "vllm CudagraphDispatcher.initialize_cudagraph_keys",
}
#: Differences recorded as intended: (rule, predicate on the point and both answers, why).
RECORDED: list[tuple[str, Callable[[JsonObject, JsonObject, JsonObject], bool], str]] = []


def random_points(count: int, seed: int = 0) -> list[JsonObject]:
    """``count`` seeded random points over the settings both sides read."""
    rng = random.Random(seed)
    points = []
    for i in range(count):
        seqs = rng.choice([1, 2, 3, 4, 8, 16, 32, 40, 64, 100, 128, 256])
        tokens = rng.choice([max(seqs, 8), 64, 257, 512, 1000, 2048, 4096, 8192])
        sizes = None
        if rng.random() < 0.4:
            sizes = sorted(rng.sample([1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 100, 128, 256, 512],
                                      rng.randint(1, 6)))
        max_size = rng.choice([None, None, None, 8, 64, 100, 300, 512]) if rng.random() < 0.3 else None
        if sizes is not None and max_size is not None and rng.random() < 0.5:
            max_size = max(sizes)  # mostly consistent, sometimes not: both must refuse the same
        points.append({"id": i, "mode": rng.choice(MODES), "max_num_seqs": seqs, "max_num_batched_tokens": tokens,
                       "capture_sizes": sizes, "max_capture_size": max_size, "k": rng.choice([0, 0, 0, 1, 2, 3])})
    return points


def _scenario(point: JsonObject) -> JsonObject:
    graph: JsonObject = {"mode": point["mode"], "max_num_seqs": point["max_num_seqs"]}
    if point.get("capture_sizes") is not None:
        graph["capture_sizes"] = point["capture_sizes"]
    if point.get("max_capture_size") is not None:
        graph["max_capture_size"] = point["max_capture_size"]
    scenario: JsonObject = {
        "name": "conformance", "stack": point.get("stack", "v0.23.0"), "graph": graph, "steps": 2,
        "model": {"kind": "random", "layers": 2, "max_model_len": 4096, "num_blocks": 512},
        "workload": {"max_num_batched_tokens": point["max_num_batched_tokens"],
                     "requests": [{"prompt_len": 1, "output_len": 2}]},
    }
    if point.get("k"):
        scenario["features"] = {"mtp": {"k": point["k"]}}
    return scenario


def harness_answer(point: JsonObject) -> JsonObject:
    """The harness's answer, in the worker's terms: refused, or mode, sizes and keys."""
    import yaml

    from harness.graph.dispatcher import Dispatcher
    from harness.resolve import ItemProblem, PointSkipped, resolve_item
    from harness.scenario import ScenarioError, load_scenario_text

    out: JsonObject = {"id": point["id"]}
    try:
        (loaded,) = load_scenario_text(yaml.safe_dump(_scenario(point)))
        item = resolve_item(loaded.scenario)
    except (ScenarioError, ItemProblem, PointSkipped) as error:
        out["refused"] = " ".join(str(error).split())[:500]
        return out
    out["mode"] = item.mode.name
    out["sizes"] = list(item.capture_sizes)
    keys: JsonObject = {}
    if item.capture_sizes:
        dispatcher = Dispatcher(item.mode, item.capture_sizes, item.uniform_decode_query_len,
                                item.scenario.graph.max_num_seqs,
                                mixed_full_key_num_reqs=item.stack.mixed_full_key_num_reqs)
        for name, found in (("PIECEWISE", dispatcher.piecewise_keys), ("FULL", dispatcher.full_keys)):
            if found:
                keys[name] = sorted([k.num_tokens, k.num_reqs, k.uniform_decode] for k in found)
    out["keys"] = keys
    return out


@dataclass(frozen=True)
class Difference:
    rule: str
    point: JsonObject
    upstream: object
    harness: object
    recorded: str = ""  # why, when the difference is intended


@dataclass
class Report:
    profile: str
    versions: JsonObject
    points: int = 0
    compared: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RULES, 0))
    differences: list[Difference] = field(default_factory=list)
    adapter_errors: list[tuple[JsonObject, str]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def unrecorded(self) -> list[Difference]:
        return [d for d in self.differences if not d.recorded]


def _keys(answer: JsonObject) -> object:
    return {mode: [list(k) for k in keys] for mode, keys in sorted((answer.get("keys") or {}).items())}


def compare(point: JsonObject, upstream: JsonObject, ours: JsonObject, report: Report) -> None:
    """Every rule of one point: the differences go into ``report``."""
    def differ(rule: str, theirs: object, mine: object, shown: tuple[object, object] | None = None) -> None:
        report.compared[rule] += 1
        if theirs == mine:
            return
        why = next((why for r, applies, why in RECORDED if r == rule and applies(point, upstream, ours)), "")
        report.differences.append(Difference(rule, point, *(shown or (theirs, mine)), recorded=why))

    refused_up, refused_us = upstream.get("refused"), ours.get("refused")
    differ("start-up", bool(refused_up), bool(refused_us), shown=(refused_up or "starts", refused_us or "starts"))
    if refused_up or refused_us:
        return
    differ("graph mode", upstream.get("mode"), ours.get("mode"))
    differ("capture sizes", upstream.get("sizes"), ours.get("sizes"))
    differ("dispatcher keys", _keys(upstream), _keys(ours))


def _python(profile: str) -> Path:
    return VENVS / profile / "bin" / "python"


def upstream_answers(points: Sequence[JsonObject], profile: str,
                     progress: Callable[[int], None] | None = None) -> Iterator[JsonObject]:
    """Upstream's answers, one per point, from one worker process in the profile's venv."""
    python = _python(profile)
    if not python.exists():
        raise FileNotFoundError(f"no upstream venv for {profile} at {python.parent.parent}: run `{SETUP}`")
    worker = subprocess.Popen([str(python), str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
    assert worker.stdin is not None and worker.stdout is not None
    stdin = worker.stdin

    def feed() -> None:  # from a thread: both pipes would fill if the points went in first
        stdin.write("".join(json.dumps(p) + "\n" for p in points))
        stdin.close()

    threading.Thread(target=feed, name="upstream-points", daemon=True).start()
    for done, line in enumerate(worker.stdout, 1):
        if progress:
            progress(done)
        yield json.loads(line)
    if worker.wait() != 0:
        raise RuntimeError(f"the upstream worker ({python}) exited with {worker.returncode}")


def versions(profile: str) -> JsonObject:
    path = VENVS / profile / "versions.json"
    return json.loads(path.read_text()) if path.exists() else {}


def run(points: Sequence[JsonObject], profile: str = "v0.23.0", *, progress: bool = True) -> Report:
    report = Report(profile, versions(profile), points=len(points))
    started = time.perf_counter()
    by_id = {p["id"]: p for p in points}

    def say(done: int) -> None:
        if progress and (done % 50 == 0 or done == len(points)):
            elapsed = time.perf_counter() - started
            print(f"\r  upstream {profile}: {done}/{len(points)} points ({elapsed:.0f} s)", end="", file=sys.stderr,
                  flush=True)

    for upstream in upstream_answers(points, profile, say):
        point = dict(by_id[upstream["id"]], stack=profile)
        if "adapter_error" in upstream:
            report.adapter_errors.append((point, upstream["adapter_error"]))
            continue
        compare(point, upstream, harness_answer(point), report)
    if progress:
        print(file=sys.stderr)
    report.seconds = time.perf_counter() - started
    return report


def render(report: Report, *, shown: int = 10) -> str:
    v = report.versions
    lines = [f"conformance, profile {report.profile}: vLLM {v.get('vllm', '?')} ({v.get('vllm_package', '?')}), "
             f"vLLM Ascend {v.get('vllm_ascend', '?')}, torch {v.get('torch', '?')}; {report.points} points in "
             f"{report.seconds:.0f} s", ""]
    for rule in RULES:
        found = [d for d in report.differences if d.rule == rule]
        recorded = sum(1 for d in found if d.recorded)
        lines.append(f"  {rule:<16} {report.compared[rule]:>5} compared, {len(found) - recorded} differ"
                     + (f", {recorded} recorded" if recorded else ""))
    if report.adapter_errors:
        lines.append(f"  adapter errors: {len(report.adapter_errors)} (the oracle failed: not an answer)")
        for point, error in report.adapter_errors[:3]:
            lines.append(f"    {json.dumps(point)}: {error}")
    for rule in RULES:
        found = [d for d in report.unrecorded if d.rule == rule]
        if not found:
            continue
        lines += ["", f"{rule}: {len(found)} difference(s); upstream: {DECIDED_BY[rule]}"]
        for d in found[:shown]:
            lines.append(f"  point {json.dumps({k: v for k, v in d.point.items() if k != 'stack'})}")
            lines.append(f"    upstream: {json.dumps(d.upstream)}")
            lines.append(f"    harness:  {json.dumps(d.harness)}")
        if len(found) > shown:
            lines.append(f"  ... and {len(found) - shown} more")
    return "\n".join(lines) + "\n"
