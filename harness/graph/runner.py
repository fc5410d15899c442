"""The graph-mode model runner under test: capture per bucket, replay per step.

This is where the domain (buckets, dispatch, padded metadata) meets an engine, through the
torch.npu-shaped names only, so the same runner drives the emulator, CUDA graphs and ACL
graphs. It follows vLLM / vLLM Ascend:

* warm-up runs, then one capture per capture key, largest first, all into one shared pool;
* PIECEWISE: L+1 graphs per bucket; attention runs eagerly between them on live host values,
  its output copied into the static input of the next piece;
* FULL: one graph per key; each attention layer's FIA is captured behind an ExternalEvent in a
  task group (``.out`` form, fixed workspace); after every replay the host parameters of each
  layer are updated on an update stream and the layer's event recorded (reference section 6);
* inputs are copied into static buffers before replay.

Each fix of the pipeline has a switch (:class:`Fixes`), so a known-bad scenario can turn one
off and show that the harness catches the bug it prevents.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from harness.graph.dispatcher import BatchDescriptor, DispatchDecision, Dispatcher, is_uniform_decode
from harness.graph.metadata import (
    AttentionMetadata,
    ScheduledRequest,
    build_attention_metadata,
    pad_attention_metadata,
)
from harness.graph.modes import CUDAGraphMode
from harness.model import Attend, DecoderLM, PagedKVCache
from harness.ops import (
    fia_call_tags,
    get_max_workspace,
    npu_fused_infer_attention_score,
    npu_fused_infer_attention_score_out,
)

FIA_OP_NAME = "harness::npu_fused_infer_attention_score"


@dataclass(frozen=True)
class Fixes:
    """The pipeline's fixes, each switchable for a known-bad scenario."""

    fia_padding: bool = True  # dummy requests so actual_seq_lengths[-1] == T (PR #6475)
    host_param_update: bool = True  # task-group update of FIA host lists after replay
    static_inputs: bool = True  # copy inputs into the captured buffers (not a fresh tensor)


@dataclass(frozen=True)
class AttentionStyle:
    """How attention runs around the FIA call: its mask, and a merge of partial results.

    Context parallel runs FIA over this rank's KV shard without a causal mask (causality is in
    its per-token KV lengths) and merges the ranks' outputs by their softmax LSE (``combine``).
    """

    sparse_mode: int = 3
    combine: Callable[[Tensor, Tensor], Tensor] | None = None


def fia_attend(model: DecoderLM, meta: AttentionMetadata, block_table: Tensor,
               style: AttentionStyle = AttentionStyle()) -> Attend:
    """Eager attention for ``meta``: FIA on this rank's heads with the live host lists."""

    def attend(layer: int, query: Tensor, key_cache: Tensor, value_cache: Tensor) -> Tensor:
        with fia_call_tags(layer=layer):
            out, lse = npu_fused_infer_attention_score(
                query, key_cache, value_cache,
                actual_seq_lengths=list(meta.actual_seq_lengths), actual_seq_lengths_kv=list(meta.seq_lens),
                block_table=block_table, block_size=model.config.block_size,
                num_heads=model.local_num_heads, num_key_value_heads=model.local_num_kv_heads,
                scale=model.attention_scale, input_layout="TND", sparse_mode=style.sparse_mode,
                softmax_lse_flag=style.combine is not None)
        return style.combine(out, lse) if style.combine else out

    return attend


@dataclass(frozen=True)
class GraphConfig:
    mode: CUDAGraphMode
    capture_sizes: tuple[int, ...]
    max_num_seqs: int
    uniform_decode_query_len: int = 1
    warmup_runs: int = 1
    fixes: Fixes = Fixes()


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
class LayerTask:
    """What a FULL graph keeps per attention layer to update its host parameters."""

    handle: Any
    event: Any
    query: Tensor
    out: Tensor
    lse: Tensor
    workspace: Tensor


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
    """Captures the graphs of one configuration and runs steps through them."""

    def __init__(self, engine: Any, model: DecoderLM, kv_cache: PagedKVCache, config: GraphConfig,
                 *, max_blocks_per_req: int, style: AttentionStyle = AttentionStyle(),
                 rank_metadata: Callable[[AttentionMetadata], AttentionMetadata] = lambda meta: meta) -> None:
        self.engine, self.model, self.kv_cache, self.config = engine, model, kv_cache, config
        self.style, self.rank_metadata = style, rank_metadata
        q = config.uniform_decode_query_len
        self.dispatcher = Dispatcher(config.mode, config.capture_sizes, q, config.max_num_seqs)
        self.max_blocks = max_blocks_per_req
        max_tokens = max(config.capture_sizes)
        # Rows for real requests, fake uniform requests and one dummy request.
        self.max_reqs = max(config.max_num_seqs, max_tokens // q, max_tokens) + 1
        self.input_ids = torch.zeros(max_tokens, dtype=torch.int64)
        self.positions = torch.zeros(max_tokens, dtype=torch.int64)
        self.slot_mapping = torch.full((max_tokens,), -1, dtype=torch.int64)
        self.block_table = torch.zeros(self.max_reqs, max_blocks_per_req, dtype=torch.int32)
        self.full: dict[BatchDescriptor, FullGraph] = {}
        self.pieces: dict[int, PiecewiseGraphs] = {}
        self.update_stream = engine.Stream()
        self.graphs_captured = 0
        self.streams_by_bucket: list[dict[str, Any]] = []

    # -- capture -----------------------------------------------------------------------------
    def capture(self) -> None:
        pool = self.engine.graph_pool_handle()
        for runtime_mode, key in self.dispatcher.capture_keys():
            meta = self._dummy_metadata(key)
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

    def _dummy_metadata(self, key: BatchDescriptor) -> AttentionMetadata:
        """A legal batch of the key's shape, all of it in the null block (slot -1)."""
        q = self.config.uniform_decode_query_len
        if key.uniform_decode:
            lens = [q] * (key.num_reqs or 1)
        else:
            n = max(1, min(key.num_tokens, self.config.max_num_seqs))
            lens = [1] * (n - 1) + [key.num_tokens - (n - 1)]
        requests = [ScheduledRequest(f"dummy{i}", 0, n, (0,) * self.max_blocks) for i, n in enumerate(lens)]
        meta = build_attention_metadata(requests, self.kv_cache.config.block_size, self.max_blocks)
        return self.rank_metadata(_with(meta, slot_mapping=[-1] * meta.num_input_tokens))

    def _capture_full(self, size: int, meta: AttentionMetadata, pool: Any) -> FullGraph:
        engine = self.engine
        graph = engine.NPUGraph()
        layers: list[LayerTask] = []
        attend = self._capture_attend(meta, layers) if self.config.fixes.host_param_update else \
            self._plain_attend(meta)
        with engine.graph(graph, pool=pool):
            logits = self.model(self.input_ids[:size], self.positions[:size], self.slot_mapping[:size],
                                self.kv_cache, attend)
        self.graphs_captured += 1
        return FullGraph(graph, logits, layers)

    def _fia_kwargs(self, meta: AttentionMetadata) -> dict[str, Any]:
        cfg = self.model.config
        return dict(
            actual_seq_lengths=list(meta.actual_seq_lengths),
            actual_seq_lengths_kv=list(meta.seq_lens),
            block_table=self.block_table,
            block_size=cfg.block_size,
            num_heads=self.model.local_num_heads,
            num_key_value_heads=self.model.local_num_kv_heads,
            scale=self.model.attention_scale,
            input_layout="TND",
            sparse_mode=self.style.sparse_mode,
            softmax_lse_flag=self.style.combine is not None,
        )

    def _capture_attend(self, meta: AttentionMetadata, layers: list[LayerTask]):
        """Attention inside a FULL capture, as vLLM Ascend captures it (reference section 6)."""
        engine = self.engine

        def attend(layer: int, query: Tensor, key_cache: Tensor, value_cache: Tensor) -> Tensor:
            stream = engine.current_stream()
            kwargs = self._fia_kwargs(meta)
            workspace = get_max_workspace(query, key_cache, value_cache, **kwargs)
            out = torch.empty_like(query)
            lse = torch.empty(query.shape[0], query.shape[1], 1, dtype=torch.float32)
            event = engine.ExternalEvent()
            event.wait(stream)
            event.reset(stream)
            engine.graph_task_group_begin(stream)
            with fia_call_tags(layer=layer):
                npu_fused_infer_attention_score_out(query, key_cache, value_cache, **kwargs,
                                                    workspace=workspace, out=(out, lse))
            handle = engine.graph_task_group_end(stream)
            layers.append(LayerTask(handle, event, query, out, lse, workspace))
            return self.style.combine(out, lse) if self.style.combine else out

        return attend

    def _plain_attend(self, meta: AttentionMetadata):
        """Attention captured with no way to update it: host lists frozen at capture."""

        def attend(layer: int, query: Tensor, key_cache: Tensor, value_cache: Tensor) -> Tensor:
            with fia_call_tags(layer=layer):
                out, lse = npu_fused_infer_attention_score(query, key_cache, value_cache,
                                                           **self._fia_kwargs(meta))
            return self.style.combine(out, lse) if self.style.combine else out

        return attend

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
    def metadata(self, requests: Sequence[ScheduledRequest]) -> AttentionMetadata:
        return build_attention_metadata(requests, self.kv_cache.config.block_size, self.max_blocks)

    def is_uniform(self, meta: AttentionMetadata) -> bool:
        return is_uniform_decode(meta.query_lens, self.config.uniform_decode_query_len)

    def decide(self, meta: AttentionMetadata) -> DispatchDecision:
        q = self.config.uniform_decode_query_len
        return self.dispatcher.dispatch(meta.num_actual_tokens, meta.num_reqs,
                                        is_uniform_decode(meta.query_lens, q))

    def redecide(self, shape: Any, meta: AttentionMetadata) -> DispatchDecision:
        """Dispatch again for a shape the DP ranks agreed on (max tokens, min mode)."""
        if shape.runtime_mode == "NONE":
            return DispatchDecision(CUDAGraphMode.NONE, None, shape.num_tokens,
                                    f"DP agreed: eager with {shape.num_tokens} tokens")
        q = self.config.uniform_decode_query_len
        uniform = shape.uniform_decode and shape.num_tokens % q == 0
        decision = self.dispatcher.dispatch(shape.num_tokens, shape.num_tokens // q if uniform else 1, uniform,
                                            disable_full=shape.runtime_mode != "FULL")
        return replace(decision, reason=f"DP agreed {shape.num_tokens} tokens, {shape.runtime_mode}: {decision.reason}")

    def idle_metadata(self, num_tokens: int) -> AttentionMetadata:
        """An idle DP rank's batch: one dummy request of KV length 0 holding every token."""
        dummy = ScheduledRequest("idle", 0, num_tokens, (0,) * self.max_blocks)
        meta = build_attention_metadata([dummy], self.kv_cache.config.block_size, self.max_blocks)
        return _with(meta, seq_lens=[0], slot_mapping=[-1] * num_tokens, positions=[0] * num_tokens,
                     num_actual_tokens=0, padding_source=f"idle DP rank: {num_tokens} dummy tokens")

    def pad(self, meta: AttentionMetadata, decision: DispatchDecision) -> AttentionMetadata:
        return pad_attention_metadata(
            meta, decision.num_tokens_padded,
            uniform_decode_query_len=self.config.uniform_decode_query_len,
            runtime_mode=decision.runtime_mode, configured_mode=self.config.mode,
            fia_padding_fix=self.config.fixes.fia_padding,
        )

    def execute(self, inputs: StepInputs, decision: DispatchDecision) -> tuple[Tensor, list[dict] | None]:
        """Run one step; return the real rows' logits and the host lists the graph executed."""
        meta = inputs.meta
        if decision.runtime_mode is CUDAGraphMode.NONE:
            return self._run_eager(meta, inputs.input_ids)[: meta.num_actual_tokens], None
        self._write_static(inputs)
        size = decision.num_tokens_padded
        if decision.runtime_mode is CUDAGraphMode.FULL:
            full = self.full[decision.batch_descriptor]
            self._replay_full(full, meta)
            logits = full.logits
            executed = self._executed(full.graph)
        else:
            logits = self._replay_pieces(self.pieces[size], meta)
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
        engine = self.engine
        full.graph.replay()  # asynchronous: stalls at each layer's event until it is recorded
        if full.layers:
            stream = self.update_stream
            kwargs = self._fia_kwargs(meta)
            with engine.stream(stream), fia_call_tags(phase="update"):
                for layer, task in enumerate(full.layers):
                    engine.graph_task_update_begin(stream, task.handle)
                    try:
                        with fia_call_tags(layer=layer):
                            npu_fused_infer_attention_score_out(
                                task.query, self.kv_cache.key_cache[layer], self.kv_cache.value_cache[layer],
                                **kwargs, workspace=task.workspace, out=(task.out, task.lse))
                    except BaseException:
                        with contextlib.suppress(Exception):  # the host check failed: nothing to end
                            engine.graph_task_update_end(stream)
                        raise
                    engine.graph_task_update_end(stream)
                    task.event.record(stream)
        engine.synchronize()

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
        read = getattr(self.engine, "executed_host_arguments", None)
        if read is None:
            return None
        return read(graph, FIA_OP_NAME, ("actual_seq_lengths", "actual_seq_lengths_kv"))

    def release(self) -> None:
        for full in self.full.values():
            full.graph.reset()
        for pieces in self.pieces.values():
            for graph in pieces.graphs:
                graph.reset()
        self.full.clear()
        self.pieces.clear()


def _with(meta: AttentionMetadata, **changes: Any) -> AttentionMetadata:
    return replace(meta, **changes)
