"""The attention call protocol: FIA's arguments, and how a FULL graph captures and updates it.

One module, because the same three things were written out by the runner, the models, the
tests and the benchmarks, and a difference between copies is a silent divergence from what
vLLM Ascend does (reference section 6):

* :func:`fia_kwargs`: the keyword arguments of ``npu_fused_infer_attention_score`` for a batch
  (TND layout, cumulative query lengths, per-request KV lengths, this rank's heads);
* :func:`attend_eager`: the eager call (live host lists), with an optional merge of partial
  results (context parallel merges ranks by their softmax LSE) and vLLM Ascend's non-FULL
  query slice (only the real tokens' rows are attended; the padding rows stay zero);
* :func:`capture_task_group`: inside a FULL capture, FIA ``.out`` behind an ExternalEvent
  (wait, reset) in a task group with a fixed workspace, returning the :class:`LayerTask` that
  lets the host parameters be changed after every replay;
* :func:`update_task_group`: after a replay, re-issue FIA ``.out`` with the new host lists
  inside ``graph_task_update_begin/end`` on the update stream, then record the layer's event
  (the replay waits on it).

The ``engine`` argument is any object with the torch.npu-shaped names (``harness.engine``);
this module never imports a backend.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import torch
from torch import Tensor

from harness.ops.fia import (
    get_max_workspace,
    npu_fused_infer_attention_score,
    npu_fused_infer_attention_score_out,
)
from harness.ops.observe import fia_call_tags
from harness.plain import Kwargs

if TYPE_CHECKING:  # the types only: harness.ops imports no backend
    from harness.engine.protocol import DeviceStream, Engine, ExternalDeviceEvent, TaskGroup

__all__ = ["AttentionHeads", "AttentionStyle", "LayerTask", "attend_eager", "capture_task_group", "fia_kwargs",
           "update_task_group"]


@dataclass(frozen=True)
class AttentionStyle:
    """How attention runs around the FIA call: its mask, and a merge of partial results.

    Context parallel runs FIA over this rank's KV shard without a causal mask (causality is in
    its per-token KV lengths) and merges the ranks' outputs by their softmax LSE (``combine``).
    """

    sparse_mode: int = 3
    combine: Callable[[Tensor, Tensor], Tensor] | None = None


@dataclass(frozen=True)
class AttentionHeads:
    """What FIA needs to know of the model on this rank: cache block size, heads, scale."""

    block_size: int
    num_heads: int
    num_kv_heads: int
    scale: float


def fia_kwargs(heads: AttentionHeads, actual_seq_lengths: Sequence[int], actual_seq_lengths_kv: Sequence[int],
               block_table: Tensor, style: AttentionStyle = AttentionStyle()) -> Kwargs:
    """FIA's keyword arguments; the host lists are copied to Python ints (read live per call)."""
    return dict(
        actual_seq_lengths=[int(x) for x in actual_seq_lengths],
        actual_seq_lengths_kv=[int(x) for x in actual_seq_lengths_kv],
        block_table=block_table,
        block_size=heads.block_size,
        num_heads=heads.num_heads,
        num_key_value_heads=heads.num_kv_heads,
        scale=heads.scale,
        input_layout="TND",
        sparse_mode=style.sparse_mode,
        softmax_lse_flag=style.combine is not None,
    )


def attend_eager(query: Tensor, key_cache: Tensor, value_cache: Tensor, kwargs: Kwargs,
                 style: AttentionStyle = AttentionStyle(), op: Callable[..., tuple[Tensor, Tensor]] | None = None, *,
                 query_rows: int | None = None) -> Tensor:
    """One eager FIA call (``op`` defaults to the harness op), merged by ``style.combine``.

    ``query_rows``: attend only the first rows of ``query`` and return zeros for the rest, as
    vLLM Ascend's non-FULL path does (``query[:actual_seq_lengths_q[-1]]``: the padding tokens
    have no request, so the FIA host check holds without a dummy one)."""
    rows = query if query_rows is None else query[:query_rows]
    out, lse = (op or npu_fused_infer_attention_score)(rows, key_cache, value_cache, **kwargs)
    out = style.combine(out, lse) if style.combine else out
    if query_rows is None:
        return out
    return torch.cat([out, out.new_zeros((query.shape[0] - query_rows, *out.shape[1:]))])


@dataclass(eq=False)
class LayerTask:
    """What a FULL graph keeps per attention layer to update its host parameters."""

    handle: TaskGroup
    event: ExternalDeviceEvent
    query: Tensor
    out: Tensor
    lse: Tensor
    workspace: Tensor


def capture_task_group(engine: Engine, query: Tensor, key_cache: Tensor, value_cache: Tensor,
                       kwargs: Kwargs, workspace: Tensor | None = None) -> LayerTask:
    """Inside a capture: event wait + reset, task group begin, FIA ``.out``, task group end.

    ``workspace`` is the capture size's workspace once an earlier layer has made it: vLLM Ascend
    queries ``get_max_workspace`` once per size (``graph_params.workspaces[num_tokens]``) and
    every layer of that size's graphs shares the buffer, since graphs never replay at once.
    ``None`` makes it here.
    """
    stream = engine.current_stream()
    if workspace is None:
        workspace = get_max_workspace(query, key_cache, value_cache, **kwargs)
    out = torch.empty_like(query)
    lse = torch.empty(query.shape[0], query.shape[1], 1, dtype=torch.float32, device=query.device)
    event = engine.ExternalEvent()
    event.wait(stream)
    event.reset(stream)
    engine.graph_task_group_begin(stream)
    npu_fused_infer_attention_score_out(query, key_cache, value_cache, **kwargs, workspace=workspace, out=(out, lse))
    handle = engine.graph_task_group_end(stream)
    return LayerTask(handle, event, query, out, lse, workspace)


def update_task_group(engine: Engine, stream: DeviceStream, task: LayerTask, key_cache: Tensor, value_cache: Tensor,
                      kwargs: Kwargs, *, update: bool = True) -> None:
    """After a replay, on ``stream``: re-issue FIA with new host lists, then record the event.

    ``update=False`` records the event without updating (the known-bad pipeline whose graph
    keeps the host lists of its capture). A host check that raises inside the update still
    ends the update, so the engine is left in a consistent state.
    """
    if update:
        engine.graph_task_update_begin(stream, task.handle)
        try:
            npu_fused_infer_attention_score_out(task.query, key_cache, value_cache, **kwargs,
                                                workspace=task.workspace, out=(task.out, task.lse))
        except BaseException:
            with contextlib.suppress(Exception):  # the host check failed: nothing to end
                engine.graph_task_update_end(stream)
            raise
        engine.graph_task_update_end(stream)
    task.event.record(stream)


def update_layers(engine: Engine, stream: DeviceStream, tasks: Sequence[LayerTask], caches: Sequence[tuple[Tensor, Tensor]],
                  kwargs: Kwargs) -> None:
    """Update every layer of a replayed FULL graph on ``stream`` (tags each call with its layer).

    If a layer's update raises (the host check refused the new lists), the events of that layer
    and every later one are still recorded: the replay, which waits at each layer's event, then
    runs to its end with the lists it had, instead of waiting for ever (a hung device)."""
    with engine.stream(stream):
        for layer, (task, (key_cache, value_cache)) in enumerate(zip(tasks, caches)):
            try:
                with fia_call_tags(layer=layer):
                    update_task_group(engine, stream, task, key_cache, value_cache, kwargs)
            except BaseException:
                for stalled in tasks[layer:]:
                    stalled.event.record(stream)
                raise
