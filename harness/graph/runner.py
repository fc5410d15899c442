"""The graph-mode model runner under test: capture per key, then execute the plans it is given.

This is where the domain meets an engine, through the torch.npu-shaped names only, so the
same runner drives the emulator, CUDA graphs and ACL graphs. Like vLLM's model runner it trusts
the decision it is handed (a :class:`~harness.graph.plan.StepPlan`): it never dispatches, pads
or builds metadata. Capture and replay go through graph wrappers
(:mod:`harness.graph.graph_wrapper`, vLLM Ascend's ``ACLGraphWrapper``), and it follows vLLM /
vLLM Ascend:

* one capture per capture key, largest first, all into one shared pool, each after warm-up runs
  (runtime mode NONE, passed through the wrappers); capturing is legal only in that phase; only a
  FULL key's dummy runs have attention metadata (a PIECEWISE key's run no attention);
* PIECEWISE: L+1 wrapped pieces per bucket; attention runs eagerly between them on live host
  values, its output copied into the static buffer the next piece captured;
* FULL: one wrapped forward per key. Where the lengths live is the capability step's answer
  (:class:`~harness.graph.capability.AttentionPath`): in host lists, each attention layer's FIA
  is captured behind an ExternalEvent in a task group, and after every replay its host
  parameters are updated on an update stream (ACL graph; the protocol is
  :mod:`harness.ops.attention`, reference section 6); in device buffers, the graph holds the
  device-metadata attention (``fia_device_metadata``) reading ``query_start_loc`` and
  ``seq_lens`` buffers that are refreshed before every replay (CUDA graph, FlashAttention's
  ``cu_seqlens``);
* inputs are copied into static buffers before replay (the wrappers keep none).

Each fix of the runner has a switch (:class:`Fixes`), so a known-bad scenario can turn one
off and show that the harness catches the bug it prevents.

Over 500 lines on purpose: capture, both attention paths and launch/resolve share the static
buffers, the wrappers and the pool, and vLLM keeps them in one model runner too; the parts that
stand alone already live beside it (wrappers, dispatch, metadata, the drafter's graphs).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import torch
from torch import Tensor

from harness.engine.protocol import DeviceEvent, DeviceGraph, Engine
from harness.graph.capability import AttentionPath
from harness.graph.dispatcher import BatchDescriptor
from harness.graph.graph_wrapper import CaptureMonitor, GraphWrapper, get_forward_context, set_forward_context
from harness.graph.metadata import AttentionMetadata
from harness.graph.modes import CUDAGraphMode
from harness.graph.plan import StepPlan
from harness.model import Attend, DecoderLM, PagedKVCache
from harness.ops import DEVICE_METADATA_OP_NAME, FIA_OP_NAME, fia_call_tags, fia_device_metadata, observe_device_lengths
from harness.ops.attention import (
    AttentionHeads,
    AttentionStyle,
    LayerTask,
    attend_eager,
    capture_task_group,
    fia_kwargs,
    update_layers,
)
from harness.plain import JsonObject, Kwargs

__all__ = ["AttentionStyle", "EagerRunner", "Fixes", "GraphRunner", "Launched", "RunnerConfig", "StepInputs", "fia_attend"]


@dataclass(frozen=True)
class Fixes:
    """The runner's fixes, each switchable for a known-bad scenario."""

    device_placement: bool = True  # model, caches and buffers on the engine's device (not the host)
    host_param_update: bool = True  # task-group update of FIA host lists after replay
    static_inputs: bool = True  # copy inputs into the captured buffers (not a fresh tensor)
    refresh_device_buffers: bool = True  # write the lengths' device buffers before a replay (device path)
    sync_before_replay: bool = True  # FULL host-list path: wait for the last replay before this one's update


@dataclass(frozen=True)
class RunnerConfig:
    max_num_tokens: int  # the largest capture size: the static buffers' length
    max_num_seqs: int
    max_blocks_per_req: int
    warmup_runs: int = 1
    fixes: Fixes = Fixes()
    mode: CUDAGraphMode = CUDAGraphMode.FULL  # the configured mode: which wrappers exist
    debug_input_addresses: bool = False  # the wrappers' replay-time address check (VLLM_LOGGING_LEVEL=DEBUG)
    attention_path: AttentionPath = AttentionPath.HOST_LISTS  # where FULL graphs keep the lengths
    capture_error_guidance: str | None = None  # the stack's advice before a stream-resource capture error


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
            return attend_eager(query, key_cache, value_cache, kwargs, style, query_rows=meta.query_rows)

    return attend


class DraftGraphs(Protocol):
    """What the target's runner asks of the draft model's graphs
    (:class:`~harness.graph.draft_runner.DraftGraphRunner`, which imports this module)."""

    @property
    def graphs_captured(self) -> int: ...
    def dummy_run(self, runtime_mode: CUDAGraphMode, key: BatchDescriptor) -> None: ...
    def release(self) -> None: ...


@dataclass(frozen=True)
class LiveAttention:
    """What attention reads from the forward context: the step's metadata and FIA's arguments."""

    meta: AttentionMetadata
    kwargs: Kwargs


@dataclass
class StepInputs:
    """One step's inputs for one path: metadata (maybe padded) and token ids (padded with 0)."""

    meta: AttentionMetadata
    input_ids: list[int]


@dataclass
class Launched:
    """A step issued to the device that the host has not waited for (vLLM's
    ``AsyncModelRunnerOutput``): its logits and device-side samples, and where to read what its
    FULL graph executed once it has run."""

    logits: Tensor  # the real rows, on the device
    sampled: Tensor | None = None  # the greedy token of each sampled row, on the device
    graph: DeviceGraph | None = None  # the FULL graph replayed, if any
    replay: int | None = None  # which of its replays (the emulator logs each)
    num_reqs: int = 0  # the padded request count of the replay
    buffers: tuple[Tensor, Tensor] | None = None  # device path: copies of the lengths the replay read
    read_back: tuple[Tensor, ...] | None = None  # host copies of logits (and buffers), filled when ready
    ready: DeviceEvent | None = None  # the event after those copies (async scheduling): the host waits on it only


def _block_table(meta: AttentionMetadata, device: torch.device) -> Tensor:
    return torch.tensor(meta.block_table, dtype=torch.int32, device=device)


def _step_tensors(input_ids: list[int], meta: AttentionMetadata, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """A step's token ids, positions and slots, copied to the device (fresh tensors of its size)."""
    return (torch.tensor(input_ids, dtype=torch.int64, device=device),
            torch.tensor(meta.positions, dtype=torch.int64, device=device),
            torch.tensor(meta.slot_mapping, dtype=torch.int64, device=device))


class EagerRunner:
    """Runs a step eagerly with the metadata it is given (the reference and padded paths)."""

    def __init__(self, model: DecoderLM, kv_cache: PagedKVCache, style: AttentionStyle = AttentionStyle()) -> None:
        self.model, self.kv_cache, self.style = model, kv_cache, style

    def execute(self, inputs: StepInputs, *, attention: bool = True) -> Tensor:
        """``attention=False``: a step without attention metadata (an idle rank's non-FULL dummy):
        every attention returns zeros, as upstream's does without metadata."""
        meta, device = inputs.meta, self.kv_cache.device
        attend = fia_attend(self.model, meta, _block_table(meta, device), self.style) if attention else _no_attention
        logits: Tensor = self.model(*_step_tensors(inputs.input_ids, meta, device), self.kv_cache, attend)
        return logits[: meta.num_actual_tokens]


def _no_attention(layer: int, query: Tensor, key_cache: Tensor, value_cache: Tensor) -> Tensor:
    return torch.zeros_like(query)


class _Piece:
    """Piece ``index`` of the forward as a callable of tensors only (what a PIECEWISE wrapper wraps).

    Arguments: the piece's inputs (``input_ids`` for piece 0; attention output and residual
    after), then ``positions`` and ``slot_mapping``, so the wrapper's debug check sees every
    tensor the piece's graph reads.
    """

    def __init__(self, model: DecoderLM, index: int, kv_cache: PagedKVCache) -> None:
        self.model, self.index, self.kv_cache = model, index, kv_cache
        self.__name__ = f"piece{index}"

    def __call__(self, *args: Tensor) -> tuple[Tensor, ...]:
        *inputs, positions, slot_mapping = args
        return self.model.piece(self.index, tuple(inputs), positions, slot_mapping, self.kv_cache)


class GraphRunner:
    """Captures the graphs it is told to and executes plans through them.

    The forward is built as vLLM builds it: the model's pieces, each behind a PIECEWISE
    :class:`~harness.graph.graph_wrapper.GraphWrapper` when the configured mode has piecewise
    graphs, with attention between them, and the whole behind one FULL wrapper when the mode has
    full graphs. Every call of the graph path (warm-up, capture, replay, eager batch) goes through
    these wrappers under a forward context, so which graph runs is the wrappers' decision from the
    plan's runtime mode and batch descriptor, as upstream.
    """

    def __init__(self, engine: Engine, model: DecoderLM, kv_cache: PagedKVCache, config: RunnerConfig,
                 style: AttentionStyle = AttentionStyle()) -> None:
        self.engine, self.model, self.kv_cache, self.config, self.style = engine, model, kv_cache, config, style
        self.heads = attention_heads(model)
        self.device = device = kv_cache.device
        max_tokens = config.max_num_tokens
        # Rows for real requests, fake uniform requests (at most one per token) and one dummy.
        self.max_reqs = max(config.max_num_seqs, max_tokens) + 1
        # The static buffers every graph reads: device memory, written in place before replay.
        self.input_ids = torch.zeros(max_tokens, dtype=torch.int64, device=device)
        self.positions = torch.zeros(max_tokens, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((max_tokens,), -1, dtype=torch.int64, device=device)
        self.block_table = torch.zeros(self.max_reqs, config.max_blocks_per_req, dtype=torch.int32, device=device)
        self.device_buffers = config.attention_path is AttentionPath.DEVICE_BUFFERS
        if self.device_buffers:  # the lengths a FULL graph's attention reads when it runs
            self.query_start_loc = torch.zeros(self.max_reqs + 1, dtype=torch.int32, device=device)
            self.seq_lens = torch.zeros(self.max_reqs, dtype=torch.int32, device=device)
        self.update_stream = engine.Stream()
        self.copy_stream = engine.Stream()  # async scheduling's read-back of each step's results
        self.streams_by_bucket: list[JsonObject] = []
        # What attention keeps per captured key: FULL graphs' task groups, PIECEWISE graphs'
        # static attention outputs (the next piece's captured input).
        self.layer_tasks: dict[BatchDescriptor, list[LayerTask]] = {}
        self.workspaces: dict[int, Tensor] = {}  # FIA's workspace per capture size, shared by its layers
        self.attn_outputs: dict[BatchDescriptor, list[Tensor]] = {}
        self.monitor = CaptureMonitor(enabled=False)  # capturing is legal only inside capture()
        mode = config.mode
        # One pool for every graph of the run, the drafter's too (vLLM Ascend: the platform's
        # global graph pool, shared by every ACLGraphWrapper).
        self.pool = pool = engine.graph_pool_handle() if mode is not CUDAGraphMode.NONE else None
        self.drafter: DraftGraphs | None = None  # the draft model's graphs, captured with each key
        wrap: Kwargs = dict(engine=engine, pool=pool, monitor=self.monitor, debug=config.debug_input_addresses,
                    capture_error_guidance=config.capture_error_guidance)
        # vLLM Ascend synchronizes before a FULL replay so that the host update of this step
        # cannot race the last replay (PR #4233); device buffers need no update, and vLLM's
        # CUDA graph wrapper has no such sync.
        full_sync = not self.device_buffers and config.fixes.sync_before_replay
        self.piece_wrappers: list[GraphWrapper] = []
        pieces: list[Callable[..., tuple[Tensor, ...]]] = [_Piece(model, i, kv_cache) for i in range(model.num_pieces)]
        if mode.has_piecewise_cudagraphs():
            # only the last piece's output is used by no later graph (vLLM: weak_ref_output=is_last_graph)
            self.piece_wrappers = [GraphWrapper(p, CUDAGraphMode.PIECEWISE, weak_ref_output=i == len(pieces) - 1,
                                                **wrap) for i, p in enumerate(pieces)]
            pieces = list(self.piece_wrappers)
        self.pieces = pieces
        self.full_wrapper: GraphWrapper | None = None
        self.forward: Callable[..., Tensor] = self._forward
        if mode.has_full_cudagraphs():
            self.full_wrapper = self.forward = GraphWrapper(self._forward, CUDAGraphMode.FULL, name="forward",
                                                            sync_before_replay=full_sync, **wrap)

    @property
    def graphs_captured(self) -> int:
        """Graphs of the target and of the drafter: every one holds streams of the same pool."""
        wrappers = [*self.piece_wrappers, *([self.full_wrapper] if self.full_wrapper else [])]
        drafted = self.drafter.graphs_captured if self.drafter is not None else 0
        return sum(w.num_captured for w in wrappers) + drafted

    # -- the forward the wrappers wrap ---------------------------------------------------------
    def _forward(self, input_ids: Tensor, positions: Tensor, slot_mapping: Tensor) -> Tensor:
        """The model forward: its pieces (maybe wrapped) with attention between them."""
        outs = self.pieces[0](input_ids, positions, slot_mapping)
        for layer in range(self.model.config.num_layers):
            query, residual = outs
            attn_out = self._attention(layer, query)
            outs = self.pieces[layer + 1](attn_out, residual, positions, slot_mapping)
        hidden: Tensor = outs[0]
        return hidden

    def _attention(self, layer: int, query: Tensor) -> Tensor:
        """Attention of ``layer`` as the forward context says: captured in a FULL graph's task
        group, or eager with the step's live host lists (into a PIECEWISE key's static buffer)."""
        context = get_forward_context()
        live: LiveAttention | None = context.attn_metadata
        key_cache, value_cache = self.kv_cache.key_cache[layer], self.kv_cache.value_cache[layer]
        mode, style = context.runtime_mode, self.style
        if live is None:
            # A dummy run without attention metadata (a PIECEWISE key's warm-up and capture,
            # vLLM ``_should_build_dummy_attn_metadata``): vLLM Ascend's attention returns zeros
            # (``if attn_metadata is None: return output.fill_(0)``), FIA is not called.
            if mode is CUDAGraphMode.PIECEWISE:
                return self._attention_buffer(context.graph_key, layer, query).zero_()
            return torch.zeros_like(query)
        if mode is CUDAGraphMode.FULL and context.capturing and self.device_buffers:
            with fia_call_tags(layer=layer):
                out, lse = fia_device_metadata(query, key_cache, value_cache, self.query_start_loc, self.seq_lens,
                                               self.block_table, block_size=self.heads.block_size,
                                               num_heads=self.heads.num_heads,
                                               num_key_value_heads=self.heads.num_kv_heads, scale=self.heads.scale,
                                               max_num_reqs=self.max_reqs, sparse_mode=style.sparse_mode)
            return style.combine(out, lse) if style.combine else out
        kwargs = live.kwargs
        if mode is CUDAGraphMode.FULL and context.capturing and self.config.fixes.host_param_update:
            num_tokens = query.shape[0]
            with fia_call_tags(layer=layer):
                task = capture_task_group(self.engine, query, key_cache, value_cache, kwargs,
                                          workspace=self.workspaces.get(num_tokens))
            self.workspaces.setdefault(num_tokens, task.workspace)
            self.layer_tasks.setdefault(context.graph_key, []).append(task)
            return style.combine(task.out, task.lse) if style.combine else task.out
        between = mode is CUDAGraphMode.PIECEWISE
        # Eager: NONE, between PIECEWISE pieces, or (known-bad) FIA frozen into a FULL capture
        # with no way to update its host lists.
        with fia_call_tags(layer=layer, **({"phase": "between-pieces"} if between else {})):
            out = attend_eager(query, key_cache, value_cache, kwargs, style, query_rows=live.meta.query_rows)
        if not between:
            return out
        buffer = self._attention_buffer(context.graph_key, layer, out)
        buffer.copy_(out)
        return buffer

    def _attention_buffer(self, key: BatchDescriptor, layer: int, like: Tensor) -> Tensor:
        """The static attention output of ``layer`` for PIECEWISE ``key``: the next piece's input."""
        buffers = self.attn_outputs.setdefault(key, [])
        if len(buffers) <= layer:  # made by the key's capture, in layer order
            buffers.append(torch.zeros_like(like))
        return buffers[layer]

    # -- capture -----------------------------------------------------------------------------
    def capture(self, plans: Sequence[tuple[CUDAGraphMode, BatchDescriptor, AttentionMetadata]]) -> None:
        """Capture one graph per key, each on its dummy batch (``StepPlanner.capture_plans``):
        warm-up runs (runtime mode NONE, through the wrappers), then the capturing call.

        Attention metadata is built for a FULL key's dummy runs only (vLLM ``_warmup_and_capture``:
        ``force_attention`` for FULL; vLLM Ascend ``_should_build_dummy_attn_metadata``): a
        PIECEWISE key's warm-ups and capture run no attention at all. Each dummy run ends with the
        drafter's (vLLM Ascend ``_dummy_run`` calls ``drafter.dummy_run``), which captures the
        draft model's graphs of the key (:mod:`harness.graph.draft_runner`)."""
        self.monitor.enabled = True
        try:
            for runtime_mode, key, meta in plans:
                inputs = StepInputs(meta, [0] * key.num_tokens)
                self._write_static(inputs)
                if self.device_buffers and runtime_mode is CUDAGraphMode.FULL:
                    self._refresh_device_buffers(meta)  # the dummy batch the graph is captured on
                args = self._static_args(meta)
                live = self._live(meta, self.block_table) if runtime_mode is CUDAGraphMode.FULL else None
                with fia_call_tags(phase="warmup", bucket=key.num_tokens), \
                        set_forward_context(CUDAGraphMode.NONE, None, live):
                    for _ in range(self.config.warmup_runs):
                        self.forward(*args)
                        if self.drafter is not None:
                            self.drafter.dummy_run(CUDAGraphMode.NONE, key)
                with fia_call_tags(phase="capture", bucket=key.num_tokens, graph=str(runtime_mode)):
                    had_workspaces = set(self.workspaces)
                    try:
                        with set_forward_context(runtime_mode, key, live):
                            self.forward(*args)
                        if self.drafter is not None:
                            self.drafter.dummy_run(runtime_mode, key)
                    except Exception as error:
                        self._log_streams(runtime_mode, key, needed=getattr(error, "needed", None), failed=True)
                        # a failed capture gives its memory back: a workspace it made must not outlive it
                        for size in set(self.workspaces) - had_workspaces:
                            del self.workspaces[size]
                        raise
                self._log_streams(runtime_mode, key)
        finally:
            self.monitor.enabled = False

    def _log_streams(self, runtime_mode: CUDAGraphMode, key: BatchDescriptor, needed: int | None = None,
                     failed: bool = False) -> None:
        """Streams held after each bucket's capture (and what a failed one needed): the report
        draws them against the pool."""
        in_use = self.engine.stream_usage().get("in_use")
        self.streams_by_bucket.append({"bucket": key.num_tokens, "mode": str(runtime_mode), "in_use": in_use,
                                       "needed": needed, "failed": failed})

    # -- execution ---------------------------------------------------------------------------
    def execute(self, plan: StepPlan, input_ids: list[int]) -> tuple[Tensor, list[JsonObject] | None]:
        """Run one plan and wait for it; return the real rows' logits and the host lists the
        graph executed (a step of an engine without async scheduling)."""
        return self.resolve(self.launch(plan, input_ids))

    def launch(self, plan: StepPlan, input_ids: list[int], fills: Sequence[tuple[int, int]] = (),
               previous: Launched | None = None, sample_rows: Sequence[int] = (), *,
               read_back: bool = False) -> Launched:
        """Issue one plan to the device and return without waiting for it (async scheduling).

        ``fills``: ``(input position, row of previous.sampled)`` pairs, the tokens of the step
        before that the host has not read yet: they are copied on the device into the step's input
        ids (vLLM's ``prev_sampled_token_ids``). ``sample_rows``: the logits rows whose greedy
        token the next step may need (each request's last), sampled on the device. ``read_back``:
        copy the results to the host on a stream of their own, behind an event (vLLM's async
        output copy), so that waiting for this step does not wait for the steps launched after it."""
        launched = self._launch(plan, input_ids, fills, previous, sample_rows)
        if read_back:
            self._read_back(launched)
        return launched

    def _launch(self, plan: StepPlan, input_ids: list[int], fills: Sequence[tuple[int, int]],
                previous: Launched | None, sample_rows: Sequence[int]) -> Launched:
        decision = plan.decision
        meta = plan.padded
        if decision is None or decision.runtime_mode is CUDAGraphMode.NONE:
            # Eager, through the wrappers (they pass it on): fresh tensors of the batch's own size.
            args = _step_tensors(input_ids, meta, self.device)
            self._fill_sampled(args[0], fills, previous)
            eager_live = self._live(meta, _block_table(meta, self.device)) if plan.builds_attention else None
            with set_forward_context(CUDAGraphMode.NONE, None, eager_live):
                logits = self.forward(*args)
            return self._launched(logits[: meta.num_actual_tokens], sample_rows)
        self._write_static(StepInputs(meta, input_ids))
        self._fill_sampled(self.input_ids, fills, previous)
        key, mode = decision.graph_key, decision.runtime_mode
        live = self._live(meta, self.block_table) if plan.builds_attention else None
        if self.device_buffers and mode is CUDAGraphMode.FULL:
            self._refresh_device_buffers(meta, kv_lengths=self.config.fixes.refresh_device_buffers)
            self._observe_device_lengths(key)
        try:
            with set_forward_context(mode, key, live):
                logits = self.forward(*self._static_args(meta))  # a replay (the runnable is not called)
                if mode is CUDAGraphMode.FULL:
                    assert live is not None  # a FULL step always builds its attention's metadata
                    self._update_full_graph_params(key, live.kwargs)
        except BaseException:
            # What was launched runs on a device whatever the host does next (the update releases
            # the replay's events even when it fails): let it finish here, before this rank's
            # host moves on, so its collectives meet its peers' in the same order.
            with contextlib.suppress(Exception):
                self.engine.synchronize()
            raise
        # the graph's output buffer is the next replay's too: the step keeps a copy, in stream order
        launched = self._launched(logits[: meta.num_actual_tokens].clone(), sample_rows)
        if mode is CUDAGraphMode.FULL and self.full_wrapper is not None:
            launched.graph = self.full_wrapper.graph_of(key)
            launched.replay = getattr(launched.graph, "replays", None)
            launched.num_reqs = meta.num_reqs_padded
            if self.device_buffers:  # what this replay read, before the next step rewrites them
                launched.buffers = (self.query_start_loc[: meta.num_reqs_padded + 1].clone(),
                                    self.seq_lens[: meta.num_reqs_padded].clone())
        return launched

    def resolve(self, launched: Launched) -> tuple[Tensor, list[JsonObject] | None]:
        """Wait for a launched step: its logits on the host, and the host lists its FULL graph
        executed (None where no FULL graph ran)."""
        if launched.ready is None:
            logits = launched.logits.cpu()  # a host read: the host waits for the step's stream
        else:
            launched.ready.synchronize()  # this step's copies, not what was launched after it
            logits, *buffers = launched.read_back or ()
            if launched.buffers is not None:
                launched.buffers = (buffers[0], buffers[1])
        executed = self._executed(launched) if launched.graph is not None else None
        return logits, executed

    def _read_back(self, launched: Launched) -> None:
        """Queue the step's host copies on the copy stream, after the step, and an event after them."""
        engine = self.engine
        self.copy_stream.wait_stream(engine.current_stream())
        with engine.stream(self.copy_stream):
            sources = (launched.logits, *(launched.buffers or ()))
            launched.read_back = tuple(t.to("cpu", non_blocking=True) for t in sources)
            launched.ready = engine.Event()
            launched.ready.record()

    def _launched(self, logits: Tensor, sample_rows: Sequence[int]) -> Launched:
        sampled = None
        if sample_rows:  # greedy sampling on the device: the host does not wait for it
            rows = torch.tensor(list(sample_rows), dtype=torch.int64).to(self.device, non_blocking=True)
            sampled = logits.index_select(0, rows).argmax(dim=-1)
        return Launched(logits, sampled)

    @staticmethod
    def _fill_sampled(input_ids: Tensor, fills: Sequence[tuple[int, int]], previous: Launched | None) -> None:
        """Copy the previous step's sampled tokens into ``input_ids`` on the device."""
        if not fills:
            return
        if previous is None or previous.sampled is None:
            raise ValueError("the step's inputs need tokens of a previous step that sampled none on the device")
        positions, rows = zip(*fills)
        device = input_ids.device
        dst = torch.tensor(positions, dtype=torch.int64).to(device, non_blocking=True)
        src = torch.tensor(rows, dtype=torch.int64).to(device, non_blocking=True)
        input_ids.index_copy_(0, dst, previous.sampled.index_select(0, src))

    def _update_full_graph_params(self, key: BatchDescriptor, kwargs: Kwargs) -> None:
        """After a FULL replay was launched (it stalls at each layer's event): update every
        layer's FIA host lists on the update stream (vLLM Ascend ``update_full_graph_params``)."""
        tasks = self.layer_tasks.get(key)
        if not tasks:
            return
        caches = list(zip(self.kv_cache.key_cache, self.kv_cache.value_cache))
        with fia_call_tags(phase="update"):
            update_layers(self.engine, self.update_stream, tasks, caches, kwargs)

    def _live(self, meta: AttentionMetadata, block_table: Tensor) -> LiveAttention:
        return LiveAttention(meta, fia_kwargs(self.heads, meta.actual_seq_lengths, meta.seq_lens, block_table,
                                              self.style))

    def _static_args(self, meta: AttentionMetadata) -> tuple[Tensor, Tensor, Tensor]:
        n = meta.num_input_tokens
        return self.input_ids[:n], self.positions[:n], self.slot_mapping[:n]

    def _write_static(self, inputs: StepInputs) -> None:
        meta = inputs.meta
        n = meta.num_input_tokens
        if not self.config.fixes.static_inputs:
            # The bug this switch reproduces: fresh tensors bound to the names, so the graph
            # still reads the buffers it captured (never written again).
            self.input_ids, self.positions, self.slot_mapping = _step_tensors(inputs.input_ids, meta, self.device)
            return
        # Host-to-device copies into the captured addresses, in stream order and without a host
        # wait (vLLM: CpuGpuBuffer.copy_to_gpu, non_blocking): a replay still queued reads the old values.
        self.input_ids[:n].copy_(torch.tensor(inputs.input_ids, dtype=torch.int64), non_blocking=True)
        self.positions[:n].copy_(torch.tensor(meta.positions, dtype=torch.int64), non_blocking=True)
        self.slot_mapping[:n].copy_(torch.tensor(meta.slot_mapping, dtype=torch.int64), non_blocking=True)
        self.block_table.zero_()
        self.block_table[: meta.num_reqs_padded].copy_(torch.tensor(meta.block_table, dtype=torch.int32),
                                                       non_blocking=True)

    def _refresh_device_buffers(self, meta: AttentionMetadata, *, kv_lengths: bool = True) -> None:
        """Write the step's lengths into the device buffers the FULL graph reads (vLLM's
        ``query_start_loc`` / ``seq_lens`` CpuGpuBuffers): request slots past the padded count
        repeat the last start (zero-length queries) and have KV length 0.

        ``kv_lengths=False`` is the known-bad pipeline (``fixes.refresh_device_buffers``): the
        KV lengths keep what the capture wrote, as FIA's host lists do without their update."""
        n = meta.num_reqs_padded
        starts = list(meta.query_start_loc) + [meta.query_start_loc[-1]] * (self.max_reqs - n)
        self.query_start_loc.copy_(torch.tensor(starts, dtype=torch.int32), non_blocking=True)
        if kv_lengths:
            self.seq_lens.copy_(torch.tensor(list(meta.seq_lens) + [0] * (self.max_reqs - n), dtype=torch.int32),
                                non_blocking=True)
            self._kv_lengths = list(meta.seq_lens) + [0] * (self.max_reqs - n)
        self._buffer_lists = (list(meta.actual_seq_lengths), self._kv_lengths[:n])

    def _observe_device_lengths(self, key: BatchDescriptor) -> None:
        """The FIA invariant on the device path: what each layer's attention will read from the
        buffers (the lists last written), against the graph's T, once per layer and step."""
        cumulative, kv = self._buffer_lists
        for layer in range(self.model.config.num_layers):
            with fia_call_tags(layer=layer, phase="device-buffers"):
                observe_device_lengths(key.num_tokens, cumulative, kv, tuple(self.block_table.shape),
                                       self.heads.block_size)

    def _executed(self, launched: Launched) -> list[JsonObject] | None:
        """The lengths each layer's attention ran with in the launched replay, where they can be
        known: the emulator reads them off the ops it ran; device buffers are read from the copy
        taken right after the replay; else None (the text is the evidence)."""
        names = ("actual_seq_lengths", "actual_seq_lengths_kv")
        graph, num_reqs = launched.graph, launched.num_reqs
        assert graph is not None  # only a FULL replay is read back
        if self.engine.capabilities.reports_executed_arguments:
            if not self.device_buffers:  # the host lists each FIA ran with, whole
                return self.engine.executed_host_arguments(graph, FIA_OP_NAME, names, replay=launched.replay)
            # the buffers' request slots past the padded count are unused (zero-length queries)
            ran = self.engine.executed_host_arguments(graph, DEVICE_METADATA_OP_NAME, names, replay=launched.replay)
            return [{name: list(entry[name])[:num_reqs] for name in names} for entry in ran]
        if launched.buffers is not None:
            starts, kv = (buffer.tolist() for buffer in launched.buffers)
            return [{"actual_seq_lengths": starts[1:], "actual_seq_lengths_kv": kv}] * self.model.config.num_layers
        return None

    def release(self) -> None:
        if self.drafter is not None:
            self.drafter.release()
        for wrapper in [*self.piece_wrappers, *([self.full_wrapper] if self.full_wrapper else [])]:
            wrapper.reset()
        self.layer_tasks.clear()
        self.workspaces.clear()
        self.attn_outputs.clear()
