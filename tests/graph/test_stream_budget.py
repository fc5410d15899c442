"""The legacy ACL stream budget against every worked anchor of the reference (section 7)."""

import pytest

from harness.graph.modes import CUDAGraphMode as M
from harness.graph.stream_budget import (
    OLD_LEGACY_MAX_STREAMS,
    downsample_sizes,
    legacy_stream_budget,
    stream_budget,
)

SIZES_150 = list(range(1, 151))  # only the count matters for the anchors


def budget(sizes=SIZES_150, **kwargs):
    kwargs.setdefault("mode", M.PIECEWISE)
    return legacy_stream_budget(sizes, **kwargs)


class TestAnchors:
    def test_opt125m_aiv_dense(self):
        d = budget(num_layers=12, hccl_mode="AIV")
        # pf=1; MAX=1800-1*13=1787; n=floor(1787/13)=137.
        assert d.max_num_sizes == 137
        assert len(d.sizes_kept) == 137
        assert len(d.sizes_dropped) == 13
        assert (d.per_size, d.parallel_factor, d.max_graphs) == (13, 1, 1787)

    def test_opt125m_with_two_layer_draft(self):
        d = budget(num_layers=12, draft_layers=2, hccl_mode="AIV")
        # per_size=13+3=16; MAX=1800-16=1784; n=floor(1784/16)=111.
        assert len(d.sizes_kept) == 111
        assert d.per_size == 16

    def test_old_cap_l48_tp4_aiv_moe(self):
        # The 19 of the engine's code comment: floor(1920/49/2). It holds when no dense
        # deduction is made, i.e. for a MoE model.
        d = budget(num_layers=48, tp=4, hccl_mode="AIV", is_moe=True, max_streams=OLD_LEGACY_MAX_STREAMS)
        assert len(d.sizes_kept) == 19
        assert d.parallel_factor == 2

    def test_old_cap_l48_tp4_aiv_dense_is_18(self):
        # Discrepancy with the "19 (AIV)" anchor: the dense deduction (MAX -= pf*per_size)
        # gives floor((1920-98)/49/2) = 18.
        d = budget(num_layers=48, tp=4, hccl_mode="AIV", max_streams=OLD_LEGACY_MAX_STREAMS)
        assert len(d.sizes_kept) == 18

    @pytest.mark.parametrize("is_moe", [False, True])
    def test_old_cap_l48_tp4_default(self, is_moe):
        # floor((1920-40)/49/3) = 12.
        d = budget(num_layers=48, tp=4, is_moe=is_moe, max_streams=OLD_LEGACY_MAX_STREAMS)
        assert len(d.sizes_kept) == 12
        assert d.parallel_factor == 3

    def test_qwen3_06b_single_card_default(self):
        # floor(1800/29/1) = 62.
        assert len(budget(num_layers=28).sizes_kept) == 62

    @pytest.mark.parametrize("is_moe", [False, True])
    def test_deepseek_v2_lite_dp2_default(self, is_moe):
        # floor((1800-40)/28/3) = 20; MoE plays no part in the default-HCCL branch.
        assert len(budget(num_layers=27, dp=2, is_moe=is_moe).sizes_kept) == 20

    def test_deepseek_v2_lite_dp2_aiv_moe_differs(self):
        # AIV: pf=1+1+(dp>1 for MoE)=3, no dense deduction: floor(1800/28/3) = 21.
        assert len(budget(num_layers=27, dp=2, hccl_mode="AIV", is_moe=True).sizes_kept) == 21

    def test_qwen3_235b_tp8_default_keeps_six(self):
        # Issue #1168: 94 layers on 8 NPUs kept 6 sizes: floor((1800-40)/95/3) = 6.
        assert len(budget(num_layers=94, tp=8).sizes_kept) == 6


class TestDeductions:
    def test_full_and_piecewise_subtracts_its_full_graphs(self):
        d = budget(num_layers=12, hccl_mode="AIV", mode=M.FULL_AND_PIECEWISE)
        # MAX=1800-150=1650; dense: -13 -> 1637; n=floor(1637/13)=125.
        assert d.max_graphs == 1637
        assert len(d.sizes_kept) == 125

    @pytest.mark.parametrize("pcp, dcp, n", [(1, 1, 62), (2, 1, 58), (1, 2, 58), (2, 2, 55)])
    def test_context_parallel_default_hccl(self, pcp, dcp, n):
        assert len(budget(num_layers=28, pcp=pcp, dcp=dcp).sizes_kept) == n

    def test_context_parallel_ignored_under_aiv(self):
        a = budget(num_layers=28, hccl_mode="AIV")
        b = budget(num_layers=28, hccl_mode="AIV", pcp=2, dcp=2)
        assert a.sizes_kept == b.sizes_kept

    def test_aiv_expert_parallel_and_multistream(self):
        d = budget(num_layers=27, dp=2, tp=2, hccl_mode="AIV", is_moe=True,
                   expert_parallel=True, multistream_overlap_shared_expert=True)
        # pf = 1 + 2 + 1 + 1 + (dp>1) = 6; n=floor(1800/28/6) = 10.
        assert d.parallel_factor == 6
        assert len(d.sizes_kept) == 10


class TestDownsampling:
    def test_n_at_most_one_keeps_largest(self):
        d = budget(num_layers=1000)  # n = floor(1800/1001) = 1
        assert d.max_num_sizes == 1
        assert d.sizes_kept == [150]
        d0 = budget(num_layers=2000)  # n = 0
        assert d0.sizes_kept == [150]
        assert "only the largest" in d0.explanation

    def test_evenly_spaced_in_index_space_with_bankers_rounding(self):
        # step = 5/4 = 1.25 -> 0, 1.25, 2.5, 3.75, 5 -> 0, 1, 2 (banker's), 4, 5.
        assert downsample_sizes([10, 20, 30, 40, 50, 60], 5) == [10, 20, 30, 50, 60]
        assert downsample_sizes(list(range(10)), 4) == [0, 3, 6, 9]

    def test_first_and_last_preserved(self):
        kept = budget(num_layers=12, hccl_mode="AIV").sizes_kept
        assert kept[0] == 1 and kept[-1] == 150
        assert kept == sorted(set(kept))

    def test_enough_budget_keeps_all(self):
        d = budget(sizes=[1, 2, 4, 8], num_layers=12)
        assert d.sizes_kept == [1, 2, 4, 8] and d.sizes_dropped == []


@pytest.mark.parametrize("mode", [M.NONE, M.FULL, M.FULL_DECODE_ONLY])
def test_modes_without_piecewise_graphs_are_unchanged(mode):
    d = budget(num_layers=94, tp=8, mode=mode)
    assert d.sizes_kept == SIZES_150
    assert d.sizes_dropped == []


def test_policy_none_keeps_all():
    d = stream_budget("none", SIZES_150)
    assert d.sizes_kept == SIZES_150


def test_policy_legacy_dispatches():
    d = stream_budget("legacy", SIZES_150, num_layers=28, mode=M.PIECEWISE)
    assert len(d.sizes_kept) == 62
    assert "n=floor" in d.explanation


def test_unknown_policy():
    with pytest.raises(ValueError, match="legacy"):
        stream_budget("strict", SIZES_150)  # type: ignore[arg-type]


def test_full_and_piecewise_deduction_clamps_at_zero():
    """vLLM Ascend ``update_aclgraph_sizes``: ``MAX_CAPTURE_SIZE = max(0, MAX_CAPTURE_SIZE - len(sizes))``."""
    sizes = list(range(1, 1901))  # more sizes than the 1800 streams
    d = legacy_stream_budget(sizes, num_layers=2, mode=M.FULL_AND_PIECEWISE)
    assert d.max_graphs == 0 and d.max_num_sizes == 0  # never a negative budget or size count
    assert d.sizes_kept == [1900]  # n <= 1 keeps only the largest
    assert "max(0, MAX-1900" in d.explanation
