"""The decoder's fused kernels, each registered as ONE ``torch.library`` op.

A captured graph is a sequence of kernel launches, and the emulator records one node per op it
sees. Written as plain Python, an RMSNorm is five aten ops and the batch-invariant linear seven
(pad, transpose, expand, view, bmm, view, slice), so a decoder layer was about 70 recorded nodes
where a serving engine launches about 20 kernels (vLLM's ``rms_norm`` and ``silu_and_mul`` custom
ops, a GEMM per projection). As ops, each is one node to record and one step to replay, as on
the device, and capture costs a third of what it did. The arithmetic is unchanged: each op's
kernel is the Python function of the same name, run on the same aten calls, so results are
bitwise those of the Python composite (``tests/model/test_model_kernels.py``).

Ops, in the ``harness`` namespace (``CompositeExplicitAutograd``: any device; nothing here reads
tensor data on the host, so each is capture-safe on CUDA and NPU too):

* ``harness::row_linear(Tensor x, Tensor weight) -> Tensor``: ``x @ weight.T`` in fixed blocks of
  :data:`ROW_BLOCK` rows, float32 accumulate, cast back to ``x``'s dtype (see :func:`row_linear`);
* ``harness::rms_norm(Tensor x, Tensor weight, float eps) -> Tensor``: row-wise RMSNorm in float32,
  cast back;
* ``harness::silu_and_mul(Tensor x) -> Tensor``: ``silu(gate) * up`` of the two halves of ``x``'s
  last dim (vLLM's ``SiluAndMul`` on the fused gate/up projection);
* ``harness::reshape_and_cache(Tensor key, Tensor value, Tensor(a!) key_cache,
  Tensor(b!) value_cache, Tensor slot_mapping) -> ()``: this step's K/V rows written into the
  paged caches in place (:func:`harness.model.kv_cache.write_kv`; vLLM Ascend calls torch_npu's
  ``_npu_reshape_and_cache`` with the same arguments).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from harness.model.kv_cache import write_kv

#: Rows per block of :func:`row_linear`: every block is one GEMM of exactly this many rows.
ROW_BLOCK = 8


def row_linear(x: Tensor, weight: Tensor) -> Tensor:
    """``x @ weight.T`` in fixed blocks of :data:`ROW_BLOCK` rows (batch-invariant), float32
    accumulate, cast back.

    A plain GEMM (``F.linear``) picks different kernels / blockings for different row counts
    (on CPU, fp32 results of a row change with T for T = 1, 2, 3, 5, 6, 7, 9, ...), which would
    make a real token's logits depend on the padding behind it. Here the rows are zero-padded to
    a multiple of the block and multiplied with one batched GEMM whose every batch element is a
    ``[ROW_BLOCK, in] x [in, out]`` product: each block runs the same kernel whatever T is, and
    row ``i`` always sits at position ``i % ROW_BLOCK`` of a block, so its result does not depend
    on T or on the rows after it. (One GEMM per row did the same with T times the calls' cost.)
    """
    t = x.shape[0]
    rows = _cast(x, torch.float32)
    pad = -t % ROW_BLOCK
    if pad:
        rows = torch.constant_pad_nd(rows, (0, 0, 0, pad))  # zero rows; F.pad adds Python overhead
    blocks = rows.shape[0] // ROW_BLOCK
    w = _cast(weight, torch.float32).t().expand(blocks, -1, -1)  # every block shares the weight: a stride-0 view
    out = torch.bmm(rows.reshape(blocks, ROW_BLOCK, -1), w).reshape(blocks * ROW_BLOCK, -1)
    return _cast(out[:t] if pad else out, x.dtype)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """Row-wise RMSNorm computed in float32, cast back to ``x``'s dtype."""
    x32 = _cast(x, torch.float32)
    var = x32.pow(2).mean(dim=-1, keepdim=True)
    y = x32 * torch.rsqrt(var + eps)
    return _cast(y * _cast(weight, torch.float32), x.dtype)


def _cast(t: Tensor, dtype: torch.dtype) -> Tensor:
    """``t.to(dtype)`` without the dispatcher round trip when it would return ``t`` itself.

    The decoder calls these kernels hundreds of times per item, and on CPU each op's fixed
    cost (microseconds) outweighs the arithmetic of these tiny shapes."""
    return t if t.dtype is dtype else t.to(dtype)


def silu_and_mul(x: Tensor) -> Tensor:
    """The gated MLP's activation on the fused gate/up output: ``silu(x[..., :d]) * x[..., d:]``."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def reshape_and_cache(key: Tensor, value: Tensor, key_cache: Tensor, value_cache: Tensor,
                      slot_mapping: Tensor) -> None:
    """:func:`~harness.model.kv_cache.write_kv` in vLLM Ascend's argument order."""
    write_kv(key_cache, value_cache, key, value, slot_mapping)


def _row_linear_fake(x: Tensor, weight: Tensor) -> Tensor:
    return x.new_empty((x.shape[0], weight.shape[0]))


def _rms_norm_fake(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _silu_and_mul_fake(x: Tensor) -> Tensor:
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


def _reshape_and_cache_fake(key: Tensor, value: Tensor, key_cache: Tensor, value_cache: Tensor,
                            slot_mapping: Tensor) -> None:
    return None


_lib = torch.library.Library("harness", "FRAGMENT")  # noqa: TOR901 (kept alive by this module)
for _name, _schema, _kernel, _fake in (
    ("row_linear", "row_linear(Tensor x, Tensor weight) -> Tensor", row_linear, _row_linear_fake),
    ("rms_norm", "rms_norm(Tensor x, Tensor weight, float eps) -> Tensor", rms_norm, _rms_norm_fake),
    ("silu_and_mul", "silu_and_mul(Tensor x) -> Tensor", silu_and_mul, _silu_and_mul_fake),
    ("reshape_and_cache",
     "reshape_and_cache(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
     "Tensor slot_mapping) -> ()",
     reshape_and_cache, _reshape_and_cache_fake),
):
    _lib.define(_schema)
    _lib.impl(_name, _kernel, "CompositeExplicitAutograd")
    torch.library.register_fake(f"harness::{_name}", _fake, lib=_lib)
