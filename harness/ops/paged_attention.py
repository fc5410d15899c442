"""torch_npu's ``_npu_paged_attention``: the ATB decode attention vLLM Ascend uses, on CPU.

vLLM Ascend's decode path (``vllm_ascend/attention/attention_v1.py``: ``full_graph_pa`` and
the paged-attention branch of the graph-parameter update) calls::

    torch_npu._npu_paged_attention(query=[B, N, D], key_cache=[blocks, block_size, N_kv, D],
        value_cache=..., num_kv_heads=, num_heads=, scale_value=, block_table=int32 [B, max_blocks],
        context_lens=seq_lens, out=[B, N, Dv], workspace=...)

One query token per request (decode); request i attends over the first ``context_lens[i]``
tokens of its blocks. ``context_lens`` is a HOST input: vLLM Ascend passes the CPU tensor
``attn_metadata.seq_lens`` and ATB reads it on the host when the op is launched. So in a
captured graph the lengths are frozen at capture, exactly like FIA's ``actual_seq_lengths``, and
a task-group update that re-issues the op with the new ``context_lens`` is what refreshes them
(torch_npu registers ``_npu_paged_attention.default`` for ``NPUGraph.update`` with
``("arg", 7, "context_lens")`` in ``torch_npu/npu/_npugraph_handlers/simple_handler.py``; the
test is ``test_paged_attention_aclgraph_update`` in ``test/npu/test_aclgraph_update.py``).

Two ops, registered with ``torch.library`` so a recorder sees ONE node per call:

* ``harness::npu_paged_attention`` -- torch_npu's schema (``Tensor(a!) out`` at position 8,
  ``context_lens`` at position 7), except that ``context_lens`` is ``SymInt[]``: the host
  values, which the wrapper reads from the host tensor. An update replaces that argument.
* ``harness::npu_paged_attention_device_lens`` -- the comparison design, NOT a torch_npu
  behaviour: ``context_lens`` is a tensor the kernel reads when it runs, so a replay sees its
  current contents without any update (as ``fia_device_metadata`` does for FIA). CPU kernel only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from harness.ops.contract import FiaArgumentError
from harness.ops.library import NAMESPACE, PAGED_ATTENTION_OP_NAME
from harness.ops.reference import Span, paged_attention_into
from harness.plain import Kwargs

#: ``Tensor.tolist`` as torch defines it, taken before any capture can wrap it. The wrapper reads
#: ``context_lens`` from HOST memory, which is legal inside a capture; the emulator's capture
#: guard (which treats every CPU tensor as device memory) must not see that read.
_HOST_TOLIST = torch.Tensor.tolist

_PA_ARGS = (
    "Tensor query, Tensor key_cache, Tensor value_cache, int num_kv_heads, int num_heads, "
    "float scale_value, Tensor block_table, {lens} context_lens, Tensor(a!) out, *, "
    "Tensor? workspace=None"
)
PAGED_ATTENTION_SCHEMA = f"npu_paged_attention({_PA_ARGS.format(lens='SymInt[]')}) -> ()"
PAGED_ATTENTION_DEVICE_SCHEMA = f"npu_paged_attention_device_lens({_PA_ARGS.format(lens='Tensor')}) -> ()"
PAGED_ATTENTION_DEVICE_OP_NAME = f"{NAMESPACE}::npu_paged_attention_device_lens"

_lib = torch.library.Library(NAMESPACE, "FRAGMENT")  # noqa: TOR901 (kept alive by this module)
_lib.define(PAGED_ATTENTION_SCHEMA)
_lib.define(PAGED_ATTENTION_DEVICE_SCHEMA)

NativeFn = Callable[..., Any]
# Process-wide backend choice, like harness.ops.fia's set_native_impl; None = the reference.
_native: dict[str, NativeFn | None] = {"op": None, "workspace": None}


def set_native_paged_attention(fn: NativeFn | None, fn_workspace: NativeFn | None = None) -> None:
    """Route the wrapper to torch_npu's ``_npu_paged_attention`` (``None`` restores the reference)."""
    _native["op"], _native["workspace"] = fn, fn_workspace


# --------------------------------------------------------------------------- validation


def paged_attention_violation(
    query_shape: Sequence[int],
    key_shape: Sequence[int],
    value_shape: Sequence[int],
    block_table_shape: Sequence[int],
    out_shape: Sequence[int],
    num_kv_heads: int,
    num_heads: int,
    context_lens: Sequence[int] | None,
) -> tuple[str, str] | None:
    """First problem with a paged-attention call, as ``(argument, message)``; shapes and host values only."""
    if num_heads <= 0 or num_kv_heads <= 0:
        return "num_kv_heads", f"num_heads ({num_heads}) and num_kv_heads ({num_kv_heads}) must be positive"
    if num_heads % num_kv_heads != 0:
        return "num_kv_heads", f"num_heads ({num_heads}) must be divisible by num_kv_heads ({num_kv_heads})"
    if len(query_shape) != 3 or query_shape[1] != num_heads:
        return "query", f"needs [batch, num_heads={num_heads}, head_dim] (one decode token each), got {tuple(query_shape)}"
    batch, head_dim = int(query_shape[0]), int(query_shape[2])
    for name, shape in (("key_cache", key_shape), ("value_cache", value_shape)):
        if len(shape) != 4 or shape[2] != num_kv_heads:
            return name, f"needs [num_blocks, block_size, num_kv_heads={num_kv_heads}, D], got {tuple(shape)}"
    if key_shape[3] != head_dim:
        return "key_cache", f"head dim {key_shape[3]} differs from the query's ({head_dim})"
    if tuple(key_shape[:3]) != tuple(value_shape[:3]):
        return "value_cache", f"shape {tuple(value_shape)} does not match key_cache {tuple(key_shape)}"
    if len(block_table_shape) != 2 or block_table_shape[0] < batch:
        return "block_table", f"needs [>= batch={batch}, max_blocks], got {tuple(block_table_shape)}"
    if tuple(out_shape) != (batch, num_heads, value_shape[3]):
        return "out", f"needs {[batch, num_heads, value_shape[3]]}, got {list(out_shape)}"
    if context_lens is None:
        return None
    if len(context_lens) != batch:
        return "context_lens", f"has {len(context_lens)} entries for a batch of {batch} (one per request)"
    capacity = int(block_table_shape[1]) * int(key_shape[1])
    for i, length in enumerate(context_lens):
        if not 0 <= int(length) <= capacity:
            return "context_lens", (f"element {i} ({length}) is outside [0, {capacity}] "
                                    f"(block table capacity {block_table_shape[1]} x block_size {key_shape[1]})")
    return None


def _raise_in_kernel(problem: tuple[str, str] | None) -> None:
    if problem is not None:
        raise RuntimeError(f"harness paged attention: {problem[0]}: {problem[1]}")


# --------------------------------------------------------------------------- kernels


def _attend(query: Tensor, key_cache: Tensor, value_cache: Tensor, block_table: Tensor,
            lengths: list[int], scale_value: float, out: Tensor) -> None:
    spans = [Span(i, i + 1, int(n), i) for i, n in enumerate(lengths)]  # one decode row per request
    paged_attention_into(query, key_cache, value_cache, block_table, spans, block_size=key_cache.shape[1],
                         scale=scale_value, causal=False, out=out, lse=None)


def _host_kernel(query: Tensor, key_cache: Tensor, value_cache: Tensor, num_kv_heads: int, num_heads: int,
                 scale_value: float, block_table: Tensor, context_lens: Sequence[int], out: Tensor, *,
                 workspace: Tensor | None = None) -> None:
    _raise_in_kernel(paged_attention_violation(query.shape, key_cache.shape, value_cache.shape, block_table.shape,
                                               out.shape, num_kv_heads, num_heads, list(context_lens)))
    _attend(query, key_cache, value_cache, block_table, list(context_lens), scale_value, out)


def _device_kernel(query: Tensor, key_cache: Tensor, value_cache: Tensor, num_kv_heads: int, num_heads: int,
                   scale_value: float, block_table: Tensor, context_lens: Tensor, out: Tensor, *,
                   workspace: Tensor | None = None) -> None:
    # Read when the kernel RUNS (a replay reads the tensor's current contents).
    lengths = [int(x) for x in context_lens[: query.shape[0]].tolist()]
    _raise_in_kernel(paged_attention_violation(query.shape, key_cache.shape, value_cache.shape, block_table.shape,
                                               out.shape, num_kv_heads, num_heads, lengths))
    _attend(query, key_cache, value_cache, block_table, lengths, scale_value, out)


def _host_fake(query: Tensor, key_cache: Tensor, value_cache: Tensor, num_kv_heads: int, num_heads: int,
               scale_value: float, block_table: Tensor, context_lens: Sequence[int], out: Tensor, *,
               workspace: Tensor | None = None) -> None:
    _raise_in_kernel(paged_attention_violation(query.shape, key_cache.shape, value_cache.shape, block_table.shape,
                                               out.shape, num_kv_heads, num_heads, list(context_lens)))


def _device_fake(query: Tensor, key_cache: Tensor, value_cache: Tensor, num_kv_heads: int, num_heads: int,
                 scale_value: float, block_table: Tensor, context_lens: Tensor, out: Tensor, *,
                 workspace: Tensor | None = None) -> None:
    _raise_in_kernel(paged_attention_violation(query.shape, key_cache.shape, value_cache.shape, block_table.shape,
                                               out.shape, num_kv_heads, num_heads, None))


_lib.impl("npu_paged_attention", _host_kernel, "CompositeExplicitAutograd")
_lib.impl("npu_paged_attention_device_lens", _device_kernel, "CPU")
torch.library.register_fake(PAGED_ATTENTION_OP_NAME, _host_fake, lib=_lib)
torch.library.register_fake(PAGED_ATTENTION_DEVICE_OP_NAME, _device_fake, lib=_lib)


# --------------------------------------------------------------------------- wrappers


def host_context_lens(context_lens: Sequence[int] | Tensor) -> list[int]:
    """The host values of ``context_lens``: a list, or a tensor in host (CPU) memory.

    A tensor on an accelerator is refused: ATB reads ``context_lens`` on the host, so torch_npu
    would have to copy it back (a sync, illegal in a capture). The device-read design is the
    separate :func:`npu_paged_attention_device_lens`.
    """
    if isinstance(context_lens, Tensor):
        if context_lens.device.type != "cpu":
            raise FiaArgumentError("context_lens", f"must be in host memory (ATB reads it on the host), got a "
                                   f"{context_lens.device.type} tensor; use npu_paged_attention_device_lens")
        if context_lens.dim() != 1 or context_lens.dtype.is_floating_point:
            raise FiaArgumentError("context_lens", f"must be a 1-D integer tensor, got {context_lens.dtype} "
                                   f"{list(context_lens.shape)}")
        return [int(v) for v in _HOST_TOLIST(context_lens)]
    return [int(v) for v in context_lens]


def _check(query: Tensor, key_cache: Tensor, value_cache: Tensor, num_kv_heads: int, num_heads: int,
           block_table: Tensor, out: Tensor, lengths: list[int] | None) -> None:
    problem = paged_attention_violation(query.shape, key_cache.shape, value_cache.shape, block_table.shape,
                                        out.shape, num_kv_heads, num_heads, lengths)
    if problem is not None:
        raise FiaArgumentError(*problem)
    if block_table.dtype != torch.int32:
        raise FiaArgumentError("block_table", f"must be int32, got {block_table.dtype}")
    if out.dtype != query.dtype:
        raise FiaArgumentError("out", f"must have the query's dtype {query.dtype}, got {out.dtype}")


def npu_paged_attention(
    query: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    num_kv_heads: int,
    num_heads: int,
    scale_value: float,
    block_table: Tensor,
    context_lens: Sequence[int] | Tensor,
    out: Tensor,
    *,
    workspace: Tensor | None = None,
) -> None:
    """``torch_npu._npu_paged_attention``: writes ``out`` ``[B, N, Dv]``; ``context_lens`` is host data.

    Validation is the host step: it runs on every path (eager, capture, task-group update), then
    exactly one op call follows, so a recorder sees one node whose ``context_lens`` it can replace.
    """
    lengths = host_context_lens(context_lens)
    _check(query, key_cache, value_cache, num_kv_heads, num_heads, block_table, out, lengths)
    if _native["op"] is not None:
        lens = context_lens if isinstance(context_lens, Tensor) else torch.tensor(lengths, dtype=torch.int32)
        kwargs: Kwargs = {} if workspace is None else {"workspace": workspace}
        _native["op"](query=query, key_cache=key_cache, value_cache=value_cache, num_kv_heads=num_kv_heads,
                      num_heads=num_heads, scale_value=scale_value, block_table=block_table,
                      context_lens=lens, out=out, **kwargs)
        return
    torch.ops.harness.npu_paged_attention(query, key_cache, value_cache, num_kv_heads, num_heads, scale_value,
                                          block_table, lengths, out, workspace=workspace)


def npu_paged_attention_device_lens(
    query: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    num_kv_heads: int,
    num_heads: int,
    scale_value: float,
    block_table: Tensor,
    context_lens: Tensor,
    out: Tensor,
    *,
    workspace: Tensor | None = None,
) -> None:
    """The device-read variant (harness design, not torch_npu): ``context_lens`` int32 ``[>= B]`` is read at run time."""
    if not isinstance(context_lens, Tensor) or context_lens.dtype != torch.int32 or context_lens.dim() != 1:
        raise FiaArgumentError("context_lens", "must be a 1-D int32 device tensor for the device-read variant")
    if context_lens.shape[0] < query.shape[0]:
        raise FiaArgumentError("context_lens", f"has {context_lens.shape[0]} rows for a batch of {query.shape[0]}")
    _check(query, key_cache, value_cache, num_kv_heads, num_heads, block_table, out, None)
    torch.ops.harness.npu_paged_attention_device_lens(query, key_cache, value_cache, num_kv_heads, num_heads,
                                                      scale_value, block_table, context_lens, out,
                                                      workspace=workspace)


def paged_attention_get_workspace(query: Tensor, **kwargs: object) -> Tensor:
    """``torch_npu._npu_paged_attention_get_workspace``: a workspace with a fixed address for graphs.

    Takes the op's keyword arguments (``query=`` may be positional). The reference needs no
    scratch, so it returns a small uint8 buffer; the native function is used when installed.
    """
    if _native["workspace"] is not None:
        workspace: Tensor = _native["workspace"](query=query, **kwargs)
        return workspace
    return torch.empty(64, dtype=torch.uint8, device=query.device)
