"""The torch.library side: the .out form, fake kernels, one node per call, opcheck, backends."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from fia_testlib import make_batch
from torch.utils._python_dispatch import TorchDispatchMode

from harness.ops import (
    fia_device_metadata,
    get_max_workspace,
    get_native_impl,
    npu_fused_infer_attention_score as fia,
    npu_fused_infer_attention_score_out as fia_out,
    set_native_impl,
    workspace_nbytes,
)

OP = torch.ops.harness.npu_fused_infer_attention_score


class OpLog(TorchDispatchMode):
    """The smallest recorder: remembers which ops reached the dispatcher."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def meta(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(t.shape, dtype=t.dtype, device="meta")


@pytest.fixture
def batch():
    return make_batch([4, 1, 3], [6, 9, 3])


# ------------------------------------------------------------------ .out form


@pytest.mark.parametrize("lse_flag", [True, False])
def test_out_writes_in_place_and_equals_functional(batch, lse_flag: bool) -> None:
    b = batch
    want_out, want_lse = fia(b.query, b.key, b.value, **b.kwargs(softmax_lse_flag=lse_flag))
    workspace = get_max_workspace(b.query, b.key, b.value, **b.kwargs())
    attn = torch.full_like(b.query, 7.0)
    lse = torch.full((b.T, b.num_heads, 1) if lse_flag else (1,), 7.0)
    ptrs = (workspace.data_ptr(), attn.data_ptr(), lse.data_ptr())
    assert fia_out(b.query, b.key, b.value, **b.kwargs(softmax_lse_flag=lse_flag),
                   workspace=workspace, out=(attn, lse)) is None
    assert (workspace.data_ptr(), attn.data_ptr(), lse.data_ptr()) == ptrs
    assert torch.equal(attn, want_out)
    assert torch.equal(lse, want_lse)


def test_out_with_flag_false_zeroes_a_full_size_lse(batch) -> None:
    b = batch
    lse = torch.full((b.T, b.num_heads, 1), 7.0)
    fia_out(b.query, b.key, b.value, **b.kwargs(softmax_lse_flag=False),
            workspace=get_max_workspace(b.query, b.key, b.value), out=(torch.empty_like(b.query), lse))
    assert torch.equal(lse, torch.zeros_like(lse))


def test_out_schema_marks_written_tensors() -> None:
    schema = OP.out._schema
    written = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert written == ["workspace", "attention_out", "softmax_lse"]
    assert len(schema.returns) == 0
    assert not any(a.alias_info is not None for a in OP.default._schema.arguments)


def test_workspace_is_deterministic_and_checked(batch) -> None:
    b = batch
    ws = get_max_workspace(b.query, b.key, b.value, **b.kwargs())
    assert ws.dtype == torch.uint8 and ws.numel() == workspace_nbytes(b.T, b.num_heads)
    with pytest.raises(RuntimeError, match="workspace holds 8 bytes"):
        fia_out(b.query, b.key, b.value, **b.kwargs(), workspace=torch.empty(8, dtype=torch.uint8),
                out=(torch.empty_like(b.query), torch.empty(b.T, b.num_heads, 1)))


def test_out_rejects_wrong_output_shapes(batch) -> None:
    b = batch
    with pytest.raises(RuntimeError, match="attention_out must be"):
        fia_out(b.query, b.key, b.value, **b.kwargs(), workspace=get_max_workspace(b.query, b.key, b.value),
                out=(torch.empty(1, b.num_heads, 16), torch.empty(b.T, b.num_heads, 1)))


# ------------------------------------------------------------------ fake kernels


@pytest.mark.parametrize("lse_flag", [True, False])
def test_fake_kernel_shapes_on_meta(batch, lse_flag: bool) -> None:
    b = batch
    kw = b.kwargs(softmax_lse_flag=lse_flag, block_table=meta(b.block_table))
    out, lse = OP(meta(b.query), meta(b.key), meta(b.value), **kw)
    assert out.device.type == "meta" and out.shape == b.query.shape and out.dtype == b.query.dtype
    assert lse.dtype == torch.float32
    assert lse.shape == ((b.T, b.num_heads, 1) if lse_flag else (1,))
    OP.out(meta(b.query), meta(b.key), meta(b.value), **kw, workspace=meta(get_max_workspace(b.query, b.key, b.value)),
           attention_out=meta(b.query), softmax_lse=meta(lse))


def test_fake_kernel_rejects_bad_shapes(batch) -> None:
    b = batch
    with pytest.raises(RuntimeError, match="query: has 4 heads but num_heads is 8"):
        OP(meta(b.query), meta(b.key), meta(b.value), **b.kwargs(num_heads=8, num_key_value_heads=2))


def test_fake_kernel_of_device_metadata(batch) -> None:
    b = batch
    i32 = dict(dtype=torch.int32, device="meta")
    out, lse = torch.ops.harness.fia_device_metadata(
        meta(b.query), meta(b.key), meta(b.value), torch.empty(5, **i32), torch.empty(4, **i32),
        torch.empty(4, 3, **i32), block_size=b.block_size, num_heads=b.num_heads,
        num_key_value_heads=b.num_kv_heads, scale=b.scale, max_num_reqs=4,
    )
    assert out.shape == b.query.shape and lse.shape == (b.T, b.num_heads, 1)


# ------------------------------------------------------------------ one node per call


def test_functional_call_is_one_node(batch) -> None:
    b = batch
    with OpLog() as log:
        fia(b.query, b.key, b.value, **b.kwargs())
    assert log.names == ["harness.npu_fused_infer_attention_score.default"]


def test_out_call_is_one_node(batch) -> None:
    b = batch
    ws = get_max_workspace(b.query, b.key, b.value)
    out = (torch.empty_like(b.query), torch.empty(b.T, b.num_heads, 1))
    with OpLog() as log:
        fia_out(b.query, b.key, b.value, **b.kwargs(), workspace=ws, out=out)
    assert log.names == ["harness.npu_fused_infer_attention_score.out"]


def test_device_metadata_call_is_one_node(batch) -> None:
    b = batch
    qsl = torch.tensor([0, *b.cum_q], dtype=torch.int32)
    kvl = torch.tensor(b.kv_lens, dtype=torch.int32)
    with OpLog() as log:
        fia_device_metadata(b.query, b.key, b.value, qsl, kvl, b.block_table, block_size=b.block_size,
                            num_heads=b.num_heads, num_key_value_heads=b.num_kv_heads, scale=b.scale,
                            max_num_reqs=3)
    assert log.names == ["harness.fia_device_metadata.default"]


# ------------------------------------------------------------------ opcheck


def test_opcheck() -> None:
    # opcheck runs the schema, autograd-registration, fake-tensor and AOT-dispatch tests.
    # Inputs do not require grad: the ops are inference-only and have no autograd formula.
    b = make_batch([2, 1], [3, 5])
    kw = b.kwargs()
    ws = get_max_workspace(b.query, b.key, b.value)
    torch.library.opcheck(OP.default, (b.query, b.key, b.value), kw)
    torch.library.opcheck(
        OP.out, (b.query, b.key, b.value),
        dict(kw, workspace=ws, attention_out=torch.empty_like(b.query), softmax_lse=torch.empty(b.T, b.num_heads, 1)),
    )
    qsl = torch.tensor([0, *b.cum_q], dtype=torch.int32)
    kvl = torch.tensor(b.kv_lens, dtype=torch.int32)
    torch.library.opcheck(
        torch.ops.harness.fia_device_metadata.default, (b.query, b.key, b.value, qsl, kvl, b.block_table),
        dict(block_size=b.block_size, num_heads=b.num_heads, num_key_value_heads=b.num_kv_heads,
             scale=b.scale, max_num_reqs=2),
    )


# ------------------------------------------------------------------ native backend hook


def test_native_impl_receives_torch_npu_keywords(batch) -> None:
    b = batch
    calls: list[tuple[str, dict[str, Any]]] = []

    def functional(q, k, v, **kw):  # type: ignore[no-untyped-def]
        calls.append(("functional", kw))
        return torch.ops.harness.npu_fused_infer_attention_score(q, k, v, **kw)

    def out_form(q, k, v, *, workspace, out, **kw):  # type: ignore[no-untyped-def]
        calls.append(("out", kw))
        torch.ops.harness.npu_fused_infer_attention_score.out(
            q, k, v, **kw, workspace=workspace, attention_out=out[0], softmax_lse=out[1])

    saved = get_native_impl()
    set_native_impl(functional, out_form)
    try:
        fia(b.query, b.key, b.value, **b.kwargs())
        fia_out(b.query, b.key, b.value, **b.kwargs(), workspace=get_max_workspace(b.query, b.key, b.value),
                out=(torch.empty_like(b.query), torch.empty(b.T, b.num_heads, 1)))
    finally:
        set_native_impl(*saved)
    assert [kind for kind, _ in calls] == ["functional", "out"]
    assert calls[0][1]["actual_seq_lengths"] == b.cum_q
    assert calls[0][1]["num_key_value_heads"] == b.num_kv_heads
    assert get_native_impl() == (None, None, None)


# -- one definition of the keywords ---------------------------------------------------------------


def test_the_fia_keywords_are_written_once_and_every_definition_reads_them():
    """The ops' schemas, rendered from ``FiaKeywords``, are torch_npu's (unchanged since they
    were written out by hand); the wrappers show and check the same keywords."""
    import inspect

    from harness.ops.signature import FIA_KEYWORD_NAMES

    assert str(OP.default._schema) == (
        "harness::npu_fused_infer_attention_score(Tensor query, Tensor key, Tensor value, *, "
        "SymInt[]? actual_seq_lengths=None, SymInt[]? actual_seq_lengths_kv=None, Tensor? block_table=None, "
        "int block_size=0, int num_heads=1, int num_key_value_heads=0, float scale=1., "
        "str input_layout=\"TND\", int sparse_mode=0, Tensor? atten_mask=None, bool softmax_lse_flag=False) "
        "-> (Tensor, Tensor)")
    out_keywords = [a.name for a in OP.out._schema.arguments if a.kwarg_only]
    assert out_keywords == [*FIA_KEYWORD_NAMES, "workspace", "attention_out", "softmax_lse"]
    for wrapper, own in ((fia, ["contract"]), (fia_out, ["workspace", "out", "contract"])):
        keywords = [p.name for p in inspect.signature(wrapper).parameters.values() if p.kind is p.KEYWORD_ONLY]
        assert keywords == [*FIA_KEYWORD_NAMES, *own]
    q, k, v = (torch.zeros(1, 1, 1),) * 3
    with pytest.raises(TypeError, match=r"^npu_fused_infer_attention_score\(\) got an unexpected keyword argument 'actual_seq_len'$"):
        fia(q, k, v, actual_seq_len=[1])
