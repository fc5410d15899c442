"""FIA's other input forms and torch_npu's ``_npu_paged_attention``, against straightforward references.

* the flat 3-D paged KV view vLLM Ascend passes (``key_cache.view(num_blocks, block_size, -1)``);
* dense BNSD, whose ``actual_seq_lengths`` are per-batch lengths (TND's are cumulative);
* ``_npu_paged_attention`` (decode, one token per request, host ``context_lens``) and its
  device-read variant.

References are float64 loops that share no code with ``harness.ops.reference``.
"""

from __future__ import annotations

import math

import pytest
import torch

from harness.ops import (
    FiaArgumentError,
    FiaContractError,
    npu_fused_infer_attention_score,
    npu_fused_infer_attention_score_out,
    get_max_workspace,
    npu_paged_attention,
    npu_paged_attention_device_lens,
    observe_fia_calls,
)
from tests.ops.fia_testlib import make_batch, naive_attention

# --------------------------------------------------------------------------- flat 3-D KV view


@pytest.mark.parametrize("form", ["functional", "out"])
def test_flat_3d_kv_view_equals_the_4d_cache(form):
    b = make_batch([3, 1, 4], [7, 2, 9], num_heads=4, num_kv_heads=2, head_dim=8, block_size=4)
    nb, bs = b.key.shape[:2]
    key3, value3 = b.key.view(nb, bs, -1), b.value.view(nb, bs, -1)  # as vLLM Ascend hands them over
    assert key3.data_ptr() == b.key.data_ptr()
    kwargs = b.kwargs()
    want = npu_fused_infer_attention_score(b.query, b.key, b.value, **kwargs)
    if form == "functional":
        got = npu_fused_infer_attention_score(b.query, key3, value3, **kwargs)
    else:
        out, lse = torch.empty_like(b.query), torch.empty(b.T, b.num_heads, 1)
        ws = get_max_workspace(b.query, key3, value3, **kwargs)
        npu_fused_infer_attention_score_out(b.query, key3, value3, **kwargs, workspace=ws, out=(out, lse))
        got = (out, lse)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    ref_out, _ = naive_attention(b, causal=True)
    assert torch.allclose(got[0].double(), ref_out, atol=1e-5)


def test_flat_3d_kv_view_is_checked():
    b = make_batch([2], [5], num_heads=4, num_kv_heads=2, head_dim=8, block_size=4)
    nb, bs = b.key.shape[:2]
    odd = torch.zeros(nb, bs, 15)  # 15 does not split into 2 KV heads
    with pytest.raises(FiaArgumentError, match="key: last dim 15 of the flat 3-D view does not split into 2"):
        npu_fused_infer_attention_score(b.query, odd, odd, **b.kwargs())
    wrong_d = torch.zeros(nb, bs, 2 * 4)  # head dim 4, the query's is 8
    with pytest.raises(FiaArgumentError, match=r"key: head dim 4 differs from the query's \(8\)"):
        npu_fused_infer_attention_score(b.query, wrong_d, wrong_d, **b.kwargs())


# --------------------------------------------------------------------------- dense BNSD


def _bnsd_inputs(B=3, N=4, N_kv=2, S=5, S_kv=7, D=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, N, S, D, generator=g), torch.randn(B, N_kv, S_kv, D, generator=g),
            torch.randn(B, N_kv, S_kv, D, generator=g))


def _naive_bnsd(q, k, v, q_lens, kv_lens, scale, causal):
    B, N, S, D = q.shape
    group = N // k.shape[1]
    out = torch.zeros(B, N, S, v.shape[3], dtype=torch.float64)
    lse = torch.full((B, N, S), float("-inf"), dtype=torch.float64)
    for b in range(B):
        for h in range(N):
            for j in range(q_lens[b]):
                visible = kv_lens[b] - q_lens[b] + j + 1 if causal else kv_lens[b]
                if visible <= 0:
                    continue
                s = (k[b, h // group, :visible].double() @ q[b, h, j].double()) * scale
                lse[b, h, j] = torch.logsumexp(s, 0)
                out[b, h, j] = torch.softmax(s, 0) @ v[b, h // group, :visible].double()
    return out, lse


@pytest.mark.parametrize("sparse_mode", [0, 3])
def test_bnsd_per_batch_lengths_against_a_naive_reference(sparse_mode):
    q, k, v = _bnsd_inputs()
    q_lens, kv_lens = [5, 2, 0], [7, 3, 6]  # per batch, NOT cumulative: decreasing is fine
    kw = dict(actual_seq_lengths=q_lens, actual_seq_lengths_kv=kv_lens, num_heads=4, num_key_value_heads=2,
              scale=0.3, input_layout="BNSD", sparse_mode=sparse_mode, softmax_lse_flag=True)
    with observe_fia_calls() as calls:
        out, lse = npu_fused_infer_attention_score(q, k, v, **kw)
    ref_out, ref_lse = _naive_bnsd(q, k, v, q_lens, kv_lens, 0.3, causal=sparse_mode == 3)
    assert out.shape == (3, 4, 5, 8) and lse.shape == (3, 4, 5, 1)
    assert torch.allclose(out.double(), ref_out, atol=1e-5)
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse[..., 0]), finite)
    assert torch.allclose(lse[..., 0].double()[finite], ref_lse[finite], atol=1e-5)
    assert torch.equal(out[1, :, 2:], torch.zeros_like(out[1, :, 2:]))  # padding rows are 0
    # The TND last-element rule does not exist in BNSD: strict and relaxed both accept.
    assert calls[0].layout == "BNSD" and calls[0].strict_ok and calls[0].relaxed_ok and calls[0].num_reqs == 3


def test_bnsd_without_lengths_uses_the_full_s():
    q, k, v = _bnsd_inputs(B=2, S=3, S_kv=4)
    kw = dict(num_heads=4, num_key_value_heads=2, scale=0.5, input_layout="BNSD", softmax_lse_flag=False)
    out, lse = npu_fused_infer_attention_score(q, k, v, **kw)
    ref_out, _ = _naive_bnsd(q, k, v, [3, 3], [4, 4], 0.5, causal=False)
    assert torch.allclose(out.double(), ref_out, atol=1e-5) and lse.shape == (1,)


@pytest.mark.parametrize("over, message", [
    (dict(actual_seq_lengths=[5, 2]), "actual_seq_lengths: has 2 entries; BNSD needs one per batch"),
    (dict(actual_seq_lengths=[5, 6, 1]), r"actual_seq_lengths: element 1 \(6\) is outside \[0, 5\]"),
    (dict(actual_seq_lengths_kv=[8, 1, 1]), r"actual_seq_lengths_kv: element 0 \(8\) is outside \[0, 7\]"),
    (dict(block_table=torch.zeros(3, 2, dtype=torch.int32)), "block_table: the harness models BNSD dense"),
])
def test_bnsd_host_contract_rejections(over, message):
    q, k, v = _bnsd_inputs()
    kw = dict(num_heads=4, num_key_value_heads=2, input_layout="BNSD", **over)
    for contract in ("strict", "relaxed", "off"):
        with pytest.raises(FiaArgumentError, match=message):
            npu_fused_infer_attention_score(q, k, v, contract=contract, **kw)


def test_bnsd_shapes_are_checked():
    q, k, v = _bnsd_inputs()
    with pytest.raises(FiaArgumentError, match="query: BNSD layout needs a 4-D query"):
        npu_fused_infer_attention_score(q[0], k, v, num_heads=4, num_key_value_heads=2, input_layout="BNSD")
    with pytest.raises(FiaArgumentError, match=r"key: batch 2 differs from the query's \(3\)"):
        npu_fused_infer_attention_score(q, k[:2], v[:2], num_heads=4, num_key_value_heads=2, input_layout="BNSD")


def test_tnd_keeps_its_cumulative_last_element_rule():
    """The same per-batch list that BNSD accepts is a strict-contract violation in TND."""
    b = make_batch([2, 2], [3, 3])
    with pytest.raises(FiaContractError, match="561002"):
        npu_fused_infer_attention_score(b.query, b.key, b.value, **b.kwargs(actual_seq_lengths=[2, 2]))


# --------------------------------------------------------------------------- paged attention


def _pa_inputs(B=4, N=4, N_kv=2, D=8, block_size=4, max_blocks=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    num_blocks = B * max_blocks + 2
    table = torch.randperm(num_blocks, generator=g)[: B * max_blocks].view(B, max_blocks).to(torch.int32)
    return dict(query=torch.randn(B, N, D, generator=g),
                key_cache=torch.randn(num_blocks, block_size, N_kv, D, generator=g),
                value_cache=torch.randn(num_blocks, block_size, N_kv, D, generator=g),
                num_kv_heads=N_kv, num_heads=N, scale_value=1 / math.sqrt(D), block_table=table)


def _naive_pa(x, context_lens):
    q, kc, vc, table = x["query"], x["key_cache"], x["value_cache"], x["block_table"]
    B, N, D = q.shape
    bs, group = kc.shape[1], N // x["num_kv_heads"]
    out = torch.zeros(B, N, vc.shape[3], dtype=torch.float64)
    for i in range(B):
        n = int(context_lens[i])
        if n == 0:
            continue
        slots = [(int(table[i, p // bs]), p % bs) for p in range(n)]
        for h in range(N):
            k = torch.stack([kc[blk, off, h // group] for blk, off in slots]).double()
            v = torch.stack([vc[blk, off, h // group] for blk, off in slots]).double()
            out[i, h] = torch.softmax((k @ q[i, h].double()) * x["scale_value"], 0) @ v
    return out


@pytest.mark.parametrize("lens_as", ["list", "host_tensor"])
def test_paged_attention_against_a_naive_reference(lens_as):
    x = _pa_inputs()
    lens = [12, 1, 0, 7]
    out = torch.full_like(x["query"], float("nan"))
    context_lens = lens if lens_as == "list" else torch.tensor(lens, dtype=torch.int32)
    npu_paged_attention(**x, context_lens=context_lens, out=out)
    assert torch.allclose(out.double(), _naive_pa(x, lens), atol=1e-5)
    assert torch.equal(out[2], torch.zeros_like(out[2]))  # context length 0 sees nothing


def test_paged_attention_device_lens_reads_the_tensor_when_it_runs():
    x = _pa_inputs()
    lens = torch.tensor([3, 5, 2, 9], dtype=torch.int32)
    out = torch.empty_like(x["query"])
    npu_paged_attention_device_lens(**x, context_lens=lens, out=out)
    assert torch.allclose(out.double(), _naive_pa(x, lens.tolist()), atol=1e-5)


@pytest.mark.parametrize("over, message", [
    (dict(context_lens=[1, 2, 3]), "context_lens: has 3 entries for a batch of 4"),
    (dict(context_lens=[1, 2, 3, 13]), r"context_lens: element 3 \(13\) is outside \[0, 12\]"),
    (dict(num_kv_heads=3), r"num_kv_heads: num_heads \(4\) must be divisible by num_kv_heads \(3\)"),
    (dict(out=torch.empty(4, 4, 5)), r"out: needs \[4, 4, 8\]"),
    (dict(block_table="int64"), "block_table: must be int32"),
])
def test_paged_attention_rejections_name_the_argument(over, message):
    x = _pa_inputs()
    args = dict(x, context_lens=[1, 2, 3, 4], out=torch.empty_like(x["query"]))
    if over.get("block_table") == "int64":
        over = dict(block_table=x["block_table"].long())
    args.update(over)
    with pytest.raises(FiaArgumentError, match=message):
        npu_paged_attention(**args)
