"""Tensor parallel and sequence parallel DecoderLM: sharding, errors, and a real 2-rank gloo run
(TP / SP vs single rank, greedy tokens, canary, capture/replay through the emulated engine)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harness.model import DecoderLM, ModelConfig, PagedKVCache, make_eager_attend
from harness.model.decoder import random_state_dict, stack_projections
from harness.model.parallel import (
    ParallelContext,
    column_shard,
    make_kv_cache,
    padded_num_tokens,
    row_shard,
    shard_state_dict,
)
from model_helpers import make_batch
from model_parallel_helpers import SMALL, parallel_job, run_ranks


@dataclasses.dataclass(frozen=True)
class FakeGroup:
    """Stands in for a ProcessGroup in single-process tests; no process group is registered
    under its name, so any real collective on it raises."""

    n: int = 2
    r: int = 0
    group_name: str = "no-such-group"

    def size(self) -> int:
        return self.n

    def rank(self) -> int:
        return self.r


def fake_ctx(tp: int = 2, rank: int = 0, sp: bool = False) -> ParallelContext:
    return ParallelContext(tp=tp, tp_rank=rank, group=FakeGroup(tp, rank), sequence_parallel=sp)


CONFIG = ModelConfig(kind="random", **SMALL)


# ------------------------------------------------------------------------------- single process
def test_column_and_row_shards_reassemble_the_full_weight():
    w = torch.arange(24.0).reshape(4, 6)
    assert torch.equal(torch.cat([column_shard(w, 2, r) for r in range(2)], 0), w)
    assert torch.equal(torch.cat([row_shard(w, 3, r) for r in range(3)], 1), w)
    assert torch.equal(column_shard(w, 2, 1), w[2:])
    with pytest.raises(ValueError, match="not divisible by tp=4"):
        row_shard(w, 4, 0)


def test_rank_keeps_its_shard_of_the_same_full_weights():
    full = random_state_dict(CONFIG)
    for rank in range(2):
        model = DecoderLM(CONFIG, fake_ctx(rank=rank))
        own = model.state_dict()
        assert own.keys() == stack_projections(full, CONFIG.num_layers).keys()
        # column parallel by whole heads, each of q, k and v sharded before they are stacked
        # (vLLM's QKVParallelLinear), and gate and up likewise (MergedColumnParallelLinear)
        q, k, v = (full[f"layers.1.{p}_proj.weight"][rows * rank: rows * (rank + 1)]
                   for p, rows in (("q", 32), ("k", 16), ("v", 16)))
        assert torch.equal(own["layers.1.qkv_proj.weight"], torch.cat([q, k, v]))
        gate, up = (full[f"layers.0.{p}_proj.weight"][64 * rank: 64 * (rank + 1)] for p in ("gate", "up"))
        assert torch.equal(own["layers.0.gate_up_proj.weight"], torch.cat([gate, up]))
        assert torch.equal(own["layers.0.o_proj.weight"], full["layers.0.o_proj.weight"][:, 32 * rank: 32 * (rank + 1)])
        assert torch.equal(own["layers.0.down_proj.weight"], full["layers.0.down_proj.weight"][:, 64 * rank: 64 * (rank + 1)])
        for name in ("embed_tokens.weight", "lm_head.weight", "norm.weight", "layers.0.input_norm.weight"):
            assert torch.equal(own[name], full[name])
    assert shard_state_dict(full, ParallelContext()).keys() == full.keys()


def test_tp1_context_is_the_single_rank_model_bitwise():
    cache_a, cache_b = PagedKVCache(CONFIG), make_kv_cache(CONFIG, ParallelContext())
    ref, one = DecoderLM(CONFIG), DecoderLM(CONFIG, ParallelContext(sequence_parallel=True))
    outs = []
    for model, cache in ((ref, cache_a), (one, cache_b)):
        b = make_batch(cache, [("a", [1, 2, 3, 4, 5], 0)])
        attend = make_eager_attend(CONFIG, b.cum_q, b.kv_lens, b.block_table, parallel=model.parallel)
        outs.append(model(b.input_ids, b.positions, b.slot_mapping, cache, attend))
    assert torch.equal(outs[0], outs[1])


def test_parallel_context_validation():
    with pytest.raises(ValueError, match="needs the TP ProcessGroup"):
        ParallelContext(tp=2, tp_rank=0)
    with pytest.raises(ValueError, match="tp_rank"):
        ParallelContext(tp=2, tp_rank=2, group=FakeGroup())
    with pytest.raises(ValueError, match="group has 2 ranks"):
        ParallelContext(tp=4, tp_rank=0, group=FakeGroup(2))
    assert fake_ctx(sp=True).sp and not ParallelContext(sequence_parallel=True).sp


def test_indivisible_heads_raise_a_clear_error():
    with pytest.raises(ValueError, match=r"num_kv_heads \(2\) must be divisible by tp \(4\)"):
        DecoderLM(CONFIG, fake_ctx(tp=4))
    with pytest.raises(ValueError, match=r"num_heads \(6\) must be divisible by tp \(4\)"):
        DecoderLM(CONFIG.replace(num_heads=6, num_kv_heads=1), fake_ctx(tp=4))


def test_sequence_parallel_needs_t_divisible_by_tp():
    assert [padded_num_tokens(t, fake_ctx(sp=True)) for t in (1, 2, 3, 5)] == [2, 2, 4, 6]
    assert padded_num_tokens(5, fake_ctx()) == 5 and padded_num_tokens(5, None) == 5
    ctx = fake_ctx(sp=True)
    model = DecoderLM(CONFIG, ctx)
    cache = make_kv_cache(CONFIG, ctx)
    b = make_batch(cache, [("a", [1, 2, 3], 0)])
    with pytest.raises(ValueError, match="T=3 tokens is not a multiple of tp=2; pad T up to 4"):
        model.piece(0, (b.input_ids,), b.positions, b.slot_mapping, cache)


def test_kv_cache_and_eager_attend_use_this_ranks_heads():
    cache = make_kv_cache(CONFIG, fake_ctx())
    assert cache.key_cache[0].shape == (CONFIG.num_blocks, CONFIG.block_size, 1, CONFIG.head_dim)
    assert cache.config is CONFIG
    seen = {}

    def fia(query, key, value, **kw):
        seen.update(kw)
        return query, None

    attend = make_eager_attend(CONFIG, [2], [2], torch.zeros(1, 4, dtype=torch.int32), fia=fia,
                               parallel=fake_ctx())
    attend(0, torch.zeros(2, 2, 16), cache.key_cache[0], cache.value_cache[0])
    assert (seen["num_heads"], seen["num_key_value_heads"]) == (2, 1)


@pytest.fixture(params=["_c10d_functional", "harness_comm"])
def collective_family(request):
    """Each op family a rank's collectives may go through (the process's default is restored)."""
    from harness.engine.emulated.collectives import OPS
    from harness.model.parallel import use_collective_ops

    use_collective_ops(None if request.param == "_c10d_functional" else OPS)
    yield request.param
    use_collective_ops(None)


@pytest.mark.parametrize("sp", [False, True], ids=["tp", "sp"])
def test_capture_records_collectives_without_communicating(sp, collective_family):
    """The group name resolves to no process group: a capture that ran any collective (or a
    collective's real kernel for shape inference) would raise. The emulator's shared-memory
    family is recorded the same way, less the waits (its ops are done when they return)."""
    from harness.engine import load

    npu = load("emulated")
    npu.reset_device()
    ctx = fake_ctx(sp=sp)
    model = DecoderLM(CONFIG, ctx).to(npu.device)
    cache = make_kv_cache(CONFIG, ctx, npu.device)
    b = make_batch(cache, [("a", [1, 2, 3, 4], 0)])
    attend = make_eager_attend(CONFIG, b.cum_q, b.kv_lens, b.block_table.to(npu.device), parallel=ctx)
    g = npu.NPUGraph()
    with npu.graph(g):
        model(*(x.to(npu.device) for x in (b.input_ids, b.positions, b.slot_mapping)), cache, attend)
    comm = [n for n in g.nodes if getattr(n, "func", None) is not None
            and n.func.namespace == collective_family]
    kinds = {n.name: n.kind for n in comm}
    expected = ({"all_gather_into_tensor_out", "reduce_scatter_tensor_out"} if sp else {"all_reduce_"})
    waits = {"wait_tensor"} if collective_family == "_c10d_functional" else set()
    assert {k.split("::")[1] for k in kinds} == expected | waits
    assert all(kind == "mutating" for name, kind in kinds.items() if "wait_tensor" not in name)
    def group_name(node):
        names = [a.name for a in node.func._schema.arguments]
        return node.args[names.index("group_name")]

    assert {group_name(n) for n in comm if "wait_tensor" not in n.name} == {"no-such-group"}
    assert g.streams_held >= 3  # one graph + the communication group's streams
    g.reset()


# ------------------------------------------------------------------------------- 2 real ranks
@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    return run_ranks(parallel_job, tmp_path_factory.mktemp("tp2"))


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


@pytest.mark.parametrize("mode", ["tp", "sp"])
def test_logits_match_single_rank(two_ranks, mode):
    for res in two_ranks:
        for got, ref in zip(res[f"{mode}_logits"], res["single_logits"]):
            # SP pads the 3-token decode batch to 4 rows: compare the real rows
            assert got.shape[1] == ref.shape[1] and got.shape[0] >= ref.shape[0]
            got = got[: ref.shape[0]]
            scale = float(ref.abs().max())
            # measured: max abs diff ~7e-7 at logit scale ~3.5-4.4 (fp32)
            assert _max_diff(got, ref) <= 1e-5 * max(1.0, scale), (mode, _max_diff(got, ref))
    # every rank returns the same full logits
    for a, b in zip(two_ranks[0][f"{mode}_logits"], two_ranks[1][f"{mode}_logits"]):
        assert torch.equal(a, b)


def test_greedy_tokens_identical(two_ranks):
    for res in two_ranks:
        assert res["tp_greedy"] == res["sp_greedy"] == res["single_greedy"]


def test_canary_still_counts_up_under_tp_and_sp(two_ranks):
    for res in two_ranks:
        expected = list(range(4, 12))  # prompt at positions 0..3 -> 4, 5, ...
        assert res["canary_tp_greedy"] == expected
        assert res["canary_sp_greedy"] == expected


def test_piece_boundaries_and_composition(two_ranks):
    for res in two_ranks:
        assert res["single_piece_shapes"][0] == ((12, 4, 16), (12, 64))
        assert res["tp_piece_shapes"][0] == ((12, 2, 16), (12, 64))
        assert res["sp_piece_shapes"][0] == ((12, 2, 16), (6, 64))
        assert res["single_pieces_eq"] and res["tp_pieces_eq"] and res["sp_pieces_eq"]
        assert res["local_q_rows"] == 32
        assert (res["single_cache_heads"], res["tp_cache_heads"], res["sp_cache_heads"]) == (2, 1, 1)


@pytest.mark.parametrize("mode", ["tp", "sp"])
def test_capture_replay_bitwise_equals_eager_on_each_rank(two_ranks, mode):
    for res in two_ranks:
        cap = res[f"capture_{mode}"]
        assert cap["replay1_eq"] and cap["replay2_eq"] and cap["changed"]
        assert cap["num_comm_nodes"] == (4 if mode == "tp" else 9)  # 2/layer; 4/layer + head


@pytest.mark.parametrize("mode", ["tp", "sp"])
def test_capture_holds_streams_for_the_communication(two_ranks, mode):
    for res in two_ranks:
        assert res[f"capture_{mode}"]["streams_held"] > 1


@pytest.mark.parametrize("mode", ["tp", "sp"])
def test_one_comm_group_holds_three_streams(two_ranks, mode):
    for res in two_ranks:
        assert res[f"capture_{mode}"]["streams_held"] == 3
