"""torch_npu's auto_dispatch_capture update mechanics (torch_npu/npu/graphs.py, _GraphDispatchMode)."""

from __future__ import annotations

import pytest
import torch

from harness.engine import GraphHangError
from harness.engine.emulated import dispatch_mode
from harness.engine.emulated.recorder import EventNode
from tests.engine.conftest import scale_rows

# Tensors these tests make live on the emulated NPU, as the pipeline's do (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("on_npu")


def _captured(npu, n_ops=2):
    x = torch.ones(2, 2)
    g = npu.NPUGraph()
    with npu.graph(g, auto_dispatch_capture=True):
        y = x
        for _ in range(n_ops):
            y = scale_rows(y, [1, 1])
    return g, y


def test_each_dispatched_op_is_guarded_by_an_event_wait_and_reset(npu):
    g, _ = _captured(npu)
    kinds = [n.kind if isinstance(n, EventNode) else n.name for n in g.nodes]
    assert kinds == ["wait", "reset", "enginetest::scale_rows", "wait", "reset", "enginetest::scale_rows"]


def test_a_replay_stalls_until_update_and_the_update_runs_on_the_shared_update_stream(npu):
    g, y = _captured(npu)
    g.replay()
    assert not npu.current_stream().query()  # stopped at the first op's event
    g.update(cpu_update_input=[{"factors": [2, 3]}])
    npu.synchronize()
    assert y[:, 0].tolist() == [4.0, 9.0]
    other, _ = _captured(npu, n_ops=1)
    assert dispatch_mode.update_stream(npu._device) is dispatch_mode.update_stream(npu._device)
    assert dispatch_mode.update_stream(npu._device) is not npu.current_stream()


def test_replay_without_a_fresh_update_hangs(npu):
    g, _ = _captured(npu)
    g.replay()
    with pytest.raises(GraphHangError, match="before enginetest::scale_rows"):
        npu.synchronize()


def test_host_tensor_for_a_host_list_argument_is_read_as_a_list():
    func = torch.ops.enginetest.scale_rows.default
    assert dispatch_mode.host_value(func, "factors", torch.tensor([2, 5], dtype=torch.int32, device="cpu")) == [2, 5]
    kept = torch.ones(2)
    assert dispatch_mode.host_value(func, "x", kept) is kept  # a tensor argument stays a tensor
