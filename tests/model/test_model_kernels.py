"""The decoder's fused kernels: each is one op, bitwise its Python composite, one node in a graph."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from harness.engine.emulated.recorder import OpNode
from harness.model import kernels
from harness.model.kv_cache import PagedKVCache, write_kv
from model_helpers import small_model


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 5, 8, 13])
def test_each_op_is_bitwise_its_python_composite(dtype, rows):
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 32, generator=g).to(dtype)
    w = torch.randn(48, 32, generator=g).to(dtype)
    norm_w = (1 + 0.1 * torch.randn(32, generator=g)).to(dtype)
    assert torch.equal(torch.ops.harness.row_linear(x, w), kernels.row_linear(x, w))
    assert torch.equal(torch.ops.harness.rms_norm(x, norm_w, 1e-6), kernels.rms_norm(x, norm_w, 1e-6))
    gate_up = torch.randn(rows, 96, generator=g).to(dtype)
    gate, up = gate_up[:, :48], gate_up[:, 48:]
    assert torch.equal(torch.ops.harness.silu_and_mul(gate_up), F.silu(gate) * up)


def test_reshape_and_cache_writes_the_caches_in_place_as_write_kv():
    g = torch.Generator().manual_seed(0)
    caches = [torch.zeros(4, 4, 2, 8) for _ in range(4)]
    key, value = torch.randn(2, 3, 2, 8, generator=g).unbind(0)
    slots = torch.tensor([5, -1, 9])
    torch.ops.harness.reshape_and_cache(key, value, caches[0], caches[1], slots)
    write_kv(caches[2], caches[3], key, value, slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    assert torch.equal(caches[0].view(-1, 2, 8)[5], key[0])


@pytest.mark.parametrize("op, args", [
    ("row_linear", lambda: (torch.randn(5, 16), torch.randn(24, 16))),
    ("rms_norm", lambda: (torch.randn(5, 16), torch.ones(16), 1e-6)),
    ("silu_and_mul", lambda: (torch.randn(5, 32),)),
])
def test_fake_kernels_give_the_real_outputs_shape_stride_and_dtype(op, args):
    values = args()
    real = getattr(torch.ops.harness, op)(*values)
    metas = [v.to("meta") if isinstance(v, torch.Tensor) else v for v in values]
    fake = getattr(torch.ops.harness, op)(*metas)
    assert (fake.shape, fake.stride(), fake.dtype) == (real.shape, real.stride(), real.dtype)


def test_a_captured_decoder_layer_records_each_fused_kernel_as_one_node(npu):
    """No GEMM, pad or norm arithmetic leaks into the tape as separate aten nodes."""
    model = small_model().to(npu.device)
    cache = PagedKVCache(model.config, npu.device)
    t = 5
    residual = torch.randn(t, model.config.hidden_size, device=npu.device)
    slots = torch.arange(16, 16 + t, device=npu.device)
    attn_out = torch.randn(t, model.layers[0].num_heads, model.layers[0].head_dim, device=npu.device)
    graph = npu.NPUGraph()
    with npu.graph(graph):
        model.layers[0].pre_attention(residual, slots, cache)
        model.layers[0].post_attention(attn_out, residual)
    names = [n.name for n in graph.nodes if isinstance(n, OpNode) and n.kind not in ("view", "allocation")]
    # one fused q/k/v projection and one fused gate/up projection, as vLLM's layers launch them
    assert names == ["harness::rms_norm", "harness::row_linear", "harness::reshape_and_cache",  # pre-attention
                     "harness::row_linear", "aten::add.Tensor", "harness::rms_norm",  # o_proj, residual, norm
                     "harness::row_linear", "harness::silu_and_mul", "harness::row_linear", "aten::add.Tensor"]


def test_opcheck():
    """torch.library's own checks of each op: schema (mutation annotations), fake kernel,
    autograd registration, AOT dispatch. Inference-only ops: no input requires grad."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 16, generator=g)
    torch.library.opcheck(torch.ops.harness.row_linear.default, (x, torch.randn(24, 16, generator=g)))
    torch.library.opcheck(torch.ops.harness.rms_norm.default, (x, torch.ones(16), 1e-6))
    torch.library.opcheck(torch.ops.harness.silu_and_mul.default, (torch.randn(5, 32, generator=g),))
    key, value = torch.randn(2, 3, 2, 8, generator=g).unbind(0)
    torch.library.opcheck(torch.ops.harness.reshape_and_cache.default,
                          (key, value, torch.zeros(4, 4, 2, 8), torch.zeros(4, 4, 2, 8), torch.tensor([5, -1, 9])))
