import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from harness.model import (
    NULL_BLOCK,
    SCRATCH_SLOT,
    BlockAllocator,
    ModelConfig,
    OutOfBlocksError,
    PagedKVCache,
    make_block_table,
    write_kv,
)


def test_allocator_deterministic_and_reuses_lowest():
    a = BlockAllocator(num_blocks=10, block_size=4)
    assert a.allocate("x", 5) == [1, 2]
    assert a.allocate("y", 1) == [3]
    assert a.allocate("x", 9) == [1, 2, 4]  # extended, never shrunk
    assert a.allocate("x", 2) == [1, 2, 4]
    a.free("x")
    assert a.allocate("z", 12) == [1, 2, 4]
    assert a.slot("z", 0) == 4 and a.slot("z", 9) == 4 * 4 + 1
    with pytest.raises(IndexError):
        a.slot("z", 12)
    with pytest.raises(OutOfBlocksError):
        a.allocate("w", 100)
    b = BlockAllocator(num_blocks=10, block_size=4)
    for op in (("x", 5), ("y", 1), ("x", 9)):
        b.allocate(*op)
    b.free("x")
    assert b.allocate("z", 12) == [1, 2, 4]
    assert NULL_BLOCK not in sum((a.blocks(r) for r in ("y", "z")), [])


def test_block_table_zero_rows():
    a = BlockAllocator(num_blocks=10, block_size=4)
    a.allocate("x", 5)
    t = a.block_table(["x"], 4, num_rows=3)
    assert t.dtype == torch.int32 and t.shape == (3, 4)
    assert t.tolist() == [[1, 2, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
    assert make_block_table([[3], []], 2).tolist() == [[3, 0], [0, 0]]


def _cache(dtype="float32"):
    cfg = ModelConfig(num_blocks=6, block_size=4, num_kv_heads=2, head_dim=8, dtype=dtype)
    return cfg, PagedKVCache(cfg)


def test_cache_shapes_and_write():
    cfg, cache = _cache()
    ptrs = cache.data_ptrs()
    assert cache.key_cache[0].shape == (6, 4, 2, 8)
    k = torch.randn(5, 2, 8)
    v = torch.randn(5, 2, 8)
    slots = torch.tensor([4, 5, -1, 9, -1])
    cache.write(1, k, v, slots)
    flat_k = cache.key_cache[1].view(-1, 2, 8)
    flat_v = cache.value_cache[1].view(-1, 2, 8)
    assert torch.equal(flat_k[4], k[0]) and torch.equal(flat_k[5], k[1])
    assert torch.equal(flat_k[9], k[3]) and torch.equal(flat_v[9], v[3])
    # slot -1 wrote only into the scratch slot of the null block
    written = {4, 5, 9, SCRATCH_SLOT}
    for s in range(flat_k.shape[0]):
        if s not in written:
            assert not flat_k[s].any() and not flat_v[s].any()
    assert flat_k[SCRATCH_SLOT].any()
    assert not cache.key_cache[0].any()  # other layer untouched
    assert cache.data_ptrs() == ptrs


def test_write_bf16_casts():
    cfg, cache = _cache("bfloat16")
    k = torch.randn(2, 2, 8)
    cache.write(0, k, k, torch.tensor([5, 6]))
    assert cache.key_cache[0].dtype == torch.bfloat16
    assert torch.equal(cache.key_cache[0].view(-1, 2, 8)[5], k[0].to(torch.bfloat16))


class _Recorder(TorchDispatchMode):
    """Minimal aten recorder: replay re-runs every op on the captured tensors."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.ops.append((func, args, kwargs, out))
        return out

    def replay(self):
        for func, args, kwargs, out in self.ops:
            new = func(*args, **kwargs)
            if isinstance(out, torch.Tensor) and new.data_ptr() != out.data_ptr():
                out.copy_(new)


def test_write_replays_under_dispatch_recorder():
    cfg, cache = _cache()
    k_buf = torch.zeros(3, 2, 8)
    v_buf = torch.zeros(3, 2, 8)
    slot_buf = torch.tensor([-1, -1, -1])
    rec = _Recorder()
    with rec:
        write_kv(cache.key_cache[0], cache.value_cache[0], k_buf, v_buf, slot_buf)
    cache.zero_()
    names = [str(f) for f, *_ in rec.ops]
    assert any("index_copy_" in n for n in names)
    for step in range(3):
        k_buf.copy_(torch.randn(3, 2, 8))
        v_buf.copy_(torch.randn(3, 2, 8))
        slot_buf.copy_(torch.tensor([4 + step, -1, 12 + step]))
        rec.replay()
        flat_k = cache.key_cache[0].view(-1, 2, 8)
        flat_v = cache.value_cache[0].view(-1, 2, 8)
        assert torch.equal(flat_k[4 + step], k_buf[0]) and torch.equal(flat_v[12 + step], v_buf[2])
        assert torch.equal(flat_k[SCRATCH_SLOT], k_buf[1])
