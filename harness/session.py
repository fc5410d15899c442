"""Run one scenario point end to end: build, execute, check, decide the item's outcome.

The one place where a validated :class:`~harness.scenario.Scenario` becomes the pipeline's
inputs (model config, capture sizes, schedule, fixes) and the checks' verdicts become an
outcome against the scenario's ``expect``. pytest-free: the plugin, a CLI or a notebook can
call :func:`run_point` alike.
"""

from __future__ import annotations

import contextlib
import gc
import platform
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

import torch

import harness
from harness.checks import CHECKS, EXECUTION, CheckName, CheckResult, run_checks
from harness.checks.dispatch_table import check_dispatch_table, summarize_mismatches
from harness.engine import DeviceRules, Engine, StreamConfig, UnsupportedOnBackend, load, resolve
from harness.features import rank_model
from harness.features.layout import axis_sizes, describe, rank_context, runs_reference
from harness.graph.pipeline import GraphConfig, PipelineSpec, Workload, run_pipeline
from harness.graph.record import ErrorCategory, PathError, RunRecord
from harness.graph.runner import Fixes
from harness.graph.scheduler import RequestPlan
from harness.graph.shape import SINGLE_RANK, RankContext
from harness.model.parallel import use_collective_ops
from harness.ranks import device_count, process_group_backend, run_ranks, too_few_devices
from harness.ops import set_native_impl, set_native_paged_attention
from harness.resolve import ItemProblem, PointSkipped, ResolvedItem, resolve_item
from harness.scenario import Scenario, ScenarioPoint, locate
from harness.scenario.limits import rank_timeout
from harness.stacks import StackProfile, profile

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
    try:
        engine = load(backend)
        name, device = engine.name, engine.device_name()
    except UnsupportedOnBackend as error:  # every item then fails with this reason
        name, device = backend, f"unavailable: {error}"
    return {
        "harness": harness.__version__,
        "torch": str(torch.__version__),
        "python": platform.python_version(),
        "backend": name,
        "device": device,
    }


def backend_problem(backend: str) -> str | None:
    """Why ``backend`` cannot run here (torch_npu absent, no CUDA device), else None."""
    try:
        load(backend)
    except UnsupportedOnBackend as error:
        return str(error)
    return None


def build_spec(item: ResolvedItem, ctx: RankContext = SINGLE_RANK) -> PipelineSpec:
    """The pipeline's inputs for this rank, read off the resolved item."""
    scenario = item.scenario
    g, w = scenario.graph, scenario.workload
    q = item.uniform_decode_query_len
    f = scenario.fixes
    fixes = Fixes(device_placement=f.device_placement, host_param_update=f.host_param_update,
                  static_inputs=f.static_inputs, refresh_device_buffers=f.refresh_device_buffers,
                  sync_before_replay=f.sync_before_replay)
    graph = GraphConfig(item.mode, item.capture_sizes, g.max_num_seqs, q, g.warmup_runs, f.fia_padding, fixes,
                        mixed_full_key_num_reqs=item.stack.mixed_full_key_num_reqs,
                        pad_requests_without_full=item.stack.pad_requests_without_full,
                        debug_input_addresses=g.debug_input_addresses, attention_path=item.graph.attention_path,
                        dp_padding=item.stack.dp_padding, spec_decode_needs_computed=item.stack.spec_decode_needs_computed,
                        capture_error_guidance=item.stack.capture_error_guidance, async_scheduling=g.async_scheduling,
                        drafter_graphs=g.compilation_mode == "VLLM_COMPILE")
    if w.requests is not None:
        plans: list[RequestPlan] = []
        for request in w.requests:
            for _ in range(request.repeat):
                plans.append(RequestPlan(f"r{len(plans)}", request.prompt_len, request.output_len,
                                         request.arrival_step))
        for feature in item.features:
            plans = feature.share_requests(plans, ctx)
        workload = Workload(requests=tuple(plans), max_num_batched_tokens=w.max_num_batched_tokens,
                            prompt_seed=w.prompt_seed)
    else:
        # (the schema gives a workload requests or steps, never neither)
        batches = tuple(tuple((str(e.req), e.new_tokens) for e in step) for step in w.steps or ())
        workload = Workload(explicit=batches, max_num_batched_tokens=w.max_num_batched_tokens,
                            prompt_seed=w.prompt_seed)
    return PipelineSpec(item.model, graph, workload, scenario.steps, scenario.fia_contract, item.features,
                        num_speculative_tokens=q - 1)


def decide(expect, checks: dict[str, CheckResult]) -> tuple[str, str]:
    failed = {name for name, r in checks.items() if not r.passed}
    if expect.outcome == "pass":
        if not failed:
            table = " and the dispatch table matched" if CheckName.DISPATCH in checks else ""
            idle = [name for name in _ordered(checks) if not checks[name].evaluated]
            if not idle:
                return PASSED, "all four checks passed" + table
            ran = [name for name in _ordered(checks) if checks[name].evaluated and name in CHECKS]
            return PASSED, (f"{', '.join(ran) or 'no check'} passed; not evaluated: {', '.join(idle)}" + table)
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
    order = (*CHECKS, CheckName.DISPATCH, EXECUTION)
    return sorted(names, key=order.index)


def run_point(point: ScenarioPoint, *, backend: str = "auto", fia_contract: str | None = None,
              stack: str | None = None) -> ItemResult:
    """Run ``point``; never raises for a scenario's own failure (that is the result).

    ``stack`` is the version profile of a scenario that names none (``--stack``)."""
    resolved = resolve(backend)
    scenario = point.scenario
    result = ItemResult(point.name, point.id, f"{point.source.path}:{point.source.line}",
                        scenario.model_dump(mode="json"), resolved, SKIPPED, "")
    if scenario.expect.outcome == "skip":
        result.verdict = f"unsupported by design: {scenario.expect.skip}"
        return result
    started = time.perf_counter()
    problem = backend_problem(resolved)
    if problem:  # one line per item, no traceback: the option is wrong for this machine
        result.outcome, result.verdict = FAILED, f"backend unavailable: {problem}"
        return result
    try:
        item = resolve_item(scenario, resolved, fia_contract=fia_contract, stack=stack)
        result.scenario = item.scenario.model_dump(mode="json")
        run_item(item, point, result)
    except PointSkipped as skipped:
        result.verdict = skipped.reason
    except ItemProblem as refused:  # collection refuses it; a direct caller gets this
        result.outcome, result.verdict = FAILED, f"{refused.field}: {refused.message}"
    except UnsupportedOnBackend as error:  # a setting this backend refuses: not a finding
        result.outcome, result.verdict = SKIPPED, f"unsupported on {resolved}: {error}"
    except Exception as error:  # noqa: BLE001 - a crash is this item's result, never the suite's
        result.outcome = FAILED
        result.verdict = f"harness error: {type(error).__name__}: {error}"
        result.traceback = traceback.format_exc()
    finally:
        result.duration = time.perf_counter() - started
    return result


def run_item(item: ResolvedItem, point: ScenarioPoint, result: ItemResult) -> None:
    """Run a resolved item on its ranks and decide its outcome into ``result``."""
    short = too_few_devices(item.backend, item.world_size, device_count(item.backend)) if item.world_size > 1 else None
    if short:  # one device per rank: NCCL refuses two ranks on one GPU
        result.outcome, result.verdict = SKIPPED, short
        return
    if item.world_size > 1:
        result.checks, result.record, notes = _run_ranks(item)
        result.record.notes.extend(notes)
    else:
        result.record, result.checks = run_rank(item)
    _locate_rows(result.checks.get(CheckName.DISPATCH), point)
    result.outcome, result.verdict = decide(item.scenario.expect, result.checks)
    if result.outcome == PASSED and not result.record.steps:
        result.outcome = FAILED
        result.verdict = "nothing was compared: no step ran, so no check saw any evidence"


def _locate_rows(check: CheckResult | None, point: ScenarioPoint) -> None:
    """Name the file line of each mismatching dispatch row (``expect.dispatch[2] (line 31)``)."""
    if check is None or check.passed:
        return
    lines: dict[int, int | None] = {}
    for entry in check.details.get("table_mismatches", []):
        i = entry["row"]
        if i not in lines:
            lines[i] = locate(point.source.path, f"expect.dispatch.{i}") if point.source.path else None
        if lines[i]:
            entry["line"] = lines[i]
            entry["text"] = entry["text"].replace(f"expect.dispatch[{i}]:", f"expect.dispatch[{i}] (line {lines[i]}):", 1)
    check.summary = summarize_mismatches(check.details["table_mismatches"])


def preflight(scenario: Scenario) -> tuple[str, str] | None:
    """What the schema cannot see, as ``(field, message)``: the resolution of the point (a point
    that resolves, or is skipped, has no problem)."""
    try:
        resolve_item(scenario)
    except ItemProblem as problem:
        return problem.field, problem.message
    except PointSkipped:
        return None
    return None


def run_rank(item: ResolvedItem, ctx: RankContext = SINGLE_RANK,
             rows: list[dict[str, Any]] | None = None) -> tuple[RunRecord, dict[str, CheckResult]]:
    """One rank's whole job: build, run the pipeline, check (``rows``: the dispatch table, taken
    from the scenario when not given; a rank gets it as data, since the rows pin what they name
    and a scenario rebuilt from JSON no longer knows which fields its file named)."""
    scenario = item.scenario
    spec = build_spec(item, ctx)
    engine = load(item.backend)
    install_native_ops(engine)
    record = RunRecord(str(item.mode), item.backend, list(item.capture_sizes), budget=item.budget_report)
    record.notes.extend(item.notes)
    reference = runs_reference(list(item.features), ctx)
    if not reference:
        record.notes.append(f"rank {ctx.rank}: the reference path and the plain greedy decode ran on the first rank "
                            "of its TP/CP group (the same requests), and were compared there")
    per_group = 1 if scenario.engine.hccl_mode == "AIV" else 2
    engine.reset_device(StreamConfig(scenario.engine.stream_pool, scenario.engine.streams_per_graph, per_group),
                        device_rules(item.stack))
    try:
        with cyclic_gc_paused():
            run_pipeline(spec, engine, record, ctx, rank_model=rank_model(item.features, ctx), reference=reference)
        record.device_work = dict(engine.device_work())
    finally:
        engine.reset_device()
        use_collective_ops(None)  # the process's default again, whoever runs in it next
    tolerance = (scenario.tolerance.atol, scenario.tolerance.rtol) if scenario.tolerance else None
    checks = run_checks(record, contract=scenario.fia_contract, dtype=scenario.model.dtype,
                        bitwise_replay=item.capabilities.bitwise_replay, tolerance=tolerance)
    rows = dispatch_rows(scenario) if rows is None else rows
    if rows:
        checks[CheckName.DISPATCH] = check_dispatch_table(record, rows, rank=ctx.rank, mode=scenario.graph.mode)
    return record, checks


@contextlib.contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while a pipeline runs.

    A run allocates tens of thousands of short-lived objects (tape nodes, tensors, specs) that
    reference counting frees; every so often the cyclic collector would walk the whole heap,
    torch's included, to find next to nothing. Measured on the 40-layer FULL item: 0.9 s of
    collections in 7 s, and 10% less CPU with them paused. vLLM pauses collection around graph
    capture for the same reason (``freeze_gc``). Whatever cycles a run leaves, the next
    automatic collection after it takes."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def dispatch_rows(scenario: Scenario) -> list[dict[str, Any]]:
    """The scenario's dispatch table as plain rows for :func:`check_dispatch_table` (the rows of
    another stack left out: ``for_stack``)."""
    stack = profile(scenario.stack).name
    return [{**row.pinned(), "step": row.step, "rank": row.rank, "for_mode": row.for_mode, "index": i}
            for i, row in enumerate(scenario.expect.dispatch or ()) if row.for_stack in (None, stack)]


def install_native_ops(engine: Engine) -> None:
    """Route harness.ops to the engine's own kernels (torch_npu's FIA and paged attention, host
    checks included), or back to the reference where the engine has none; and the ranks'
    collectives to the engine's own (the emulator's shared memory), or to ``_c10d_functional``."""
    set_native_impl(*(engine.native_attention() or (None, None, None)))
    set_native_paged_attention(*(engine.native_paged_attention() or (None, None)))
    use_collective_ops(engine.collective_ops())


def device_rules(stack: StackProfile) -> DeviceRules:
    """The stack's torch_npu rules, as the engine's options (the engine knows no profiles)."""
    return DeviceRules(rng_in_capture=stack.rng_in_capture,
                       capture_survives_rejected_sync=stack.capture_survives_rejected_sync,
                       generator_registration=stack.generator_registration)


# -- multi-rank ---------------------------------------------------------------------------------
def _run_ranks(item: ResolvedItem) -> tuple[dict[str, CheckResult], RunRecord, list[str]]:
    scenario, world = item.scenario, item.world_size
    outcome = run_ranks(_rank_job, world, args=(item, dispatch_rows(scenario)), timeout=rank_timeout(scenario),
                        backend=process_group_backend(item.backend))
    layout = describe(axis_sizes(list(item.features)))
    if not outcome.ok:
        record = RunRecord(str(item.mode), item.backend, [])
        failure = outcome.root_cause or outcome.failures[0]
        record.errors.append(PathError("graph", None, f"rank {failure.rank}", failure.kind, failure.message,
                                       category=ErrorCategory.RANK))
        summary = f"rank {failure.rank} {failure.kind}: {failure.message}"
        checks: dict[str, CheckResult] = {EXECUTION: CheckResult(EXECUTION, False, summary, None,
                                                                 {"ranks": outcome.report()})}
        return checks, record, [layout, outcome.report()]
    per_rank = [returned for returned in outcome.results if returned is not None]  # ok: every rank returned
    merged: dict[str, CheckResult] = {}
    for name in per_rank[0][1]:
        results = [(rank, checks[name]) for rank, (_, checks) in enumerate(per_rank) if name in checks]
        failing = [(rank, r) for rank, r in results if not r.passed]
        evaluated = [(rank, r) for rank, r in results if r.evaluated]
        rank, chosen = (failing or evaluated or results)[0]
        if failing:
            summary = f"rank {rank}: {chosen.summary}"
        elif len(evaluated) in (0, len(results)):
            summary = f"{chosen.summary} (all {world} ranks)"
        else:  # a pass some ranks could not judge: say whose it is
            summary = f"{chosen.summary} (ranks {', '.join(str(r) for r, _ in evaluated)} of {world}; the others not evaluated)"
        merged[name] = CheckResult(name, not failing, summary, chosen.first_step,
                                   {**chosen.details, "ranks_failing": [r for r, _ in failing]},
                                   evaluated=bool(failing or evaluated))
    for rank, (_, checks) in enumerate(per_rank):  # a check that failed on some rank only
        for name, check in checks.items():
            if name not in merged:
                merged[name] = CheckResult(name, check.passed, f"rank {rank}: {check.summary}", check.first_step,
                                           check.details, evaluated=check.evaluated)
    shown = next((rank for rank, (_, checks) in enumerate(per_rank) if any(not c.passed for c in checks.values())), 0)
    return merged, per_rank[shown][0], [layout, f"the run evidence shown is rank {shown}'s"]


def _rank_job(rank: int, world: int, item: ResolvedItem, rows: list[dict[str, Any]] | None = None):
    ctx = rank_context(list(item.features), rank, world)
    record, checks = run_rank(item, ctx, rows or [])
    for step in record.steps:
        step.logits = {}  # tensors stay on the rank: the checks have read them
    return record, checks
