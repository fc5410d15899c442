"""The graph-mode model runner under test: capture per key, then execute the plans it is given.

This is where the domain meets an engine, through the torch.npu-shaped names only, so the
same runner drives the emulator, CUDA graphs and ACL graphs. Like vLLM's ``CUDAGraphWrapper``
it trusts the decision it is handed (a :class:`~harness.graph.plan.StepPlan`): it never
dispatches, pads or builds metadata. It follows vLLM / vLLM Ascend:

* warm-up runs, then one capture per capture key, largest first, all into one shared pool;
* PIECEWISE: L+1 graphs per bucket; attention runs eagerly between them on live host values,
  its output copied into the static input of the next piece;
* FULL: one graph per key; each attention layer's FIA is captured behind an ExternalEvent in a
  task group, and after every replay its host parameters are updated on an update stream
  (the protocol is :mod:`harness.ops.attention`; reference section 6);
* inputs are copied into static buffers before replay.

Each fix of the runner has a switch (:class:`Fixes`), so a known-bad scenario can turn one
off and show that the harness catches the bug it prevents.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from torch import Tensor

from harness.graph.dispatcher import BatchDescriptor
from harness.graph.metadata import AttentionMetadata
from harness.graph.modes import CUDAGraphMode
from harness.graph.plan import StepPlan
from harness.model import Attend, DecoderLM, PagedKVCache
from harness.ops import FIA_OP_NAME, fia_call_tags
from harness.ops.attention import (
    AttentionHeads,
    AttentionStyle,
    LayerTask,
    attend_eager,
    capture_task_group,
    fia_kwargs,
    update_layers,
)

__all__ = ["AttentionStyle", "EagerRunner", "Fixes", "GraphRunner", "RunnerConfig", "StepInputs", "fia_attend"]


@dataclass(frozen=True)
class Fixes:
    """The runner's fixes, each switchable for a known-bad scenario."""

    host_param_update: bool = True  # task-group update of FIA host lists after replay
    static_inputs: bool = True  # copy inputs into the captured buffers (not a fresh tensor)


@dataclass(frozen=True)
class RunnerConfig:
    max_num_tokens: int  # the largest capture size: the static buffers' length
    max_num_seqs: int
    max_blocks_per_req: int
    warmup_runs: int = 1
    fixes: Fixes = Fixes()


def attention_heads(model: DecoderLM) -> AttentionHeads:
    """This rank's heads of ``model`` (a TP shard holds ``num_heads / tp`` of them)."""
    return AttentionHeads(model.config.block_size, model.local_num_heads, model.local_num_kv_heads,
                          model.attention_scale)


def fia_attend(model: DecoderLM, meta: AttentionMetadata, block_table: Tensor,
               style: AttentionStyle = AttentionStyle()) -> Attend:
    """Eager attention for ``meta``: FIA on this rank's heads with the live host lists."""
    heads = attention_heads(model)

    def attend(layer: int, query: Tensor, key_cache: Tensor, value_cache: Tensor) -> Tensor:
        with fia_call_tags(layer=layer):
            kwargs = fia_kwargs(heads, meta.actual_seq_lengths, meta.seq_lens, block_table, style)
            if not meta.query_slice:
                return attend_eager(query, key_cache, value_cache, kwargs, style)
            # vLLM Ascend's non-FULL path: query[:actual_seq_lengths_q[-1]], padding rows left zero
            real = meta.actual_seq_lengths[-1] if meta.actual_seq_lengths else 0
            out = attend_eager(query[:real], key_cache, value_cache, kwargs, style)
            return torch.cat([out, out.new_zeros((query.shape[0] - real, *out.shape[1:]))])

    return attend


@dataclass
class StepInputs:
    """One step's inputs for one path: metadata (maybe padded) and token ids (padded with 0)."""

    meta: AttentionMetadata
    input_ids: list[int]


def _block_table(meta: AttentionMetadata) -> Tensor:
    return torch.tensor(meta.block_table, dtype=torch.int32)


class EagerRunner:
    """Runs a step eagerly with the metadata it is given (the reference and padded paths)."""

    def __init__(self, model: DecoderLM, kv_cache: PagedKVCache, style: AttentionStyle = AttentionStyle()) -> None:
        self.model, self.kv_cache, self.style = model, kv_cache, style

    def execute(self, inputs: StepInputs) -> Tensor:
        meta = inputs.meta
        logits = self.model(
            torch.tensor(inputs.input_ids, dtype=torch.int64),
            torch.tensor(meta.positions, dtype=torch.int64),
            torch.tensor(meta.slot_mapping, dtype=torch.int64),
            self.kv_cache,
            fia_attend(self.model, meta, _block_table(meta), self.style),
        )
        return logits[: meta.num_actual_tokens]


@dataclass(eq=False)
class FullGraph:
    graph: Any
    logits: Tensor
    layers: list[LayerTask] = field(default_factory=list)


@dataclass(eq=False)
class PiecewiseGraphs:
    graphs: list[Any]
    outputs: list[tuple[Tensor, ...]]
    attn_inputs: list[Tensor]  # static input of piece i+1: attention output of layer i


class GraphRunner:
    """Captures the graphs it is told to and executes plans through them."""

    def __init__(self, engine: Any, model: DecoderLM, kv_cache: PagedKVCache, config: RunnerConfig,
                 style: AttentionStyle = AttentionStyle()) -> None:
        self.engine, self.model, self.kv_cache, self.config, self.style = engine, model, kv_cache, config, style
        self.heads = attention_heads(model)
        max_tokens = config.max_num_tokens
        # Rows for real requests, fake uniform requests (at most one per token) and one dummy.
        self.max_reqs = max(config.max_num_seqs, max_tokens) + 1
        self.input_ids = torch.zeros(max_tokens, dtype=torch.int64)
        self.positions = torch.zeros(max_tokens, dtype=torch.int64)
        self.slot_mapping = torch.full((max_tokens,), -1, dtype=torch.int64)
        self.block_table = torch.zeros(self.max_reqs, config.max_blocks_per_req, dtype=torch.int32)
        self.full: dict[BatchDescriptor, FullGraph] = {}
        self.pieces: dict[int, PiecewiseGraphs] = {}
        self.update_stream = engine.Stream()
        self.graphs_captured = 0
        self.streams_by_bucket: list[dict[str, Any]] = []

    # -- capture -----------------------------------------------------------------------------
    def capture(self, plans: Sequence[tuple[CUDAGraphMode, BatchDescriptor, AttentionMetadata]]) -> None:
        """Capture one graph per key, each on its dummy batch (``StepPlanner.capture_plans``)."""
        pool = self.engine.graph_pool_handle()
        for runtime_mode, key, meta in plans:
            with fia_call_tags(phase="warmup", bucket=key.num_tokens):
                for _ in range(self.config.warmup_runs):
                    self._run_eager(meta, [0] * key.num_tokens)
            self._write_static(StepInputs(meta, [0] * key.num_tokens))
            with fia_call_tags(phase="capture", bucket=key.num_tokens, graph=str(runtime_mode)):
                try:
                    if runtime_mode is CUDAGraphMode.FULL:
                        self.full[key] = self._capture_full(key.num_tokens, meta, pool)
                    else:
                        self.pieces[key.num_tokens] = self._capture_pieces(key.num_tokens, pool)
                except Exception as error:
                    self._log_streams(runtime_mode, key, needed=getattr(error, "needed", None), failed=True)
                    raise
            self._log_streams(runtime_mode, key)

    def _log_streams(self, runtime_mode: CUDAGraphMode, key: BatchDescriptor, needed: int | None = None,
                     failed: bool = False) -> None:
        """Streams held after each bucket's capture (and what a failed one needed): the report
        draws them against the pool."""
        in_use = self.engine.stream_usage().get("in_use")
        self.streams_by_bucket.append({"bucket": key.num_tokens, "mode": str(runtime_mode), "in_use": in_use,
                                       "needed": needed, "failed": failed})

    def _capture_full(self, size: int, meta: AttentionMetadata, pool: Any) -> FullGraph:
        engine = self.engine
        graph = engine.NPUGraph()
        layers: list[LayerTask] = []
        kwargs = fia_kwargs(self.heads, meta.actual_seq_lengths, meta.seq_lens, self.block_table, self.style)
        style = self.style

        def attend(layer: int, query: Tensor, key_cache: Tensor, value_cache: Tensor) -> Tensor:
            with fia_call_tags(layer=layer):
                if not self.config.fixes.host_param_update:
                    # The known-bad pipeline: FIA captured with no way to update its host lists.
                    return attend_eager(query, key_cache, value_cache, kwargs, style)
                task = capture_task_group(engine, query, key_cache, value_cache, kwargs)
            layers.append(task)
            return style.combine(task.out, task.lse) if style.combine else task.out

        with engine.graph(graph, pool=pool):
            logits = self.model(self.input_ids[:size], self.positions[:size], self.slot_mapping[:size],
                                self.kv_cache, attend)
        self.graphs_captured += 1
        return FullGraph(graph, logits, layers)

    def _capture_pieces(self, size: int, pool: Any) -> PiecewiseGraphs:
        engine, model = self.engine, self.model
        cfg = model.config
        graphs, outputs, attn_inputs = [], [], []
        inputs: tuple[Tensor, ...] = (self.input_ids[:size],)
        for i in range(model.num_pieces):
            graph = engine.NPUGraph()
            with engine.graph(graph, pool=pool):
                outs = model.piece(i, inputs, self.positions[:size], self.slot_mapping[:size], self.kv_cache)
            self.graphs_captured += 1
            graphs.append(graph)
            outputs.append(outs)
            if i < cfg.num_layers:
                attn_in = torch.zeros(size, model.local_num_heads, cfg.head_dim, dtype=model.dtype)
                attn_inputs.append(attn_in)
                inputs = (attn_in, outs[1])
        return PiecewiseGraphs(graphs, outputs, attn_inputs)

    # -- execution ---------------------------------------------------------------------------
    def execute(self, plan: StepPlan, input_ids: list[int]) -> tuple[Tensor, list[dict] | None]:
        """Run one plan; return the real rows' logits and the host lists the graph executed."""
        decision = plan.decision
        meta = plan.padded
        if decision is None or decision.runtime_mode is CUDAGraphMode.NONE:
            return self._run_eager(meta, input_ids)[: meta.num_actual_tokens], None
        inputs = StepInputs(meta, input_ids)
        self._write_static(inputs)
        if decision.runtime_mode is CUDAGraphMode.FULL:
            full = self.full[decision.batch_descriptor]
            self._replay_full(full, meta)
            logits = full.logits
            executed = self._executed(full.graph)
        else:
            logits = self._replay_pieces(self.pieces[decision.num_tokens_padded], meta)
            executed = None
        return logits[: meta.num_actual_tokens].clone(), executed

    def _run_eager(self, meta: AttentionMetadata, input_ids: list[int]) -> Tensor:
        return EagerRunner(self.model, self.kv_cache, self.style).execute(StepInputs(meta, input_ids))

    def _write_static(self, inputs: StepInputs) -> None:
        meta = inputs.meta
        n = meta.num_input_tokens
        if not self.config.fixes.static_inputs:
            # The bug this switch reproduces: fresh tensors bound to the names, so the graph
            # still reads the buffers it captured (never written again).
            self.input_ids = torch.tensor(inputs.input_ids, dtype=torch.int64)
            self.positions = torch.tensor(meta.positions, dtype=torch.int64)
            self.slot_mapping = torch.tensor(meta.slot_mapping, dtype=torch.int64)
            return
        self.input_ids[:n].copy_(torch.tensor(inputs.input_ids, dtype=torch.int64))
        self.positions[:n].copy_(torch.tensor(meta.positions, dtype=torch.int64))
        self.slot_mapping[:n].copy_(torch.tensor(meta.slot_mapping, dtype=torch.int64))
        self.block_table.zero_()
        self.block_table[: meta.num_reqs_padded].copy_(_block_table(meta))

    def _replay_full(self, full: FullGraph, meta: AttentionMetadata) -> None:
        full.graph.replay()  # asynchronous: stalls at each layer's event until it is recorded
        if full.layers:
            kwargs = fia_kwargs(self.heads, meta.actual_seq_lengths, meta.seq_lens, self.block_table, self.style)
            caches = list(zip(self.kv_cache.key_cache, self.kv_cache.value_cache))
            with fia_call_tags(phase="update"):
                update_layers(self.engine, self.update_stream, full.layers, caches, kwargs)
        self.engine.synchronize()

    def _replay_pieces(self, pieces: PiecewiseGraphs, meta: AttentionMetadata) -> Tensor:
        engine, cfg = self.engine, self.model.config
        attend = fia_attend(self.model, meta, self.block_table, self.style)
        for i, graph in enumerate(pieces.graphs):
            graph.replay()
            engine.synchronize()
            if i < cfg.num_layers:
                query = pieces.outputs[i][0]
                with fia_call_tags(phase="between-pieces"):
                    out = attend(i, query, self.kv_cache.key_cache[i], self.kv_cache.value_cache[i])
                pieces.attn_inputs[i].copy_(out)
        return pieces.outputs[-1][0]

    def _executed(self, graph: Any) -> list[dict] | None:
        if not self.engine.capabilities.reports_executed_arguments:
            return None
        return self.engine.executed_host_arguments(graph, FIA_OP_NAME, ("actual_seq_lengths", "actual_seq_lengths_kv"))

    def release(self) -> None:
        for full in self.full.values():
            full.graph.reset()
        for pieces in self.pieces.values():
            for graph in pieces.graphs:
                graph.reset()
        self.full.clear()
        self.pieces.clear()
