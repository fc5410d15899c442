"""A CPU-only guard for what a GPU refuses: a host tensor made inside the harness's kernels or
model code, beside device tensors.

The emulated NPU catches host/device mixing in everything the pipeline issues, but its custom
ops' kernels (FIA, the model's fused kernels) run on the device tensors' host data, where a host
tensor made inside a kernel goes unseen; so does the CUDA-only kernel of the device-metadata
attention. Here they run on fake device tensors (``FakeTensorMode``: shapes and devices without
memory, on a CPU-only torch), where a tensor made on the host meets the device tensors and
raises, as on a GPU. The first H200 run met exactly such a tensor: the causal mask of
``harness/ops/reference.py``, made on the host ("expected self and mask to be on the same
device, but got mask on cpu and self on cuda:0").
"""

from __future__ import annotations

import functools

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from harness.engine import load
from harness.model import ModelConfig, build_model, make_eager_attend
from harness.model import kernels
from harness.model.kv_cache import PagedKVCache
from harness.ops import library, reference

CUDA = load("emulated").device  # a device that is not the host (the emulated NPU's type)
T, N, NKV, D, BLOCKS, BS = 6, 4, 2, 16, 8, 4
CUM_Q, KV = [2, 5, 6], [5, 3, 9]  # a prefill of 2 (causal mask), a chunk of 3, a decode token


@pytest.fixture
def fake_cuda():
    """Fake device tensors; the reference's mask cache is emptied around it (it holds tensors)."""
    reference._causal_hidden.cache_clear()
    with FakeTensorMode() as mode:
        yield mode
    reference._causal_hidden.cache_clear()


def _on_cuda(mode: FakeTensorMode, values: list, dtype: torch.dtype) -> torch.Tensor:
    """A fake device tensor of known values' shape (a fake mode makes no device tensor from data)."""
    return mode.from_tensor(torch.tensor(values, dtype=dtype, device="cpu")).to(CUDA)


def _attention_inputs(mode: FakeTensorMode):
    query = torch.randn(T, N, D, device=CUDA)
    key, value = (torch.randn(BLOCKS, BS, NKV, D, device=CUDA) for _ in range(2))
    block_table = _on_cuda(mode, [[1, 2, 0], [3, 0, 0], [4, 5, 6]], torch.int32)
    return query, key, value, block_table


def test_the_host_list_fia_kernel_makes_nothing_on_the_host(fake_cuda):
    query, key, value, block_table = _attention_inputs(fake_cuda)
    out, lse = library._fia_kernel(query, key, value, actual_seq_lengths=CUM_Q, actual_seq_lengths_kv=KV,
                                   block_table=block_table, block_size=BS, num_heads=N, num_key_value_heads=NKV,
                                   scale=0.25, sparse_mode=3, softmax_lse_flag=True)
    assert out.device == lse.device == CUDA


def test_the_device_metadata_kernels_make_nothing_on_the_host(fake_cuda):
    query, key, value, block_table = _attention_inputs(fake_cuda)
    starts = _on_cuda(fake_cuda, [0, *CUM_Q, 6], torch.int32)
    seq_lens = _on_cuda(fake_cuda, [*KV, 0], torch.int32)
    table = torch.cat([block_table, torch.zeros(1, 3, dtype=torch.int32, device=CUDA)])
    out, lse = library._device_metadata_kernel_sync_free(
        query, key, value, starts, seq_lens, table, block_size=BS, num_heads=N, num_key_value_heads=NKV,
        scale=0.25, max_num_reqs=4)  # the CUDA kernel, which only a GPU runs otherwise
    assert out.device == lse.device == CUDA


def test_the_model_and_its_kernels_make_nothing_on_the_host(fake_cuda):
    x, w = torch.randn(5, 32, device=CUDA), torch.randn(24, 32, device=CUDA)
    assert kernels.row_linear(x, w).device == CUDA
    assert kernels.rms_norm(x, torch.ones(32, device=CUDA), 1e-6).device == CUDA
    assert kernels.silu_and_mul(x).device == CUDA
    config = ModelConfig(kind="random", num_layers=2, max_model_len=64, num_blocks=16)
    with torch._subclasses.fake_tensor.unset_fake_temporarily():
        model = build_model(config)  # weights are made on the host, then copied to the device
    for module in model.modules():
        for name, param in module._parameters.items():
            module._parameters[name] = torch.nn.Parameter(fake_cuda.from_tensor(param).to(CUDA), requires_grad=False)
    cache = PagedKVCache(config, CUDA)
    table = _on_cuda(fake_cuda, [[1, 2], [3, 0]], torch.int32)
    attend = make_eager_attend(config, [3, 4], [3, 1], table)
    ids, positions, slots = (_on_cuda(fake_cuda, v, torch.int64) for v in ([5, 6, 7, 8], [0, 1, 2, 0], [16, 17, 18, 48]))
    logits = model(ids, positions, slots, cache, attend)
    assert logits.device == CUDA and tuple(logits.shape) == (4, config.vocab_size)


def test_the_guard_fails_on_the_host_mask_of_the_first_gpu_run(fake_cuda, monkeypatch):
    """The mask as the H200 run found it (made on the host): the guard raises, as the GPU did."""

    @functools.lru_cache(maxsize=None)
    def host_mask(q_len: int, kv_len: int, device: torch.device) -> torch.Tensor:
        del device  # the bug: the mask ignores the scores' device
        last_visible = torch.arange(q_len).unsqueeze(1) + (kv_len - q_len)
        return torch.arange(kv_len).unsqueeze(0) > last_visible

    monkeypatch.setattr(reference, "_causal_hidden", host_mask)
    query, key, value, block_table = _attention_inputs(fake_cuda)
    with pytest.raises(RuntimeError, match="on the same device, but found at least two devices, npu:0 and cpu"):
        library._fia_kernel(query, key, value, actual_seq_lengths=CUM_Q, actual_seq_lengths_kv=KV,
                            block_table=block_table, block_size=BS, num_heads=N, num_key_value_heads=NKV,
                            scale=0.25, sparse_mode=3, softmax_lse_flag=True)
