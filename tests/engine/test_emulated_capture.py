"""Capture and replay semantics of the emulated ACL graph: each test fails without its rule."""

from __future__ import annotations

import contextlib

import pytest
import torch

from harness.engine import CaptureError
from harness.engine.emulated.tensors import DeviceMismatchError, host_data

from .conftest import scale_rows

# Tensors these tests make live on the emulated NPU, as the pipeline's do (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("on_npu")


def test_replay_runs_the_record_not_the_python(npu):
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    calls = []

    def forward():
        calls.append(1)
        return torch.relu(x @ w)

    g = npu.NPUGraph()
    with npu.graph(g):
        out = forward()
    for _ in range(3):
        g.replay()
    npu.synchronize()
    assert len(calls) == 1
    assert torch.equal(out, torch.relu(x @ w))


def test_static_inputs_are_bound_by_address(npu):
    x = torch.ones(3, 3)
    g = npu.NPUGraph()
    with npu.graph(g):
        out = x * 2
    x.copy_(torch.full((3, 3), 5.0))  # new contents at the captured address: seen
    g.replay()
    npu.synchronize()
    assert torch.equal(out, torch.full((3, 3), 10.0))
    x = torch.full((3, 3), 7.0)  # rebinding the name: silently ignored, as on hardware
    g.replay()
    npu.synchronize()
    assert torch.equal(out, torch.full((3, 3), 10.0))


def test_host_lists_are_frozen_at_capture(npu):
    x = torch.ones(3, 2)
    factors = [1, 2, 3]
    g = npu.NPUGraph()
    with npu.graph(g):
        out = scale_rows(x, factors)
    factors[0] = 100  # the caller's list changes; the graph keeps its deep copy
    g.replay()
    npu.synchronize()
    assert out[:, 0].tolist() == [1.0, 2.0, 3.0]


def test_capture_has_no_side_effect_and_outputs_hold_no_data(npu):
    kv_cache = torch.zeros(4, 2)
    new_kv = torch.ones(2, 2)
    slots = torch.tensor([1, 3])
    g = npu.NPUGraph()
    with npu.graph(g):
        kv_cache.index_copy_(0, slots, new_kv)
        out = kv_cache.sum(dim=0)
    assert torch.equal(kv_cache, torch.zeros(4, 2))
    assert out.isnan().all()
    g.replay()
    npu.synchronize()
    assert kv_cache[[1, 3]].eq(1).all() and torch.equal(out, torch.tensor([2.0, 2.0]))


@pytest.mark.parametrize(
    "host_sync",
    [
        lambda t: t.sum().item(),
        lambda t: t.tolist(),
        lambda t: bool(t.sum() > 0),
        lambda t: torch.nonzero(t),
        lambda t: t[t > 0],
        lambda t: torch.equal(t, t),
        lambda t: t.cpu(),
    ],
    ids=["item", "tolist", "bool", "nonzero", "bool-mask", "equal", "cpu"],
)
def test_host_sync_in_capture_raises_and_capture_can_be_redone(npu, host_sync):
    x = torch.randn(4)
    g = npu.NPUGraph()
    with pytest.raises(CaptureError, match="operation not permitted when stream is capturing"):
        with npu.graph(g):
            host_sync(x)
    assert x.tolist() == x.tolist()  # host reads work again once the capture is gone
    with npu.graph(g):
        out = x * 2
    g.replay()
    npu.synchronize()
    assert torch.equal(out, x * 2)


def test_rng_is_rejected_unless_allowed(npu):
    with pytest.raises(CaptureError, match="random"):
        with npu.graph(npu.NPUGraph()):
            torch.rand(3)
    g = npu.NPUGraph(allow_rng=True)
    with npu.graph(g):
        out = torch.rand(3)
    g.replay()
    npu.synchronize()
    assert not out.isnan().any()


def test_views_and_in_place_ops_run_once_per_replay(npu):
    state = torch.zeros(2, 4)
    g = npu.NPUGraph()
    with npu.graph(g):
        row = state[1]  # a view of a static input
        row.add_(1.0)  # in place through the view
        out = state.t().contiguous()
    for _ in range(3):
        g.replay()
    npu.synchronize()
    assert torch.equal(state[1], torch.full((4,), 3.0)) and torch.equal(state[0], torch.zeros(4))
    assert torch.equal(out, state.t())


def test_mixed_dtypes_replay_bitwise(npu):
    x32 = torch.randn(5, 16)
    w16 = torch.randn(16, 16, dtype=torch.bfloat16)

    def forward():
        h = (x32.to(torch.bfloat16) @ w16).float()
        return torch.softmax(h, dim=-1)

    g = npu.NPUGraph()
    with npu.graph(g):
        out = forward()
    g.replay()
    npu.synchronize()
    assert out.dtype == torch.float32 and torch.equal(out, forward())


def test_capture_requires_a_side_stream(npu):
    with pytest.raises(CaptureError, match="default stream"):
        npu.NPUGraph().capture_begin()


def test_capture_begin_end_by_hand_on_a_side_stream(npu):
    x = torch.ones(2)
    g = npu.NPUGraph()
    with npu.stream(npu.Stream()):
        g.capture_begin()
        out = x + 1
        g.capture_end()
    g.replay()
    npu.synchronize()
    assert torch.equal(out, torch.full((2,), 2.0))


def test_allocations_are_not_replayed(npu):
    """torch.empty launches no kernel: a buffer keeps the last replay's result until rewritten."""
    x = torch.ones(4)
    event = npu.ExternalEvent()
    g = npu.NPUGraph()
    with npu.graph(g):
        out = torch.empty_like(x)
        stream = npu.current_stream()
        event.wait(stream)
        event.reset(stream)
        out.copy_(x * 3)
    event.record(npu.current_stream())
    g.replay()
    npu.synchronize()
    assert out.tolist() == [3.0] * 4
    g.replay()  # stalls at the event: the buffer must still hold the previous result
    assert host_data(out).tolist() == [3.0] * 4  # (read without waiting for the stream: it never ends)
    event.record(npu.Stream())
    npu.synchronize()


def test_numpy_of_device_memory_refuses_as_on_cuda(npu):
    with pytest.raises(TypeError, match="can't convert npu:0 device type tensor to numpy"):
        torch.ones(2).numpy()
    assert torch.ones(2).cpu().numpy().tolist() == [1.0, 1.0]


def test_host_work_is_not_captured_and_a_graph_of_only_host_work_is_refused(npu):
    """The pre-fix pipeline of the first GPU run: a model left in host memory. Its capture records
    nothing, and the emulator refuses the empty graph naming what ran on the host instead."""
    x, w = torch.randn(4, 8, device="cpu"), torch.randn(8, 8, device="cpu")
    g = npu.NPUGraph()
    with pytest.raises(CaptureError, match=r"has no device work; 2 operation\(s\) ran on the host instead "
                                           r"\(first: aten::mm on host tensors of shape \[\[4, 8\], \[8, 8\]\]"):
        with npu.graph(g):
            torch.relu(x @ w)
    g = npu.NPUGraph()  # host work beside device work: the host part runs once, at capture
    y = torch.zeros(4)
    with npu.graph(g):
        host = x.sum()  # on the host, now
        y.add_(1.0)
    assert host == x.sum()
    g.replay()
    npu.synchronize()
    assert y.tolist() == [1.0] * 4  # the device part runs at each replay, never at capture


@pytest.mark.parametrize("capturing", [False, True], ids=["eager", "capture"])
def test_a_host_tensor_mixed_with_device_tensors_raises_as_on_a_device(npu, capturing):
    """The mask bug the GPU run found (``harness/ops/reference.py``, fixed): a host mask beside a
    device tensor. Copies between the memories and host index tensors stay legal, as on CUDA."""
    scores, mask = torch.randn(2, 3), torch.ones(2, 3, dtype=torch.bool, device="cpu")
    context = npu.graph(npu.NPUGraph()) if capturing else contextlib.nullcontext()
    with pytest.raises(DeviceMismatchError, match=r"npu:0 and cpu! \(aten::masked_fill: argument 'mask'"):
        with context:
            scores.masked_fill(mask, 0.0)
    rows = torch.tensor([1, 0], device="cpu")
    assert torch.equal(scores[rows].cpu(), scores.cpu()[rows])
    assert scores.masked_fill(mask.to(scores.device), 0.0).eq(0).all()
