"""FiaCall records: one per wrapper call, with tags, for calls that raise too."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from fia_testlib import make_batch

from harness.ops import (
    FiaArgumentError,
    FiaCall,
    FiaContractError,
    fia_call_tags,
    fia_contract,
    fia_device_metadata,
    get_max_workspace,
    npu_fused_infer_attention_score as fia,
    npu_fused_infer_attention_score_out as fia_out,
    observe_fia_calls,
)


def test_record_of_a_successful_call() -> None:
    b = make_batch([3, 1], [5, 2])
    with observe_fia_calls() as calls, fia_call_tags(phase="eager", step=3):
        fia(b.query, b.key, b.value, **b.kwargs())
    assert calls == [
        FiaCall(kind="functional", T=4, actual_seq_lengths=(3, 4), actual_seq_lengths_kv=(5, 2),
                num_reqs=2, contract="strict", strict_ok=True, relaxed_ok=True, error=None,
                tags={"phase": "eager", "step": 3})
    ]
    with pytest.raises(dataclasses.FrozenInstanceError):
        calls[0].T = 5  # type: ignore[misc]


def test_calls_that_raise_are_recorded_with_the_error() -> None:
    b = make_batch([3, 1], [5, 2]).padded(4)
    with observe_fia_calls() as calls, fia_call_tags(phase="capture", bucket=8):
        with pytest.raises(FiaContractError):
            fia(b.query, b.key, b.value, **b.kwargs(), contract="strict")
        with pytest.raises(FiaArgumentError):
            fia(b.query, b.key, b.value, **b.kwargs(actual_seq_lengths=[3, 2]))
    first, second = calls
    assert (first.strict_ok, first.relaxed_ok, first.contract) == (False, True, "strict")
    assert first.error is not None and "561002" in first.error
    assert first.tags == {"phase": "capture", "bucket": 8}
    assert (second.strict_ok, second.relaxed_ok) == (False, False)
    assert second.error is not None and second.error.startswith("FiaArgumentError")


def test_contract_default_is_recorded() -> None:
    b = make_batch([3, 1], [5, 2]).padded(4)
    with observe_fia_calls() as calls, fia_contract("relaxed"):
        fia(b.query, b.key, b.value, **b.kwargs())
    assert calls[0].contract == "relaxed" and calls[0].strict_ok is False and calls[0].error is None


def test_observers_nest_and_tags_merge() -> None:
    b = make_batch([2], [2])
    with observe_fia_calls() as outer, fia_call_tags(phase="replay", layer=0):
        fia(b.query, b.key, b.value, **b.kwargs())
        with observe_fia_calls() as inner, fia_call_tags(layer=1, step=7):
            fia_out(b.query, b.key, b.value, **b.kwargs(), workspace=get_max_workspace(b.query, b.key, b.value),
                    out=(torch.empty_like(b.query), torch.empty(b.T, b.num_heads, 1)))
        fia(b.query, b.key, b.value, **b.kwargs())
    assert [c.kind for c in outer] == ["functional", "out", "functional"]
    assert [c.kind for c in inner] == ["out"]
    assert inner[0] is outer[1]
    assert [c.tags for c in outer] == [
        {"phase": "replay", "layer": 0},
        {"phase": "replay", "layer": 1, "step": 7},
        {"phase": "replay", "layer": 0},
    ]


def test_nothing_is_recorded_outside_an_observer() -> None:
    b = make_batch([2], [2])
    fia(b.query, b.key, b.value, **b.kwargs())
    with observe_fia_calls() as calls:
        pass
    assert calls == []


def test_device_metadata_record_has_no_host_lists() -> None:
    b = make_batch([3, 1], [5, 2])
    qsl = torch.tensor([0, 3, 4, 4], dtype=torch.int32)
    kvl = torch.tensor([5, 2, 0], dtype=torch.int32)
    table = torch.cat([b.block_table, torch.zeros_like(b.block_table[:1])])
    with observe_fia_calls() as calls:
        fia_device_metadata(b.query, b.key, b.value, qsl, kvl, table, block_size=b.block_size,
                            num_heads=b.num_heads, num_key_value_heads=b.num_kv_heads, scale=b.scale,
                            max_num_reqs=3)
    (call,) = calls
    assert (call.kind, call.T, call.num_reqs) == ("device_metadata", 4, 3)
    assert call.actual_seq_lengths == () and call.actual_seq_lengths_kv == ()
    assert call.strict_ok and call.relaxed_ok and call.error is None


def test_tensor_lengths_are_refused_and_recorded() -> None:
    b = make_batch([3, 1], [5, 2])
    with observe_fia_calls() as calls, pytest.raises(FiaArgumentError, match="host list"):
        fia(b.query, b.key, b.value, **b.kwargs(actual_seq_lengths=torch.tensor(b.cum_q)))
    assert calls[0].error is not None and calls[0].strict_ok is False
