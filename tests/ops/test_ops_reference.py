"""The FIA reference against an independent dense attention, and its batch invariance."""

from __future__ import annotations

import pytest
import torch
from fia_testlib import make_batch, naive_attention

from harness.ops import npu_fused_infer_attention_score as fia

# Mixed prefill + decode: a 5-token prefill on a fresh request, a 3-token chunk on top of 6
# cached tokens, two decodes, and a prefill that spans several blocks.
MIXED_Q = [5, 3, 1, 1, 7]
MIXED_KV = [5, 9, 12, 1, 7]


@pytest.mark.parametrize("sparse_mode", [3, 0])
@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
def test_matches_naive_attention_fp32(sparse_mode: int, num_kv_heads: int) -> None:
    batch = make_batch(MIXED_Q, MIXED_KV, num_heads=4, num_kv_heads=num_kv_heads)
    out, lse = fia(batch.query, batch.key, batch.value, **batch.kwargs(sparse_mode=sparse_mode))
    want_out, want_lse = naive_attention(batch, causal=sparse_mode == 3)
    assert out.dtype == torch.float32 and out.shape == batch.query.shape
    assert lse.dtype == torch.float32 and lse.shape == (batch.T, 4, 1)
    torch.testing.assert_close(out.double(), want_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse[..., 0].double(), want_lse, rtol=1e-5, atol=1e-5)


def test_matches_naive_attention_bf16() -> None:
    batch = make_batch(MIXED_Q, MIXED_KV, dtype=torch.bfloat16)
    out, lse = fia(batch.query, batch.key, batch.value, **batch.kwargs())
    want_out, want_lse = naive_attention(batch, causal=True)
    assert out.dtype == torch.bfloat16
    assert lse.dtype == torch.float32
    torch.testing.assert_close(out.double(), want_out, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(lse[..., 0].double(), want_lse, rtol=1e-4, atol=1e-4)


def test_rows_that_see_no_key_are_zero_with_minus_inf_lse() -> None:
    # request 1 has no KV at all; request 2 has fewer KV tokens than queries, so under the
    # right-down causal mask its first query row sees nothing.
    batch = make_batch([2, 3, 2], [4, 0, 1])
    out, lse = fia(batch.query, batch.key, batch.value, **batch.kwargs())
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    assert torch.equal(out[2:5], torch.zeros_like(out[2:5]))
    assert torch.isneginf(lse[2:5]).all()
    assert torch.equal(out[5], torch.zeros_like(out[5])) and torch.isneginf(lse[5]).all()
    assert torch.isfinite(lse[6]).all()


def test_lse_flag_false_returns_torch_npu_placeholder() -> None:
    batch = make_batch([2, 1], [2, 3])
    _, lse = fia(batch.query, batch.key, batch.value, **batch.kwargs(softmax_lse_flag=False))
    assert lse.dtype == torch.float32 and lse.shape == (1,) and lse.item() == 0.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batch_invariance_alone_batched_and_padded(dtype: torch.dtype) -> None:
    batch = make_batch(MIXED_Q, MIXED_KV, dtype=dtype)
    full, full_lse = fia(batch.query, batch.key, batch.value, **batch.kwargs())
    padded = batch.padded(6)
    pad_out, pad_lse = fia(padded.query, padded.key, padded.value, **padded.kwargs(), contract="relaxed")
    start = 0
    for i, q_len in enumerate(batch.q_lens):
        alone = batch.request(i)
        out, lse = fia(alone.query, alone.key, alone.value, **alone.kwargs())
        rows = slice(start, start + q_len)
        assert torch.equal(out, full[rows]), f"request {i}: batched != alone"
        assert torch.equal(lse, full_lse[rows])
        assert torch.equal(out, pad_out[rows]), f"request {i}: padded batch != alone"
        assert torch.equal(lse, pad_lse[rows])
        start += q_len
    assert torch.equal(pad_out[batch.T :], torch.zeros_like(pad_out[batch.T :]))
    assert torch.isneginf(pad_lse[batch.T :]).all()


def test_repeated_calls_are_bitwise_identical() -> None:
    batch = make_batch(MIXED_Q, MIXED_KV)
    first = fia(batch.query, batch.key, batch.value, **batch.kwargs())
    second = fia(batch.query, batch.key, batch.value, **batch.kwargs())
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
