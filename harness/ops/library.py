"""The FIA ops registered with ``torch.library`` in the ``harness`` namespace.

Why custom ops: a graph recorder (a ``TorchDispatchMode``) must see each attention call as ONE
node whose host-side list arguments (``actual_seq_lengths``, ``actual_seq_lengths_kv``) are
stored as arguments, so that a later task-group update can replace them. If the Python
reference ran as plain aten ops, its per-request loop would be unrolled into hundreds of
nodes with the capture-time lengths baked in, and there would be nothing to update.

Ops (schemas below):

* ``harness::npu_fused_infer_attention_score`` -- functional, returns ``(attention_out,
  softmax_lse)``. Mirrors torch_npu's keyword names; ``SymInt[]?`` as in torch_npu. The
  keywords are written once, in :class:`harness.ops.signature.FiaKeywords`: both schemas are
  rendered from it, and every kernel below reads them as one.
* ``harness::npu_fused_infer_attention_score.out`` -- writes into caller-owned tensors, so a
  captured graph keeps the same workspace/output addresses across updates. torch_npu spells
  the outputs as ``out=[attention_out, softmax_lse]``; a torch.library schema cannot take a
  list of mutable tensors with per-element alias sets, so here they are the keyword-only
  arguments ``workspace``, ``attention_out`` and ``softmax_lse``, each annotated ``(x!)``
  (``schema.arguments[i].alias_info.is_write`` is True for them), and the op returns ``()``.
  The Python wrapper accepts torch_npu's ``out=(attention_out, softmax_lse)`` form.
* ``harness::fia_device_metadata`` -- the GPU FlashAttention design for comparison: the
  per-request bounds live in device tensors (``query_start_loc`` [>= B+1] cumulative starts,
  ``seq_lens_kv`` [>= B]) that the kernel reads when it runs, so a replayed graph sees their
  current contents; only the host upper bound ``max_num_reqs`` is frozen.

Output conventions (TND, paged KV):

* ``attention_out``: ``[T, N, Dv]``, the query's dtype. Padding rows (beyond
  ``actual_seq_lengths[-1]``) and rows that see no key are 0.
* ``softmax_lse`` with ``softmax_lse_flag=True``: float32 ``[T, N, 1]``; ``-inf`` for rows that
  see no key. With ``softmax_lse_flag=False`` it is float32 zeros of shape ``[1]``, matching
  the shape torch_npu's meta kernel gives; the ``.out`` form then zero-fills whatever
  ``softmax_lse`` it is given. ``fia_device_metadata`` always returns the ``[T, N, 1]`` lse.
* ``workspace``: the reference needs no scratch; it only checks the size that
  :func:`workspace_nbytes` promises (the tensor exists to have a fixed address).

Kernels guard memory safety only (raising ``RuntimeError`` instead of reading out of bounds).
Contracts, validation and observation belong to the wrappers in :mod:`harness.ops.fia`: during
a capture only the fake kernel runs, and during an update the call is intercepted, but the
wrapper runs every time.

The host-list ops are registered for ``CompositeExplicitAutograd`` (any device; the kernel
reads no tensor data on the host, so it is capture-safe). ``fia_device_metadata`` has two
kernels: on CPU an exact per-request loop that reads the bounds with ``.tolist()`` (the
emulated recorder treats the op as one opaque node, so that is legal there, and the result is
bitwise equal to the host-list op); on CUDA a sync-free masked kernel
(:func:`~harness.ops.reference.paged_attention_from_device_bounds`), because a real CUDA
graph capture forbids host reads. The CUDA kernel equals the CPU one within float32 rounding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from harness.ops.contract import bnsd_length_violation, bounds_violation, shape_violation
from harness.ops.signature import FiaKeywords
from harness.ops.reference import (
    as_4d_paged_cache,
    dense_bnsd_attention_into,
    paged_attention_from_device_bounds,
    Span,
    paged_attention_into,
    spans_from_host_lists,
    spans_from_query_start_loc,
)

NAMESPACE = "harness"

_FIA_ARGS = f"Tensor query, Tensor key, Tensor value, *, {FiaKeywords.schema()}"
FIA_SCHEMA = f"npu_fused_infer_attention_score({_FIA_ARGS}) -> (Tensor, Tensor)"
FIA_OUT_SCHEMA = (
    f"npu_fused_infer_attention_score.out({_FIA_ARGS}, "
    "Tensor(a!) workspace, Tensor(b!) attention_out, Tensor(c!) softmax_lse) -> ()"
)
DEVICE_METADATA_SCHEMA = (
    "fia_device_metadata(Tensor query, Tensor key, Tensor value, Tensor query_start_loc, "
    "Tensor seq_lens_kv, Tensor block_table, *, int block_size, int num_heads, "
    "int num_key_value_heads, float scale, int max_num_reqs, int sparse_mode=3) -> (Tensor, Tensor)"
)

_lib = torch.library.Library(NAMESPACE, "DEF")  # noqa: TOR901 (kept alive by this module)
_lib.define(FIA_SCHEMA)
_lib.define(FIA_OUT_SCHEMA)
_lib.define(DEVICE_METADATA_SCHEMA)


def workspace_nbytes(T: int, num_heads: int) -> int:
    """Bytes of workspace the reference asks for: one float32 per (token, head), at least 64."""
    return max(64, 4 * T * num_heads)


# --------------------------------------------------------------------------- shared guards


def _raise_if_bad_shapes(query: Tensor, key: Tensor, value: Tensor, **kwargs: object) -> None:
    problem = shape_violation(query.shape, key.shape, value.shape, **kwargs)  # type: ignore[arg-type]
    if problem is not None:
        raise RuntimeError(f"harness FIA: {problem[0]}: {problem[1]}")


def _raise_if_bad_layout(query: Tensor, key: Tensor, value: Tensor, kw: FiaKeywords) -> None:
    _raise_if_bad_shapes(query, key, value, block_size=kw.block_size, num_heads=kw.num_heads,
                         num_key_value_heads=kw.num_key_value_heads, input_layout=kw.input_layout,
                         sparse_mode=kw.sparse_mode)


def _lse_shape(query: Tensor, softmax_lse_flag: bool) -> tuple[int, ...]:
    """``[T, N, 1]`` (TND) or ``[B, N, S, 1]`` (BNSD) with the flag, else ``[1]``."""
    return (*query.shape[:-1], 1) if softmax_lse_flag else (1,)


def _out_shape(query: Tensor, value: Tensor, kv_heads: int) -> tuple[int, ...]:
    """The query's shape with the value head dim last (value 4-D, or the flat 3-D paged view)."""
    dv = value.shape[3] if value.dim() == 4 else value.shape[2] // kv_heads
    return (*query.shape[:-1], dv)


def _host_list_spans(
    query: Tensor,
    actual_seq_lengths: Sequence[int] | None,
    actual_seq_lengths_kv: Sequence[int] | None,
    block_table: Tensor | None,
    block_size: int,
) -> list[Span]:
    """Validate the host lists against the buffers they index and turn them into spans."""
    if actual_seq_lengths is None or actual_seq_lengths_kv is None or block_table is None:
        raise RuntimeError(
            "harness FIA: TND paged attention needs actual_seq_lengths, actual_seq_lengths_kv "
            "and block_table"
        )
    cum_q = [int(x) for x in actual_seq_lengths]
    kv = [int(x) for x in actual_seq_lengths_kv]
    problem = bounds_violation(cum_q, kv, block_table.shape, block_size)
    if problem is not None:
        raise RuntimeError(f"harness FIA: {problem[0]}: {problem[1]}")
    T = query.shape[0]
    if cum_q[-1] > T:
        raise RuntimeError(
            f"harness FIA: actual_seq_lengths[-1] ({cum_q[-1]}) exceeds the query's T ({T}); "
            "the kernel refuses to read past the query"
        )
    return spans_from_host_lists(cum_q, kv)


def _check_mask(sparse_mode: int, atten_mask: Tensor | None) -> bool:
    """Return ``causal``. A mask is accepted only as sparse_mode 3's (implied) causal mask."""
    if sparse_mode == 0 and atten_mask is not None:
        raise RuntimeError("harness FIA: an explicit atten_mask with sparse_mode 0 is not supported")
    return sparse_mode == 3


# --------------------------------------------------------------------------- host-list FIA


def _fia_into(query: Tensor, key: Tensor, value: Tensor, kw: FiaKeywords, out: Tensor, lse: Tensor | None) -> None:
    _raise_if_bad_layout(query, key, value, kw)
    causal = _check_mask(kw.sparse_mode, kw.atten_mask)
    q_lengths, kv_lengths = kw.actual_seq_lengths, kw.actual_seq_lengths_kv
    if kw.input_layout == "BNSD":
        if kw.block_table is not None:
            raise RuntimeError("harness FIA: BNSD is modelled dense (non-paged); block_table must be None")
        problem = bnsd_length_violation(query.shape, key.shape, q_lengths, kv_lengths)
        if problem is not None:
            raise RuntimeError(f"harness FIA: {problem[0]}: {problem[1]}")
        batch = query.shape[0]
        q_lens = [query.shape[2]] * batch if q_lengths is None else [int(x) for x in q_lengths]
        kv_lens = [key.shape[2]] * batch if kv_lengths is None else [int(x) for x in kv_lengths]
        dense_bnsd_attention_into(query, key, value, q_lens, kv_lens, scale=kw.scale, causal=causal, out=out, lse=lse)
        return
    spans = _host_list_spans(query, q_lengths, kv_lengths, kw.block_table, kw.block_size)
    assert kw.block_table is not None
    paged_attention_into(
        query, as_4d_paged_cache(key, kw.kv_heads), as_4d_paged_cache(value, kw.kv_heads), kw.block_table, spans,
        block_size=kw.block_size, scale=kw.scale, causal=causal, out=out, lse=lse,
    )


def _fia_kernel(query: Tensor, key: Tensor, value: Tensor, **keywords: Any) -> tuple[Tensor, Tensor]:
    kw = FiaKeywords(**keywords)
    out = query.new_empty(_out_shape(query, value, kw.kv_heads))
    lse = torch.empty(_lse_shape(query, True), dtype=torch.float32, device=query.device)
    _fia_into(query, key, value, kw, out, lse)
    if not kw.softmax_lse_flag:
        lse = torch.zeros((1,), dtype=torch.float32, device=query.device)
    return out, lse


def _fia_fake(query: Tensor, key: Tensor, value: Tensor, **keywords: Any) -> tuple[Tensor, Tensor]:
    kw = FiaKeywords(**keywords)
    _raise_if_bad_layout(query, key, value, kw)
    out = query.new_empty(_out_shape(query, value, kw.kv_heads))
    lse = query.new_empty(_lse_shape(query, kw.softmax_lse_flag), dtype=torch.float32)
    return out, lse


def _check_out_tensors(
    query: Tensor,
    value: Tensor,
    workspace: Tensor,
    attention_out: Tensor,
    softmax_lse: Tensor,
    softmax_lse_flag: bool,
    kv_heads: int,
) -> None:
    want = _out_shape(query, value, kv_heads)
    if tuple(attention_out.shape) != want or attention_out.dtype != query.dtype:
        raise RuntimeError(
            f"harness FIA: attention_out must be {query.dtype} {list(want)}, got "
            f"{attention_out.dtype} {list(attention_out.shape)}"
        )
    if softmax_lse.dtype != torch.float32:
        raise RuntimeError(f"harness FIA: softmax_lse must be float32, got {softmax_lse.dtype}")
    if softmax_lse_flag and tuple(softmax_lse.shape) != _lse_shape(query, True):
        raise RuntimeError(
            f"harness FIA: softmax_lse must be {list(_lse_shape(query, True))} when "
            f"softmax_lse_flag is set, got {list(softmax_lse.shape)}"
        )
    need = workspace_nbytes(query.shape[0], query.shape[1])
    have = workspace.numel() * workspace.element_size()
    if have < need:
        raise RuntimeError(f"harness FIA: workspace holds {have} bytes, needs {need}")


def _fia_out_kernel(query: Tensor, key: Tensor, value: Tensor, *, workspace: Tensor, attention_out: Tensor,
                    softmax_lse: Tensor, **keywords: Any) -> None:
    kw = FiaKeywords(**keywords)
    _check_out_tensors(query, value, workspace, attention_out, softmax_lse, kw.softmax_lse_flag, kw.kv_heads)
    _fia_into(query, key, value, kw, attention_out, softmax_lse if kw.softmax_lse_flag else None)
    if not kw.softmax_lse_flag:
        softmax_lse.zero_()


def _fia_out_fake(query: Tensor, key: Tensor, value: Tensor, *, workspace: Tensor, attention_out: Tensor,
                  softmax_lse: Tensor, **keywords: Any) -> None:
    kw = FiaKeywords(**keywords)
    _raise_if_bad_layout(query, key, value, kw)
    _check_out_tensors(query, value, workspace, attention_out, softmax_lse, kw.softmax_lse_flag, kw.kv_heads)


# --------------------------------------------------------------------------- device metadata


def _device_spans(
    T: int,
    query_start_loc: Tensor,
    seq_lens_kv: Tensor,
    block_table: Tensor,
    block_size: int,
    max_num_reqs: int,
) -> list[Span]:
    """Read the device-side bounds (as a GPU kernel prologue would) and guard them."""
    starts = [int(x) for x in query_start_loc[: max_num_reqs + 1].tolist()]
    kv = [int(x) for x in seq_lens_kv[:max_num_reqs].tolist()]
    if starts and starts[0] < 0:
        raise RuntimeError(f"harness FIA: query_start_loc[0] is negative ({starts[0]})")
    problem = bounds_violation(starts[1:], kv, block_table.shape, block_size)
    if problem is not None:
        name = {"actual_seq_lengths": "query_start_loc", "actual_seq_lengths_kv": "seq_lens_kv"}
        raise RuntimeError(f"harness FIA: {name.get(problem[0], problem[0])}: {problem[1]}")
    if starts[0] > starts[1] or starts[-1] > T:
        raise RuntimeError(
            f"harness FIA: query_start_loc spans rows {starts[0]}..{starts[-1]} but the query has "
            f"T={T} rows (or decreases); the kernel refuses to read out of bounds"
        )
    return spans_from_query_start_loc(starts, kv)


def _check_device_metadata_shapes(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    query_start_loc: Tensor,
    seq_lens_kv: Tensor,
    block_table: Tensor,
    block_size: int,
    num_heads: int,
    num_key_value_heads: int,
    max_num_reqs: int,
    sparse_mode: int,
) -> None:
    _raise_if_bad_shapes(
        query, key, value, block_size=block_size, num_heads=num_heads,
        num_key_value_heads=num_key_value_heads, sparse_mode=sparse_mode,
    )
    if max_num_reqs <= 0:
        raise RuntimeError(f"harness FIA: max_num_reqs must be positive, got {max_num_reqs}")
    for name, tensor, need in (
        ("query_start_loc", query_start_loc, max_num_reqs + 1),
        ("seq_lens_kv", seq_lens_kv, max_num_reqs),
        ("block_table", block_table, max_num_reqs),
    ):
        if tensor.dtype != torch.int32:
            raise RuntimeError(f"harness FIA: {name} must be int32, got {tensor.dtype}")
        if tensor.dim() < 1 or tensor.shape[0] < need:
            raise RuntimeError(
                f"harness FIA: {name} needs at least {need} rows for max_num_reqs={max_num_reqs}, "
                f"got shape {list(tensor.shape)}"
            )
    if block_table.dim() != 2:
        raise RuntimeError(f"harness FIA: block_table must be 2-D, got {list(block_table.shape)}")


def _device_metadata_kernel(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    query_start_loc: Tensor,
    seq_lens_kv: Tensor,
    block_table: Tensor,
    *,
    block_size: int,
    num_heads: int,
    num_key_value_heads: int,
    scale: float,
    max_num_reqs: int,
    sparse_mode: int = 3,
) -> tuple[Tensor, Tensor]:
    _check_device_metadata_shapes(
        query, key, value, query_start_loc, seq_lens_kv, block_table,
        block_size, num_heads, num_key_value_heads, max_num_reqs, sparse_mode,
    )
    spans = _device_spans(query.shape[0], query_start_loc, seq_lens_kv, block_table, block_size, max_num_reqs)
    key = as_4d_paged_cache(key, num_key_value_heads or num_heads)
    value = as_4d_paged_cache(value, num_key_value_heads or num_heads)
    out = query.new_empty(_out_shape(query, value, num_key_value_heads or num_heads))
    lse = torch.empty(_lse_shape(query, True), dtype=torch.float32, device=query.device)
    paged_attention_into(
        query, key, value, block_table, spans,
        block_size=block_size, scale=scale, causal=sparse_mode == 3, out=out, lse=lse,
    )
    return out, lse


def _device_metadata_kernel_sync_free(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    query_start_loc: Tensor,
    seq_lens_kv: Tensor,
    block_table: Tensor,
    *,
    block_size: int,
    num_heads: int,
    num_key_value_heads: int,
    scale: float,
    max_num_reqs: int,
    sparse_mode: int = 3,
) -> tuple[Tensor, Tensor]:
    _check_device_metadata_shapes(
        query, key, value, query_start_loc, seq_lens_kv, block_table,
        block_size, num_heads, num_key_value_heads, max_num_reqs, sparse_mode,
    )
    kv_heads = num_key_value_heads or num_heads
    return paged_attention_from_device_bounds(
        query, as_4d_paged_cache(key, kv_heads), as_4d_paged_cache(value, kv_heads), query_start_loc, seq_lens_kv, block_table, max_num_reqs=max_num_reqs,
        block_size=block_size, scale=scale, causal=sparse_mode == 3,
    )


def _device_metadata_fake(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    query_start_loc: Tensor,
    seq_lens_kv: Tensor,
    block_table: Tensor,
    *,
    block_size: int,
    num_heads: int,
    num_key_value_heads: int,
    scale: float,
    max_num_reqs: int,
    sparse_mode: int = 3,
) -> tuple[Tensor, Tensor]:
    _check_device_metadata_shapes(
        query, key, value, query_start_loc, seq_lens_kv, block_table,
        block_size, num_heads, num_key_value_heads, max_num_reqs, sparse_mode,
    )
    out = query.new_empty(_out_shape(query, value, num_key_value_heads or num_heads))
    lse = query.new_empty(_lse_shape(query, True), dtype=torch.float32)
    return out, lse


# --------------------------------------------------------------------------- registration

_lib.impl("npu_fused_infer_attention_score", _fia_kernel, "CompositeExplicitAutograd")
_lib.impl("npu_fused_infer_attention_score.out", _fia_out_kernel, "CompositeExplicitAutograd")
_lib.impl("fia_device_metadata", _device_metadata_kernel, "CPU")
_lib.impl("fia_device_metadata", _device_metadata_kernel_sync_free, "CUDA")
torch.library.register_fake(f"{NAMESPACE}::npu_fused_infer_attention_score", _fia_fake, lib=_lib)
torch.library.register_fake(f"{NAMESPACE}::npu_fused_infer_attention_score.out", _fia_out_fake, lib=_lib)
torch.library.register_fake(f"{NAMESPACE}::fia_device_metadata", _device_metadata_fake, lib=_lib)

#: Schema names (``func._schema.name``) whose host arguments a task-group update may replace.
FIA_OP_NAME = f"{NAMESPACE}::npu_fused_infer_attention_score"
#: The device-metadata attention (lengths in device buffers, read when the kernel runs).
DEVICE_METADATA_OP_NAME = f"{NAMESPACE}::fia_device_metadata"
#: torch_npu's ``_npu_paged_attention`` (defined in :mod:`harness.ops.paged_attention`).
PAGED_ATTENTION_OP_NAME = f"{NAMESPACE}::npu_paged_attention"
UPDATABLE_OP_NAMES: tuple[str, ...] = (FIA_OP_NAME, PAGED_ATTENTION_OP_NAME)
