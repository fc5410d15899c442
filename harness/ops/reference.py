"""CPU reference math for paged TND and dense BNSD attention (the body of the FIA kernels).

The harness compares eager runs with graph replays *bitwise*, so this code is written for
determinism and batch invariance rather than speed:

* requests are processed one at a time, each from fresh contiguous float32 copies, so a
  request's rows depend only on its own query rows, KV length and blocks: the same request
  gives the same bits whether it is alone, batched, or followed by padding;
* everything is computed in float32 and cast back to the query dtype once.

Conventions:

* ``query`` is ``[T, N, D]``; ``key``/``value`` are paged caches
  ``[num_blocks, block_size, num_kv_heads, D]``; ``block_table`` is int32 ``[B, max_blocks]``.
* A request is a :class:`Span`: query rows ``[q_start, q_end)``, ``kv_len`` cached tokens
  (the current step's tokens included), and its block-table row.
* ``causal`` (sparse_mode 3, right-down): query row j (0-based within the request) of a request
  with q rows and k KV tokens sees KV positions ``[0, k - q + j]``.
* A row that sees no key at all (padding rows, q_len-0 or kv_len-0 requests, or causal windows
  that are empty) gets output 0 and log-sum-exp ``-inf``. Outputs are never NaN.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
from torch import Tensor


class Span(NamedTuple):
    """One request's slice of the packed query and where its KV lives."""

    q_start: int
    q_end: int
    kv_len: int
    block_row: int


def spans_from_host_lists(cum_q: list[int], kv_lens: list[int]) -> list[Span]:
    """Spans from FIA's host lists: cumulative query ends and per-request KV lengths."""
    starts = [0] + cum_q[:-1]
    return [Span(s, e, k, i) for i, (s, e, k) in enumerate(zip(starts, cum_q, kv_lens))]


def spans_from_query_start_loc(query_start_loc: list[int], kv_lens: list[int]) -> list[Span]:
    """Spans from the GPU-style metadata: ``query_start_loc`` [B+1] and KV lengths [B]."""
    return [
        Span(query_start_loc[i], query_start_loc[i + 1], kv_lens[i], i) for i in range(len(kv_lens))
    ]


def _fresh_float32(x: Tensor) -> Tensor:
    """A float32 copy of ``x`` in a new, contiguous allocation.

    Always a copy (never a view into a bigger buffer), so the math below sees the same
    memory layout and alignment for a request wherever it sits in the batch. One call (not
    ``empty`` then ``copy_``): a request's attention is some forty ops, each a trip through the
    dispatcher, and the reference runs once per request, layer and path.
    """
    return x.to(torch.float32, copy=True, memory_format=torch.contiguous_format)


def _gather_kv(cache: Tensor, block_ids: Tensor, kv_len: int) -> Tensor:
    """The first ``kv_len`` tokens of a request, as float32 ``[num_kv_heads, kv_len, D]``.

    ``block_ids``: int64, exactly the request's first ``ceil(kv_len / block_size)`` blocks."""
    blocks = cache.index_select(0, block_ids)
    tokens = blocks.reshape(-1, cache.shape[2], cache.shape[3])[:kv_len]
    return _fresh_float32(tokens.transpose(0, 1))


@functools.lru_cache(maxsize=1024)
def _causal_hidden(q_len: int, kv_len: int, device: torch.device) -> Tensor:
    """``[q_len, kv_len]`` on ``device``, True where query row j may not see key i
    (``i > kv_len - q_len + j``).

    On the scores' device: a host mask beside device scores is a mixed-device operation, which a
    GPU refuses (the first H200 run: "expected self and mask to be on the same device").
    Cached per shape and device (read only: ``masked_fill`` copies): a prefill of a given length
    meets the same mask in every layer and every path."""
    last_visible = torch.arange(q_len, device=device).unsqueeze(1) + (kv_len - q_len)
    return torch.arange(kv_len, device=device).unsqueeze(0) > last_visible


def attend_request(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    scale: float,
    causal: bool,
) -> tuple[Tensor, Tensor]:
    """Attention of one request.

    Args:
        q: float32 ``[N, q_len, D]``, contiguous; k, v: float32 ``[N_kv, kv_len, D]`` with
            ``N % N_kv == 0``.

    Returns:
        ``(out [N, q_len, Dv], lse [N, q_len])`` in float32; rows that see no key give 0/-inf.

    GQA without copying K and V per query head: the ``group`` query heads that share a KV head
    (heads ``kv * group .. kv * group + group - 1``) are stacked into one ``[group * q_len, D]``
    matrix against that head's keys, so each product is one batched GEMM whose shapes depend on
    this request only.
    """
    num_heads, q_len, head_dim = q.shape
    num_kv_heads, kv_len = k.shape[0], k.shape[1]
    group = num_heads // num_kv_heads
    rows = q.view(num_kv_heads, group * q_len, head_dim)
    scores = torch.bmm(rows, k.transpose(1, 2)) * scale  # [N_kv, group * q_len, kv_len]
    if causal and q_len > 1:  # one query row sees every key (k - 1 + 0 = last): nothing to hide
        scores = scores.view(num_kv_heads, group, q_len, kv_len).masked_fill(
            _causal_hidden(q_len, kv_len, scores.device), float("-inf")).view(num_kv_heads, group * q_len, kv_len)
    row_max = scores.amax(dim=-1, keepdim=True).nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
    weights = torch.exp(scores - row_max)
    denom = weights.sum(dim=-1, keepdim=True)
    seen = denom > 0
    # A row that sees a key has denom >= 1 (its maximum contributes exp(0)): clamping to 1
    # changes only the rows that see nothing, whose output the where below zeroes.
    out = torch.where(seen, torch.bmm(weights, v) / denom.clamp_min(1.0), 0.0)
    lse = row_max + torch.log(denom)  # log(0) = -inf for rows that see nothing
    return out.view(num_heads, q_len, -1), lse.view(num_heads, q_len)


def paged_attention_into(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    block_table: Tensor,
    spans: list[Span],
    *,
    block_size: int,
    scale: float,
    causal: bool,
    out: Tensor,
    lse: Tensor | None,
) -> None:
    """Write attention of every span into ``out`` ``[T, N, Dv]`` (and ``lse`` ``[T, N, 1]``).

    Rows not covered by a span (padding) are zero with lse ``-inf``. Bounds are the caller's
    job (see :func:`harness.ops.contract.bounds_violation`).
    """
    out.zero_()
    if lse is not None:
        lse.fill_(float("-inf"))
    block_rows = block_table.to(torch.int64)  # index_select's index type, converted once per call
    for span in spans:
        q_len = span.q_end - span.q_start
        if q_len <= 0 or span.kv_len <= 0:
            continue  # nothing to see: the zeros / -inf written above stand
        q = _fresh_float32(query[span.q_start : span.q_end].transpose(0, 1))
        block_ids = block_rows[span.block_row, : -(-span.kv_len // block_size)]  # one slice for K and V
        k = _gather_kv(key, block_ids, span.kv_len)
        v = _gather_kv(value, block_ids, span.kv_len)
        o, s = attend_request(q, k, v, scale=scale, causal=causal)
        out[span.q_start : span.q_end].copy_(o.transpose(0, 1))
        if lse is not None:
            lse[span.q_start : span.q_end, :, 0].copy_(s.transpose(0, 1))


def paged_attention_from_device_bounds(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    query_start_loc: Tensor,
    seq_lens_kv: Tensor,
    block_table: Tensor,
    *,
    max_num_reqs: int,
    block_size: int,
    scale: float,
    causal: bool,
) -> tuple[Tensor, Tensor]:
    """Sync-free variant for devices whose graphs forbid host reads (CUDA graph capture).

    Every query row finds its request with ``searchsorted`` on the device and attends over the
    whole block-table capacity under a mask, so no shape depends on tensor contents and
    nothing is read on the host. Out-of-range contents cannot read out of bounds: rows past
    ``query_start_loc[max_num_reqs]`` are padding, KV lengths are clipped to the table's
    capacity, block ids are clamped. It allocates ``T x capacity`` keys, fine for test models,
    and is equal to :func:`paged_attention_into` within float32 rounding (not bitwise: its
    reductions run over the padded capacity).

    Returns ``(out [T, N, Dv] in the query dtype, lse [T, N, 1] float32)``.
    """
    device = query.device
    T, num_heads, _ = query.shape
    num_kv_heads = key.shape[2]
    group = num_heads // num_kv_heads
    capacity = block_table.shape[1] * block_size

    starts = query_start_loc[: max_num_reqs + 1].to(torch.int64)
    kv_lens = seq_lens_kv[:max_num_reqs].to(torch.int64)
    rows = torch.arange(T, device=device)
    req = torch.searchsorted(starts[1:].contiguous(), rows, right=True)  # in [0, max_num_reqs]
    valid = (req < max_num_reqs) & (rows >= starts[0])
    req = req.clamp(max=max_num_reqs - 1)
    q_len = starts[req + 1] - starts[req]
    j = rows - starts[req]
    kv_len = kv_lens[req].clamp(min=0, max=capacity)
    limit = torch.minimum(kv_len - q_len + j + 1, kv_len) if causal else kv_len
    positions = torch.arange(capacity, device=device)
    visible = (positions.unsqueeze(0) < limit.unsqueeze(1)) & valid.unsqueeze(1)  # [T, capacity]

    block_ids = block_table[req].to(torch.int64).clamp(0, key.shape[0] - 1)  # [T, max_blocks]
    k = key[block_ids].reshape(T, capacity, num_kv_heads, -1).to(torch.float32)
    v = value[block_ids].reshape(T, capacity, num_kv_heads, -1).to(torch.float32)
    q = query.to(torch.float32).reshape(T, num_kv_heads, group, -1)
    scores = torch.einsum("tkgd,tckd->tkgc", q, k) * scale  # [T, N_kv, G, capacity]
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    row_max = scores.amax(dim=-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    weights = torch.exp(scores - row_max)
    denom = weights.sum(dim=-1, keepdim=True)
    seen = denom > 0
    out = torch.einsum("tkgc,tckd->tkgd", weights, v) / torch.where(seen, denom, torch.ones_like(denom))
    out = torch.where(seen, out, torch.zeros_like(out))
    lse = row_max + torch.log(denom)
    return out.reshape(T, num_heads, -1).to(query.dtype), lse.reshape(T, num_heads, 1)


def as_4d_paged_cache(cache: Tensor, num_kv_heads: int) -> Tensor:
    """The 4-D view ``[num_blocks, block_size, N_kv, D]`` of a paged cache given 4-D or flat 3-D.

    vLLM Ascend passes ``key_cache.view(num_blocks, block_size, -1)``; the kernel splits the
    last dim back into heads, which is a view (no copy) of the same memory.
    """
    if cache.dim() == 4:
        return cache
    return cache.view(cache.shape[0], cache.shape[1], num_kv_heads, cache.shape[2] // num_kv_heads)


def dense_bnsd_attention_into(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    q_lens: list[int],
    kv_lens: list[int],
    *,
    scale: float,
    causal: bool,
    out: Tensor,
    lse: Tensor | None,
) -> None:
    """Dense BNSD attention: batch b's first ``q_lens[b]`` query rows over its first ``kv_lens[b]`` keys.

    ``query`` ``[B, N, S, D]``, ``key``/``value`` ``[B, N_kv, S_kv, D]``; ``out`` ``[B, N, S, Dv]``,
    ``lse`` ``[B, N, S, 1]``. Rows beyond ``q_lens[b]`` are padding: 0 and ``-inf``. Each batch is
    computed alone from fresh float32 copies, as in :func:`paged_attention_into`.
    """
    out.zero_()
    if lse is not None:
        lse.fill_(float("-inf"))
    for b, (q_len, kv_len) in enumerate(zip(q_lens, kv_lens)):
        if q_len <= 0 or kv_len <= 0:
            continue
        q = _fresh_float32(query[b, :, :q_len])
        k = _fresh_float32(key[b, :, :kv_len])
        v = _fresh_float32(value[b, :, :kv_len])
        o, s = attend_request(q, k, v, scale=scale, causal=causal)
        out[b, :, :q_len].copy_(o)
        if lse is not None:
            lse[b, :, :q_len, 0].copy_(s)
