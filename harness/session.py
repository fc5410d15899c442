"""Run one scenario point end to end: build, execute, check, decide the item's outcome.

The one place where a validated :class:`~harness.scenario.Scenario` becomes the pipeline's
inputs (model config, capture sizes, schedule, fixes) and the checks' verdicts become an
outcome against the scenario's ``expect``. pytest-free: the plugin, a CLI or a notebook can
call :func:`run_point` alike.
"""

from __future__ import annotations

import platform
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch

import harness
from harness.checks import CHECKS, EXECUTION, CheckResult, run_checks
from harness.engine import load, resolve
from harness.engine.emulated.device import StreamConfig
from harness.graph.capture_sizes import resolve_capture_sizes
from harness.graph.modes import parse_mode
from harness.graph.pipeline import PipelineSpec, prompt_tokens, run_pipeline
from harness.graph.record import RunRecord
from harness.graph.runner import Fixes, GraphConfig
from harness.graph.scheduler import RequestPlan, explicit_steps, schedule
from harness.model import ModelConfig
from harness.scenario import Scenario, ScenarioPoint

#: Outcomes, in pytest's vocabulary.
PASSED, FAILED, XFAILED, SKIPPED = "passed", "failed", "xfailed", "skipped"


@dataclass
class ItemResult:
    name: str
    id: str
    source: str
    scenario: dict[str, Any]
    backend: str
    outcome: str
    verdict: str  # one line: why this outcome
    checks: dict[str, CheckResult] = field(default_factory=dict)
    record: RunRecord | None = None
    duration: float = 0.0
    traceback: str | None = None

    @property
    def failed_checks(self) -> list[str]:
        return [name for name, result in self.checks.items() if not result.passed]


def environment(backend: str) -> dict[str, str]:
    engine = load(backend)
    return {
        "harness": harness.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "backend": engine.name,
        "device": engine.device_name(),
    }


def unsupported_reason(scenario: Scenario) -> str | None:
    """Why a point cannot run yet (the item is then skipped with this reason)."""
    f = scenario.features
    active = [name for name, on in (("SP", f.sp.tp > 1), ("DP", f.dp.size > 1), ("MTP", f.mtp.k > 0),
                                     ("CP", f.cp.size > 1)) if on]
    if active:
        return f"features {', '.join(active)} are not supported by this harness version"
    return None


def build_spec(scenario: Scenario) -> tuple[PipelineSpec, list[int]]:
    m, g, w = scenario.model, scenario.graph, scenario.workload
    model = ModelConfig(kind=m.kind, num_layers=m.layers, hidden_size=m.hidden_size, num_heads=m.num_heads,
                        num_kv_heads=m.num_kv_heads, head_dim=m.head_dim, vocab_size=m.vocab_size,
                        dtype=m.dtype, seed=m.seed, block_size=m.block_size, num_blocks=m.num_blocks,
                        max_model_len=m.max_model_len)
    k = scenario.features.mtp.k
    sizes = resolve_capture_sizes(max_num_seqs=g.max_num_seqs, platform=g.platform, num_speculative_tokens=k,
                                  capture_sizes=g.capture_sizes, max_capture_size=g.max_capture_size,
                                  max_num_batched_tokens=w.max_num_batched_tokens)
    fixes = Fixes(fia_padding=scenario.fixes.fia_padding, host_param_update=scenario.fixes.host_param_update,
                  static_inputs=scenario.fixes.static_inputs)
    graph = GraphConfig(parse_mode(g.mode), tuple(sizes), g.max_num_seqs, 1 + k, g.warmup_runs, fixes)
    if w.requests is not None:
        plans: list[RequestPlan] = []
        for request in w.requests:
            for _ in range(request.repeat):
                plans.append(RequestPlan(f"r{len(plans)}", request.prompt_len, request.output_len,
                                         request.arrival_step))
        steps = schedule(plans, block_size=m.block_size, num_blocks=m.num_blocks, max_num_seqs=g.max_num_seqs,
                         max_num_batched_tokens=w.max_num_batched_tokens, max_steps=scenario.steps,
                         decode_query_len=1 + k)
        lengths = {p.req_id: p.prompt_len for p in plans}
    else:
        batches = [[(str(e.req), e.new_tokens) for e in step] for step in w.steps]
        steps = explicit_steps(batches[: scenario.steps], block_size=m.block_size, num_blocks=m.num_blocks,
                               max_model_len=m.max_model_len)
        lengths = {}
        for step in steps:
            for req in step.requests:
                lengths[req.req_id] = max(lengths.get(req.req_id, 0), req.seq_len)
    prompts = prompt_tokens(list(lengths), list(lengths.values()), m.vocab_size, w.prompt_seed)
    return PipelineSpec(model, graph, tuple(steps), prompts, scenario.fia_contract), sizes


def decide(expect, checks: dict[str, CheckResult]) -> tuple[str, str]:
    failed = {name for name, r in checks.items() if not r.passed}
    if expect.outcome == "pass":
        if not failed:
            return PASSED, "all four checks passed"
        return FAILED, "; ".join(f"{name}: {checks[name].summary}" for name in _ordered(failed))
    wanted = set(expect.failing_checks)
    if failed == wanted:
        return XFAILED, f"known-bad scenario failed exactly as expected ({', '.join(_ordered(failed))})"
    if not failed:
        return FAILED, (f"known-bad scenario passed unexpectedly: expected {', '.join(_ordered(wanted))} to fail"
                        + (f" ({expect.reason})" if expect.reason else ""))
    missing, extra = wanted - failed, failed - wanted
    parts = []
    if missing:
        parts.append(f"expected {', '.join(_ordered(missing))} to fail but it passed")
    if extra:
        parts.append("unexpected failure of " + "; ".join(f"{n}: {checks[n].summary}" for n in _ordered(extra)))
    return FAILED, "known-bad scenario failed differently: " + "; ".join(parts)


def _ordered(names) -> list[str]:
    order = (*CHECKS, EXECUTION)
    return sorted(names, key=order.index)


def run_point(point: ScenarioPoint, *, backend: str = "auto", fia_contract: str | None = None) -> ItemResult:
    """Run ``point``; never raises for a scenario's own failure (that is the result)."""
    scenario = point.scenario
    if fia_contract is not None:
        scenario = scenario.model_copy(update={"fia_contract": fia_contract})
    resolved = resolve(backend)
    result = ItemResult(point.name, point.id, f"{point.source.path}:{point.source.line}",
                        scenario.model_dump(mode="json"), resolved, SKIPPED, "")
    if scenario.expect.outcome == "skip":
        result.verdict = f"unsupported by design: {scenario.expect.skip}"
        return result
    reason = unsupported_reason(scenario)
    if reason:
        result.verdict = reason
        return result
    started = time.perf_counter()
    engine = load(resolved)
    try:
        spec, sizes = build_spec(scenario)
        record = RunRecord(scenario.graph.mode, resolved, sizes)
        result.record = record
        per_group = 1 if scenario.engine.hccl_mode == "AIV" else 2
        engine.reset_device(StreamConfig(scenario.engine.stream_pool, scenario.engine.streams_per_graph, per_group))
        run_pipeline(spec, engine, record)
        tolerance = (scenario.tolerance.atol, scenario.tolerance.rtol) if scenario.tolerance else None
        result.checks = run_checks(record, contract=scenario.fia_contract, dtype=scenario.model.dtype,
                                   bitwise_replay=engine.bitwise_replay, tolerance=tolerance)
        result.outcome, result.verdict = decide(scenario.expect, result.checks)
    except Exception as error:  # noqa: BLE001 - a crash is this item's result, never the suite's
        result.outcome = FAILED
        result.verdict = f"harness error: {type(error).__name__}: {error}"
        result.traceback = traceback.format_exc()
    finally:
        engine.reset_device()
        result.duration = time.perf_counter() - started
    return result
