import pytest

from harness.graph.capture_sizes import (
    EngineRefusal,
    resolve_sizes,
    PaddedSizeTable,
    default_capture_sizes,
    default_max_capture_size,
    resolve_capture_sizes,
    sizes_for_sequence_parallel,
    sizes_for_spec_decode,
    truncate_to_grid,
)


class TestDefaultGrid:
    def test_512_has_51_sizes(self):
        sizes = default_capture_sizes(512)
        assert len(sizes) == 51
        assert sizes[:5] == [1, 2, 4, 8, 16]
        assert sizes[33:36] == [248, 256, 272]
        assert sizes[-1] == 512

    @pytest.mark.parametrize(
        "max_size, expected",
        [(1, [1]), (3, [1, 2]), (4, [1, 2, 4]), (7, [1, 2, 4]), (8, [1, 2, 4, 8]), (17, [1, 2, 4, 8, 16])],
    )
    def test_small(self, max_size, expected):
        assert default_capture_sizes(max_size) == expected

    def test_step_16_from_256(self):
        assert default_capture_sizes(300)[-4:] == [248, 256, 272, 288]

    @pytest.mark.parametrize("bad", [0, -1])
    def test_rejects_non_positive(self, bad):
        with pytest.raises(ValueError, match="max_size"):
            default_capture_sizes(bad)

    @pytest.mark.parametrize("max_size, grid", [(257, 256), (256, 256), (255, 248), (7, 4), (512, 512), (270, 256)])
    def test_truncate_to_grid(self, max_size, grid):
        assert truncate_to_grid(max_size) == grid


class TestDefaultMax:
    @pytest.mark.parametrize("seqs, k, expected", [(40, 3, 160), (200, 3, 512), (8, 0, 8), (1000, 0, 512)])
    def test_npu_anchors(self, seqs, k, expected):
        assert default_max_capture_size(seqs, k, "npu") == expected

    @pytest.mark.parametrize("seqs, k, expected", [(40, 3, 320), (200, 3, 512), (8, 0, 16), (256, 0, 512)])
    def test_gpu_doubles(self, seqs, k, expected):
        assert default_max_capture_size(seqs, k, "gpu") == expected

    def test_clamped_to_max_num_batched_tokens(self):
        assert default_max_capture_size(200, 3, "npu", max_num_batched_tokens=100) == 100

    def test_cap(self):
        assert default_max_capture_size(1000, 0, "gpu", cap=1024) == 1024

    def test_bad_platform(self):
        with pytest.raises(ValueError, match="platform"):
            default_max_capture_size(8, 0, "tpu")  # type: ignore[arg-type]


class TestFilters:
    def test_sequence_parallel_keeps_multiples_of_tp(self):
        assert sizes_for_sequence_parallel([1, 2, 4, 8, 12, 16], 4) == [4, 8, 12, 16]

    def test_sequence_parallel_tp1_keeps_all(self):
        assert sizes_for_sequence_parallel([4, 1, 2], 1) == [1, 2, 4]

    def test_sequence_parallel_empty_is_error(self):
        with pytest.raises(ValueError, match=r"tp=8.*\[1, 2, 4\]"):
            sizes_for_sequence_parallel([1, 2, 4], 8)

    def test_spec_decode_rounds_up_and_dedupes(self):
        # q=4 (k=3): 1,2,4 -> 4; 8 -> 8; 16 -> 16; 24 -> 24; 32 -> 32.
        assert sizes_for_spec_decode([1, 2, 4, 8, 16, 24, 32], 4, 32) == [4, 8, 16, 24, 32]

    def test_spec_decode_drops_above_max(self):
        # q=3: 1,2->3; 4->6; 8->9; 16->18 (> 16, dropped).
        assert sizes_for_spec_decode([1, 2, 4, 8, 16], 3, 16) == [3, 6, 9]

    def test_spec_decode_with_sp_uses_lcm(self):
        # q=3, tp=2 -> multiples of 6.
        assert sizes_for_spec_decode([2, 4, 8, 16, 24], 3, 24, tp=2) == [6, 12, 18, 24]

    def test_spec_decode_q1_is_identity(self):
        assert sizes_for_spec_decode([8, 1, 4], 1, 8) == [1, 4, 8]

    def test_spec_decode_falls_back_to_the_multiple(self):
        assert sizes_for_spec_decode([5], 3, 5) == [3]

    def test_spec_decode_empty_is_error(self):
        with pytest.raises(ValueError, match="multiples of 4"):
            sizes_for_spec_decode([1, 2], 4, 2)


class TestResolve:
    def test_default_npu(self):
        sizes = resolve_capture_sizes(max_num_seqs=40, num_speculative_tokens=3, platform="npu")
        assert sizes[-1] == 160
        assert all(s % 4 == 0 for s in sizes)
        assert sizes[:4] == [4, 8, 16, 24]  # 1, 2, 4 all round up to 4

    def test_default_plain_decode(self):
        assert resolve_capture_sizes(max_num_seqs=256, platform="npu") == default_capture_sizes(256)
        assert resolve_capture_sizes(max_num_seqs=256, platform="gpu") == default_capture_sizes(512)

    def test_off_grid_default_max_leaves_top_uncaptured(self):
        # max_num_seqs=5 -> max 5 -> grid [1, 2, 4]: 5-request decode runs eagerly (#16049).
        assert resolve_capture_sizes(max_num_seqs=5, platform="npu") == [1, 2, 4]

    def test_user_max_truncated_to_grid(self):
        assert resolve_capture_sizes(max_num_seqs=8, max_capture_size=257)[-1] == 256

    def test_user_max_clamped_by_batched_tokens(self):
        # newer vLLM (PR #40734) appends an off-grid max_num_batched_tokens; older cut the grid at 96
        sizes = resolve_capture_sizes(max_num_seqs=8, max_capture_size=512, max_num_batched_tokens=100)
        assert sizes[-2:] == [96, 100]
        old = resolve_capture_sizes(max_num_seqs=8, max_capture_size=512, max_num_batched_tokens=100,
                                    capture_max_num_batched_tokens=False)
        assert old[-1] == 96

    def test_explicit_sizes_sorted_and_deduped(self):
        assert resolve_capture_sizes(max_num_seqs=8, capture_sizes=[8, 1, 4, 4]) == [1, 4, 8]

    @pytest.mark.parametrize(
        "sizes, match",
        [([], "empty"), ([0, 4], "positive"), ([-2], "positive"),
         ([4, 600], r"customized max_cudagraph_capture_size\(=512\) should be consistent with the max value "
                    r"of cudagraph_capture_sizes\(=600\)")],
    )
    def test_explicit_sizes_invalid(self, sizes, match):
        with pytest.raises(ValueError, match=match):
            resolve_capture_sizes(max_num_seqs=8, capture_sizes=sizes, max_capture_size=512)

    def test_sp_then_spec(self):
        sizes = resolve_capture_sizes(
            max_num_seqs=8,
            capture_sizes=[1, 2, 4, 8, 12, 16, 24],
            num_speculative_tokens=2,
            tp=2,
            sequence_parallel=True,
            spec_sp_multiple="lcm",
        )
        # SP tp=2: [2, 4, 8, 12, 16, 24]; spec q=3 with tp=2 -> multiples of 6 within 24.
        assert sizes == [6, 12, 18, 24]

    def test_tp_without_sp_does_not_filter(self):
        assert resolve_capture_sizes(max_num_seqs=8, capture_sizes=[1, 3], tp=2) == [1, 3]

    def test_no_mixed_graph_is_captured_on_a_dummy_request_longer_than_the_model(self):
        # 64 tokens on 2 dummy requests: 32 each, above max_model_len 16; 8 tokens: 4 each
        with pytest.raises(ValueError, match="capture size 64 .* dummy request of 32 tokens, above model.max_model_len 16"):
            resolve_sizes(max_num_seqs=2, capture_sizes=[8, 64], mixed_graphs=True, max_model_len=16)
        assert resolve_sizes(max_num_seqs=2, capture_sizes=[8, 64], mixed_graphs=False, max_model_len=16).sizes == [8, 64]
        assert resolve_sizes(max_num_seqs=2, capture_sizes=[8, 32], mixed_graphs=True, max_model_len=16).sizes == [8, 32]


class TestPaddedSizeTable:
    def test_lookup(self):
        table = PaddedSizeTable([1, 2, 4, 8, 16])
        assert [table.padded_size(n) for n in range(1, 18)] == [
            1, 2, 4, 4, 8, 8, 8, 8, 16, 16, 16, 16, 16, 16, 16, 16, None,
        ]
        assert table.max_size == 16

    def test_every_count_maps_to_smallest_size_at_least_it(self):
        sizes = default_capture_sizes(512)
        table = PaddedSizeTable(sizes)
        for n in range(1, 513):
            assert table.padded_size(n) == min(s for s in sizes if s >= n)
        assert table.padded_size(513) is None

    def test_unsorted_input(self):
        assert PaddedSizeTable([8, 1]).padded_size(5) == 8

    def test_zero_and_negative(self):
        table = PaddedSizeTable([2, 8])
        assert table.padded_size(0) == 2
        with pytest.raises(ValueError):
            table.padded_size(-1)

    def test_is_a_value(self):
        assert PaddedSizeTable([1, 8]) == PaddedSizeTable([8, 1, 1])


class TestUpstreamRules:
    """vLLM ``_set_cudagraph_sizes`` and ``adjust_cudagraph_sizes_for_spec_decode`` (issue 10, point 1)."""

    def test_user_max_disagreeing_with_the_user_list_is_upstreams_error(self):
        message = (r"^customized max_cudagraph_capture_size\(=16\) should be consistent with the max value of "
                   r"cudagraph_capture_sizes\(=8\)$")
        with pytest.raises(ValueError, match=message):  # a max above the list's largest
            resolve_capture_sizes(max_num_seqs=8, capture_sizes=[1, 2, 4, 8], max_capture_size=16)
        # the list after dropping sizes above max_num_batched_tokens is what the max must match
        with pytest.raises(ValueError, match=r"max_cudagraph_capture_size\(=16\).*cudagraph_capture_sizes\(=8\)"):
            resolve_capture_sizes(max_num_seqs=8, capture_sizes=[1, 8, 16], max_capture_size=16,
                                  max_num_batched_tokens=12)
        assert resolve_capture_sizes(max_num_seqs=8, capture_sizes=[1, 2, 8], max_capture_size=8) == [1, 2, 8]

    def test_user_max_alone_is_truncated_with_a_warning_not_an_error(self):
        got = resolve_sizes(max_num_seqs=8, max_capture_size=20)
        assert got.sizes == [1, 2, 4, 8, 16]
        assert got.notes == ["Truncating max_cudagraph_capture_size 20 to 16"]

    def test_sizes_above_max_num_batched_tokens_are_dropped_not_an_error(self):
        got = resolve_sizes(max_num_seqs=8, capture_sizes=[1, 4, 8, 32, 64], max_num_batched_tokens=16)
        assert got.sizes == [1, 4, 8] and got.dropped == [32, 64]
        assert "overridden by max_num_batched_tokens=16: [32, 64] dropped" in got.notes[0]
        with pytest.raises(ValueError, match="every capture size of \\[32\\] is above max_num_batched_tokens 16"):
            resolve_sizes(max_num_seqs=8, capture_sizes=[32], max_num_batched_tokens=16)

    @pytest.mark.parametrize("decode_full, expected", [(True, [3, 6]), (False, [1, 2, 4, 8])])
    def test_spec_decode_rounds_only_when_the_decode_routine_is_full(self, decode_full, expected):
        got = resolve_capture_sizes(max_num_seqs=8, capture_sizes=[1, 2, 4, 8], num_speculative_tokens=2,
                                    decode_full=decode_full)
        assert got == expected

    @pytest.mark.parametrize("tp, k", [(2, 2), (4, 2), (4, 4)])
    def test_spec_decode_with_sp_refuses_when_max_q_tp_is_not_a_common_multiple(self, tp, k):
        q = k + 1
        with pytest.raises(EngineRefusal) as error:
            resolve_capture_sizes(max_num_seqs=8, capture_sizes=[4, 8, 16, 32, 64], num_speculative_tokens=k,
                                  tp=tp, sequence_parallel=True)
        assert str(error.value) == (
            f"Can't determine cudagraph shapes that are both a multiple of {q} (num_speculative_tokens + 1) "
            f"required by spec-decode and {tp} (tensor_parallel_size) required by sequence parallelism please "
            "adjust num_speculative_tokens or disable sequence parallelism")
        assert not isinstance(error.value, ValueError)  # not a bad scenario: the engine refuses to start
        # the harness alternative composes instead; PIECEWISE decode never rounds, so never refuses
        lcm = resolve_capture_sizes(max_num_seqs=8, capture_sizes=[4, 8, 16, 32, 64], num_speculative_tokens=k,
                                    tp=tp, sequence_parallel=True, spec_sp_multiple="lcm")
        assert lcm and all(s % q == 0 and s % tp == 0 for s in lcm)
        assert resolve_capture_sizes(max_num_seqs=8, capture_sizes=[4, 8], num_speculative_tokens=k, tp=tp,
                                     sequence_parallel=True, decode_full=False) == [4, 8]

    @pytest.mark.parametrize("tp, k, expected", [(2, 1, [2, 4, 8, 16]), (4, 3, [4, 8, 16]), (2, 3, [4, 8, 16]),
                                                 (4, 1, [4, 8, 16])])
    def test_spec_decode_with_sp_uses_max_q_tp_when_it_is_a_common_multiple(self, tp, k, expected):
        assert resolve_capture_sizes(max_num_seqs=8, capture_sizes=[1, 2, 4, 8, 16], num_speculative_tokens=k,
                                     tp=tp, sequence_parallel=True) == expected

    def test_off_grid_max_num_batched_tokens_257(self):
        newer = resolve_capture_sizes(max_num_seqs=512, max_num_batched_tokens=257)
        older = resolve_capture_sizes(max_num_seqs=512, max_num_batched_tokens=257,
                                      capture_max_num_batched_tokens=False)
        assert newer[-2:] == [256, 257] and older[-1] == 256

    def test_off_grid_max_num_seqs_ceiling_only_with_pr_16623(self):
        assert resolve_capture_sizes(max_num_seqs=12, platform="npu") == [1, 2, 4, 8]  # #16049: 9-12 eager
        assert resolve_capture_sizes(max_num_seqs=12, platform="npu", capture_max_num_seqs=True) == [1, 2, 4, 8, 12]
        # with a user max the ceiling is not added
        assert resolve_capture_sizes(max_num_seqs=12, max_capture_size=12, capture_max_num_seqs=True)[-1] == 8
