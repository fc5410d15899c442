"""Dispatch tables per mode, exact (after vLLM tests/v1/cudagraph/test_cudagraph_dispatch.py)."""

import pytest

from harness.graph.dispatcher import BatchDescriptor as BD
from harness.graph.dispatcher import Dispatcher, is_uniform_decode
from harness.graph.modes import CUDAGraphMode as M

SIZES = [1, 8]
MIXED_8 = BD(8)
UNIFORM_8 = BD(8, 8, True)

# (mode, num_tokens, num_reqs, uniform) -> (runtime mode, key, num_tokens_padded)
TABLE = [
    # NONE: nothing captured.
    (M.NONE, 8, 3, False, M.NONE, None, 8),
    (M.NONE, 8, 8, True, M.NONE, None, 8),
    (M.NONE, 15, 15, True, M.NONE, None, 15),
    (M.NONE, 5, 5, True, M.NONE, None, 5),
    # PIECEWISE: relaxed keys for every batch shape.
    (M.PIECEWISE, 8, 3, False, M.PIECEWISE, MIXED_8, 8),
    (M.PIECEWISE, 8, 8, True, M.PIECEWISE, MIXED_8, 8),
    (M.PIECEWISE, 15, 15, True, M.NONE, None, 15),
    (M.PIECEWISE, 5, 2, False, M.PIECEWISE, MIXED_8, 8),
    (M.PIECEWISE, 1, 1, True, M.PIECEWISE, BD(1), 1),
    # FULL: one full graph per bucket serves mixed and uniform batches (relaxed key).
    (M.FULL, 8, 3, False, M.FULL, MIXED_8, 8),
    (M.FULL, 8, 8, True, M.FULL, MIXED_8, 8),
    (M.FULL, 15, 15, True, M.NONE, None, 15),
    (M.FULL, 5, 5, True, M.FULL, MIXED_8, 8),
    # FULL_DECODE_ONLY: full graphs for uniform decode only; mixed runs eagerly unpadded.
    (M.FULL_DECODE_ONLY, 8, 3, False, M.NONE, None, 8),
    (M.FULL_DECODE_ONLY, 8, 8, True, M.FULL, UNIFORM_8, 8),
    (M.FULL_DECODE_ONLY, 15, 15, True, M.NONE, None, 15),
    (M.FULL_DECODE_ONLY, 5, 5, True, M.FULL, UNIFORM_8, 8),
    (M.FULL_DECODE_ONLY, 5, 2, False, M.NONE, None, 5),
    # FULL_AND_PIECEWISE: full for uniform decode, piecewise for mixed.
    (M.FULL_AND_PIECEWISE, 8, 3, False, M.PIECEWISE, MIXED_8, 8),
    (M.FULL_AND_PIECEWISE, 8, 8, True, M.FULL, UNIFORM_8, 8),
    (M.FULL_AND_PIECEWISE, 15, 15, True, M.NONE, None, 15),
    (M.FULL_AND_PIECEWISE, 15, 4, False, M.NONE, None, 15),
    (M.FULL_AND_PIECEWISE, 5, 5, True, M.FULL, UNIFORM_8, 8),
    (M.FULL_AND_PIECEWISE, 5, 2, False, M.PIECEWISE, MIXED_8, 8),
    (M.FULL_AND_PIECEWISE, 1, 1, True, M.FULL, BD(1, 1, True), 1),
]


@pytest.mark.parametrize(
    "mode, num_tokens, num_reqs, uniform, want_mode, want_key, want_padded",
    TABLE,
    ids=[f"{r[0]}-{r[1]}tok-{'uniform' if r[3] else 'mixed'}" for r in TABLE],
)
def test_dispatch_table(mode, num_tokens, num_reqs, uniform, want_mode, want_key, want_padded):
    decision = Dispatcher(mode, SIZES).dispatch(num_tokens, num_reqs, uniform)
    assert (decision.runtime_mode, decision.batch_descriptor, decision.num_tokens_padded) == (
        want_mode,
        want_key,
        want_padded,
    )
    assert decision.reason


@pytest.mark.parametrize(
    "mode, full, piecewise",
    [
        (M.NONE, set(), set()),
        (M.PIECEWISE, set(), {BD(1), BD(8)}),
        (M.FULL, {BD(1), BD(8)}, set()),
        (M.FULL_DECODE_ONLY, {BD(1, 1, True), BD(8, 8, True)}, set()),
        (M.FULL_AND_PIECEWISE, {BD(1, 1, True), BD(8, 8, True)}, {BD(1), BD(8)}),
    ],
    ids=lambda value: str(value) if isinstance(value, M) else "keys",  # sets have no stable order
)
def test_keys(mode, full, piecewise):
    d = Dispatcher(mode, SIZES)
    assert d.full_keys == full
    assert d.piecewise_keys == piecewise
    assert len(d.capture_keys()) == len(full) + len(piecewise)


def test_capture_keys_order():
    keys = Dispatcher(M.FULL_AND_PIECEWISE, SIZES).capture_keys()
    assert keys == [
        (M.PIECEWISE, BD(8)),
        (M.PIECEWISE, BD(1)),
        (M.FULL, BD(8, 8, True)),
        (M.FULL, BD(1, 1, True)),
    ]


class TestSpecDecode:
    """q = 2 (MTP k=1): uniform FULL keys only for multiples of q."""

    def test_decode_keys_are_multiples_of_q(self):
        d = Dispatcher(M.FULL_DECODE_ONLY, [1, 2, 4, 6, 8], uniform_decode_query_len=2)
        assert d.full_keys == {BD(2, 1, True), BD(4, 2, True), BD(6, 3, True), BD(8, 4, True)}

    def test_uniform_spec_batch_padded(self):
        d = Dispatcher(M.FULL_AND_PIECEWISE, [2, 4, 8], uniform_decode_query_len=2)
        decision = d.dispatch(6, 3, True)
        assert decision.runtime_mode is M.FULL
        assert decision.batch_descriptor == BD(8, 4, True)

    def test_max_num_seqs_caps_decode_keys(self):
        d = Dispatcher(M.FULL_DECODE_ONLY, [2, 4, 8, 16], uniform_decode_query_len=2, max_num_seqs=4)
        assert {k.num_tokens for k in d.full_keys} == {2, 4, 8}
        assert d.dispatch(16, 8, True).runtime_mode is M.NONE

    def test_inconsistent_uniform_claim_raises(self):
        d = Dispatcher(M.FULL, [8], uniform_decode_query_len=2)
        with pytest.raises(ValueError, match="uniform decode"):
            d.dispatch(5, 3, True)


def test_disable_full_falls_back_to_piecewise():
    d = Dispatcher(M.FULL_AND_PIECEWISE, SIZES)
    decision = d.dispatch(8, 8, True, disable_full=True)
    assert (decision.runtime_mode, decision.batch_descriptor) == (M.PIECEWISE, MIXED_8)
    assert Dispatcher(M.FULL, SIZES).dispatch(8, 8, True, disable_full=True).runtime_mode is M.NONE


def test_above_max_reason_names_the_max():
    decision = Dispatcher(M.FULL, SIZES).dispatch(15, 15, True)
    assert "above the largest capture size 8" in decision.reason


@pytest.mark.parametrize(
    "query_lens, q, expected",
    [([1, 1, 1], 1, True), ([2, 2], 2, True), ([1, 2], 1, False), ([5, 1, 1], 1, False), ([], 1, False), ([1, 1], 2, False)],
)
def test_is_uniform_decode(query_lens, q, expected):
    assert is_uniform_decode(query_lens, q) is expected


@pytest.mark.parametrize("with_num_reqs, expected", [(False, BD(8)), (True, BD(8, 4))])
def test_mixed_full_keys_carry_num_reqs_after_vllm_pr_34043(with_num_reqs, expected):
    d = Dispatcher(M.FULL, [2, 4, 8], 1, max_num_seqs=4, mixed_full_key_num_reqs=with_num_reqs)
    assert expected in d.full_keys
    decision = d.dispatch(6, 3, uniform_decode=False)
    assert (decision.runtime_mode, decision.batch_descriptor) == (M.FULL, expected)
    small = d.dispatch(2, 1, uniform_decode=False).batch_descriptor  # min(T, max_num_seqs) = 2
    assert small == (BD(2, 2) if with_num_reqs else BD(2))
    # PIECEWISE keys stay relaxed
    pw = Dispatcher(M.PIECEWISE, [2, 4, 8], 1, max_num_seqs=4, mixed_full_key_num_reqs=with_num_reqs)
    assert pw.dispatch(6, 3, uniform_decode=False).batch_descriptor == BD(8)
