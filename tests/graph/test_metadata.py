import itertools

import pytest

from harness.graph.metadata import (
    AttentionMetadata,
    ScheduledRequest,
    build_attention_metadata,
    pad_attention_metadata,
    slice_attention_metadata,
)
from harness.graph.modes import CUDAGraphMode as M

BLOCK = 4
MAX_BLOCKS = 4


def req(req_id, computed, new, *blocks):
    return ScheduledRequest(req_id, computed, new, tuple(blocks))


def decode_batch(q=1):
    """Three decode requests of q tokens each (KV 5+q, 2+q, 7+q after the step)."""
    return build_attention_metadata(
        [req("a", 5, q, 10, 11), req("b", 2, q, 20, 21), req("c", 7, q, 30, 31, 32)],
        BLOCK,
        MAX_BLOCKS,
    )


def mixed_batch(prefill=5):
    """One prefill of ``prefill`` tokens plus two single-token decodes."""
    return build_attention_metadata(
        [req("p", 0, prefill, 1, 2, 3), req("d1", 5, 1, 10, 11), req("d2", 2, 1, 20)],
        BLOCK,
        MAX_BLOCKS,
    )


def pad(meta, padded, *, q=1, runtime=M.FULL, configured=M.FULL_DECODE_ONLY, fix=True):
    return pad_attention_metadata(
        meta,
        padded,
        uniform_decode_query_len=q,
        runtime_mode=runtime,
        configured_mode=configured,
        fia_padding_fix=fix,
    )


class TestBuild:
    def test_decode(self):
        meta = decode_batch()
        assert meta.num_reqs == meta.num_reqs_padded == 3
        assert meta.num_actual_tokens == meta.num_input_tokens == 3
        assert meta.query_start_loc == [0, 1, 2, 3]
        assert meta.actual_seq_lengths == [1, 2, 3]
        assert meta.seq_lens == [6, 3, 8]
        assert meta.query_lens == [1, 1, 1]
        assert meta.positions == [5, 2, 7]
        # pos 5 -> block 11 offset 1; pos 2 -> block 20 offset 2; pos 7 -> block 31 offset 3.
        assert meta.slot_mapping == [45, 82, 127]
        assert meta.block_table == [[10, 11, 0, 0], [20, 21, 0, 0], [30, 31, 32, 0]]
        assert meta.padding_source == "none"

    def test_prefill_spans_blocks(self):
        meta = build_attention_metadata([req("p", 2, 5, 7, 9)], BLOCK, MAX_BLOCKS)
        # positions 2..6: block 7 offsets 2,3 then block 9 offsets 0,1,2.
        assert meta.slot_mapping == [30, 31, 36, 37, 38]
        assert meta.positions == [2, 3, 4, 5, 6]
        assert meta.seq_lens == [7]

    def test_too_few_blocks(self):
        with pytest.raises(ValueError, match="need 2 blocks"):
            build_attention_metadata([req("p", 2, 5, 7)], BLOCK, MAX_BLOCKS)

    def test_too_many_blocks(self):
        with pytest.raises(ValueError, match="max_blocks_per_req"):
            build_attention_metadata([req("p", 0, 1, 1, 2, 3, 4, 5)], BLOCK, MAX_BLOCKS)

    def test_request_validation(self):
        with pytest.raises(ValueError):
            req("x", 0, 0, 1)
        with pytest.raises(ValueError):
            build_attention_metadata([], BLOCK, MAX_BLOCKS)


class TestUniform:
    def test_three_decodes_padded_to_four(self):
        meta = pad(decode_batch(), 4)
        assert meta.num_reqs == 3 and meta.num_reqs_padded == 4
        assert meta.query_start_loc == [0, 1, 2, 3, 4]
        assert meta.actual_seq_lengths == [1, 2, 3, 4]
        assert meta.num_input_tokens == 4 and meta.num_actual_tokens == 3
        assert meta.seq_lens == [6, 3, 8, 0]
        assert meta.block_table[-1] == [0, 0, 0, 0]
        assert meta.slot_mapping == [45, 82, 127, -1]
        assert meta.positions == [5, 2, 7, 0]
        assert meta.padding_source.startswith("uniform:")
        assert meta.padding_source == "uniform: 1 fake requests"

    def test_three_decodes_padded_to_eight_get_five_fake_requests(self):
        meta = pad(decode_batch(), 8, configured=M.FULL_AND_PIECEWISE)
        assert meta.num_reqs_padded == 8
        assert meta.query_start_loc == [0, 1, 2, 3, 4, 5, 6, 7, 8]
        assert meta.seq_lens == [6, 3, 8, 0, 0, 0, 0, 0]
        assert meta.block_table[3:] == [[0] * MAX_BLOCKS] * 5
        assert meta.slot_mapping[3:] == [-1] * 5

    def test_mtp_q2_three_requests_padded_to_eight(self):
        meta = pad(decode_batch(q=2), 8, q=2)
        assert meta.num_actual_tokens == 6
        assert meta.num_reqs_padded == 4
        assert meta.query_start_loc == [0, 2, 4, 6, 8]
        assert meta.query_lens == [2, 2, 2, 2]
        assert meta.seq_lens == [7, 4, 9, 0]
        assert meta.slot_mapping[6:] == [-1, -1]
        assert meta.padding_source.startswith("uniform:")


class TestPureFull:
    """PR #7460: in pure FULL mode requests are never padded to T / q."""

    def test_three_decodes_padded_to_four(self):
        meta = pad(decode_batch(), 4, configured=M.FULL)
        assert meta.query_start_loc == [0, 1, 2, 3, 4]
        assert meta.padding_source.startswith("mixed:")
        assert meta.padding_source == "mixed: one dummy request absorbing 1 tokens"

    def test_three_decodes_padded_to_eight_get_one_dummy(self):
        meta = pad(decode_batch(), 8, configured=M.FULL)
        assert meta.num_reqs_padded == 4
        assert meta.query_start_loc == [0, 1, 2, 3, 8]
        assert meta.seq_lens == [6, 3, 8, 0]

    def test_mtp_q2(self):
        meta = pad(decode_batch(q=2), 8, q=2, configured=M.FULL)
        assert meta.num_reqs_padded == 4
        assert meta.query_start_loc == [0, 2, 4, 6, 8]
        assert meta.padding_source.startswith("mixed:")


class TestMixed:
    def test_seven_to_eight_one_dummy_of_one(self):
        meta = pad(mixed_batch(), 8, runtime=M.PIECEWISE, configured=M.FULL_AND_PIECEWISE)
        assert meta.num_actual_tokens == 7 and meta.num_input_tokens == 8
        assert meta.num_reqs_padded == 4
        assert meta.query_start_loc == [0, 5, 6, 7, 8]
        assert meta.query_lens == [5, 1, 1, 1]
        assert meta.seq_lens == [5, 6, 3, 0]
        assert meta.block_table[-1] == [0, 0, 0, 0]
        assert meta.slot_mapping[-1] == -1 and len(meta.slot_mapping) == 8
        assert meta.padding_source == "mixed: one dummy request absorbing 1 tokens"

    def test_thirteen_to_sixteen_dummy_of_three(self):
        meta = pad(mixed_batch(prefill=11), 16, runtime=M.FULL, configured=M.FULL)
        assert meta.num_actual_tokens == 13
        assert meta.query_start_loc == [0, 11, 12, 13, 16]
        assert meta.query_lens[-1] == 3
        assert meta.slot_mapping[13:] == [-1, -1, -1]
        assert meta.positions[13:] == [0, 0, 0]
        assert meta.seq_lens[-1] == 0

    def test_uniform_batch_in_piecewise_runtime_gets_one_dummy(self):
        # A relaxed (PIECEWISE) key carries no request count: no fake requests.
        meta = pad(decode_batch(), 8, runtime=M.PIECEWISE, configured=M.FULL_AND_PIECEWISE)
        assert meta.query_start_loc == [0, 1, 2, 3, 8]

    def test_uniform_batch_padded_off_multiple_of_q_gets_one_dummy(self):
        meta = pad(decode_batch(q=2), 7, q=2)
        assert meta.query_start_loc == [0, 2, 4, 6, 7]


class TestFixOff:
    def test_last_element_below_t(self):
        meta = pad(mixed_batch(), 8, runtime=M.PIECEWISE, configured=M.PIECEWISE, fix=False)
        assert meta.num_input_tokens == 8
        assert meta.actual_seq_lengths[-1] == 7
        assert meta.num_reqs_padded == meta.num_reqs == 3
        assert meta.slot_mapping[-1] == -1 and meta.positions[-1] == 0
        assert meta.padding_source.startswith("unpadded")
        assert meta.padding_source.startswith("unpadded metadata: last element < T")

    def test_uniform_too(self):
        meta = pad(decode_batch(), 4, fix=False)
        assert meta.query_start_loc == [0, 1, 2, 3]
        assert meta.num_input_tokens == 4


def test_no_padding_needed_is_unchanged():
    meta = decode_batch()
    assert pad(meta, 3) is meta


def test_does_not_alias_input_lists():
    meta = decode_batch()
    padded = pad(meta, 4)
    assert meta.query_start_loc == [0, 1, 2, 3]
    assert padded.block_table[0] is not meta.block_table[0]


def test_errors():
    meta = decode_batch()
    with pytest.raises(ValueError, match="down"):
        pad(meta, 2)
    with pytest.raises(ValueError, match="pad once"):
        pad(pad(meta, 4), 8)


@pytest.mark.parametrize(
    "configured, runtime",
    [(c, r) for c, r in itertools.product(M, [M.NONE, M.PIECEWISE, M.FULL])],
    ids=lambda m: str(m),
)
@pytest.mark.parametrize("q", [1, 2, 3])
def test_fia_invariant_holds_whenever_fix_is_on(configured, runtime, q):
    batches = [decode_batch(q=q), mixed_batch(), mixed_batch(prefill=11)]
    for meta in batches:
        for padded in range(meta.num_actual_tokens, meta.num_actual_tokens + 10):
            out: AttentionMetadata = pad(meta, padded, q=q, runtime=runtime, configured=configured)
            assert out.actual_seq_lengths[-1] == out.num_input_tokens == padded
            assert len(out.query_start_loc) == out.num_reqs_padded + 1
            assert len(out.seq_lens) == len(out.block_table) == len(out.query_lens) == out.num_reqs_padded
            assert len(out.slot_mapping) == len(out.positions) == padded
            assert out.seq_lens[out.num_reqs:] == [0] * out.num_padding_reqs
            assert out.slot_mapping[out.num_actual_tokens:] == [-1] * out.num_padding_tokens


def test_slice_pads_tokens_only_and_marks_the_query_slice():
    """vLLM Ascend's non-FULL path without SP: no padded request, attention reads the real rows."""
    reqs = [ScheduledRequest("a", 4, 1, (0, 1)), ScheduledRequest("b", 0, 3, (2,))]
    meta = build_attention_metadata(reqs, block_size=4, max_blocks_per_req=2)
    sliced = slice_attention_metadata(meta, 8)
    assert sliced.query_slice and sliced.num_input_tokens == 8 and sliced.num_reqs_padded == 2
    assert sliced.actual_seq_lengths == meta.actual_seq_lengths == [1, 4]  # last element: the real T
    assert sliced.slot_mapping[4:] == [-1] * 4 and sliced.positions[4:] == [0] * 4
    assert sliced.query_rows == 4 and meta.query_rows is None  # the rows the attention reads
    assert slice_attention_metadata(meta, 4) is meta
    with pytest.raises(ValueError, match="pad once"):
        slice_attention_metadata(sliced, 8)
