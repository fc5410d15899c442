"""The step planner: one step in, one frozen :class:`StepPlan` out, its dispatch decided once.

Modelled on vLLM's split between ``CudagraphDispatcher`` (decides) and ``CUDAGraphWrapper``
(trusts the decision): the planner owns the dispatcher and everything that decides a step's
shape; the runner (:mod:`harness.graph.runner`) only executes plans.

A plan is made in this order, and nothing is decided twice:

1. the unpadded metadata of this rank's batch (or none: an idle DP rank);
2. this rank's own dispatch (an idle DP rank dispatches its dummy batch: vLLM Ascend's
   ``execute_dummy_batch``, one uniform request of ``q`` tokens), and the shape it proposes
   (:class:`StepShape`: its bucket-padded tokens and its own mode), then every feature's
   ``agree`` (DP all-reduces it: max tokens, min mode; a rank whose own mode is eager keeps its
   own count on newer stacks);
3. the re-dispatch at the agreed count within the agreed mode (vLLM Ascend
   ``_determine_batch_execution_and_padding``); without DP the first dispatch stands (the
   dispatcher also rounds eager batches up to the features' token multiple, e.g. SP's tp);
4. the metadata padded to the decision's token count (the FIA padding fix), minus the tokens
   of any feature whose fix is off (the known-bad pipeline), then each feature's view of it
   for this rank (CP shards it). A non-FULL runtime without SP pads the tokens only: the
   attention slices the query to the real ones (vLLM Ascend; ``metadata.slice_attention_metadata``);
5. the padding ledger: who added how many tokens to T.

The reference path (eager, unpadded) and an idle rank are plans of their own kind, not
invented dispatch decisions. Pure host logic: no torch, no engine.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, replace
from typing import Sequence

from harness.graph.capture_sizes import dummy_request_lens
from harness.graph.dispatcher import BatchDescriptor, DispatchDecision, Dispatcher, is_uniform_decode
from harness.graph.metadata import (
    PAD_SLOT_ID,
    AttentionMetadata,
    ScheduledRequest,
    build_attention_metadata,
    pad_attention_metadata,
    slice_attention_metadata,
)
from harness.graph.modes import CUDAGraphMode
from harness.graph.scheduler import Step
from harness.graph.shape import SINGLE_RANK, RankContext, RunShape, StepFeature, StepShape

__all__ = ["PaddingLedger", "PlanKind", "PlannerConfig", "StepPlan", "StepPlanner"]


class PlanKind(enum.Enum):
    REFERENCE = "reference"  # eager, unpadded: what the step should compute; never dispatched
    STEP = "step"  # this rank's batch, dispatched once
    IDLE = "idle"  # no batch on this rank: the agreed decision runs on dummy requests


@dataclass(frozen=True)
class PaddingLedger:
    """Where T came from: real tokens, draft tokens, the bucket, and each feature's share."""

    real: int
    spec: int = 0
    bucket: int = 0
    features: tuple[tuple[str, int], ...] = ()  # (ledger column, tokens), only non-zero ones

    @property
    def total(self) -> int:
        return self.real + self.spec + self.bucket + sum(n for _, n in self.features)

    def to_dict(self) -> dict[str, int]:
        out = {"real": self.real, "bucket": self.bucket}
        if self.spec:
            out["spec"] = self.spec
        out.update(self.features)
        return out


@dataclass(frozen=True)
class StepPlan:
    """Everything about one step on one path that is decided before it runs."""

    kind: PlanKind
    meta: AttentionMetadata  # unpadded (this rank's batch; the dummy batch of an idle rank)
    decision: DispatchDecision | None  # None for the reference path
    padded: AttentionMetadata  # what the path runs: padded, and this rank's view of it
    ledger: PaddingLedger
    shape: StepShape  # what the ranks agreed on (the dispatcher's input)
    uniform: bool  # this rank's batch is uniform decode

    @property
    def runtime_mode(self) -> CUDAGraphMode:
        return self.decision.runtime_mode if self.decision else CUDAGraphMode.NONE

    @property
    def num_tokens_padded(self) -> int:
        return self.decision.num_tokens_padded if self.decision else self.meta.num_actual_tokens

    @property
    def run_shape(self) -> RunShape:
        return RunShape(self.num_tokens_padded, self.runtime_mode)

    @property
    def builds_attention(self) -> bool:
        """Whether the step's attention gets metadata. An idle rank's dummy step builds none
        unless it replays a FULL graph (vLLM Ascend ``_dummy_run``:
        ``_should_build_dummy_attn_metadata`` is ``force_attention`` or FULL): its attention
        returns zeros and FIA is not called."""
        return self.kind is not PlanKind.IDLE or self.runtime_mode is CUDAGraphMode.FULL

    @property
    def dispatch_reason(self) -> str:
        return self.decision.reason if self.decision else "reference: eager, unpadded"


@dataclass(frozen=True)
class PlannerConfig:
    mode: CUDAGraphMode
    capture_sizes: tuple[int, ...]
    max_num_seqs: int
    uniform_decode_query_len: int
    block_size: int
    max_blocks_per_req: int
    fia_padding: bool = True  # the core fix: dummy requests so actual_seq_lengths[-1] == T
    num_speculative_tokens: int = 0
    # stack rules (harness.stacks): mixed FULL keys carry num_reqs; every non-FULL batch pads requests;
    # which DP ranks take the group's max count; spec decode's uniform batches need computed tokens
    mixed_full_key_num_reqs: bool = True
    pad_requests_without_full: bool = False
    dp_padding: str = "graph_ranks"  # "graph_ranks" (vLLM Ascend PR #7297) or "all_ranks"
    spec_decode_needs_computed: bool = True  # vLLM Ascend PR #6835


class StepPlanner:
    """Owns the dispatcher; turns each step of one path into a :class:`StepPlan`."""

    def __init__(self, config: PlannerConfig, features: Sequence[StepFeature] = (), ctx: RankContext = SINGLE_RANK) -> None:
        self.config, self.features, self.ctx = config, tuple(features), ctx
        multiple = math.lcm(1, *(f.token_multiple() for f in self.features))
        self.dispatcher = Dispatcher(config.mode, config.capture_sizes, config.uniform_decode_query_len,
                                     config.max_num_seqs, token_multiple=multiple,
                                     mixed_full_key_num_reqs=config.mixed_full_key_num_reqs)
        # vLLM Ascend pads the requests of a non-FULL batch only with SP and without CP (dcp):
        # each feature says whether it makes it so, forbids it, or has no say
        votes = [f.pads_requests_without_full() for f in self.features]
        self.pads_without_full = config.pad_requests_without_full or (True in votes and False not in votes)

    # -- what to capture ----------------------------------------------------------------------
    def capture_plans(self) -> list[tuple[CUDAGraphMode, BatchDescriptor, AttentionMetadata]]:
        """Every graph the dispatcher can name, with the dummy batch it is captured on."""
        return [(mode, key, self._dummy_metadata(key)) for mode, key in self.dispatcher.capture_keys()]

    def _dummy_metadata(self, key: BatchDescriptor) -> AttentionMetadata:
        """A legal batch of the key's shape, all of it in the null block (slot -1)."""
        cfg = self.config
        q = cfg.uniform_decode_query_len
        lens = [q] * (key.num_reqs or 1) if key.uniform_decode else dummy_request_lens(key.num_tokens, cfg.max_num_seqs)
        requests = [ScheduledRequest(f"dummy{i}", 0, n, (0,) * cfg.max_blocks_per_req) for i, n in enumerate(lens)]
        meta = self.metadata(requests)
        return self._rank_view(replace(meta, slot_mapping=[PAD_SLOT_ID] * meta.num_input_tokens))

    # -- per step -----------------------------------------------------------------------------
    def metadata(self, requests: Sequence[ScheduledRequest]) -> AttentionMetadata:
        return build_attention_metadata(requests, self.config.block_size, self.config.max_blocks_per_req)

    def is_uniform(self, meta: AttentionMetadata, requests: Sequence[ScheduledRequest]) -> bool:
        """Whether this batch is uniform decode: every request has ``q`` new tokens and, under
        speculative decoding, tokens computed already (vLLM Ascend PR #6835, ``is_all_decode``:
        a fresh prompt of exactly ``1 + k`` tokens is a prefill, not a decode)."""
        cfg = self.config
        if not is_uniform_decode(meta.query_lens, cfg.uniform_decode_query_len):
            return False
        if cfg.num_speculative_tokens and cfg.spec_decode_needs_computed:
            return all(r.num_computed_tokens > 0 for r in requests)
        return True

    def reference(self, step: Step | None) -> StepPlan | None:
        """The reference path's plan: this step eagerly, unpadded, on the single-rank model."""
        if step is None:
            return None
        meta = self.metadata(step.requests)
        uniform = self.is_uniform(meta, step.requests)
        return StepPlan(PlanKind.REFERENCE, meta, None, meta, PaddingLedger(meta.num_actual_tokens),
                        StepShape(meta.num_actual_tokens, uniform), uniform)

    def plan(self, step: Step | None) -> StepPlan | None:
        """This rank's plan for ``step`` (``None``: this rank has no batch).

        Returns None when no rank has work; an idle rank whose peers have work gets an IDLE plan.
        """
        cfg = self.config
        q = cfg.uniform_decode_query_len
        meta = self.metadata(step.requests) if step is not None else None
        if step is not None and meta is not None:
            uniform, real, num_reqs = self.is_uniform(meta, step.requests), meta.num_actual_tokens, meta.num_reqs
        else:  # execute_dummy_batch: _dummy_run(num_tokens=q, uniform_decode=True)
            uniform, real, num_reqs = True, q, 1
        own = self.dispatcher.dispatch(real, num_reqs, uniform)
        split = any(f.token_multiple() > 1 for f in self.features)
        accepts = cfg.dp_padding == "all_ranks" or own.runtime_mode is not CUDAGraphMode.NONE or split
        shape = StepShape(own.num_tokens_padded, uniform, has_work=meta is not None, mode=own.runtime_mode,
                          accepts_padding=accepts)
        proposed = shape
        added: dict[StepFeature, int] = {}  # feature -> tokens it added to T
        woke: StepFeature | None = None  # the feature that gave an idle rank work (DP: a busy peer)
        for feature in self.features:
            agreed = feature.agree(shape, self.ctx)
            if agreed.num_tokens != shape.num_tokens:
                added[feature] = agreed.num_tokens - shape.num_tokens
            if agreed.has_work and not shape.has_work:
                woke = feature
            shape = agreed
        if not shape.has_work:
            return None
        decision = own
        if (shape.num_tokens, shape.mode) != (proposed.num_tokens, proposed.mode):
            decision = self._redispatch(shape, uniform, num_reqs)
        tokens = decision.num_tokens_padded
        own_padding = own.num_tokens_padded - real
        if own.runtime_mode is CUDAGraphMode.NONE and own_padding:
            # The only padding of an eager batch: a feature's token multiple (SP's tp).
            owner = next(f for f in self.features if f.token_multiple() > 1)
            added[owner] = added.get(owner, 0) + own_padding
            bucket = 0
        else:
            bucket = own_padding
        bucket += tokens - shape.num_tokens  # what the re-dispatch padded beyond the agreed count
        if meta is None:
            assert woke is not None  # an idle rank that runs was woken by a peer's work
            idle = self._idle_metadata(decision)
            ledger = PaddingLedger(0, features=((woke.ledger or woke.name, tokens),))
            return StepPlan(PlanKind.IDLE, idle, decision, self._rank_view(idle), ledger, shape, True)
        assert step is not None  # meta is the step's
        drafts = sum(r.num_new_tokens - 1 for r, d in zip(step.requests, step.decodes) if d) \
            if cfg.num_speculative_tokens else 0
        ledger = PaddingLedger(real - drafts, drafts, bucket,
                               tuple((f.ledger or f.name, n) for f, n in added.items() if n))
        padded = self._rank_view(self._pad(meta, decision, added))
        return StepPlan(PlanKind.STEP, meta, decision, padded, ledger, shape, uniform)

    def _redispatch(self, shape: StepShape, uniform: bool, num_reqs: int) -> DispatchDecision:
        """The dispatch at the count the ranks agreed on, within the mode they agreed on.

        ``dp_padding == "graph_ranks"`` (vLLM Ascend since PRs #6944, #7297): ``valid_modes`` is
        the agreed mode alone; ``"all_ranks"`` (older): FULL is left out unless the agreed mode
        is FULL (``disable_full``). The agreed count must come back unchanged (vLLM Ascend asserts
        it: every rank's ``num_tokens_across_dp`` entry is what the others were told)."""
        q, tokens = self.config.uniform_decode_query_len, shape.num_tokens
        assert shape.mode is not None  # agreed from this rank's dispatch, which chose a mode
        uniform = uniform and tokens % q == 0
        reqs = tokens // q if uniform else num_reqs
        if self.config.dp_padding == "all_ranks":
            decision = self.dispatcher.dispatch(tokens, reqs, uniform, disable_full=shape.mode is not CUDAGraphMode.FULL)
        else:
            decision = self.dispatcher.dispatch(tokens, reqs, uniform, valid_modes={shape.mode})
        if decision.num_tokens_padded != tokens:
            raise ValueError(f"the re-dispatch at the DP ranks' agreed {tokens} tokens gave {decision.num_tokens_padded} "
                             f"({decision.reason}): vLLM Ascend asserts batch_descriptor.num_tokens == num_tokens_padded")
        return replace(decision, reason=f"{decision.reason} (DP: agreed {tokens} tokens, mode {shape.mode})")

    def any_rank(self, flag: bool) -> bool:
        """Whether ``flag`` holds on any rank of this path (``flag``: whether it holds here).

        For what every rank must decide alike: whether any rank still has requests, on a step
        where none has a batch (a DP rank whose own requests are done keeps stepping, idle,
        until every peer is done, as vLLM's DP ranks keep running dummy batches while any
        engine has requests), and whether the path failed on any rank (then every rank stops
        it). A rank that decided alone would leave its peers waiting for it in the next
        step's agreement."""
        for feature in self.features:
            flag = feature.any_rank(flag, self.ctx)
        return flag

    # -- helpers ------------------------------------------------------------------------------
    def _pad(self, meta: AttentionMetadata, decision: DispatchDecision, added: dict[StepFeature, int]) -> AttentionMetadata:
        """Pad to T; tokens added by a feature whose fix is off are left out of the request lists."""
        cfg = self.config
        total = decision.num_tokens_padded
        if decision.runtime_mode is not CUDAGraphMode.FULL and not self.pads_without_full:
            return slice_attention_metadata(meta, total)  # the attention slices: no padded request
        unfixed = {f: n for f, n in added.items() if n and not f.fix_on}
        covered = total - sum(unfixed.values())
        key = decision.batch_descriptor
        padded = pad_attention_metadata(meta, covered, uniform_decode_query_len=cfg.uniform_decode_query_len,
                                        runtime_mode=decision.runtime_mode, configured_mode=cfg.mode,
                                        fia_padding_fix=cfg.fia_padding, uniform=bool(key and key.uniform_decode))
        if unfixed:
            why = ", ".join(f"{f.name} added {n} token(s) with its fix {'/'.join(f.fixes_off)} off"
                            for f, n in unfixed.items())
            extra = total - padded.num_input_tokens
            padded = replace(padded, num_input_tokens=total, slot_mapping=padded.slot_mapping + [PAD_SLOT_ID] * extra,
                             positions=padded.positions + [0] * extra, padding_source=f"{padded.padding_source}; {why}")
        return padded

    def _idle_metadata(self, decision: DispatchDecision) -> AttentionMetadata:
        """An idle DP rank's batch: vLLM Ascend's ``execute_dummy_batch``, one request of ``q``
        tokens (KV length ``q``: ``_dummy_run`` sets ``seq_lens`` to its query length) in the null
        block, every slot -1, padded to the agreed shape as any batch of that decision is.

        The dummy is padding, not a request (``num_reqs`` 0), so a feature that re-derives
        metadata from the real requests (CP) sees no real token.
        """
        cfg = self.config
        q = cfg.uniform_decode_query_len
        dummy = ScheduledRequest("idle", 0, q, (0,) * cfg.max_blocks_per_req)
        meta = self.metadata([dummy])
        meta = replace(meta, slot_mapping=[PAD_SLOT_ID] * q)
        padded = self._pad(meta, decision, {})
        return replace(padded, num_reqs=0, num_actual_tokens=0,
                       padding_source=f"idle DP rank: a dummy request of {q} token(s), {padded.padding_source}")

    def _rank_view(self, meta: AttentionMetadata) -> AttentionMetadata:
        for feature in self.features:
            meta = feature.rank_metadata(meta, self.ctx, self.config.block_size)
        return meta
