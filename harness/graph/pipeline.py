"""Run a workload through the three execution paths in lockstep and record everything.

Every step runs three times, each path with its own KV cache, scheduler and generated text:

* ``reference``: the single-rank model, eager, unpadded metadata (what should be computed);
* ``padded``: this rank's model, eager, with the padding the graph path uses (separates
  padding effects from graph effects);
* ``graph``: the pipeline under test (dispatch, padding fixes, features, capture/replay,
  host-parameter updates).

Features enter through their hooks (capture sizes, token padding, DP agreement, spec decode).
A path that raises stops; the others go on, and the record keeps where and why, so the checks
can say which failure came first and a report is written whatever happened.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import torch

from harness.engine.protocol import Engine
from harness.graph.acceptance import accept
from harness.graph.capability import AttentionPath
from harness.graph.draft_runner import DraftGraphConfig, DraftGraphRunner
from harness.graph.drafter import Drafter, draft_model
from harness.graph.metadata import AttentionMetadata, build_attention_metadata
from harness.graph.modes import CUDAGraphMode
from harness.graph.plan import PlanKind, PlannerConfig, StepPlan, StepPlanner
from harness.graph.record import PATHS, PathError, RunRecord, StepRecord
from harness.graph.runner import EagerRunner, Fixes, GraphRunner, Launched, RunnerConfig, StepInputs
from harness.graph.scheduler import Batcher, ExplicitBatcher, RequestPlan, Step
from harness.graph.shape import SINGLE_RANK, RankContext, StepFeature
from harness.model import DecoderLM, ModelConfig, PagedKVCache, build_model
from harness.model.parallel import make_kv_cache
from harness.ops import fia_call_tags, fia_contract, observe_fia_calls, register_updatable_ops
from harness.ops.attention import AttentionStyle
from harness.plain import JsonObject


@dataclass(frozen=True)
class Workload:
    """Either planned requests (continuous batching) or explicit per-step batches."""

    requests: tuple[RequestPlan, ...] = ()
    explicit: tuple[tuple[tuple[str, int], ...], ...] = ()
    max_num_batched_tokens: int = 512
    prompt_seed: int = 0


@dataclass(frozen=True)
class GraphConfig:
    """The graph-mode configuration of a run: mode, capture sizes and the pipeline's fixes."""

    mode: CUDAGraphMode
    capture_sizes: tuple[int, ...]
    max_num_seqs: int
    uniform_decode_query_len: int = 1
    warmup_runs: int = 1
    fia_padding: bool = True  # dummy requests so actual_seq_lengths[-1] == T (PR #6475)
    fixes: Fixes = Fixes()
    # stack rules (harness.stacks), defaults = the newest release
    mixed_full_key_num_reqs: bool = True  # mixed FULL keys carry min(T, max_num_seqs) (vLLM PR #34043)
    pad_requests_without_full: bool = False  # True: a dummy request in PIECEWISE/NONE too (no real stack)
    debug_input_addresses: bool = False  # the graph wrappers' debug check (VLLM_LOGGING_LEVEL=DEBUG)
    attention_path: AttentionPath = AttentionPath.HOST_LISTS  # where FULL graphs keep the lengths (capability step)
    dp_padding: str = "graph_ranks"  # which DP ranks take the group's max count (vLLM Ascend PR #7297)
    spec_decode_needs_computed: bool = True  # spec decode: a fresh prompt is never uniform (PR #6835)
    capture_error_guidance: str | None = "pr9962"  # the wrapper's advice on 207008 (PR #9962)
    async_scheduling: bool = False  # launch step i+1 before reading step i (vLLM --async-scheduling)
    drafter_graphs: bool = True  # the draft model has graphs too (vLLM Ascend `_use_aclgraph()`: VLLM_COMPILE)


@dataclass(frozen=True)
class PipelineSpec:
    model: ModelConfig
    graph: GraphConfig
    workload: Workload
    max_steps: int
    fia_contract: str = "strict"
    features: tuple[StepFeature, ...] = ()
    num_speculative_tokens: int = 0
    drafter_layers: int = 1

    @property
    def max_blocks_per_req(self) -> int:
        return -(-self.model.max_model_len // self.model.block_size)

    def planner_config(self) -> PlannerConfig:
        g = self.graph
        return PlannerConfig(g.mode, g.capture_sizes, g.max_num_seqs, g.uniform_decode_query_len,
                             self.model.block_size, self.max_blocks_per_req, g.fia_padding,
                             self.num_speculative_tokens, g.mixed_full_key_num_reqs, g.pad_requests_without_full,
                             g.dp_padding, g.spec_decode_needs_computed)


@dataclass
class Path:
    name: str
    batcher: Batcher | ExplicitBatcher
    model: DecoderLM
    kv_cache: PagedKVCache
    tokens: dict[str, list[int]]
    prompt_lengths: dict[str, int]
    drafter: Drafter | None = None
    finished: bool = False


def run_pipeline(spec: PipelineSpec, engine: Engine, record: RunRecord, ctx: RankContext = SINGLE_RANK,
                 rank_model: Callable[[DecoderLM], DecoderLM] | None = None, reference: bool = True) -> RunRecord:
    """Execute ``spec`` on ``engine``, filling ``record`` (also when something raises).

    ``reference=False``: skip the reference path and the plain greedy decode, which a peer
    with the same requests computes (``harness.features.layout.runs_reference``)."""
    g = spec.graph
    planner_config = spec.planner_config()
    drafter_param_update = feature_fix(spec.features, "drafter_param_update")
    register_updatable_ops(engine)
    # Every tensor of the run lives on the engine's device; the known-bad pipeline leaves them on the host.
    device = engine.device if g.fixes.device_placement else torch.device("cpu")
    reference_model = build_model(spec.model, device)
    model = rank_model(reference_model) if rank_model else reference_model
    draft = draft_model(reference_model, spec.drafter_layers) if spec.num_speculative_tokens else None
    paths = {name: _new_path(name, spec, reference_model if name == "reference" else model, draft)
             for name in PATHS}
    record.reference_here = reference
    paths["reference"].finished = not reference
    style = next((s for f in spec.features if (s := f.attention_style(ctx)) is not None), AttentionStyle())
    # One planner per path that is dispatched: each path has its own scheduler state.
    planners = {name: StepPlanner(planner_config, spec.features, ctx) for name in ("padded", "graph")}
    eager = {"reference": EagerRunner(reference_model, paths["reference"].kv_cache),
             "padded": EagerRunner(model, paths["padded"].kv_cache, style)}
    runner = GraphRunner(engine, model, paths["graph"].kv_cache,
                         RunnerConfig(max(g.capture_sizes, default=1), g.max_num_seqs, spec.max_blocks_per_req,
                                      g.warmup_runs, g.fixes, g.mode, g.debug_input_addresses, g.attention_path,
                                      g.capture_error_guidance), style)
    drafter = paths["graph"].drafter
    if drafter is not None:  # the draft model's graphs, captured with the target's, in the same pool
        drafter.graphs = runner.drafter = DraftGraphRunner(
            engine, drafter.model, drafter.kv_cache,
            DraftGraphConfig(g.mode, g.capture_sizes, g.max_num_seqs, spec.num_speculative_tokens,
                             spec.max_blocks_per_req, graphs=g.drafter_graphs,
                             full_graphs=g.attention_path is AttentionPath.HOST_LISTS, fia_padding=g.fia_padding,
                             mixed_full_key_num_reqs=g.mixed_full_key_num_reqs,
                             pad_requests_without_full=g.pad_requests_without_full,
                             param_update=drafter_param_update,
                             debug_input_addresses=g.debug_input_addresses,
                             capture_error_guidance=g.capture_error_guidance),
            pool=runner.pool, monitor=runner.monitor)
    with observe_fia_calls() as calls, fia_contract(spec.fia_contract):  # type: ignore[arg-type]
        record.fia_calls = calls
        started = time.perf_counter()
        try:
            with fia_call_tags(path="graph"):
                runner.capture(planners["graph"].capture_plans())
        except Exception as error:  # noqa: BLE001 - a failed capture is a finding, not a crash
            record.errors.append(PathError.of("graph", None, "capture", error))
            paths["graph"].finished = True
        # every rank runs the graph path, or none: a rank whose capture failed stops its peers'
        paths["graph"].finished = planners["graph"].any_rank(paths["graph"].finished)
        record.capture_seconds = time.perf_counter() - started
        record.graphs_captured = runner.graphs_captured
        record.draft_graphs_captured = runner.drafter.graphs_captured if runner.drafter is not None else 0
        record.stream_usage = dict(engine.stream_usage(), by_bucket=runner.streams_by_bucket)
        record.memory = dict(engine.memory_report())
        stepper = Stepper(spec, planners, runner, eager, ctx, record)
        for _ in range(spec.max_steps):
            if not stepper.step(paths):
                break
        stepper.finish(paths["graph"])
    ran = {name: path for name, path in paths.items() if reference or name != "reference"}
    record.texts = {
        name: {req: ids[path.prompt_lengths[req]:] for req, ids in path.tokens.items()}
        for name, path in ran.items()
    }
    record.unfinished = {name: path.batcher.unfinished() for name, path in ran.items()}
    if spec.num_speculative_tokens and reference:
        record.texts["plain"], record.unfinished["plain"] = plain_greedy_texts(spec, reference_model)
    runner.release()
    return record


def plain_greedy_texts(spec: PipelineSpec, model: DecoderLM) -> tuple[dict[str, list[int]], list[str]]:
    """The same workload decoded greedily without speculation: what spec decode must equal.

    Returns the texts and the requests still unfinished when its steps ran out (it runs
    ``1 + k`` times the steps of a speculating path, which makes at most ``1 + k`` tokens a step)."""
    plain = replace(spec, num_speculative_tokens=0, graph=replace(spec.graph, uniform_decode_query_len=1))
    path = _new_path("plain", plain, model)
    runner = EagerRunner(model, path.kv_cache)
    for _ in range(spec.max_steps * (1 + spec.num_speculative_tokens)):
        if path.batcher.done:
            break
        step = path.batcher.next_step()
        if step is None:
            path.batcher.commit(None, {}, {})
            continue
        meta = build_attention_metadata(step.requests, spec.model.block_size, spec.max_blocks_per_req)
        logits = runner.execute(step_inputs(step, path.tokens, meta, {}))
        step_out = accept(step, meta, logits, path.tokens, {}, path.batcher)
        path.batcher.commit(step, step_out.advanced, step_out.generated)
    return {req: ids[path.prompt_lengths[req]:] for req, ids in path.tokens.items()}, path.batcher.unfinished()


def _new_path(name: str, spec: PipelineSpec, model: DecoderLM, draft: DecoderLM | None = None) -> Path:
    m, w = spec.model, spec.workload
    q = 1 + spec.num_speculative_tokens
    if w.explicit:
        explicit = ExplicitBatcher(w.explicit, block_size=m.block_size, num_blocks=m.num_blocks,
                                   max_model_len=m.max_model_len)
        batcher: Batcher | ExplicitBatcher = explicit
        lengths = dict(explicit.prompt_lengths)
    else:
        batcher = Batcher(w.requests, m.block_size, m.num_blocks, spec.graph.max_num_seqs,
                          w.max_num_batched_tokens, decode_query_len=q)
        lengths = {r.req_id: r.prompt_len for r in w.requests}
    tokens = prompt_tokens(list(lengths), list(lengths.values()), m.vocab_size, w.prompt_seed)
    # The drafter is a small single-rank model on every rank, cut from the full target.
    drafter = Drafter(draft, spec.num_speculative_tokens) if draft is not None else None
    return Path(name, batcher, model, make_kv_cache(model.config, model.parallel, model.device), tokens, lengths,
                drafter)


#: A token the host has scheduled but not read yet (async scheduling): the device fills it in.
PENDING_TOKEN = -1


@dataclass
class InFlight:
    """The graph step launched but not read (async scheduling keeps one)."""

    step: Step
    plan: StepPlan
    rec: StepRecord
    launched: Launched
    rows: dict[str, int]  # request -> its row of the step's device samples
    placeholders: dict[str, int]  # request -> where its token to come sits in the path's text


def _owner(step: Step | None, position: int, meta: AttentionMetadata) -> str | None:
    """The request whose input ``position`` is (None: a padding token)."""
    starts = meta.query_start_loc
    for i, req in enumerate(step.requests if step else ()):
        if starts[i] <= position < starts[i + 1]:
            return req.req_id
    return None


class Stepper:
    """One step of every path: plan it (the planner), execute the plan, sample, commit."""

    def __init__(self, spec: PipelineSpec, planners: dict[str, StepPlanner], runner: GraphRunner,
                 eager: dict[str, EagerRunner], ctx: RankContext, record: RunRecord) -> None:
        self.spec, self.planners, self.runner, self.eager = spec, planners, runner, eager
        self.ctx, self.record = ctx, record
        self.async_scheduling = spec.graph.async_scheduling
        self.in_flight: InFlight | None = None  # the graph step launched and not yet read (async scheduling)
        # The comparison paths run on a stream of their own: their host reads must not wait for
        # the graph path's queued work, which would hide what async scheduling exposes. It
        # starts after everything issued so far (the weights' copies).
        engine = runner.engine
        self.eager_stream = engine.Stream()
        self.eager_stream.wait_stream(engine.current_stream())

    def step(self, paths: dict[str, Path]) -> bool:
        """Run one step on every path still running; False once every path has finished."""
        rec: StepRecord | None = None
        progressed = False
        for name in PATHS:
            path = paths[name]
            if path.finished:
                continue
            step = path.batcher.next_step()
            plan = self._plan(name, step)
            if plan is None:  # no rank of this path has a batch now: done, or waiting for arrivals
                failed = name == "graph" and not self._resolve(path, self._take_in_flight())
                pending = not path.batcher.done and not failed
                path.finished = not self._on_any_rank(name, pending)
                if not path.finished:
                    path.batcher.commit(None, {}, {})
                    progressed = True
                continue
            progressed = True
            if name == "graph" or rec is None:
                rec = self._record(step, plan, rec, path.batcher.index)
            failed = False
            previous = self._take_in_flight() if name == "graph" else None
            try:
                self._execute(name, path, step, plan, rec, previous)
            except Exception as error:  # noqa: BLE001 - recorded; the other paths go on
                self.record.errors.append(PathError.of(name, path.batcher.index, "step", error,
                                                       bucket=plan.num_tokens_padded))
                failed = True
            # async scheduling reads a step once the next one is launched (or failed to launch)
            failed = not self._resolve(path, previous) or failed
            if failed:  # what was launched after a failure is not read (the device was reset)
                self.in_flight = None
            path.finished = self._on_any_rank(name, failed)  # a peer's failure stops this rank's path too
        if rec is not None:
            self.record.steps.append(rec)
        return progressed

    def _on_any_rank(self, name: str, flag: bool) -> bool:
        """``flag`` on any rank of the path's group; the reference path runs alone on each rank."""
        return flag if name == "reference" else self.planners[name].any_rank(flag)

    def _plan(self, name: str, step: Step | None) -> StepPlan | None:
        if name == "reference":
            return self.planners["graph"].reference(step)
        return self.planners[name].plan(step)

    def _record(self, step: Step | None, plan: StepPlan, previous: StepRecord | None, index: int) -> StepRecord:
        """The step's record; ``index`` is the path's step count (an idle DP rank has no step of
        its own, but it runs the same step as its busy peers)."""
        meta, padded = plan.meta, plan.padded
        index = step.index if step else (previous.step if previous else index)
        requests = [(r.req_id, r.num_computed_tokens, r.num_new_tokens) for r in step.requests] if step else []
        rec = StepRecord(
            step=index, requests=requests, num_tokens=meta.num_actual_tokens, uniform_decode=plan.uniform,
            runtime_mode=str(plan.runtime_mode), num_tokens_padded=plan.num_tokens_padded,
            num_reqs=meta.num_reqs, num_reqs_padded=padded.num_reqs_padded, padding_source=padded.padding_source,
            dispatch_reason=plan.dispatch_reason, ledger=plan.ledger.to_dict(), descriptor=_descriptor(plan),
            metadata=_host_lists(padded),
            reference_metadata=_host_lists(meta),
        )
        if previous is not None:  # keep what the reference path already put there
            rec.sampled, rec.generated, rec.proposed = previous.sampled, previous.generated, previous.proposed
            rec.logits, rec.seconds = previous.logits, previous.seconds
        return rec

    def _execute(self, name: str, path: Path, step: Step | None, plan: StepPlan, rec: StepRecord,
                 previous: InFlight | None = None) -> None:
        drafts: dict[str, list[int]] = {}
        tags = dict(step=rec.step, bucket=plan.num_tokens_padded, runtime_mode=str(plan.runtime_mode),
                    padding=plan.padded.padding_source)
        with fia_call_tags(path=name, **tags):
            try:
                if path.drafter is not None and step is not None:
                    with fia_call_tags(phase="draft"):
                        drafts = path.drafter.propose(step, path.tokens, plan,
                                                      fix_on=feature_fix(self.spec.features, "drafter_unpadded"))
                    if name == "graph":
                        rec.draft = path.drafter.last
                inputs = step_inputs(step, path.tokens, plan.padded, drafts)
            finally:
                if name == "graph":  # a collective (DP's shape check): a rank whose drafter raised joins it too
                    for feature in self.spec.features:
                        feature.before_forward(plan.run_shape, self.ctx, rec.step)
            with fia_call_tags(phase="step"):
                if name == "graph" and self.async_scheduling:
                    self._launch(path, step, plan, rec, inputs, previous)
                    return
                # each path's wall time to its logits on the host (what a replay buys over eager)
                started = time.perf_counter()
                if name == "graph":
                    logits, rec.executed = self.runner.execute(plan, inputs.input_ids)
                    rec.host_lists_unverifiable = plan.runtime_mode is CUDAGraphMode.FULL and rec.executed is None
                else:
                    with self.runner.engine.stream(self.eager_stream):
                        logits = self.eager[name].execute(inputs, attention=plan.builds_attention).cpu()
                rec.seconds[name] = time.perf_counter() - started
        if plan.kind is PlanKind.IDLE:  # an idle DP rank ran dummies: nothing to sample
            path.batcher.commit(None, {}, {})
            return
        assert step is not None
        rec.logits[name] = logits = logits.cpu()  # the record's evidence lives on the host
        step_out = accept(step, plan.meta, logits, path.tokens, drafts, path.batcher)
        rec.sampled[name], rec.generated[name] = step_out.sampled, step_out.verified
        if drafts:
            rec.proposed[name] = drafts
            stats = self.record.speculation.setdefault(name, {"proposed": 0, "accepted": 0})
            stats["proposed"] += sum(len(d) for d in drafts.values())
            stats["accepted"] += sum(step_out.advanced[r] - 1 for r in drafts)
        path.batcher.commit(step, step_out.advanced, step_out.generated)

    def _launch(self, path: Path, step: Step | None, plan: StepPlan, rec: StepRecord, inputs: StepInputs,
                previous: InFlight | None) -> None:
        """Async scheduling (vLLM ``--async-scheduling``): launch the step and schedule the next
        one without reading it. Tokens of the step before that the host has not read are
        placeholders in the inputs, filled on the device from that step's samples; this step's
        tokens become placeholders in turn (the scheduler needs only their count: one a request)."""
        fills = []
        for position, token in enumerate(inputs.input_ids):
            if token == PENDING_TOKEN:
                owner = _owner(step, position, plan.meta)
                if previous is None or owner not in previous.rows:
                    raise ValueError(f"step {rec.step}: request {owner}'s last token is neither read nor in flight")
                fills.append((position, previous.rows[owner]))
        rows = [plan.meta.query_start_loc[i + 1] - 1 for i in range(len(step.requests))] if step else []
        launched = self.runner.launch(plan, inputs.input_ids, fills, previous.launched if previous else None, rows,
                                      read_back=True)
        if plan.kind is PlanKind.IDLE or step is None:  # an idle DP rank ran dummies: nothing to sample
            path.batcher.commit(None, {}, {})
            return
        placeholders: dict[str, int] = {}
        for req in step.requests:
            known = path.tokens[req.req_id]
            if req.seq_len == len(known):  # the step reaches the end of the known text: a token to come
                placeholders[req.req_id] = len(known)
                known.append(PENDING_TOKEN)
        self.in_flight = InFlight(step, plan, rec, launched, {r.req_id: i for i, r in enumerate(step.requests)},
                                  placeholders)
        path.batcher.commit(step, {r.req_id: r.num_new_tokens for r in step.requests},
                            {r.req_id: 1 for r in step.requests})

    def _take_in_flight(self) -> InFlight | None:
        flight, self.in_flight = self.in_flight, None
        return flight

    def _resolve(self, path: Path, flight: InFlight | None) -> bool:
        """Read a launched graph step, if any, into its record and the path's text; False (the
        error recorded at that step) when waiting for it failed."""
        if flight is None:
            return True
        rec = flight.rec
        try:
            with fia_call_tags(path="graph", step=rec.step, phase="step"):
                logits, rec.executed = self.runner.resolve(flight.launched)
        except Exception as error:  # noqa: BLE001 - a finding of that step
            self.record.errors.append(PathError.of("graph", rec.step, "step", error,
                                                   bucket=flight.plan.num_tokens_padded))
            return False
        rec.host_lists_unverifiable = flight.plan.runtime_mode is CUDAGraphMode.FULL and rec.executed is None
        rec.logits["graph"] = logits
        greedy = logits.argmax(dim=-1).tolist()
        starts = flight.plan.meta.query_start_loc
        firsts = [int(greedy[starts[i + 1] - 1]) for i in range(len(flight.step.requests))]
        for req_id, index in flight.placeholders.items():
            path.tokens[req_id][index] = firsts[flight.rows[req_id]]
        rec.sampled["graph"] = firsts
        rec.generated["graph"] = [[token] for token in firsts]
        return True

    def finish(self, graph_path: Path) -> None:
        """Read the last graph step still in flight (the steps ran out before it was read)."""
        if not self._resolve(graph_path, self._take_in_flight()):
            graph_path.finished = True


def feature_fix(features: Sequence[StepFeature], switch: str) -> bool:
    """Whether fix ``switch`` is on: off when a speculating feature declares it switched off
    (the known-bad drafter); a feature that does not declare it leaves it on."""
    return all(f.fix_states.get(switch, True) for f in features if f.extra_query_tokens())


def step_inputs(step: Step | None, tokens: dict[str, list[int]], meta: AttentionMetadata,
                drafts: dict[str, list[int]]) -> StepInputs:
    """Input ids of a step: each request's known tokens, its drafts, then zeros for padding."""
    ids: list[int] = []
    for req in step.requests if step else ():
        known = tokens[req.req_id][req.num_computed_tokens : req.seq_len]
        ids.extend(known + drafts.get(req.req_id, [])[: req.num_new_tokens - len(known)])
    ids.extend([0] * (meta.num_input_tokens - len(ids)))
    return StepInputs(meta, ids)


def _descriptor(plan: StepPlan) -> JsonObject | None:
    key = plan.decision.batch_descriptor if plan.decision else None
    return None if key is None else {"num_tokens": key.num_tokens, "num_reqs": key.num_reqs,
                                     "uniform_decode": key.uniform_decode}


def _host_lists(meta: AttentionMetadata) -> JsonObject:
    return {
        "query_start_loc": list(meta.query_start_loc),
        "actual_seq_lengths": list(meta.actual_seq_lengths),
        "actual_seq_lengths_kv": list(meta.seq_lens),
        "block_table": [list(row) for row in meta.block_table],
        "slot_mapping": list(meta.slot_mapping),
        "num_input_tokens": meta.num_input_tokens,
    }


def prompt_tokens(req_ids: Sequence[str], lengths: Sequence[int], vocab_size: int, seed: int) -> dict[str, list[int]]:
    """Seeded prompt token ids, one list per request."""
    generator = torch.Generator().manual_seed(seed)
    return {
        req: torch.randint(0, vocab_size, (n,), generator=generator).tolist()
        for req, n in zip(req_ids, lengths)
    }
