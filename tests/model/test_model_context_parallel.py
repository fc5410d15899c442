"""Decode context parallel: per-rank metadata, the LSE merge, and a 2-rank gloo model run.

The gloo run (one spawn, ~10 s) checks that CP=2 logits equal the single-rank model's over a
prefill + 4 decode steps (one of them padded to a bucket), and captures / replays one CP step
with the emulated engine on each rank.
"""

from __future__ import annotations

import math

import pytest
import torch

from harness.model import ModelConfig, PagedKVCache
from harness.model.context_parallel import (
    build_cp_metadata,
    cp_local_capacity,
    cp_local_kv_len,
    cp_metadata_from_attention_metadata,
    cp_slot_mapping,
    make_cp_attend,
    merge_attention_states,
)
from harness.ops import npu_fused_infer_attention_score
from harness.ops.contract import FiaArgumentError
from harness.ops.observe import observe_fia_calls

# --------------------------------------------------------------------------- pure metadata


def test_single_decode_token_exact_numbers():
    """cp=2, one request of KV length 5 decoding position 4 (block 3, block_size 4)."""
    r0 = build_cp_metadata([1], [5], [4], [[3, 0]], block_size=4, cp=2, rank=0)
    r1 = build_cp_metadata([1], [5], [4], [[3, 0]], block_size=4, cp=2, rank=1)
    # rank 0 owns 0, 2, 4 -> 3 KV; position 4 is local position 2 -> slot 3*4 + 2
    assert r0.actual_seq_lengths == [1] and r0.actual_seq_lengths_kv == [3]
    assert r0.slot_mapping == [14] and r0.block_table == [[3, 0]]
    # rank 1 owns 1, 3 -> 2 KV; it does not own position 4 -> no write
    assert r1.actual_seq_lengths == [1] and r1.actual_seq_lengths_kv == [2]
    assert r1.slot_mapping == [-1]


def test_cp_local_kv_len_counts_owned_positions():
    for cp in (1, 2, 3, 4):
        for rank in range(cp):
            for pos in range(20):
                owned = sum(1 for p in range(pos + 1) if p % cp == rank)
                assert cp_local_kv_len(pos, cp, rank) == owned
    # ranks' shares add up to the global length; capacity is the fullest rank's share
    for cp in (2, 3):
        for seq_len in range(1, 12):
            shares = [cp_local_kv_len(seq_len - 1, cp, r) for r in range(cp)]
            assert sum(shares) == seq_len and max(shares) == cp_local_capacity(seq_len, cp)


def test_prefill_tokens_become_length_one_requests():
    """A 3-token prefill (positions 0..2) + a decode at position 6 of another request, cp=2."""
    q, s, pos, rows = [3, 1], [3, 7], [0, 1, 2, 6], [[2, 0], [5, 6]]
    r0 = build_cp_metadata(q, s, pos, rows, block_size=2, cp=2, rank=0)
    r1 = build_cp_metadata(q, s, pos, rows, block_size=2, cp=2, rank=1)
    for m in (r0, r1):
        assert m.actual_seq_lengths == [1, 2, 3, 4]
        assert m.block_table == [[2, 0], [2, 0], [2, 0], [5, 6]]
    assert r0.actual_seq_lengths_kv == [1, 1, 2, 4]  # owns 0,2 | 0,2,4,6
    assert r1.actual_seq_lengths_kv == [0, 1, 1, 3]  # owns 1 | 1,3,5
    # local position p // 2: pos 0 -> 0, 1 -> 0, 2 -> 1, 6 -> 3 (block 6, offset 1)
    assert r0.slot_mapping == [2 * 2 + 0, -1, 2 * 2 + 1, 6 * 2 + 1]
    assert r1.slot_mapping == [-1, 2 * 2 + 0, -1, -1]


def test_slot_mapping_rules():
    assert cp_slot_mapping([0, 1, 5], [[4], [4], None], 4, 2, 0) == [16, -1, -1]
    assert cp_slot_mapping([0, 1, 5], [[4], [4], None], 4, 2, 1) == [-1, 16, -1]
    with pytest.raises(ValueError, match="not covered"):
        cp_slot_mapping([9], [[4]], 4, 2, 1)  # local position 4 needs a second block
    with pytest.raises(ValueError, match="rank"):
        cp_slot_mapping([0], [[4]], 4, 2, 2)


@pytest.mark.parametrize("rank", [0, 1])
def test_padding_zero_pads_cp_seq_len(rank):
    m = build_cp_metadata([1, 1], [5, 3], [4, 2], [[3, 0], [5, 0]], block_size=4, cp=2,
                          rank=rank, num_tokens_padded=4)
    assert m.num_actual_tokens == 2 and m.num_input_tokens == 4
    assert m.actual_seq_lengths == [1, 2, 3, 4]  # last == T
    assert m.actual_seq_lengths_kv == ([3, 2] if rank == 0 else [2, 1]) + [0, 0]
    assert m.block_table[2:] == [[0, 0], [0, 0]]
    assert m.slot_mapping[2:] == [-1, -1]
    assert len(m.block_table) == len(m.slot_mapping) == len(m.positions) == 4


def test_missing_kv_padding_is_rejected_by_fia():
    """The known-bad pipeline: q lengths padded to T=4, cp_seq_len only for the 2 real tokens."""
    m = build_cp_metadata([1, 1], [5, 3], [4, 2], [[3, 0], [5, 0]], block_size=4, cp=2,
                          rank=1, num_tokens_padded=4, pad_kv_lengths=False)
    assert m.actual_seq_lengths == [1, 2, 3, 4] and m.actual_seq_lengths_kv == [2, 1]
    cfg = ModelConfig(block_size=4, num_blocks=8)
    cache = PagedKVCache(cfg)
    q = torch.zeros(4, cfg.num_heads, cfg.head_dim)
    for contract in ("strict", "relaxed", "off"):
        with observe_fia_calls() as calls, pytest.raises(
            FiaArgumentError, match=r"actual_seq_lengths_kv: has 2 entries but actual_seq_lengths has 4"
        ):
            npu_fused_infer_attention_score(
                q, cache.key_cache[0], cache.value_cache[0],
                actual_seq_lengths=m.actual_seq_lengths, actual_seq_lengths_kv=m.actual_seq_lengths_kv,
                block_table=m.block_table_tensor(), block_size=4, num_heads=cfg.num_heads,
                num_key_value_heads=cfg.num_kv_heads, sparse_mode=0, softmax_lse_flag=True,
                contract=contract,
            )
        (call,) = calls  # observed for the FIA-invariant check, with both verdicts False
        assert call.error and not call.strict_ok and not call.relaxed_ok


def test_from_attention_metadata_matches_direct_build():
    from harness.graph.metadata import ScheduledRequest, build_attention_metadata, pad_attention_metadata
    from harness.graph.modes import CUDAGraphMode

    reqs = [ScheduledRequest("a", 4, 1, (3, 4)), ScheduledRequest("b", 2, 1, (5,))]
    meta = build_attention_metadata(reqs, 4, 2)
    padded = pad_attention_metadata(meta, 4, uniform_decode_query_len=1,
                                    runtime_mode=CUDAGraphMode.FULL,
                                    configured_mode=CUDAGraphMode.FULL_DECODE_ONLY)
    got = cp_metadata_from_attention_metadata(padded, block_size=4, cp=2, rank=0)
    want = build_cp_metadata([1, 1], [5, 3], [4, 2], [[3, 4], [5, 0]], block_size=4, cp=2,
                             rank=0, num_tokens_padded=4)
    assert got == want


# --------------------------------------------------------------------------- LSE merge


def _dense(q, k, v, scale):
    """q [T, N, D], k/v [S, N, D] -> (out [T, N, D], lse [T, N, 1]); S may be 0."""
    s = torch.einsum("tnd,snd->tns", q, k) * scale
    lse = torch.logsumexp(s, dim=-1, keepdim=True) if k.shape[0] else torch.full(
        (*q.shape[:2], 1), float("-inf"))
    out = torch.einsum("tns,snd->tnd", torch.softmax(s, -1), v) if k.shape[0] else torch.zeros_like(q)
    return out, lse


def test_merge_of_two_halves_equals_full_attention():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(5, 3, 8, generator=g) for _ in range(3))
    k, v = torch.randn(11, 3, 8, generator=g), torch.randn(11, 3, 8, generator=g)
    scale = 1 / math.sqrt(8)
    full, full_lse = _dense(q, k, v, scale)
    parts = [_dense(q, k[idx], v[idx], scale) for idx in (slice(0, None, 2), slice(1, None, 2))]
    out, lse = merge_attention_states(torch.stack([p[0] for p in parts]),
                                      torch.stack([p[1] for p in parts]))
    torch.testing.assert_close(out, full, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(lse, full_lse, atol=1e-6, rtol=1e-5)


def test_merge_handles_minus_inf_without_nan():
    g = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(2, 2, 4, generator=g), torch.randn(3, 2, 4, generator=g), torch.randn(3, 2, 4, generator=g)
    seen, seen_lse = _dense(q, k, v, 0.5)
    empty, empty_lse = _dense(q, k[:0], v[:0], 0.5)  # a rank that owns no KV yet
    out, lse = merge_attention_states(torch.stack([empty, seen]), torch.stack([empty_lse, seen_lse]))
    assert torch.equal(out, seen) and torch.equal(lse, seen_lse)
    # no rank saw anything (a padding token): 0 / -inf, no NaN
    out, lse = merge_attention_states(torch.stack([empty, empty]), torch.stack([empty_lse, empty_lse]))
    assert torch.equal(out, torch.zeros_like(out)) and bool(torch.isneginf(lse).all())


def test_cp1_attend_equals_plain_fia_with_one_token_requests():
    """cp=1 (no collective): the one-token-request form equals the usual causal call."""
    from harness.model import make_eager_attend

    cfg = ModelConfig(block_size=4, num_blocks=8)
    cache = PagedKVCache(cfg)
    g = torch.Generator().manual_seed(2)
    for t in (*cache.key_cache, *cache.value_cache):
        t.copy_(torch.randn(t.shape, generator=g))
    q = torch.randn(3, cfg.num_heads, cfg.head_dim, generator=g)
    meta = build_cp_metadata([3], [6], [3, 4, 5], [[2, 3]], block_size=4, cp=1, rank=0)
    cp_out = make_cp_attend(cfg, 1, 0, None, meta)(0, q, cache.key_cache[0], cache.value_cache[0])
    plain = make_eager_attend(cfg, [3], [6], torch.tensor([[2, 3]], dtype=torch.int32))
    ref = plain(0, q, cache.key_cache[0], cache.value_cache[0])
    torch.testing.assert_close(cp_out, ref, atol=1e-6, rtol=1e-6)


# --------------------------------------------------------------------------- 2-rank gloo run


@pytest.fixture(scope="module")
def cp2_results(tmp_path_factory):
    import cp_rank_fns

    single = cp_rank_fns.run_decoder(1, 0, None)
    ranks = cp_rank_fns.launch(cp_rank_fns.cp_worker, 2, tmp_path_factory.mktemp("cp2"), 1,
                               timeout=120)
    return single, ranks


GATHERS = ("functional", "out")


@pytest.mark.parametrize("gather", GATHERS)
def test_cp2_logits_match_single_rank(cp2_results, gather):
    single, ranks = cp2_results
    for rank, res in enumerate(r[gather] for r in ranks):
        assert len(res["logits"]) == len(single["logits"]) == 5
        for step, (a, b) in enumerate(zip(res["logits"], single["logits"])):
            assert a.shape == b.shape
            diff = float((a - b).abs().max())
            assert diff < 1e-4, f"rank {rank} step {step}: max |diff| {diff}"
        assert res["tokens"] == single["tokens"]


@pytest.mark.parametrize("gather", GATHERS)
def test_cp2_capture_records_the_all_gather(cp2_results, gather):
    """The collective is recorded (its meta kernel gives the shape), one gather + one wait per
    layer; the capture itself writes nothing; one communication group is counted."""
    _, ranks = cp2_results
    gather_op = {"functional": "all_gather_into_tensor", "out": "all_gather_into_tensor_out"}[gather]
    for res in (r[gather] for r in ranks):
        cap = res["capture"]
        assert "capture_error" not in cap, cap
        assert cap["comm_nodes"].count(f"_c10d_functional::{gather_op}") == 2
        assert cap["comm_nodes"].count("_c10d_functional::wait_tensor") == 2
        assert len(cap["fia_nodes"]) == 2
        assert cap["cache_untouched_by_capture"]
        assert cap["stream_usage"]["in_use"] == 3  # 1 graph + 2 for the one CP comm group


@pytest.mark.parametrize("gather", GATHERS)
def test_cp2_replay_equals_eager(cp2_results, gather):
    """Replaying the captured CP step gives eager's logits and cache bit for bit, twice."""
    _, ranks = cp2_results
    for res in (r[gather] for r in ranks):
        cap = res["capture"]
        assert cap["replay_equal"] and cap["cache_equal"] and cap["second_replay_equal"], cap
