"""Host contracts: strict / relaxed / off, and the inputs every contract rejects."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from fia_testlib import make_batch

from harness.ops import (
    FiaArgumentError,
    FiaContractError,
    check_fia_lengths,
    current_fia_contract,
    fia_contract,
    get_max_workspace,
    npu_fused_infer_attention_score as fia,
    npu_fused_infer_attention_score_out as fia_out,
)

STRICT_MESSAGE = (
    "When layout is TND, queryT(10) must be equal to the last element of actualSequenceLengthQ(8)"
)


@pytest.fixture
def padded_batch():
    """8 real tokens in a T=10 bucket: the last cumulative length (8) is below T."""
    return make_batch([3, 4, 1], [5, 4, 2]).padded(2)


def test_strict_rejects_last_element_below_T_with_cann_code(padded_batch) -> None:
    b = padded_batch
    with pytest.raises(FiaContractError) as info:
        fia(b.query, b.key, b.value, **b.kwargs(), contract="strict")
    assert info.value.code == 561002
    assert isinstance(info.value, RuntimeError)
    assert str(info.value) == f"[561002] {STRICT_MESSAGE}"


def test_strict_is_the_default(padded_batch) -> None:
    b = padded_batch
    assert current_fia_contract() == "strict"
    with pytest.raises(FiaContractError, match="561002"):
        fia(b.query, b.key, b.value, **b.kwargs())


def test_strict_rejects_last_element_above_T() -> None:
    b = make_batch([3, 4], [5, 4])
    with pytest.raises(FiaContractError, match=r"queryT\(7\) .* actualSequenceLengthQ\(9\)"):
        fia(b.query, b.key, b.value, **b.kwargs(actual_seq_lengths=[3, 9]))


def test_strict_checks_only_the_last_element() -> None:
    # A stale list whose other elements are wrong still passes CANN's check.
    b = make_batch([3, 4], [5, 4])
    fia(b.query, b.key, b.value, **b.kwargs(actual_seq_lengths=[1, 7]), contract="strict")


def test_relaxed_accepts_below_T_and_zeroes_padding(padded_batch) -> None:
    b = padded_batch
    out, lse = fia(b.query, b.key, b.value, **b.kwargs(), contract="relaxed")
    assert torch.equal(out[8:], torch.zeros_like(out[8:]))
    assert torch.isneginf(lse[8:]).all()


def test_relaxed_rejects_above_T() -> None:
    b = make_batch([3, 4], [5, 4])
    with pytest.raises(FiaContractError) as info:
        fia(b.query, b.key, b.value, **b.kwargs(actual_seq_lengths=[3, 9]), contract="relaxed")
    assert info.value.code == 561002 and "must not exceed queryT(7)" in str(info.value)


def test_off_accepts_below_T(padded_batch) -> None:
    b = padded_batch
    fia(b.query, b.key, b.value, **b.kwargs(), contract="off")


def test_off_above_T_is_refused_by_the_kernel_not_read_out_of_bounds() -> None:
    b = make_batch([3, 4], [5, 4])
    with pytest.raises(RuntimeError, match=r"actual_seq_lengths\[-1\] \(9\) exceeds the query's T \(7\)"):
        fia(b.query, b.key, b.value, **b.kwargs(actual_seq_lengths=[3, 9]), contract="off")


def test_contract_context_manager_sets_and_restores_default(padded_batch) -> None:
    b = padded_batch
    with fia_contract("relaxed"):
        assert current_fia_contract() == "relaxed"
        fia(b.query, b.key, b.value, **b.kwargs())
        with fia_contract("strict"), pytest.raises(FiaContractError):
            fia(b.query, b.key, b.value, **b.kwargs())
        # an explicit argument wins over the default
        with pytest.raises(FiaContractError):
            fia(b.query, b.key, b.value, **b.kwargs(), contract="strict")
    assert current_fia_contract() == "strict"


def test_contract_default_does_not_leak_into_other_threads() -> None:
    seen: list[str] = []
    with fia_contract("off"):
        worker = threading.Thread(target=lambda: seen.append(current_fia_contract()))
        worker.start()
        worker.join()
    assert seen == ["strict"]


def test_unknown_contract_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown FIA contract"):
        check_fia_lengths(4, [4], [4], (1, 1), 4, "lenient")  # type: ignore[arg-type]


# ------------------------------------------------------------------ rejected by every contract

ALWAYS_REJECTED: dict[str, tuple[dict[str, Any], str]] = {
    "decreasing": (dict(actual_seq_lengths=[4, 3, 8]), "actual_seq_lengths: is cumulative"),
    "negative_q": (dict(actual_seq_lengths=[-1, 7, 8]), "actual_seq_lengths: element 0 is negative"),
    "negative_kv": (dict(actual_seq_lengths_kv=[5, -4, 2]), "actual_seq_lengths_kv: element 1 is negative"),
    "length_mismatch": (dict(actual_seq_lengths_kv=[5, 4]), "actual_seq_lengths_kv: has 2 entries"),
    "kv_beyond_table": (dict(actual_seq_lengths_kv=[5, 4, 9]), "exceeds the block table's capacity"),
    "too_few_table_rows": (dict(block_table="two_rows"), "block_table: has 2 rows but the call has 3"),
    "heads_not_divisible": (dict(num_heads=4, num_key_value_heads=3), "must be divisible"),
    "empty_lists": (dict(actual_seq_lengths=[], actual_seq_lengths_kv=[]), "at least one request"),
    "missing_lists": (dict(actual_seq_lengths=None), "actual_seq_lengths: is required"),
    "bad_layout": (dict(input_layout="BSH"), "input_layout: the harness models TND and BNSD, got 'BSH'"),
    "bad_sparse_mode": (dict(sparse_mode=2), "sparse_mode: only 0"),
}


@pytest.mark.parametrize("contract", ["strict", "relaxed", "off"])
@pytest.mark.parametrize("case", sorted(ALWAYS_REJECTED))
def test_always_rejected(case: str, contract: str) -> None:
    b = make_batch([3, 4, 1], [5, 4, 2], max_blocks=2)  # capacity 8 tokens per request
    over, message = ALWAYS_REJECTED[case]
    if over.get("block_table") == "two_rows":
        over = dict(over, block_table=b.block_table[:2])
    with pytest.raises(FiaArgumentError, match=message):
        fia(b.query, b.key, b.value, **b.kwargs(**over), contract=contract)
    out = (torch.empty_like(b.query), torch.empty(b.T, b.num_heads, 1))
    with pytest.raises(FiaArgumentError, match=message):
        fia_out(b.query, b.key, b.value, **b.kwargs(**over), contract=contract,
                workspace=get_max_workspace(b.query, b.key, b.value), out=out)


def test_check_fia_lengths_is_a_pure_function() -> None:
    check_fia_lengths(8, [3, 8], [3, 8], (2, 2), 4, "strict")
    check_fia_lengths(10, [3, 8], [3, 8], (2, 2), 4, "relaxed")
    with pytest.raises(FiaContractError):
        check_fia_lengths(10, [3, 8], [3, 8], (2, 2), 4, "strict")
    with pytest.raises(FiaContractError):
        check_fia_lengths(7, [3, 8], [3, 8], (2, 2), 4, "relaxed")
    check_fia_lengths(7, [3, 8], [3, 8], (2, 2), 4, "off")
    with pytest.raises(FiaArgumentError, match="capacity"):
        check_fia_lengths(8, [3, 8], [3, 9], (2, 2), 4, "off")


def test_attend_eager_query_rows_is_the_non_full_slice(padded_batch) -> None:
    """vLLM Ascend's non-FULL path: FIA on the real rows only (the strict check holds without a
    dummy request), the padding rows zero; the same rows as the call on the slice itself."""
    from harness.ops.attention import attend_eager

    b = padded_batch
    kwargs = b.kwargs(softmax_lse_flag=False)
    with pytest.raises(FiaContractError, match="561002"):
        attend_eager(b.query, b.key, b.value, kwargs)
    out = attend_eager(b.query, b.key, b.value, kwargs, query_rows=8)
    assert out.shape == b.query.shape
    assert torch.equal(out[:8], attend_eager(b.query[:8], b.key, b.value, kwargs))
    assert torch.count_nonzero(out[8:]) == 0
