"""Task groups, ExternalEvents and streams: the vLLM Ascend host-parameter update, emulated."""

from __future__ import annotations

import pytest
import torch

from harness.engine import GraphHangError, TaskUpdateError

from .conftest import scale_rows

# Tensors these tests make live on the emulated NPU, as the pipeline's do (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("on_npu")


def _capture_grouped(npu, x, out, factors):
    """Capture as vLLM Ascend does: event wait/reset, then the op inside a task group."""
    g = npu.NPUGraph()
    event = npu.ExternalEvent()
    with npu.graph(g):
        stream = npu.current_stream()
        event.wait(stream)
        event.reset(stream)
        npu.graph_task_group_begin(stream)
        torch.ops.enginetest.scale_rows.out(x, factors, out=out)
        handle = npu.graph_task_group_end(stream)
        result = out * 1  # work after the grouped op sees its output
    return g, event, handle, result


def test_update_on_update_stream_after_replay_launch(npu):
    x, out = torch.ones(3, 2), torch.empty(3, 2)
    g, event, handle, result = _capture_grouped(npu, x, out, [1, 1, 1])
    update_stream = npu.Stream()
    for step in range(1, 4):
        g.replay()  # launched first: it stalls at the event wait
        with npu.stream(update_stream):
            npu.graph_task_update_begin(update_stream, handle)
            torch.ops.enginetest.scale_rows.out(x, [step, 2 * step, 3 * step], out=out)
            npu.graph_task_update_end(update_stream)
            event.record(update_stream)
        npu.synchronize()
        assert result[:, 0].tolist() == [step, 2 * step, 3 * step]


def test_replay_waiting_on_an_unrecorded_event_is_a_hang(npu):
    x, out = torch.ones(3, 2), torch.empty(3, 2)
    g, _, _, _ = _capture_grouped(npu, x, out, [1, 1, 1])
    g.replay()
    with pytest.raises(GraphHangError, match=r"replay of graph#\d+ .*\(before enginetest::scale_rows\.out\)"):
        npu.synchronize()
    npu.synchronize()  # the emulated device is usable again after the report


def test_update_with_a_different_tensor_is_rejected(npu):
    x, out = torch.ones(3, 2), torch.empty(3, 2)
    g, _, handle, _ = _capture_grouped(npu, x, out, [1, 1, 1])
    stream = npu.Stream()
    other = x.clone()
    npu.graph_task_update_begin(stream, handle)
    with pytest.raises(TaskUpdateError, match="'x' is a different tensor"):
        torch.ops.enginetest.scale_rows.out(other, [2, 2, 2], out=out)


def test_stale_without_update(npu):
    """Without an update the replay re-issues the capture-time host list (the repeated-text bug)."""
    x = torch.ones(3, 2)
    g = npu.NPUGraph()
    with npu.graph(g):
        out = scale_rows(x, [1, 1, 1])
    g.replay()
    npu.synchronize()
    assert out[:, 0].tolist() == [1.0, 1.0, 1.0]  # whatever the live batch wanted


def test_auto_dispatch_update(npu):
    x = torch.ones(2, 2)
    g = npu.NPUGraph()
    with npu.graph(g, auto_dispatch_capture=True):
        a = scale_rows(x, [1, 1])
        b = scale_rows(a, [1, 1])
    g.update(cpu_update_input=[{"factors": [2, 3]}, {"factors": [5, 7]}])
    g.replay()
    npu.synchronize()
    assert b[:, 0].tolist() == [10.0, 21.0]
    # torch_npu (graphs.py update_capture_record) applies a lone dict to every recorded op.
    g.update(cpu_update_input=[{"factors": [3, 1]}])
    g.replay()
    npu.synchronize()
    assert b[:, 0].tolist() == [9.0, 1.0]
    with pytest.raises(TaskUpdateError, match="2 updatable op"):
        g.update(cpu_update_input=[{"factors": [1, 1]}] * 3)
    with pytest.raises(TaskUpdateError, match="no argument 'scale'"):
        g.update(cpu_update_input=[{"scale": 1}, {"factors": [1, 1]}])


def test_update_needs_auto_dispatch_capture(npu):
    x = torch.ones(2, 2)
    g = npu.NPUGraph()
    with npu.graph(g):
        scale_rows(x, [1, 1])
    with pytest.raises(TaskUpdateError, match="auto_dispatch_capture"):
        g.update(cpu_update_input=[{"factors": [2, 2]}])


def test_work_on_one_stream_waits_for_an_event_from_another(npu):
    a, b = npu.Stream(), npu.Stream()
    event = npu.ExternalEvent()
    x = torch.ones(2)
    g = npu.NPUGraph()
    with npu.graph(g):
        out = x * 3
    with npu.stream(a):
        event.wait(a)
        g.replay()  # queued behind the wait
    assert out.isnan().all()
    event.record(b)
    npu.synchronize()
    assert torch.equal(out, torch.full((2,), 3.0))
