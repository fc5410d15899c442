"""The GPU-FlashAttention design: bounds read from device tensors when the kernel runs."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from fia_testlib import Batch, make_batch

from harness.ops import (
    FiaArgumentError,
    fia_device_metadata,
    npu_fused_infer_attention_score as fia,
)
from harness.ops.reference import paged_attention_from_device_bounds

MAX_REQS = 6  # host upper bound frozen at "capture"; real requests may be fewer


def device_buffers(b: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Static buffers sized for MAX_REQS, filled like a model runner would before replay."""
    qsl = torch.zeros(MAX_REQS + 1, dtype=torch.int32)
    kvl = torch.zeros(MAX_REQS, dtype=torch.int32)
    table = torch.zeros(MAX_REQS, b.block_table.shape[1], dtype=torch.int32)
    fill(b, qsl, kvl, table)
    return qsl, kvl, table


def fill(b: Batch, qsl: torch.Tensor, kvl: torch.Tensor, table: torch.Tensor) -> None:
    n = len(b.q_lens)
    qsl.zero_()
    qsl[1 : n + 1] = torch.tensor(b.cum_q, dtype=torch.int32)
    qsl[n + 1 :] = b.cum_q[-1]  # unused slots: zero-length queries
    kvl.zero_()
    kvl[:n] = torch.tensor(b.kv_lens, dtype=torch.int32)
    table.zero_()
    table[:n] = b.block_table


def run(b: Batch, qsl, kvl, table, sparse_mode: int = 3):  # type: ignore[no-untyped-def]
    return fia_device_metadata(
        b.query, b.key, b.value, qsl, kvl, table, block_size=b.block_size, num_heads=b.num_heads,
        num_key_value_heads=b.num_kv_heads, scale=b.scale, max_num_reqs=MAX_REQS, sparse_mode=sparse_mode,
    )


@pytest.mark.parametrize("sparse_mode", [3, 0])
def test_equals_host_list_variant_bitwise(sparse_mode: int) -> None:
    b = make_batch([5, 3, 1, 1], [5, 9, 12, 1])
    want = fia(b.query, b.key, b.value, **b.kwargs(sparse_mode=sparse_mode))
    got = run(b, *device_buffers(b), sparse_mode=sparse_mode)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_padding_rows_beyond_the_last_start_are_zero() -> None:
    b = make_batch([3, 1], [4, 6]).padded(4)
    out, lse = run(b, *device_buffers(b))
    want = fia(b.query, b.key, b.value, **b.kwargs(), contract="relaxed")
    assert torch.equal(out, want[0]) and torch.equal(lse, want[1])
    assert torch.equal(out[4:], torch.zeros_like(out[4:]))


def test_new_device_contents_change_the_result_without_host_changes() -> None:
    # Same shapes, same host arguments; only the device buffers are refilled (as before a
    # replay). A host-list kernel would keep the capture-time lengths; this one follows.
    step1 = make_batch([2, 2], [6, 3], max_blocks=4, seed=1)
    step2 = replace(step1, q_lens=[1, 3], kv_lens=[7, 8])
    qsl, kvl, table = device_buffers(step1)
    first = run(step1, qsl, kvl, table)
    fill(step2, qsl, kvl, table)
    second = run(step1, qsl, kvl, table)  # identical host call
    assert not torch.equal(first[0], second[0])
    want = fia(step2.query, step2.key, step2.value, **step2.kwargs())
    assert torch.equal(second[0], want[0]) and torch.equal(second[1], want[1])


def test_host_checks_cover_upper_bounds_only() -> None:
    b = make_batch([2, 2], [3, 3])
    qsl, kvl, table = device_buffers(b)
    with pytest.raises(FiaArgumentError, match=r"query_start_loc: needs at least 7 rows"):
        run(b, qsl[:4], kvl, table)
    with pytest.raises(FiaArgumentError, match="seq_lens_kv: must be int32"):
        run(b, qsl, kvl.long(), table)


def test_kernel_refuses_out_of_bounds_device_contents() -> None:
    b = make_batch([2, 2], [3, 3])
    qsl, kvl, table = device_buffers(b)
    qsl[-1] = b.T + 5
    with pytest.raises(RuntimeError, match="refuses to read out of bounds"):
        run(b, qsl, kvl, table)
    qsl, kvl, table = device_buffers(b)
    kvl[0] = 10_000
    with pytest.raises(RuntimeError, match="seq_lens_kv: element 0"):
        run(b, qsl, kvl, table)


# ------------------------------------------------------------------ sync-free (CUDA) kernel


def sync_free(b: Batch, qsl, kvl, table, sparse_mode: int = 3):  # type: ignore[no-untyped-def]
    return paged_attention_from_device_bounds(
        b.query, b.key, b.value, qsl, kvl, table, max_num_reqs=MAX_REQS,
        block_size=b.block_size, scale=b.scale, causal=sparse_mode == 3,
    )


@pytest.mark.parametrize("sparse_mode", [3, 0])
@pytest.mark.parametrize("num_kv_heads", [4, 2])
def test_sync_free_kernel_matches_exact_kernel(sparse_mode: int, num_kv_heads: int) -> None:
    b = make_batch([5, 3, 1, 0, 1], [5, 9, 12, 3, 0], num_kv_heads=num_kv_heads).padded(3)
    buffers = device_buffers(b)
    want_out, want_lse = run(b, *buffers, sparse_mode=sparse_mode)
    got_out, got_lse = sync_free(b, *buffers, sparse_mode=sparse_mode)
    torch.testing.assert_close(got_out, want_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_lse, want_lse, rtol=1e-5, atol=1e-5)  # -inf rows match too


def test_sync_free_kernel_never_reads_out_of_bounds() -> None:
    b = make_batch([2, 2], [3, 3])
    qsl, kvl, table = device_buffers(b)
    qsl[-1] = b.T + 5
    kvl[0] = 10_000
    table[1, 0] = 999
    out, lse = sync_free(b, qsl, kvl, table)
    assert out.shape == b.query.shape and not torch.isnan(out).any()


def test_cuda_dispatch_uses_the_sync_free_kernel() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device (the CPU kernel is covered above)")
    b = make_batch([5, 3, 1], [5, 9, 12])
    qsl, kvl, table = (t.cuda() for t in device_buffers(b))
    args = [t.cuda() for t in (b.query, b.key, b.value)]
    kw = dict(block_size=b.block_size, num_heads=b.num_heads, num_key_value_heads=b.num_kv_heads,
              scale=b.scale, max_num_reqs=MAX_REQS)
    graph = torch.cuda.CUDAGraph()
    out = fia_device_metadata(*args, qsl, kvl, table, **kw)  # warm-up outside the capture
    with torch.cuda.graph(graph):
        out, lse = fia_device_metadata(*args, qsl, kvl, table, **kw)
    graph.replay()
    want = run(b, *device_buffers(b))
    torch.testing.assert_close(out.cpu(), want[0], rtol=1e-4, atol=1e-4)
