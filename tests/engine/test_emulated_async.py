"""The emulated device is behind its host: what async scheduling relies on, and what it breaks.

A replay runs when the host waits for it, a host wait runs no more than it needs, and work with
no waits issued to an idle stream (a task-group update, an event record) runs at once. So an
update issued for step i+1 before the host waited for step i's replay reaches that replay,
as on a busy device (vLLM Ascend PR #4233), and the synchronize before the replay prevents it.
"""

from __future__ import annotations

import pytest
import torch

from harness.engine import GraphHangError

from .test_emulated_task_groups import _capture_grouped

pytestmark = pytest.mark.usefixtures("on_npu")


def _step(npu, g, event, handle, x, out, update_stream, factors, *, sync: bool) -> None:
    """One FULL step as the runner issues it: (sync), replay, update on the update stream, record."""
    if sync:
        npu.current_stream().synchronize()
    g.replay()
    npu.graph_task_update_begin(update_stream, handle)
    with npu.stream(update_stream):
        torch.ops.enginetest.scale_rows.out(x, factors, out=out)
    npu.graph_task_update_end(update_stream)
    event.record(update_stream)


def _read_back(npu, copy_stream, tensor):
    """vLLM's async output copy: a host copy on a copy stream behind the step, and an event."""
    copy_stream.wait_stream(npu.current_stream())
    with npu.stream(copy_stream):
        host = tensor.to("cpu", non_blocking=True)
        ready = npu.Event()
        ready.record()
    return host, ready


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "no-sync"])
def test_the_next_steps_update_reaches_a_queued_replay_unless_the_host_synchronizes(npu, sync):
    x, out = torch.ones(3, 2), torch.empty(3, 2)
    g, event, handle, result = _capture_grouped(npu, x, out, [1, 1, 1])
    update_stream, copy_stream = npu.Stream(), npu.Stream()
    _step(npu, g, event, handle, x, out, update_stream, [1, 2, 3], sync=sync)
    first, ready = _read_back(npu, copy_stream, result * 1)  # step 1's output, in stream order
    _step(npu, g, event, handle, x, out, update_stream, [4, 5, 6], sync=sync)
    if sync:
        ready.synchronize()
        assert first[:, 0].tolist() == [1, 2, 3]
        npu.synchronize()
        assert result[:, 0].tolist() == [4, 5, 6]
        return
    # step 2's update landed before step 1's replay ran, and its event record before step 1's
    # replay reset it: step 1 computes with step 2's factors, step 2's replay waits forever
    ready.synchronize()
    assert first[:, 0].tolist() == [4, 5, 6]
    with pytest.raises(GraphHangError, match=r"replay of graph#\d+ .* waits at .* which no queued work records"):
        npu.synchronize()


def test_a_host_wait_runs_no_more_than_it_waits_for(npu):
    x = torch.ones(2)
    g = npu.NPUGraph()
    with npu.graph(g):
        out = x * 3
    copy_stream = npu.Stream()
    g.replay()
    first, ready = _read_back(npu, copy_stream, out * 1)
    x.fill_(2.0)  # issued behind the first replay: runs after it
    g.replay()
    second, _ = _read_back(npu, copy_stream, out * 1)
    ready.synchronize()
    assert first.tolist() == [3.0, 3.0]
    assert npu.current_stream().queue, "the second replay ran although the host waited only for the first"
    npu.synchronize()
    assert second.tolist() == [6.0, 6.0]


def test_a_non_blocking_copy_to_the_host_is_filled_when_the_stream_reaches_it(npu):
    x = torch.ones(4)
    g = npu.NPUGraph()
    with npu.graph(g):
        out = x + 1
    g.replay()
    host = out.to("cpu", non_blocking=True)  # queued behind the replay: the host does not wait
    assert type(host) is torch.Tensor and host.device.type == "cpu"
    assert npu.current_stream().queue
    npu.current_stream().synchronize()
    assert host.tolist() == [2.0] * 4
    assert out.cpu().tolist() == [2.0] * 4  # a blocking read waits as before


def test_waitless_work_on_an_idle_stream_runs_at_once(npu):
    idle, busy = npu.Stream(), npu.Stream()
    now, later = npu.Event(), npu.Event()
    now.record(idle)
    assert now.query()
    x = torch.ones(2)
    g = npu.NPUGraph()
    with npu.graph(g):
        x * 2
    with npu.stream(busy):
        g.replay()
    later.record(busy)
    assert not later.query()  # behind the queued replay
    later.synchronize()
    assert later.query() and not busy.queue
    npu.Event().synchronize()  # never recorded: complete, as torch's
