"""torch_npu's graph RNG rules on the emulator: the cases of torch_npu test/npu/test_aclgraph_rng_state.py.

Each test names the upstream case it models. Random ops in a capture need ``allow_rng=True``
(torch_npu v2.11.0-26.1.0 and later accept them in a default NPUGraph capture).
"""

from __future__ import annotations

import pytest
import torch

from harness.engine import CaptureError
from harness.engine.emulated import rng

# Tensors these tests make live on the emulated NPU, as the pipeline's do (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("on_npu")


def test_get_set_rng_state_during_capture(npu):
    """test_get_set_rng_state_during_capture: save, draw, restore, draw -> the same numbers twice."""
    npu.manual_seed(123)
    eager_state = npu.get_rng_state()
    eager_first = torch.rand(8)
    npu.set_rng_state(eager_state)
    eager_second = torch.rand(8)
    eager_next = torch.rand(8)

    npu.manual_seed(123)
    graph = npu.NPUGraph(allow_rng=True)
    with npu.graph(graph):
        graph_state = npu.get_rng_state()
        graph_first = torch.rand(8)
        npu.set_rng_state(graph_state)
        graph_second = torch.rand(8)
    npu.manual_seed(123)
    graph.replay()
    npu.synchronize()
    graph_next = torch.rand(8)

    assert torch.equal(eager_first, eager_second)
    assert torch.equal(graph_first, graph_second) and torch.equal(graph_first, eager_first)
    assert torch.equal(graph_next, eager_next)  # the replay advanced the generator as eager did


def test_set_rng_state_with_nonzero_offset_during_capture(npu):
    """test_set_rng_state_with_nonzero_offset_during_capture: a state taken after a draw."""
    npu.manual_seed(123)
    eager_pre = torch.rand(8)
    eager_state = npu.get_rng_state()
    eager_first = torch.rand(8)
    npu.set_rng_state(eager_state)
    eager_second = torch.rand(8)
    eager_next = torch.rand(8)

    npu.manual_seed(123)
    graph = npu.NPUGraph(allow_rng=True)
    with npu.graph(graph):
        graph_pre = torch.rand(8)
        graph_state = npu.get_rng_state()
        graph_first = torch.rand(8)
        npu.set_rng_state(graph_state)
        graph_second = torch.rand(8)
    npu.manual_seed(123)
    graph.replay()
    npu.synchronize()
    graph_next = torch.rand(8)

    assert torch.equal(graph_pre, eager_pre)
    assert torch.equal(eager_first, eager_second) and torch.equal(graph_first, graph_second)
    assert torch.equal(graph_first, eager_first) and torch.equal(graph_next, eager_next)


def test_graph_set_rng_state_seed_mismatch_raises(npu):
    """test_graph_set_rng_state_seed_mismatch_raises."""
    npu.manual_seed(0)
    torch.rand(1)
    npu.manual_seed(1)
    mismatched_state = npu.get_rng_state()
    npu.manual_seed(0)
    with pytest.raises(RuntimeError, match="set_current_seed can be called during stream capture only if"):
        with npu.graph(npu.NPUGraph()):
            npu.set_rng_state(mismatched_state)


def test_graph_manual_seed_mismatch_raises_and_same_seed_is_a_no_op(npu):
    """test_graph_manual_seed_mismatch_raises (and its converse: the same seed is accepted)."""
    npu.manual_seed(0)
    with pytest.raises(RuntimeError, match="only if new seed is the same as the original seed"):
        with npu.graph(npu.NPUGraph()):
            npu.manual_seed(1)
    before = npu.get_rng_state()
    work = torch.zeros(1)
    with npu.graph(npu.NPUGraph()):
        npu.manual_seed(0)
        work.add_(1.0)  # a graph must hold device work (an empty one is refused)
    assert torch.equal(npu.get_rng_state(), before)


def test_each_replay_draws_fresh_numbers_and_the_capture_draws_none(npu):
    """The offset advances per replay: replay k equals the k-th eager draw from the same seed."""
    npu.manual_seed(7)
    eager = [torch.randn(16) for _ in range(3)]

    npu.manual_seed(7)
    graph = npu.NPUGraph(allow_rng=True)
    buf = torch.empty(16)
    with npu.graph(graph):
        buf.copy_(torch.randn_like(buf))
    assert torch.equal(torch.randn(16), eager[0])  # the capture consumed nothing
    npu.manual_seed(7)
    seen = []
    for _ in range(3):
        graph.replay()
        npu.synchronize()
        seen.append(buf.clone())
    assert all(torch.equal(s, e) for s, e in zip(seen, eager))
    assert not torch.equal(seen[0], seen[1])


def test_register_generator_state_under_inference_mode(npu):
    """test_register_generator_state_under_inference_mode (deprecated no-op under lazy registration)."""
    generator = torch.Generator()
    generator.manual_seed(0)
    graph = npu.NPUGraph(allow_rng=True)
    with torch.inference_mode(), pytest.warns(DeprecationWarning, match="register_generator_state"):
        graph.register_generator_state(generator)
    with npu.graph(graph):
        graph_out = torch.rand(8, generator=generator)
    eager_ref = torch.rand(8, generator=torch.Generator().manual_seed(0))
    generator.manual_seed(0)
    graph.replay()
    npu.synchronize()
    assert torch.equal(graph_out, eager_ref)
    graph.replay()  # a second replay continues the generator's stream
    npu.synchronize()
    gen = torch.Generator().manual_seed(0)
    torch.rand(8, generator=gen)
    assert torch.equal(graph_out, torch.rand(8, generator=gen))


def test_unregistered_generator_raises_under_explicit_registration(npu, monkeypatch):
    """Before torch_npu 42c2f77d7 a generator had to be registered before capture_begin."""
    monkeypatch.setattr(rng, "REGISTRATION", "explicit")
    generator = torch.Generator().manual_seed(0)
    with pytest.raises(CaptureError, match="generator is not registered with the capturing graph"):
        with npu.graph(npu.NPUGraph(allow_rng=True)):
            torch.rand(8, generator=generator)
    graph = npu.NPUGraph(allow_rng=True)
    graph.register_generator_state(generator)  # no deprecation warning in the older rule
    with npu.graph(graph):
        out = torch.rand(8, generator=generator)
    generator.manual_seed(0)
    graph.replay()
    npu.synchronize()
    assert torch.equal(out, torch.rand(8, generator=torch.Generator().manual_seed(0)))


def test_graph_rng_concurrent_replay_on_different_streams(npu):
    """test_graph_rng_concurrent_replay_on_different_streams: each graph takes its turn of the stream."""
    npu.manual_seed(1234)
    ref0, ref1 = torch.randn(64), torch.randn(64)
    npu.manual_seed(1234)
    g0, g1 = npu.NPUGraph(allow_rng=True), npu.NPUGraph(allow_rng=True)
    s_cap = npu.Stream()
    buf0, buf1 = torch.empty(64), torch.empty(64)
    for g, buf in ((g0, buf0), (g1, buf1)):
        with npu.stream(s_cap):
            g.capture_begin()
            buf.copy_(torch.randn_like(buf))
            g.capture_end()
        npu.current_stream().wait_stream(s_cap)
    s0, s1 = npu.Stream(), npu.Stream()
    buf0.zero_()
    buf1.zero_()
    for s in (s0, s1):  # the replays come after the zeroing: a device orders streams only this way
        s.wait_stream(npu.current_stream())
    with npu.stream(s0):
        g0.replay()
    with npu.stream(s1):
        g1.replay()
    npu.synchronize()
    assert torch.equal(buf0, ref0) and torch.equal(buf1, ref1)


def test_graph_rng_reset_recapture(npu):
    """test_graph_rng_reset_recapture."""
    npu.manual_seed(4321)
    ref = torch.randn(8)
    npu.manual_seed(4321)
    stream = npu.Stream()
    buf = torch.empty(8)
    graph = npu.NPUGraph(allow_rng=True)
    with npu.stream(stream):
        graph.capture_begin()
        buf.copy_(torch.randn_like(buf))
        graph.capture_end()
    graph.reset()
    npu.manual_seed(4321)
    graph = npu.NPUGraph(allow_rng=True)
    with npu.stream(stream):
        graph.capture_begin()
        buf.copy_(torch.randn_like(buf))
        graph.capture_end()
    buf.zero_()
    graph.replay()
    npu.synchronize()
    assert torch.equal(buf, ref)


def test_random_ops_without_allow_rng_still_refuse_the_capture(npu):
    """The older rule (before torch_npu v2.11.0-26.1.0), kept as the graph's allow_rng=False."""
    with pytest.raises(CaptureError, match="draws random numbers"):
        with npu.graph(npu.NPUGraph()):
            torch.rand(3, generator=torch.Generator())
