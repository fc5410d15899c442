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
from harness.engine import DeviceRules, StreamConfig, UnsupportedOnBackend, load, resolve
from harness import features as registry
from harness.features import Feature, active_features
from harness.features.layout import axis_sizes, describe, rank_context, runs_reference
from harness.graph.capture_sizes import EngineRefusal, SizeResolution, resolve_sizes
from harness.graph.modes import CUDAGraphMode, ModeResolution, parse_mode, resolve_mode
from harness.graph.pipeline import GraphConfig, PipelineSpec, Workload, run_pipeline
from harness.graph.plan import dummy_request_lens
from harness.graph.record import ErrorCategory, PathError, RunRecord
from harness.graph.runner import Fixes
from harness.graph.scheduler import RequestPlan
from harness.graph.stream_budget import stream_budget
from harness.graph.shape import SINGLE_RANK, RankContext
from harness.model import DecoderLM, ModelConfig
from harness.model.parallel import ParallelContext, tp_split_problem, use_collective_ops
from harness.ranks import run_ranks
from harness.ops import set_native_impl, set_native_paged_attention
from harness.scenario import Scenario, ScenarioPoint, locate
from harness.scenario.bounds import MAX_WORLD_SIZE
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


def unsupported_reason(scenario: Scenario) -> str | None:
    """Why a point cannot run here (the item is then skipped with this reason): a feature's, or a
    start-up the real engine does not survive (the v0.18.0 stream budget leaving one size)."""
    data = scenario.model_dump(mode="json")
    features = scenario_features(scenario)
    for feature in features:
        reason = feature.unsupported(data)
        if reason:
            return f"{feature.name}: {reason}"
    try:
        capture_sizes(scenario, features)
    except EngineRefusal as refusal:
        return f"the real engine refuses to start (stack {stack_of(scenario).name}): {refusal}"
    return None


def scenario_features(scenario: Scenario) -> list[Feature]:
    """The scenario's enabled features, each with its typed settings and fix switches."""
    settings = {name: getattr(scenario.features, name) for name in scenario.features.model_dump()}
    return active_features(settings, scenario.fixes.model_dump())


def model_config(scenario: Scenario) -> ModelConfig:
    m = scenario.model
    return ModelConfig(kind=m.kind, num_layers=m.layers, hidden_size=m.hidden_size, num_heads=m.num_heads,
                       num_kv_heads=m.num_kv_heads, head_dim=m.head_dim, vocab_size=m.vocab_size,
                       dtype=m.dtype, seed=m.seed, block_size=m.block_size, num_blocks=m.num_blocks,
                       max_model_len=m.max_model_len)


def stack_of(scenario: Scenario) -> StackProfile:
    """The version profile the scenario models (its ``stack``, else the newest release)."""
    return profile(scenario.stack)


def mode_resolution(scenario: Scenario) -> ModeResolution:
    """The graph mode the scenario's stack runs for its ``graph.mode`` (graph.modes.resolve_mode):
    the compilation mode's rule and, on older vLLM Ascend, FULL_AND_PIECEWISE -> PIECEWISE."""
    g, stack = scenario.graph, stack_of(scenario)
    return resolve_mode(parse_mode(g.mode), compilation_mode=g.compilation_mode, platform=g.platform,
                        full_and_piecewise=stack.full_and_piecewise,
                        npu_unsupported_compilation=stack.npu_unsupported_compilation)


def size_resolution(scenario: Scenario, features: list[Feature]) -> SizeResolution:
    """The capture sizes of a run, composed once from the base rule and every active feature's
    constraints under the scenario's stack (graph.capture_sizes), with the engine's warnings."""
    g, stack = scenario.graph, stack_of(scenario)
    mode = mode_resolution(scenario).mode
    return resolve_sizes(max_num_seqs=g.max_num_seqs, platform=g.platform, graphs=mode is not CUDAGraphMode.NONE,
                         num_speculative_tokens=registry.uniform_decode_query_len(features) - 1,
                         capture_sizes=g.capture_sizes, max_capture_size=g.max_capture_size,
                         max_num_batched_tokens=scenario.workload.max_num_batched_tokens,
                         constraints=registry.size_constraints(features),
                         decode_full=mode.decode_mode() is CUDAGraphMode.FULL,
                         spec_sp_multiple=stack.spec_sp_multiple,
                         capture_max_num_batched_tokens=stack.capture_max_num_batched_tokens,
                         capture_max_num_seqs=stack.capture_max_num_seqs)


def budget_policy(scenario: Scenario) -> str:
    """The scenario's own ``engine.budget_policy``, else its stack's."""
    return scenario.engine.budget_policy or stack_of(scenario).budget_policy


def capture_sizes(scenario: Scenario, features: list[Feature]) -> tuple[list[int], dict[str, Any]]:
    """The capture sizes of a run (:func:`size_resolution`), then the stream-budget policy (with
    its decision). Preflight and the run both call this, so what passes preflight is what runs."""
    sizes = size_resolution(scenario, features).sizes
    budget = stream_budget(budget_policy(scenario), sizes, **_legacy_inputs(scenario, features))
    return budget.sizes_kept, asdict(budget)


def build_spec(scenario: Scenario, ctx: RankContext = SINGLE_RANK) -> tuple[PipelineSpec, list[int], dict[str, Any]]:
    g, w = scenario.graph, scenario.workload
    model = model_config(scenario)
    features = scenario_features(scenario)
    q = registry.uniform_decode_query_len(features)
    sizes, budget = capture_sizes(scenario, features)
    fixes = Fixes(host_param_update=scenario.fixes.host_param_update, static_inputs=scenario.fixes.static_inputs)
    stack = stack_of(scenario)
    graph = GraphConfig(mode_resolution(scenario).mode, tuple(sizes), g.max_num_seqs, q, g.warmup_runs,
                        scenario.fixes.fia_padding, fixes, mixed_full_key_num_reqs=stack.mixed_full_key_num_reqs,
                        pad_requests_without_full=stack.pad_requests_without_full,
                        debug_input_addresses=g.debug_input_addresses, dp_padding=stack.dp_padding,
                        spec_decode_needs_computed=stack.spec_decode_needs_computed,
                        capture_error_guidance=stack.capture_error_guidance)
    if w.requests is not None:
        plans: list[RequestPlan] = []
        for request in w.requests:
            for _ in range(request.repeat):
                plans.append(RequestPlan(f"r{len(plans)}", request.prompt_len, request.output_len,
                                         request.arrival_step))
        for feature in features:
            plans = feature.share_requests(plans, ctx)
        workload = Workload(requests=tuple(plans), max_num_batched_tokens=w.max_num_batched_tokens,
                            prompt_seed=w.prompt_seed)
    else:
        batches = tuple(tuple((str(e.req), e.new_tokens) for e in step) for step in w.steps)
        workload = Workload(explicit=batches, max_num_batched_tokens=w.max_num_batched_tokens,
                            prompt_seed=w.prompt_seed)
    spec = PipelineSpec(model, graph, workload, scenario.steps, scenario.fia_contract, tuple(features),
                        num_speculative_tokens=q - 1)
    return spec, sizes, budget


def _legacy_inputs(scenario: Scenario, features: list[Feature]) -> dict[str, Any]:
    """What the legacy budget formula of vLLM Ascend reads from a deployment (features add theirs)."""
    if budget_policy(scenario) != "legacy":
        return {}
    return dict(num_layers=scenario.model.layers, mode=mode_resolution(scenario).mode,
                hccl_mode=scenario.engine.hccl_mode, release=stack_of(scenario).legacy_budget,
                **registry.budget_inputs(features))


def decide(expect, checks: dict[str, CheckResult]) -> tuple[str, str]:
    failed = {name for name, r in checks.items() if not r.passed}
    if expect.outcome == "pass":
        if not failed:
            table = " and the dispatch table matched" if CheckName.DISPATCH in checks else ""
            return PASSED, "all four checks passed" + table
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
    scenario = point.scenario
    if fia_contract is not None:
        scenario = scenario.model_copy(update={"fia_contract": fia_contract})
    if stack is not None and scenario.stack is None:
        scenario = scenario.model_copy(update={"stack": profile(stack).name})
    resolved = resolve(backend)
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
        reason = unsupported_reason(scenario)
        if reason:
            result.verdict = reason
            return result
        features = scenario_features(scenario)
        world = registry.world_size(features)
        if world > MAX_WORLD_SIZE:  # collection refuses it; a direct caller gets this
            raise ValueError(f"{world} ranks requested, above the maximum world size of {MAX_WORLD_SIZE}")
        if world > 1:
            result.checks, result.record, notes = _run_ranks(scenario, resolved, features)
            result.record.notes.extend(notes)
        else:
            result.record, result.checks = run_rank(scenario, resolved)
        _locate_rows(result.checks.get(CheckName.DISPATCH), point)
        result.outcome, result.verdict = decide(scenario.expect, result.checks)
        if result.outcome == PASSED and not result.record.steps:
            result.outcome = FAILED
            result.verdict = "nothing was compared: no step ran, so no check saw any evidence"
    except UnsupportedOnBackend as error:  # a setting this backend refuses: not a finding
        result.outcome, result.verdict = SKIPPED, f"unsupported on {resolved}: {error}"
    except Exception as error:  # noqa: BLE001 - a crash is this item's result, never the suite's
        result.outcome = FAILED
        result.verdict = f"harness error: {type(error).__name__}: {error}"
        result.traceback = traceback.format_exc()
    finally:
        result.duration = time.perf_counter() - started
    return result


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
    """What the schema cannot see: a model the canary cannot build, a model the TP ranks cannot
    split, capture sizes a feature leaves empty or whose dummy batch outgrows ``max_model_len``,
    an unknown plugin feature. Returns ``(field, message)`` or None."""
    try:
        features = scenario_features(scenario)
    except ValueError as error:
        return "features", str(error)
    try:
        config = model_config(scenario)
    except ValueError as error:
        fields = type(scenario.model).model_fields
        named = next((f for f in fields if f in str(error)), None)
        return (f"model.{named}" if named else "model"), str(error)
    tp = dict(axis_sizes(features)).get("tp", 1)
    if tp > 1 and (split := tp_split_problem(config, tp)) is not None:
        field, message = split  # the MLP width is twice model.hidden_size: that is the field to change
        return f"model.{'hidden_size' if field == 'intermediate_size' else field}", f"{message}, with features.sp.tp={tp}"
    try:
        sizes, _ = capture_sizes(scenario, features)
    except EngineRefusal:
        return None  # not a bad file: the point is skipped with the engine's reason (unsupported_reason)
    except ValueError as error:
        field = "graph.max_capture_size" if "max_cudagraph_capture_size" in str(error) else "graph.capture_sizes"
        return field, str(error)
    if mode_resolution(scenario).mode.mixed_mode() is not CUDAGraphMode.NONE:
        seqs, max_len = scenario.graph.max_num_seqs, config.max_model_len
        for size in sizes:
            if (longest := max(dummy_request_lens(size, seqs))) > max_len:
                return "graph.capture_sizes", (
                    f"capture size {size} with graph.max_num_seqs {seqs} is captured on a dummy request of "
                    f"{longest} tokens, above model.max_model_len {max_len}: no real batch has that shape; "
                    "drop the size or raise max_num_seqs")
    return None


def world_size(scenario: Scenario) -> int:
    return registry.world_size(scenario_features(scenario))


def run_rank(scenario: Scenario, backend: str, ctx: RankContext = SINGLE_RANK,
             rows: list[dict[str, Any]] | None = None) -> tuple[RunRecord, dict[str, CheckResult]]:
    """One rank's whole job: build, run the pipeline, check (``rows``: the dispatch table, taken
    from ``scenario`` when not given; a rank gets it as data, since the rows pin what they name
    and a scenario rebuilt from JSON no longer knows which fields its file named)."""
    spec, sizes, budget = build_spec(scenario, ctx)
    engine = load(backend)
    install_native_ops(engine)
    record = RunRecord(scenario.graph.mode, backend, sizes, budget=budget)
    stack = stack_of(scenario)
    record.notes.append(f"stack {stack.name}: {stack.summary}")
    record.notes.extend(mode_resolution(scenario).notes)
    features = scenario_features(scenario)
    record.notes.extend(size_resolution(scenario, features).notes)
    reference = runs_reference(features, ctx)
    if not reference:
        record.notes.append(f"rank {ctx.rank}: the reference path and the plain greedy decode ran on the first rank "
                            "of its TP/CP group (the same requests), and were compared there")
    per_group = 1 if scenario.engine.hccl_mode == "AIV" else 2
    engine.reset_device(StreamConfig(scenario.engine.stream_pool, scenario.engine.streams_per_graph, per_group),
                        device_rules(stack))
    try:
        with cyclic_gc_paused():
            run_pipeline(spec, engine, record, ctx, rank_model=_rank_model(ctx), reference=reference)
    finally:
        engine.reset_device()
        use_collective_ops(None)  # the process's default again, whoever runs in it next
    tolerance = (scenario.tolerance.atol, scenario.tolerance.rtol) if scenario.tolerance else None
    checks = run_checks(record, contract=scenario.fia_contract, dtype=scenario.model.dtype,
                        bitwise_replay=engine.capabilities.bitwise_replay, tolerance=tolerance)
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
    stack = stack_of(scenario).name
    return [{**row.pinned(), "step": row.step, "rank": row.rank, "for_mode": row.for_mode, "index": i}
            for i, row in enumerate(scenario.expect.dispatch or ()) if row.for_stack in (None, stack)]


def install_native_ops(engine: Any) -> None:
    """Route harness.ops to the engine's own kernels (torch_npu's FIA and paged attention, host
    checks included), or back to the CPU reference where the engine has none; and the ranks'
    collectives to the engine's own (the emulator's shared memory), or to ``_c10d_functional``."""
    caps = engine.capabilities
    set_native_impl(*(caps.native_attention() if caps.native_attention else (None, None, None)))
    set_native_paged_attention(*(caps.native_paged_attention() if caps.native_paged_attention else (None, None)))
    use_collective_ops(caps.collective_ops() if caps.collective_ops else None)


def device_rules(stack: StackProfile) -> DeviceRules:
    """The stack's torch_npu rules, as the engine's options (the engine knows no profiles)."""
    return DeviceRules(rng_in_capture=stack.rng_in_capture,
                       capture_survives_rejected_sync=stack.capture_survives_rejected_sync,
                       generator_registration=stack.generator_registration)


def _rank_model(ctx: RankContext):
    """This rank's model: the single-rank one, or its tensor/sequence-parallel shard."""
    if ctx.tp == 1:
        return None

    def shard(reference: DecoderLM) -> DecoderLM:
        parallel = ParallelContext(ctx.tp, ctx.tp_rank, ctx.tp_group, sequence_parallel=True)
        return DecoderLM(reference.config, parallel)

    return shard


# -- multi-rank ---------------------------------------------------------------------------------
def _run_ranks(scenario: Scenario, backend: str, features: list[Feature]) -> tuple[dict[str, CheckResult], RunRecord, list[str]]:
    world = registry.world_size(features)
    outcome = run_ranks(_rank_job, world,
                        args=(scenario.model_dump(mode="json"), backend, dispatch_rows(scenario)),
                        timeout=rank_timeout(scenario))
    layout = describe(axis_sizes(features))
    if not outcome.ok:
        record = RunRecord(scenario.graph.mode, backend, [])
        failure = outcome.root_cause or outcome.failures[0]
        record.errors.append(PathError("graph", None, f"rank {failure.rank}", failure.kind, failure.message,
                                       category=ErrorCategory.RANK))
        summary = f"rank {failure.rank} {failure.kind}: {failure.message}"
        checks = {EXECUTION: CheckResult(EXECUTION, False, summary, None, {"ranks": outcome.report()})}
        return checks, record, [layout, outcome.report()]
    per_rank = outcome.results
    merged: dict[str, CheckResult] = {}
    for name in per_rank[0][1]:
        results = [(rank, checks[name]) for rank, (_, checks) in enumerate(per_rank) if name in checks]
        failing = [(rank, r) for rank, r in results if not r.passed]
        rank, chosen = failing[0] if failing else results[0]
        summary = f"rank {rank}: {chosen.summary}" if failing else f"{chosen.summary} (all {world} ranks)"
        merged[name] = CheckResult(name, not failing, summary, chosen.first_step,
                                   {**chosen.details, "ranks_failing": [r for r, _ in failing]})
    for rank, (_, checks) in enumerate(per_rank):  # a check that failed on some rank only
        for name, check in checks.items():
            if name not in merged:
                merged[name] = CheckResult(name, check.passed, f"rank {rank}: {check.summary}", check.first_step,
                                           check.details)
    shown = next((rank for rank, (_, checks) in enumerate(per_rank) if any(not c.passed for c in checks.values())), 0)
    return merged, per_rank[shown][0], [layout, f"the run evidence shown is rank {shown}'s"]


def _rank_job(rank: int, world: int, scenario_json: dict, backend: str, rows: list[dict[str, Any]] | None = None):
    scenario = Scenario.model_validate(scenario_json)
    ctx = rank_context(scenario_features(scenario), rank, world)
    record, checks = run_rank(scenario, backend, ctx, rows or [])
    for step in record.steps:
        step.logits = {}  # tensors stay on the rank: the checks have read them
    return record, checks
