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
from typing import Any, Callable, Sequence

import torch

from harness.graph.dispatcher import DispatchDecision
from harness.graph.metadata import AttentionMetadata, ScheduledRequest, build_attention_metadata
from harness.graph.modes import CUDAGraphMode
from harness.graph.record import PATHS, PathError, RunRecord, StepRecord
from harness.graph.runner import AttentionStyle, EagerRunner, GraphConfig, GraphRunner, StepInputs
from harness.graph.scheduler import Batcher, ExplicitBatcher, RequestPlan, Step
from harness.graph.shape import SINGLE_RANK, RankContext, StepShape
from harness.model import DecoderLM, ModelConfig, PagedKVCache, build_model
from harness.model.parallel import make_kv_cache
from harness.ops import fia_call_tags, fia_contract, observe_fia_calls, register_updatable_ops


@dataclass(frozen=True)
class Workload:
    """Either planned requests (continuous batching) or explicit per-step batches."""

    requests: tuple[RequestPlan, ...] = ()
    explicit: tuple[tuple[tuple[str, int], ...], ...] = ()
    max_num_batched_tokens: int = 512
    prompt_seed: int = 0


@dataclass(frozen=True)
class PipelineSpec:
    model: ModelConfig
    graph: GraphConfig
    workload: Workload
    max_steps: int
    fia_contract: str = "strict"
    features: tuple[Any, ...] = ()  # harness.features.Feature instances (duck-typed hooks)
    num_speculative_tokens: int = 0
    drafter_layers: int = 1


@dataclass
class Path:
    name: str
    batcher: Any
    model: DecoderLM
    kv_cache: PagedKVCache
    tokens: dict[str, list[int]]
    prompt_lengths: dict[str, int]
    drafter: "Drafter | None" = None
    finished: bool = False


def run_pipeline(spec: PipelineSpec, engine: Any, record: RunRecord, ctx: RankContext = SINGLE_RANK,
                 rank_model: Callable[[DecoderLM], DecoderLM] | None = None) -> RunRecord:
    """Execute ``spec`` on ``engine``, filling ``record`` (also when something raises)."""
    register_updatable_ops(engine)
    reference_model = build_model(spec.model)
    model = rank_model(reference_model) if rank_model else reference_model
    paths = {name: _new_path(name, spec, reference_model if name == "reference" else model, reference_model)
             for name in PATHS}
    max_blocks = -(-spec.model.max_model_len // spec.model.block_size)
    style = next((s for f in spec.features if (s := f.attention_style(ctx)) is not None), AttentionStyle())
    runner = GraphRunner(engine, model, paths["graph"].kv_cache, spec.graph, max_blocks_per_req=max_blocks,
                         style=style, rank_metadata=lambda meta: _rank_metadata(spec, ctx, meta))
    eager = {"reference": EagerRunner(reference_model, paths["reference"].kv_cache),
             "padded": EagerRunner(model, paths["padded"].kv_cache, style)}
    with observe_fia_calls() as calls, fia_contract(spec.fia_contract):  # type: ignore[arg-type]
        record.fia_calls = calls
        started = time.perf_counter()
        try:
            with fia_call_tags(path="graph"):
                runner.capture()
        except Exception as error:  # noqa: BLE001 - a failed capture is a finding, not a crash
            record.errors.append(PathError("graph", None, "capture", type(error).__name__, str(error)))
            paths["graph"].finished = True
        record.capture_seconds = time.perf_counter() - started
        record.graphs_captured = runner.graphs_captured
        record.stream_usage = dict(engine.stream_usage(), by_bucket=runner.streams_by_bucket)
        record.memory = dict(engine.memory_report())
        stepper = Stepper(spec, runner, eager, ctx, record)
        for _ in range(spec.max_steps):
            if not stepper.step(paths):
                break
    record.texts = {
        name: {req: ids[path.prompt_lengths[req]:] for req, ids in path.tokens.items()}
        for name, path in paths.items()
    }
    if spec.num_speculative_tokens:
        record.texts["plain"] = plain_greedy_texts(spec, reference_model)
    runner.release()
    return record


def plain_greedy_texts(spec: PipelineSpec, model: DecoderLM) -> dict[str, list[int]]:
    """The same workload decoded greedily without speculation: what spec decode must equal."""
    plain = replace(spec, num_speculative_tokens=0, graph=replace(spec.graph, uniform_decode_query_len=1))
    path = _new_path("plain", plain, model)
    runner = EagerRunner(model, path.kv_cache)
    max_blocks = -(-spec.model.max_model_len // spec.model.block_size)
    for _ in range(spec.max_steps * (1 + spec.num_speculative_tokens)):
        if path.batcher.done:
            break
        step = path.batcher.next_step()
        if step is None:
            path.batcher.commit(None, {}, {})
            continue
        meta = build_attention_metadata(step.requests, spec.model.block_size, max_blocks)
        logits = runner.execute(step_inputs(step, path.tokens, meta, {}))
        advanced, generated, _ = accept(step, meta, logits, path.tokens, {}, path.batcher)
        path.batcher.commit(step, advanced, generated)
    return {req: ids[path.prompt_lengths[req]:] for req, ids in path.tokens.items()}


def _new_path(name: str, spec: PipelineSpec, model: DecoderLM, full_model: DecoderLM | None = None) -> Path:
    m, w = spec.model, spec.workload
    q = 1 + spec.num_speculative_tokens
    if w.explicit:
        batcher: Any = ExplicitBatcher(w.explicit, block_size=m.block_size, num_blocks=m.num_blocks,
                                       max_model_len=m.max_model_len)
        lengths = dict(batcher.prompt_lengths)
    else:
        batcher = Batcher(w.requests, m.block_size, m.num_blocks, spec.graph.max_num_seqs,
                          w.max_num_batched_tokens, decode_query_len=q)
        lengths = {r.req_id: r.prompt_len for r in w.requests}
    tokens = prompt_tokens(list(lengths), list(lengths.values()), m.vocab_size, w.prompt_seed)
    # The drafter is a small single-rank model on every rank, cut from the full target.
    drafter = Drafter(full_model or model, spec) if spec.num_speculative_tokens else None
    return Path(name, batcher, model, make_kv_cache(model.config, model.parallel), tokens, lengths, drafter)


@dataclass
class Planned:
    meta: AttentionMetadata
    decision: DispatchDecision
    padded: AttentionMetadata
    ledger: dict[str, int]
    uniform: bool


class Stepper:
    """One step of every path: plan (dispatch, padding, features), execute, sample, commit."""

    def __init__(self, spec: PipelineSpec, runner: GraphRunner, eager: dict[str, EagerRunner],
                 ctx: RankContext, record: RunRecord) -> None:
        self.spec, self.runner, self.eager, self.ctx, self.record = spec, runner, eager, ctx, record

    def step(self, paths: dict[str, Path]) -> bool:
        """Run one step on every path still running; False once every path has finished."""
        rec: StepRecord | None = None
        progressed = False
        for name in PATHS:
            path = paths[name]
            if path.finished:
                continue
            step = path.batcher.next_step()
            planned = self._plan(name, step)
            if planned is None:  # no rank of this path has work left
                path.finished = path.batcher.done
                if not path.finished:
                    path.batcher.commit(None, {}, {})
                    progressed = True
                continue
            progressed = True
            if name == "graph" or rec is None:
                rec = self._record(step, planned, rec)
            try:
                self._execute(name, path, step, planned, rec)
            except Exception as error:  # noqa: BLE001 - recorded; the other paths go on
                self.record.errors.append(PathError(name, path.batcher.index, "step", type(error).__name__,
                                                    str(error), bucket=planned.decision.num_tokens_padded))
                path.finished = True
        if rec is not None:
            self.record.steps.append(rec)
        return progressed

    # -- planning ----------------------------------------------------------------------------
    def _plan(self, name: str, step: Step | None) -> Planned | None:
        runner = self.runner
        if name == "reference":
            if step is None:
                return None
            meta = runner.metadata(step.requests)
            decision = DispatchDecision(CUDAGraphMode.NONE, None, meta.num_actual_tokens, "reference: eager")
            return Planned(meta, decision, meta, {"real": meta.num_actual_tokens}, runner.is_uniform(meta))
        meta = runner.metadata(step.requests) if step else None
        if meta is not None:
            decision = runner.decide(meta)
            uniform = runner.is_uniform(meta)
            real = meta.num_actual_tokens
        else:
            # An idle rank never vetoes a graph: the busy ranks' modes decide (min over ranks).
            decision = DispatchDecision(CUDAGraphMode.FULL, None, 0, "idle rank")
            uniform, real = True, 0
        ledger = {"real": real, "bucket": decision.num_tokens_padded - real}
        drafts = sum(r.num_new_tokens - 1 for r, d in zip(step.requests, step.decodes) if d) if step else 0
        if self.spec.num_speculative_tokens and drafts:  # draft tokens ride along as real rows
            ledger.update(real=real - drafts, spec=drafts)
        tokens = decision.num_tokens_padded
        added: dict[Any, int] = {}  # feature -> tokens it added to T (its padding fix covers them)
        for feature in self.spec.features:
            padded = feature.pad_tokens(tokens) if tokens else 0
            added[feature] = padded - tokens
            tokens = padded
        shape = StepShape(tokens, str(decision.runtime_mode), uniform, has_work=step is not None)
        for feature in self.spec.features:
            agreed = feature.agree(shape, self.ctx)
            added[feature] += agreed.num_tokens - shape.num_tokens
            shape = agreed
        ledger.update({f.ledger: n for f, n in added.items() if n})
        if not shape.has_work:
            return None
        if meta is None:  # this rank is idle but another is not: run the agreed shape on dummies
            meta = runner.idle_metadata(shape.num_tokens)
            ledger = {"real": 0, "dp": shape.num_tokens}
        if (shape.num_tokens, shape.runtime_mode) != (decision.num_tokens_padded, str(decision.runtime_mode)):
            decision = runner.redecide(shape, meta)
        padded = _rank_metadata(self.spec, self.ctx, self._pad(meta, decision, added))
        return Planned(meta, decision, padded, ledger, uniform)

    def _pad(self, meta: AttentionMetadata, decision: DispatchDecision, added: dict[Any, int]) -> AttentionMetadata:
        """Pad the metadata to T; features whose padding fix is off leave their tokens out."""
        if meta.num_actual_tokens == 0:
            return meta  # idle-rank metadata is padded already
        unfixed = {f: n for f, n in added.items() if n and not f.fix_on}
        covered = decision.num_tokens_padded - sum(unfixed.values())
        padded = self.runner.pad(meta, replace(decision, num_tokens_padded=covered))
        if unfixed:
            why = ", ".join(f"{f.name} added {n} token(s) with its fix {f.fix} off" for f, n in unfixed.items())
            padded = _extend_tokens(padded, decision.num_tokens_padded, why)
        return padded

    def _record(self, step: Step | None, planned: Planned, previous: StepRecord | None) -> StepRecord:
        meta, padded, decision = planned.meta, planned.padded, planned.decision
        index = step.index if step else (previous.step if previous else -1)
        requests = [(r.req_id, r.num_computed_tokens, r.num_new_tokens) for r in step.requests] if step else []
        rec = StepRecord(
            step=index, requests=requests, num_tokens=meta.num_actual_tokens, uniform_decode=planned.uniform,
            runtime_mode=str(decision.runtime_mode), num_tokens_padded=decision.num_tokens_padded,
            num_reqs=meta.num_reqs, num_reqs_padded=padded.num_reqs_padded, padding_source=padded.padding_source,
            dispatch_reason=decision.reason, ledger=dict(planned.ledger), metadata=_host_lists(padded),
            reference_metadata=_host_lists(meta),
        )
        if previous is not None:  # keep what the reference path already put there
            rec.sampled, rec.logits = previous.sampled, previous.logits
        return rec

    # -- execution ---------------------------------------------------------------------------
    def _execute(self, name: str, path: Path, step: Step | None, planned: Planned, rec: StepRecord) -> None:
        spec = self.spec
        drafts: dict[str, list[int]] = {}
        tags = dict(step=rec.step, bucket=planned.decision.num_tokens_padded,
                    runtime_mode=str(planned.decision.runtime_mode), padding=planned.padded.padding_source)
        with fia_call_tags(path=name, **tags):
            if path.drafter is not None and step is not None:
                with fia_call_tags(phase="draft"):
                    drafts = path.drafter.propose(step, path.tokens, planned, fix_on=self._drafter_fix_on())
            inputs = step_inputs(step, path.tokens, planned.padded if name != "reference" else planned.meta, drafts)
            with fia_call_tags(phase="step"):
                if name == "graph":
                    shape = StepShape(planned.decision.num_tokens_padded, str(planned.decision.runtime_mode),
                                      planned.uniform)
                    for feature in spec.features:
                        feature.before_forward(shape, self.ctx, rec.step)
                    logits, rec.executed = self.runner.execute(inputs, planned.decision)
                    rec.host_lists_unverifiable = rec.runtime_mode == "FULL" and rec.executed is None
                else:
                    logits = self.eager[name].execute(inputs)
        if step is None:  # an idle DP rank ran dummies: nothing to sample
            path.batcher.commit(None, {}, {})
            return
        rec.logits[name] = logits
        advanced, generated, sampled = accept(step, planned.meta, logits, path.tokens, drafts, path.batcher)
        rec.sampled[name] = sampled
        if drafts:
            stats = self.record.speculation.setdefault(name, {"proposed": 0, "accepted": 0})
            stats["proposed"] += sum(len(d) for d in drafts.values())
            stats["accepted"] += sum(advanced[r] - 1 for r in drafts)
        if path.drafter is not None:
            path.drafter.rewind(step, advanced)
        path.batcher.commit(step, advanced, generated)

    def _drafter_fix_on(self) -> bool:
        return all(f.fix_on for f in self.spec.features if f.fix == "drafter_unpadded")


def _rank_metadata(spec: PipelineSpec, ctx: RankContext, meta: AttentionMetadata) -> AttentionMetadata:
    for feature in spec.features:
        meta = feature.rank_metadata(meta, ctx, spec.model.block_size)
    return meta


def step_inputs(step: Step | None, tokens: dict[str, list[int]], meta: AttentionMetadata,
                drafts: dict[str, list[int]]) -> StepInputs:
    """Input ids of a step: each request's known tokens, its drafts, then zeros for padding."""
    ids: list[int] = []
    for req in step.requests if step else ():
        known = tokens[req.req_id][req.num_computed_tokens : req.seq_len]
        ids.extend(known + drafts.get(req.req_id, [])[: req.num_new_tokens - len(known)])
    ids.extend([0] * (meta.num_input_tokens - len(ids)))
    return StepInputs(meta, ids)


def accept(step: Step, meta: AttentionMetadata, logits: torch.Tensor, tokens: dict[str, list[int]],
           drafts: dict[str, list[int]], batcher: Any) -> tuple[dict[str, int], dict[str, int], list[int]]:
    """Greedy sampling, and greedy acceptance of draft tokens (the longest agreeing prefix).

    Returns, per request, the KV entries the step made valid, the tokens it generated, and the
    first greedy token of each request (what the per-step comparison looks at).
    """
    advanced: dict[str, int] = {}
    generated: dict[str, int] = {}
    firsts: list[int] = []
    starts = meta.query_start_loc
    for i, req in enumerate(step.requests):
        rows = logits[starts[i] : starts[i + 1]].argmax(dim=-1).tolist()
        proposal = drafts.get(req.req_id, [])
        known = tokens[req.req_id]
        if proposal:  # verify: rows[j] is the target's token after input j
            accepted = 0
            while accepted < len(proposal) and proposal[accepted] == rows[accepted]:
                accepted += 1
            new = rows[: accepted + 1][: batcher.remaining_output(req.req_id)]
            known.extend(new)
            advanced[req.req_id], generated[req.req_id] = accepted + 1, len(new)
        else:
            if req.seq_len == len(known):  # the step reached the end of the known text
                known.append(int(rows[-1]))
            advanced[req.req_id], generated[req.req_id] = req.num_new_tokens, 1
        firsts.append(int(rows[-1] if not proposal else rows[0]))
    return advanced, generated, firsts


class Drafter:
    """The draft model of speculative decoding: the target's first layers, run eagerly.

    Round 1 feeds each decode request the tokens the drafter has not seen yet (a mixed batch);
    rounds 2..k feed one token per request (uniform). Its metadata is its own and unpadded, as
    the ``drafter_unpadded`` fix requires; without the fix it gets the target's padded
    metadata for an unpadded input.
    """

    def __init__(self, target: DecoderLM, spec: PipelineSpec) -> None:
        config = replace(target.config, num_layers=min(spec.drafter_layers, target.config.num_layers))
        self.model = DecoderLM(config)
        shared = target.state_dict()
        self.model.load_state_dict({k: v for k, v in shared.items() if k in self.model.state_dict()})
        self.kv_cache = PagedKVCache(config)
        self.k = spec.num_speculative_tokens
        self.seen: dict[str, int] = {}
        self.max_blocks = -(-config.max_model_len // config.block_size)
        self.block_size = config.block_size

    def propose(self, step: Step, tokens: dict[str, list[int]], planned: Planned, *, fix_on: bool) -> dict[str, list[int]]:
        decoding = [r for r, is_decode in zip(step.requests, step.decodes) if is_decode]
        if not decoding:
            return {}
        runner = EagerRunner(self.model, self.kv_cache)
        drafts: dict[str, list[int]] = {r.req_id: [] for r in decoding}
        for round_ in range(self.k):
            batch = []
            for r in decoding:
                known = tokens[r.req_id] + drafts[r.req_id]
                start = self.seen.get(r.req_id, 0) if round_ == 0 else len(known) - 1
                batch.append(ScheduledRequest(r.req_id, start, len(known) - start, r.block_ids))
            meta = build_attention_metadata(batch, self.block_size, self.max_blocks)
            ids = [t for r, b in zip(decoding, batch) for t in (tokens[r.req_id] + drafts[r.req_id])[b.num_computed_tokens:]]
            if not fix_on and round_ > 0:  # the known-bad pipeline: the target's padded lists
                meta = _lengths_from(meta, planned.padded)  # for a one-token-per-request input
            with fia_call_tags(draft_round=round_ + 1):
                logits = runner.execute(StepInputs(meta, ids))
            ends = meta.query_start_loc[1 : len(batch) + 1]
            for r, end in zip(decoding, ends):
                drafts[r.req_id].append(int(logits[end - 1].argmax()))
            for r, b in zip(decoding, batch):
                self.seen[r.req_id] = b.seq_len
        return drafts

    def rewind(self, step: Step, advanced: dict[str, int]) -> None:
        """Keep only the drafter's KV entries that the target accepted."""
        for r in step.requests:
            valid = r.num_computed_tokens + advanced[r.req_id]
            self.seen[r.req_id] = min(self.seen.get(r.req_id, 0), valid)


def _lengths_from(meta: AttentionMetadata, padded: AttentionMetadata) -> AttentionMetadata:
    """The drafter bug: attention host lists copied from the target's padded metadata."""
    return replace(meta, query_start_loc=list(padded.query_start_loc), actual_seq_lengths=list(padded.actual_seq_lengths),
                   seq_lens=list(padded.seq_lens), block_table=[list(r) for r in padded.block_table],
                   num_reqs_padded=padded.num_reqs_padded, padding_source="drafter given the target's padded metadata")


def _extend_tokens(meta: AttentionMetadata, num_tokens: int, why: str) -> AttentionMetadata:
    """Pad tokens only (slot -1, position 0), leaving the request lists short of T."""
    extra = num_tokens - meta.num_input_tokens
    return replace(meta, num_input_tokens=num_tokens, slot_mapping=meta.slot_mapping + [-1] * extra,
                   positions=meta.positions + [0] * extra, padding_source=f"{meta.padding_source}; {why}")


def _host_lists(meta: AttentionMetadata) -> dict[str, Any]:
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
