"""The draft model's graphs: captured with the target's, per capture key, and replayed per step.

vLLM Ascend captures the speculative proposer's draft model (MTP / EAGLE) in the target's capture
phase: every dummy run of the target ends with ``drafter.dummy_run`` on the same batch descriptor
(``worker/model_runner_v1.py`` ``_dummy_run``), and at run time the proposer dispatches its own
first pass with the runner's dispatcher (``spec_decode/llm_base_proposer.py`` at v0.23.0,
``AscendSpecDecodeBaseProposer``). What is modelled, and from where:

* **which graphs**: the draft model has graphs wherever the target has (``use_cuda_graph =
  runner._use_aclgraph()``: a graph mode under compilation mode VLLM_COMPILE). Its pieces sit
  behind PIECEWISE wrappers when the mode has piecewise graphs (vLLM compiles it as it compiles
  the target: ``draft_layers + 1`` graphs per size, the legacy budget's count), and when the mode
  has FULL graphs one FULL wrapper holds all ``k`` rounds (``_runnable = ACLGraphWrapper(
  self._run_merged_draft, runtime_mode=FULL)``, the merged graph of PR #6860), every round's
  attention captured in it;
* **capture**: per target key, the drafter's warm-ups run with runtime NONE and no attention
  metadata, then its capture with the key's mode; only FULL builds metadata, for every round
  (``dummy_run``: ``if aclgraph_runtime_mode == CUDAGraphMode.FULL``: ``build_for_graph_capture``),
  so a PIECEWISE capture and every warm-up run no attention;
* **dispatch**: the first pass's token count (the target step's, with the padded drafter batch)
  with the target batch descriptor's uniform flag (``uniform_decode =
  target_model_batch_desc.uniform``), through the same keys as the target's;
* **metadata**: every round has ``T`` rows (``input_batch_size = num_input_tokens`` for MTP).
  FULL pads the first pass for FIA (``_pad_query_start_loc_for_fia``) and gives rounds 2..k ``T``
  one-token requests (``attn_update_stack_num_spec_norm``: ``query_start_loc = arange(T + 1)``,
  KV lengths zero-padded); PIECEWISE keeps the real requests and the attention slices the query;
* **after a FULL replay**: every round's and layer's FIA host lists are updated on the drafter's
  own update stream from its own graph parameters (``_draft_graph_params``: a workspace per size,
  ``k x layers`` task groups per size), ``update_full_graph_params(..., draft_attn_metadatas=...)``;
  the wrapper does not synchronize before a draft replay (``is_draft_eagle``).

The GPU (the device-buffers attention path) is vLLM's, whose EAGLE proposer uses piecewise
graphs only: a FULL decision runs the drafter eagerly there. The draft model runs on one rank
and does not take part in DP's agreement (``_sync_metadata_across_dp(is_draft_model=True)`` is
not modelled: the harness's drafter has no collective to hang in).

Its fix (the feature's ``drafter_param_update`` switch) is the update: without it the draft
graphs replay the host lists they were captured with, which the stale-parameters check sees.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import torch
from torch import Tensor

from harness.engine.protocol import Engine, GraphPool
from harness.graph.capture_sizes import dummy_request_lens
from harness.graph.dispatcher import BatchDescriptor, DispatchDecision, Dispatcher
from harness.graph.drafter import DraftBatch, round_metadata
from harness.graph.graph_wrapper import CaptureMonitor, GraphWrapper, get_forward_context, set_forward_context
from harness.graph.metadata import (
    PAD_SLOT_ID,
    AttentionMetadata,
    ScheduledRequest,
    build_attention_metadata,
    pad_attention_metadata,
    slice_attention_metadata,
)
from harness.graph.modes import CUDAGraphMode
from harness.graph.plan import StepPlan
from harness.graph.runner import LiveAttention, _Piece, attention_heads
from harness.model import DecoderLM, PagedKVCache
from harness.ops import FIA_OP_NAME, fia_call_tags
from harness.ops.attention import (AttentionStyle, LayerTask, attend_eager, capture_task_group, fia_kwargs,
                                   update_task_group)
from harness.plain import JsonObject, Kwargs

__all__ = ["DraftGraphConfig", "DraftGraphRunner", "one_token_requests"]

_HOST_LISTS = ("actual_seq_lengths", "actual_seq_lengths_kv")
_DEFAULT_STYLE = AttentionStyle()  # the draft model is single-rank: causal FIA, no merge


@dataclass(frozen=True)
class DraftGraphConfig:
    """What the draft model's graphs are: the target's mode and sizes, and the drafter's rules."""

    mode: CUDAGraphMode  # the configured mode (the target's): which wrappers exist
    capture_sizes: tuple[int, ...]
    max_num_seqs: int
    num_speculative_tokens: int
    max_blocks_per_req: int
    graphs: bool = True  # vLLM Ascend `runner._use_aclgraph()`: a graph mode under VLLM_COMPILE
    full_graphs: bool = True  # FULL draft graphs (host-list attention); none on the GPU's device-buffers path
    fia_padding: bool = True  # the FIA padding fix (PR #6475), as for the target
    mixed_full_key_num_reqs: bool = True  # the dispatcher's keys, as the target's
    pad_requests_without_full: bool = False  # harness-compose: a dummy request in non-FULL batches too
    param_update: bool = True  # the feature's `drafter_param_update` fix
    debug_input_addresses: bool = False
    capture_error_guidance: str | None = None


def one_token_requests(meta: AttentionMetadata, num_tokens: int) -> AttentionMetadata:
    """A FULL draft round 2..k: ``num_tokens`` one-token requests, the real ones first.

    vLLM Ascend ``attn_update_stack_num_spec_norm`` under FULL: ``query_start_loc`` is
    ``arange(T + 1)``, the KV lengths and block table are padded with zeros to ``T`` rows
    (``_adjust_tensor``), so ``actual_seq_lengths[-1] == T`` with no dummy request."""
    n, extra = meta.num_reqs, num_tokens - meta.num_reqs
    if extra < 0:
        raise ValueError(f"{n} draft requests do not fit {num_tokens} rows")
    width = len(meta.block_table[0]) if meta.block_table else 0
    starts = list(range(num_tokens + 1))
    return AttentionMetadata(
        num_reqs=n, num_reqs_padded=num_tokens, num_actual_tokens=n, num_input_tokens=num_tokens,
        query_start_loc=starts, actual_seq_lengths=starts[1:], seq_lens=list(meta.seq_lens) + [0] * extra,
        block_table=[list(row) for row in meta.block_table] + [[0] * width for _ in range(extra)],
        slot_mapping=list(meta.slot_mapping) + [PAD_SLOT_ID] * extra, positions=list(meta.positions) + [0] * extra,
        query_lens=[1] * num_tokens,
        padding_source=f"draft round: {num_tokens} one-token requests, {extra} of them padding")


class DraftGraphRunner:
    """The graph path's draft model: its own wrappers, buffers, graph parameters and update stream.

    ``pool`` and ``monitor`` are the target runner's: one graph pool and one capture phase for
    every graph of the run (vLLM Ascend's global graph pool and capture monitor).
    """

    def __init__(self, engine: Engine, model: DecoderLM, kv_cache: PagedKVCache, config: DraftGraphConfig, *,
                 pool: GraphPool | None = None, monitor: CaptureMonitor | None = None) -> None:
        self.engine, self.model, self.kv_cache, self.config = engine, model, kv_cache, config
        self.k = config.num_speculative_tokens
        self.q = 1 + self.k
        self.heads = attention_heads(model)
        device = kv_cache.device
        max_tokens = max(config.capture_sizes, default=1)
        self.max_reqs = max(config.max_num_seqs, max_tokens) + 1
        # Static buffers every draft graph reads: the rounds' shared inputs, each round's
        # positions and slots (vLLM Ascend's `slot_mapping_group`), the first pass's sample rows.
        self.input_ids = torch.zeros(max_tokens, dtype=torch.int64, device=device)
        self.positions = torch.zeros(max_tokens, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((max_tokens,), PAD_SLOT_ID, dtype=torch.int64, device=device)
        self.round_positions = torch.zeros(self.k, max_tokens, dtype=torch.int64, device=device)
        self.round_slots = torch.full((self.k, max_tokens), PAD_SLOT_ID, dtype=torch.int64, device=device)
        self.sample_rows = torch.zeros(max_tokens, dtype=torch.int64, device=device)
        self.block_table = torch.zeros(self.max_reqs, config.max_blocks_per_req, dtype=torch.int32, device=device)
        self.update_stream = engine.Stream()  # the proposer's own (load_model: `self.update_stream`)
        graphs = config.graphs and config.mode is not CUDAGraphMode.NONE and bool(config.capture_sizes)
        self.dispatcher = Dispatcher(config.mode, config.capture_sizes, self.q, config.max_num_seqs,
                                     mixed_full_key_num_reqs=config.mixed_full_key_num_reqs) if graphs else None
        # The drafter's graph parameters (vLLM Ascend `_draft_graph_params`), apart from the target's.
        self.tasks: dict[BatchDescriptor, list[LayerTask]] = {}  # per key: k rounds x layers, in order
        self.workspaces: dict[int, Tensor] = {}
        self.attn_outputs: dict[BatchDescriptor, list[Tensor]] = {}
        self._round = 0  # the round the merged forward is in (its attention's tags)
        wrap: Kwargs = dict(engine=engine, pool=pool, monitor=monitor if monitor is not None else CaptureMonitor(enabled=False),
                    debug=config.debug_input_addresses, capture_error_guidance=config.capture_error_guidance)
        pieces: list[Callable[..., tuple[Tensor, ...]]] = [_Piece(model, i, kv_cache) for i in range(model.num_pieces)]
        self.piece_wrappers: list[GraphWrapper] = []
        if graphs and config.mode.has_piecewise_cudagraphs():
            self.piece_wrappers = [GraphWrapper(p, CUDAGraphMode.PIECEWISE, name=f"draft_{p.__name__}",
                                                weak_ref_output=i == len(pieces) - 1, **wrap)
                                   for i, p in enumerate(pieces)]
            pieces = list(self.piece_wrappers)
        self.pieces = pieces
        self.full_wrapper: GraphWrapper | None = None
        self.run: Callable[..., Tensor] = self._rounds
        if graphs and config.full_graphs and config.mode.has_full_cudagraphs():
            self.full_wrapper = self.run = GraphWrapper(self._rounds, CUDAGraphMode.FULL, name="draft",
                                                        sync_before_replay=False, **wrap)

    @property
    def graphs_captured(self) -> int:
        wrappers = [*self.piece_wrappers, *([self.full_wrapper] if self.full_wrapper else [])]
        return sum(w.num_captured for w in wrappers)

    # -- the forward the wrappers wrap ---------------------------------------------------------
    def _rounds(self, input_ids: Tensor, positions: Tensor, slot_mapping: Tensor, round_positions: Tensor,
                round_slots: Tensor, sample_rows: Tensor) -> Tensor:
        """Every round of one draft (vLLM Ascend ``_run_merged_draft``): round 1 samples each
        request's row, later rounds feed the drafts back on the device, one row a request.
        Returns the drafts, ``[k, T]`` (row ``i`` of round ``r``: request ``i``'s draft)."""
        context = get_forward_context()
        lives = context.attn_metadata  # one LiveAttention per round, or None (a dummy run)
        drafts: list[Tensor] = []
        try:
            for round_ in range(self.k):
                self._round = round_
                context.attn_metadata = lives[round_] if lives is not None else None
                if round_:
                    input_ids.copy_(drafts[-1])
                positions.copy_(round_positions[round_])
                slot_mapping.copy_(round_slots[round_])
                logits = self._forward(input_ids, positions, slot_mapping)
                rows = logits.index_select(0, sample_rows) if round_ == 0 else logits
                drafts.append(rows.argmax(dim=-1))
        finally:
            context.attn_metadata = lives
        return torch.stack(drafts)

    def _forward(self, input_ids: Tensor, positions: Tensor, slot_mapping: Tensor) -> Tensor:
        outs = self.pieces[0](input_ids, positions, slot_mapping)
        for layer in range(self.model.config.num_layers):
            query, residual = outs
            outs = self.pieces[layer + 1](self._attention(layer, query), residual, positions, slot_mapping)
        hidden: Tensor = outs[0]
        return hidden

    def _attention(self, layer: int, query: Tensor) -> Tensor:
        """The draft model's attention as the forward context says: none (a dummy run without
        metadata: zeros), captured in the FULL draft graph's task group (its own graph
        parameters), or eager on the round's live lists (into a PIECEWISE key's static buffer)."""
        context = get_forward_context()
        live: LiveAttention | None = context.attn_metadata
        mode, key = context.runtime_mode, context.batch_descriptor
        # a graph's forward (PIECEWISE or FULL) always runs under its batch descriptor
        assert mode is CUDAGraphMode.NONE or key is not None, f"{mode} forward without a batch descriptor"
        if live is None:
            if mode is CUDAGraphMode.PIECEWISE and key is not None:
                return self._attention_buffer(key, layer, query).zero_()
            return torch.zeros_like(query)
        key_cache, value_cache = self.kv_cache.key_cache[layer], self.kv_cache.value_cache[layer]
        with fia_call_tags(layer=layer, draft_round=self._round + 1):
            if mode is CUDAGraphMode.FULL and context.capturing and key is not None:
                num_tokens = query.shape[0]
                task = capture_task_group(self.engine, query, key_cache, value_cache, live.kwargs,
                                          workspace=self.workspaces.get(num_tokens))
                self.workspaces.setdefault(num_tokens, task.workspace)
                self.tasks.setdefault(key, []).append(task)
                return task.out
            out = attend_eager(query, key_cache, value_cache, live.kwargs, _DEFAULT_STYLE,
                               query_rows=live.meta.query_rows)
        if mode is not CUDAGraphMode.PIECEWISE or key is None:
            return out
        buffer = self._attention_buffer(key, layer, out)
        buffer.copy_(out)
        return buffer

    def _attention_buffer(self, key: BatchDescriptor, layer: int, like: Tensor) -> Tensor:
        buffers = self.attn_outputs.setdefault(key, [])
        if len(buffers) <= layer:
            buffers.append(torch.zeros_like(like))
        return buffers[layer]

    # -- capture -----------------------------------------------------------------------------
    def dummy_run(self, runtime_mode: CUDAGraphMode, key: BatchDescriptor) -> None:
        """The drafter's part of one of the target's dummy runs on ``key`` (vLLM Ascend
        ``dummy_run``): runtime NONE is a warm-up, any other mode captures the key's draft
        graphs. Only a FULL run has attention metadata."""
        if not self.piece_wrappers and self.full_wrapper is None:
            return  # no draft graphs: upstream's dummy run is eager and skips attention
        if runtime_mode is CUDAGraphMode.FULL and self.full_wrapper is None:
            runtime_mode = CUDAGraphMode.NONE  # no FULL draft graphs here (the GPU's drafter)
        num_tokens = key.num_tokens
        batch = self._dummy_batch(key)
        metas = self._padded(batch, runtime_mode, key, num_tokens)
        self._write(batch, metas, num_tokens)
        lives = self._lives(metas) if runtime_mode is CUDAGraphMode.FULL else None
        capturing = runtime_mode is not CUDAGraphMode.NONE
        had_workspaces, had_tasks = set(self.workspaces), key in self.tasks
        phase = "draft-capture" if capturing else "draft-warmup"
        try:
            with fia_call_tags(model="draft", phase=phase, bucket=num_tokens), \
                    set_forward_context(runtime_mode, key if capturing else None, lives):
                self.run(*self._args(num_tokens))
        except Exception:
            for size in set(self.workspaces) - had_workspaces:  # a failed capture gives its memory back
                del self.workspaces[size]
            if not had_tasks:
                self.tasks.pop(key, None)
            raise

    def _dummy_batch(self, key: BatchDescriptor) -> DraftBatch:
        """The dummy batch of ``key`` (the target's dummy run shape), in the null block."""
        cfg = self.config
        block_size = self.model.config.block_size
        if key.uniform_decode:
            lens = [self.q] * (key.num_reqs or 1)
        else:
            lens = dummy_request_lens(key.num_tokens, cfg.max_num_seqs)
        requests = [ScheduledRequest(f"dummy{i}", 0, n, (0,) * cfg.max_blocks_per_req) for i, n in enumerate(lens)]
        first = build_attention_metadata(requests, block_size, cfg.max_blocks_per_req)
        first = replace(first, slot_mapping=[PAD_SLOT_ID] * first.num_input_tokens)
        rounds = tuple(replace(m, slot_mapping=[PAD_SLOT_ID] * m.num_input_tokens)
                       for m in (round_metadata(requests, r, block_size, cfg.max_blocks_per_req,
                                                self.model.config.max_model_len) for r in range(2, self.k + 1)))
        rows = [end - 1 for end in first.query_start_loc[1:]]
        return DraftBatch(tuple(requests), (True,) * len(requests), [0] * first.num_actual_tokens, first, rounds,
                          rows)

    # -- per step ------------------------------------------------------------------------------
    def dispatch(self, batch: DraftBatch, plan: StepPlan) -> DispatchDecision:
        """The first pass's dispatch: its token count, the target batch descriptor's uniform flag."""
        if self.dispatcher is None:
            why = "graph mode NONE" if self.config.mode is CUDAGraphMode.NONE else \
                "the draft model has no graphs (compilation mode not VLLM_COMPILE: `_use_aclgraph()` is false)"
            return DispatchDecision(CUDAGraphMode.NONE, None, batch.num_tokens, why)
        target = plan.decision.batch_descriptor if plan.decision else None
        uniform = bool(target and target.uniform_decode) and batch.num_tokens == self.q * batch.num_reqs
        decision = self.dispatcher.dispatch(batch.num_tokens, batch.num_reqs, uniform)
        if decision.runtime_mode is CUDAGraphMode.FULL and self.full_wrapper is None:
            return DispatchDecision(CUDAGraphMode.NONE, None, batch.num_tokens,
                                    f"{decision.reason}, but the draft model has no FULL graphs on this attention "
                                    "path (vLLM's EAGLE proposer: piecewise graphs only)")
        return decision

    def propose(self, batch: DraftBatch, plan: StepPlan,
                eager: Callable[[], list[list[int]]]) -> tuple[list[list[int]], JsonObject]:
        """Run one draft: ``eager`` when the dispatch says NONE, else through the draft graphs.

        Returns every round's drafts (one a request) and the step's draft record: the dispatch,
        and for a graph the host lists each round ran with (padded) and, where the engine can
        say, what each FULL task group executed."""
        decision = self.dispatch(batch, plan)
        key = decision.batch_descriptor
        record: JsonObject = {
            "mode": str(decision.runtime_mode), "bucket": decision.num_tokens_padded, "reason": decision.reason,
            "descriptor": None if key is None else {"num_tokens": key.num_tokens, "num_reqs": key.num_reqs,
                                                    "uniform_decode": key.uniform_decode},
            "layers": self.model.config.num_layers,
        }
        if decision.runtime_mode is CUDAGraphMode.NONE:
            return eager(), record
        rounds, metas, executed = self._replay(batch, decision)
        record["metadata"] = [{"actual_seq_lengths": list(m.actual_seq_lengths),
                               "actual_seq_lengths_kv": list(m.seq_lens)} for m in metas]
        record["executed"] = executed
        return rounds, record

    def _replay(self, batch: DraftBatch, decision: DispatchDecision
                ) -> tuple[list[list[int]], list[AttentionMetadata], list[JsonObject] | None]:
        mode, key, num_tokens = decision.runtime_mode, decision.batch_descriptor, decision.num_tokens_padded
        assert key is not None
        metas = self._padded(batch, mode, key, num_tokens)
        self._write(batch, metas, num_tokens)
        lives = self._lives(metas)
        graph = replay = None
        try:
            with fia_call_tags(bucket=num_tokens, runtime_mode=str(mode), padding=metas[0].padding_source), \
                    set_forward_context(mode, key, lives):
                drafts = self.run(*self._args(num_tokens))
                if mode is CUDAGraphMode.FULL:
                    assert self.full_wrapper is not None
                    graph = self.full_wrapper.graph_of(key)
                    replay = getattr(graph, "replays", None)
                    self._update(key, lives)
            rounds = drafts[:, : batch.num_reqs].tolist()  # one host read: the drafts of every round
        except BaseException:
            with contextlib.suppress(Exception):  # what was launched finishes before the host moves on
                self.engine.synchronize()
            raise
        executed = None
        if graph is not None and self.engine.capabilities.reports_executed_arguments:
            executed = self.engine.executed_host_arguments(graph, FIA_OP_NAME, _HOST_LISTS, replay=replay)
        return [[int(t) for t in row] for row in rounds], metas, executed

    def _update(self, key: BatchDescriptor, lives: Sequence[LiveAttention]) -> None:
        """After a FULL draft replay was launched: every round's and layer's FIA host lists, on
        the drafter's update stream (``update_full_graph_params`` with ``draft_attn_metadatas``).

        Without the ``drafter_param_update`` fix the events are recorded and nothing updated (the
        replay runs on the lists of its capture). If a layer's update raises, every event from it
        on is still recorded, so the replay ends instead of waiting for ever."""
        tasks = self.tasks.get(key) or []
        layers = self.model.config.num_layers
        caches = list(zip(self.kv_cache.key_cache, self.kv_cache.value_cache))
        stream = self.update_stream
        with self.engine.stream(stream), fia_call_tags(phase="draft-update"):
            for index, task in enumerate(tasks):
                round_, layer = divmod(index, layers)
                try:
                    with fia_call_tags(layer=layer, draft_round=round_ + 1):
                        update_task_group(self.engine, stream, task, *caches[layer], lives[round_].kwargs,
                                          update=self.config.param_update)
                except BaseException:
                    for stalled in tasks[index:]:
                        stalled.event.record(stream)
                    raise

    def _padded(self, batch: DraftBatch, mode: CUDAGraphMode, key: BatchDescriptor,
                num_tokens: int) -> list[AttentionMetadata]:
        """Every round's metadata at ``num_tokens`` rows, as the runtime mode needs it."""
        cfg = self.config
        if mode is CUDAGraphMode.FULL:
            first = pad_attention_metadata(batch.first, num_tokens, uniform_decode_query_len=self.q,
                                           runtime_mode=mode, configured_mode=cfg.mode,
                                           fia_padding_fix=cfg.fia_padding, uniform=key.uniform_decode)
            return [first, *(one_token_requests(m, num_tokens) for m in batch.rounds)]
        if cfg.pad_requests_without_full:
            first = pad_attention_metadata(batch.first, num_tokens, uniform_decode_query_len=self.q,
                                           runtime_mode=mode, configured_mode=cfg.mode,
                                           fia_padding_fix=cfg.fia_padding, uniform=key.uniform_decode)
        else:
            first = slice_attention_metadata(batch.first, num_tokens)
        return [first, *(slice_attention_metadata(m, num_tokens) for m in batch.rounds)]

    def _lives(self, metas: Sequence[AttentionMetadata]) -> list[LiveAttention]:
        return [LiveAttention(m, fia_kwargs(self.heads, m.actual_seq_lengths, m.seq_lens, self.block_table))
                for m in metas]

    def _args(self, num_tokens: int) -> tuple[Tensor, ...]:
        n = num_tokens
        return (self.input_ids[:n], self.positions[:n], self.slot_mapping[:n], self.round_positions[:, :n],
                self.round_slots[:, :n], self.sample_rows[:n])

    def _write(self, batch: DraftBatch, metas: Sequence[AttentionMetadata], num_tokens: int) -> None:
        """Host-to-device copies into the captured buffers, in stream order (as the target's)."""
        n = num_tokens
        ids = batch.input_ids + [0] * (n - len(batch.input_ids))
        self.input_ids[:n].copy_(torch.tensor(ids, dtype=torch.int64), non_blocking=True)
        for round_, meta in enumerate(metas):
            self.round_positions[round_, :n].copy_(torch.tensor(meta.positions, dtype=torch.int64), non_blocking=True)
            self.round_slots[round_, :n].copy_(torch.tensor(meta.slot_mapping, dtype=torch.int64), non_blocking=True)
        rows = batch.sample_rows + [0] * (n - len(batch.sample_rows))
        self.sample_rows[:n].copy_(torch.tensor(rows, dtype=torch.int64), non_blocking=True)
        self.block_table.zero_()
        self.block_table[: batch.num_reqs].copy_(torch.tensor(batch.first.block_table, dtype=torch.int32),
                                                  non_blocking=True)

    def release(self) -> None:
        for wrapper in [*self.piece_wrappers, *([self.full_wrapper] if self.full_wrapper else [])]:
            wrapper.reset()
        self.tasks.clear()
        self.workspaces.clear()
        self.attn_outputs.clear()
