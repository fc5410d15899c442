"""The new op forms in captured graphs on the emulator: capture, update, replay == eager (bitwise).

* FIA with the flat 3-D paged KV view, and dense BNSD, through vLLM Ascend's per-layer pattern
  (event wait/reset, task group, update on an update stream);
* ``_npu_paged_attention``: host ``context_lens`` frozen at capture and refreshed by a task-group
  update (vLLM Ascend's decode path) or by ``NPUGraph.update`` (torch_npu's
  test_paged_attention_aclgraph_update); the device-read variant needs no update.
"""

from __future__ import annotations

import math

import pytest
import torch

from harness.ops import (
    get_max_workspace,
    npu_fused_infer_attention_score,
    npu_fused_infer_attention_score_out,
    npu_paged_attention,
    npu_paged_attention_device_lens,
    paged_attention_get_workspace,
    register_updatable_ops,
)

# Tensors these tests make live on the emulated NPU, as the pipeline's do (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("on_npu")


def _task_group_capture(npu, issue):
    """Capture ``issue()`` as vLLM Ascend does; return (graph, event, handle)."""
    g, event = npu.NPUGraph(), npu.ExternalEvent()
    with npu.graph(g):
        stream = npu.current_stream()
        event.wait(stream)
        event.reset(stream)
        npu.graph_task_group_begin(stream)
        issue()
        handle = npu.graph_task_group_end(stream)
    return g, event, handle


def _task_group_update(npu, handle, event, issue):
    stream = npu.Stream()
    with npu.stream(stream):
        npu.graph_task_update_begin(stream, handle)
        issue()
        npu.graph_task_update_end(stream)
        event.record(stream)


# --------------------------------------------------------------------------- FIA forms


def _paged_inputs(T=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    key = torch.randn(9, 4, 2, 8, generator=g)
    value = torch.randn(9, 4, 2, 8, generator=g)
    return torch.randn(T, 4, 8, generator=g), key, value, torch.tensor(
        [[1, 2, 3, 4], [5, 6, 7, 8], [8, 7, 6, 5]], dtype=torch.int32)


@pytest.mark.parametrize("layout", ["TND-flat-kv", "BNSD"])
def test_fia_form_capture_update_replay_equals_eager(npu, layout):
    if layout == "BNSD":
        g = torch.Generator().manual_seed(3)
        query, key, value = (torch.randn(3, 4, 5, 8, generator=g), torch.randn(3, 2, 6, 8, generator=g),
                             torch.randn(3, 2, 6, 8, generator=g))
        base = dict(num_heads=4, num_key_value_heads=2, scale=0.3, input_layout="BNSD", sparse_mode=3,
                    softmax_lse_flag=True)
        old, new = ([5, 1, 2], [6, 2, 3]), ([2, 5, 0], [4, 6, 1])  # per-batch (q, kv) lengths
    else:
        query, key4, value4, table = _paged_inputs()
        key, value = key4.view(9, 4, -1), value4.view(9, 4, -1)  # vLLM Ascend's flat view
        base = dict(block_table=table, block_size=4, num_heads=4, num_key_value_heads=2, scale=0.3,
                    input_layout="TND", sparse_mode=3, softmax_lse_flag=True)
        old, new = ([1, 2, 3], [5, 9, 2]), ([1, 2, 3], [16, 3, 11])  # cumulative q, per-request kv
    kw = lambda lens: dict(base, actual_seq_lengths=lens[0], actual_seq_lengths_kv=lens[1])  # noqa: E731
    eager_old = npu_fused_infer_attention_score(query, key, value, **kw(old))
    eager_new = npu_fused_infer_attention_score(query, key, value, **kw(new))
    assert not torch.equal(eager_old[0], eager_new[0])
    out = torch.empty_like(eager_old[0])
    lse = torch.empty_like(eager_old[1])
    ws = get_max_workspace(query, key, value, **kw(old))

    def issue(lens):
        return lambda: npu_fused_infer_attention_score_out(query, key, value, **kw(lens), workspace=ws, out=(out, lse))

    graph, event, handle = _task_group_capture(npu, issue(old))
    event.record(npu.Stream())  # no update: the capture-time lengths replay
    graph.replay()
    npu.synchronize()
    assert torch.equal(out, eager_old[0])
    graph.replay()
    _task_group_update(npu, handle, event, issue(new))
    npu.synchronize()
    assert torch.equal(out, eager_new[0]) and torch.equal(lse, eager_new[1])


# --------------------------------------------------------------------------- paged attention


def _pa(seed=1, B=4):
    g = torch.Generator().manual_seed(seed)
    table = torch.randperm(14, generator=g)[:12].view(B, 3).to(torch.int32)
    return dict(query=torch.randn(B, 4, 8, generator=g), key_cache=torch.randn(14, 4, 2, 8, generator=g),
                value_cache=torch.randn(14, 4, 2, 8, generator=g), num_kv_heads=2, num_heads=4,
                scale_value=1 / math.sqrt(8), block_table=table)


def _eager_pa(x, lens):
    out = torch.empty_like(x["query"])
    npu_paged_attention(**x, context_lens=torch.tensor(lens, dtype=torch.int32, device="cpu"), out=out)
    return out


OLD, NEW = [5, 1, 12, 3], [9, 4, 2, 11]


def test_paged_attention_task_group_update_of_context_lens(npu):
    """vLLM Ascend's decode: seq_lens (a CPU tensor) frozen at capture; the update re-issues it."""
    x = _pa()
    eager_old, eager_new = _eager_pa(x, OLD), _eager_pa(x, NEW)
    out = torch.empty_like(x["query"])
    seq_lens = torch.tensor(OLD, dtype=torch.int32, device="cpu")
    ws = paged_attention_get_workspace(x["query"], **{k: v for k, v in x.items() if k != "query"},
                                       context_lens=seq_lens, out=out)
    graph, event, handle = _task_group_capture(
        npu, lambda: npu_paged_attention(**x, context_lens=seq_lens, out=out, workspace=ws))
    seq_lens.copy_(torch.tensor(NEW, dtype=torch.int32, device="cpu"))  # host memory changed: the graph kept copies
    event.record(npu.Stream())
    graph.replay()
    npu.synchronize()
    assert torch.equal(out, eager_old)  # stale: the repeated-text bug of a missing update
    graph.replay()
    _task_group_update(npu, handle, event,
                       lambda: npu_paged_attention(**x, context_lens=seq_lens, out=out, workspace=ws))
    npu.synchronize()
    assert torch.equal(out, eager_new)


def test_paged_attention_npugraph_update_like_torch_npus_test(npu):
    """test_paged_attention_aclgraph_update: auto_dispatch_capture + update([{"context_lens": t}])."""
    register_updatable_ops(npu)
    x = _pa()
    out = torch.empty_like(x["query"])
    graph = npu.NPUGraph()
    with npu.graph(graph, stream=npu.Stream(), pool=None, auto_dispatch_capture=True):
        npu_paged_attention(**x, context_lens=torch.tensor(OLD, dtype=torch.int32, device="cpu"), out=out)
    graph.update(cpu_update_input=[{"context_lens": torch.tensor(OLD, dtype=torch.int32, device="cpu")}])
    graph.replay()
    npu.synchronize()
    assert torch.equal(out, _eager_pa(x, OLD))
    fresh = _pa(seed=2)  # new query / caches / table contents at the same addresses
    for name in ("query", "key_cache", "value_cache", "block_table"):
        x[name].copy_(fresh[name])
    graph.update(cpu_update_input=[{"context_lens": torch.tensor(NEW, dtype=torch.int32, device="cpu")}])
    graph.replay()
    npu.synchronize()
    assert torch.equal(out, _eager_pa(x, NEW))


def test_paged_attention_device_lens_needs_no_update(npu):
    x = _pa()
    lens = torch.tensor(OLD, dtype=torch.int32)  # device memory: the kernel reads it when it runs
    out = torch.empty_like(x["query"])
    graph = npu.NPUGraph()
    with npu.graph(graph):
        npu_paged_attention_device_lens(**x, context_lens=lens, out=out)
    lens.copy_(torch.tensor(NEW, dtype=torch.int32, device="cpu"))
    graph.replay()
    npu.synchronize()
    assert torch.equal(out, _eager_pa(x, NEW))
