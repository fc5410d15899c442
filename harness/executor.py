"""Run a resolved item on its ranks: each rank builds the pipeline's inputs from the item, runs
the pipeline on its engine and checks its own evidence; the item's checks are theirs, merged.

As vLLM's executor runs its workers: a world of one runs in this process, a larger one on rank
processes (:mod:`harness.ranks`), each given the item and nothing else
(:func:`rank_job`). Everything a rank needs was decided when the item was resolved
(:class:`~harness.resolve.ResolvedItem`); here it is only read."""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator

from harness.checks import EXECUTION, CheckName, CheckResult, run_checks
from harness.checks.dispatch_table import check_dispatch_table
from harness.checks.ranks import merge_rank_checks
from harness.engine import load
from harness.features.layout import axis_sizes, describe, rank_context, rank_model, runs_reference
from harness.graph.pipeline import GraphConfig, PipelineSpec, Workload, run_pipeline
from harness.graph.record import ErrorCategory, PathError, RunRecord
from harness.graph.runner import Fixes
from harness.graph.scheduler import RequestPlan
from harness.graph.shape import SINGLE_RANK, RankContext
from harness.model.parallel import use_collective_ops
from harness.ops.native import install_native_ops
from harness.ranks import device_count, process_group_backend, run_ranks, too_few_devices
from harness.resolve import PointSkipped, ResolvedItem
from harness.scenario.limits import rank_timeout

__all__ = ["build_spec", "cyclic_gc_paused", "execute", "rank_job", "run_rank"]


def execute(item: ResolvedItem) -> tuple[dict[str, CheckResult], RunRecord]:
    """The item's checks and the run evidence to show (a failing rank's, else rank 0's).

    Raises :class:`PointSkipped` where this machine has fewer devices than the item has ranks
    (NCCL refuses two ranks on one GPU). A rank process that crashes, hangs or times out fails
    the item's ``execution`` check with its log; a world of one raises what its run raises
    (:func:`harness.session.run_point` makes that the item's result)."""
    if item.world_size == 1:
        record, checks = run_rank(item)
        return checks, record
    short = too_few_devices(item.backend, item.world_size, device_count(item.backend))
    if short:
        raise PointSkipped(short)
    outcome = run_ranks(rank_job, item.world_size, args=(item,), timeout=rank_timeout(item.scenario),
                        backend=process_group_backend(item.backend))
    layout = describe(axis_sizes(item.features))
    if not outcome.ok:
        record = RunRecord(str(item.mode), item.backend, [])
        failure = outcome.root_cause or outcome.failures[0]
        record.errors.append(PathError("graph", None, f"rank {failure.rank}", failure.kind, failure.message,
                                       category=ErrorCategory.RANK))
        record.notes.extend([layout, outcome.report()])
        summary = f"rank {failure.rank} {failure.kind}: {failure.message}"
        return {EXECUTION: CheckResult(EXECUTION, False, summary, None, {"ranks": outcome.report()})}, record
    per_rank = [returned for returned in outcome.results if returned is not None]  # ok: every rank returned
    checks, shown = merge_rank_checks([rank_checks for _, rank_checks in per_rank])
    record = per_rank[shown][0]
    record.notes.extend([layout, f"the run evidence shown is rank {shown}'s"])
    return checks, record


def rank_job(rank: int, world: int, item: ResolvedItem) -> tuple[RunRecord, dict[str, CheckResult]]:
    """What each rank process runs (:func:`harness.ranks.run_ranks` calls it)."""
    record, checks = run_rank(item, rank_context(item.features, rank, world))
    for step in record.steps:
        step.logits = {}  # tensors stay on the rank: the checks have read them
    return record, checks


def run_rank(item: ResolvedItem, ctx: RankContext = SINGLE_RANK) -> tuple[RunRecord, dict[str, CheckResult]]:
    """One rank's whole job: build its inputs, run the pipeline on the item's engine, check."""
    spec = build_spec(item, ctx)
    engine = load(item.backend)
    install_native_ops(engine)
    use_collective_ops(engine.collective_ops())  # the emulator's shared memory, or _c10d_functional
    record = RunRecord(str(item.mode), item.backend, list(item.capture_sizes), budget=item.budget_report)
    record.notes.extend(item.notes)
    reference = runs_reference(item.features, ctx)
    shard = rank_model(item.features, ctx)  # this rank's model from the single-rank one (None: the same)
    if not reference:
        record.notes.append(f"rank {ctx.rank}: the reference path and the plain greedy decode ran on the first rank "
                            "of its TP/CP group (the same requests), and were compared there")
    engine.reset_device(item.streams, item.device_rules)
    try:
        with cyclic_gc_paused():
            run_pipeline(spec, engine, record, ctx, rank_model=shard, reference=reference)
        record.device_work = dict(engine.device_work())
    finally:
        engine.reset_device()
        use_collective_ops(None)  # the process's default again, whoever runs in it next
    scenario = item.scenario
    tolerance = (scenario.tolerance.atol, scenario.tolerance.rtol) if scenario.tolerance else None
    checks = run_checks(record, contract=scenario.fia_contract, dtype=scenario.model.dtype,
                        bitwise_replay=item.capabilities.bitwise_replay, tolerance=tolerance)
    if item.dispatch_rows:
        checks[CheckName.DISPATCH] = check_dispatch_table(record, list(item.dispatch_rows), rank=ctx.rank,
                                                          mode=scenario.graph.mode)
    return record, checks


def build_spec(item: ResolvedItem, ctx: RankContext = SINGLE_RANK) -> PipelineSpec:
    """The pipeline's inputs for this rank, read off the resolved item."""
    scenario = item.scenario
    g, w, f = scenario.graph, scenario.workload, scenario.fixes
    q = item.uniform_decode_query_len
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
