"""Graph memory pools and the device stream budget."""

from __future__ import annotations

import pytest
import torch

from harness.engine import StreamBudgetError
from harness.engine.emulated.device import StreamConfig

# Tensors these tests make live on the emulated NPU, as the pipeline's do (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("on_npu")


def _capture(npu, fn, pool=None):
    g = npu.NPUGraph()
    with npu.graph(g, pool=pool):
        out = fn()
    return g, out


def test_shared_pool_reuses_intermediates_but_never_outputs(npu):
    x = torch.randn(64, 64)
    pool = npu.graph_pool_handle()
    big, out_big = _capture(npu, lambda: torch.relu(torch.relu(x @ x) @ x), pool)
    small, out_small = _capture(npu, lambda: torch.tanh(x[:32] @ x) + 1, pool)
    report = npu.memory_report()[f"pool{pool.id}"]
    assert report["bytes_reserved"] < big.bytes_held + small.bytes_held  # sharing happened
    assert big.pool() == small.pool() == pool
    big.replay()
    npu.synchronize()
    expected_big = out_big.clone()
    small.replay()  # writes only into blocks big does not hand out
    npu.synchronize()
    assert torch.equal(out_big, expected_big)
    assert torch.equal(out_small, torch.tanh(x[:32] @ x) + 1)


def test_a_block_no_tensor_holds_is_reused_within_the_same_capture(npu):
    x = torch.randn(16, 16)
    g = npu.NPUGraph()
    with npu.graph(g):
        first = x * 2
        address = first.data_ptr()
        del first  # the caching allocator frees it here, mid-capture
        second = x * 3
        assert second.data_ptr() == address
        kept = x * 4
        assert kept.data_ptr() != second.data_ptr()  # a live tensor's block is never handed out
    g.replay()
    npu.synchronize()
    assert torch.equal(second, x * 3) and torch.equal(kept, x * 4)


@pytest.mark.parametrize("hold", [True, False], ids=["held", "weak-ref-only"])
def test_an_output_only_weakly_referenced_is_recycled_by_the_next_capture(npu, hold):
    """vLLM keeps graph outputs as weak references: the pool may give their memory to the next
    capture, and reading one after another graph of the pool replayed reads that graph's data."""
    x = torch.ones(8)
    pool = npu.graph_pool_handle()
    first, out = _capture(npu, lambda: x + 1, pool)
    weak = npu.weak_ref_tensor(out)
    if not hold:
        del out
    second, other = _capture(npu, lambda: x * 5, pool)
    assert (other.data_ptr() == weak.data_ptr()) is not hold
    first.replay()
    npu.synchronize()
    assert weak.tolist() == [2.0] * 8  # read right after its own replay: correct
    second.replay()
    npu.synchronize()
    # read after the pool's next graph replayed: its own values if held, else the other graph's
    assert weak.tolist() == ([2.0] * 8 if hold else [5.0] * 8)


def test_separate_pools_do_not_share(npu):
    x = torch.randn(32, 32)
    a, _ = _capture(npu, lambda: torch.relu(x @ x) @ x)
    b, _ = _capture(npu, lambda: torch.relu(x @ x) @ x)
    assert a.pool() != b.pool()
    assert sum(p["bytes_reserved"] for p in npu.memory_report().values()) == a.bytes_held + b.bytes_held


def test_stream_budget_exhaustion_raises_207008(npu):
    npu.reset_device(StreamConfig(pool_size=3, per_graph=1))
    x = torch.ones(2)
    graphs = [_capture(npu, lambda: x + 1)[0] for _ in range(3)]
    assert npu.stream_usage()["in_use"] == 3
    with pytest.raises(StreamBudgetError, match="207008: Stream resources are insufficient") as info:
        _capture(npu, lambda: x + 1)
    assert info.value.code == 207008
    graphs[0].reset()  # releasing a graph returns its streams
    _capture(npu, lambda: x + 1)
    assert npu.stream_usage()["in_use"] == 3


def test_streams_per_graph_is_configurable(npu):
    npu.reset_device(StreamConfig(pool_size=2048, per_graph=5))
    x = torch.ones(2)
    g, _ = _capture(npu, lambda: x + 1)
    assert g.streams_held == 5 and npu.stream_usage()["in_use"] == 5


@pytest.mark.parametrize("bad", [dict(pool_size=0), dict(per_graph=0), dict(per_comm_group=-1)])
def test_a_stream_config_without_streams_is_refused(bad):
    with pytest.raises(ValueError, match="stream config needs"):
        StreamConfig(**bad)
