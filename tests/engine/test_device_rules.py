"""The torch_npu rules that changed between releases, as engine options (``DeviceRules``).

Modelled on torch_npu's own tests: ``test_graph_rng_after_failed_capture``
(``test/npu/test_aclgraph_rng_state.py``, master and the v2.12.0 branch) and the random ops in a
default ``NPUGraph`` capture (commit 8b8d865aa, v2.11.0 and later).
"""

from __future__ import annotations

import pytest
import torch

from harness.engine import CaptureError, DeviceRules
from harness.engine.emulated import rng

# Tensors these tests make live on the emulated NPU, as the pipeline's do (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("on_npu")

OLD = DeviceRules()  # the emulator's historical rules (torch_npu 2.10 and earlier)
NEW = DeviceRules(rng_in_capture=True, capture_survives_rejected_sync=True, generator_registration="lazy")


def _capture_after_rejected_item(npu):
    stream = npu.Stream()
    graph = npu.NPUGraph()
    x = torch.ones(1)
    with npu.stream(stream):
        graph.capture_begin()
        with pytest.raises(CaptureError, match="operation not permitted when stream is capturing"):
            (x + 1).item()
        graph.capture_end()
    return graph


def test_capture_end_after_a_rejected_item_succeeds_on_newer_torch_npu(npu):
    npu.reset_device(rules=NEW)
    _capture_after_rejected_item(npu)
    # capture again on the same stream: a default graph now accepts random ops
    stream, graph, buf = npu.Stream(), npu.NPUGraph(), torch.empty(4)
    with npu.stream(stream):
        graph.capture_begin()
        buf.copy_(torch.randn_like(buf))
        graph.capture_end()
    buf.zero_()
    graph.replay()
    npu.synchronize()
    assert not torch.equal(buf, torch.zeros(4))


def test_capture_end_after_a_rejected_item_is_invalidated_on_older_torch_npu(npu):
    npu.reset_device(rules=OLD)
    with pytest.raises(CaptureError, match="invalidated by an earlier error"):
        _capture_after_rejected_item(npu)


@pytest.mark.parametrize("rules, allowed", [(OLD, False), (NEW, True)])
def test_random_ops_in_a_default_capture_follow_the_release(npu, rules, allowed):
    npu.reset_device(rules=rules)
    graph = npu.NPUGraph()
    if not allowed:
        with pytest.raises(CaptureError, match="random"):
            with npu.graph(graph):
                torch.rand(3)
        graph = npu.NPUGraph(allow_rng=True)  # an explicit choice still wins
    with npu.graph(graph):
        out = torch.rand(3)
    graph.replay()
    npu.synchronize()
    assert not out.isnan().any()


def test_generator_registration_follows_the_release(npu):
    npu.reset_device(rules=DeviceRules(generator_registration="explicit"))
    assert rng.REGISTRATION == "explicit"
    npu.reset_device(rules=NEW)
    assert rng.REGISTRATION == "lazy"
    npu.reset_device()
    assert rng.REGISTRATION == "lazy"
