import pytest
import torch

from harness.model import DecoderLM, ModelConfig, PagedKVCache, build_model, make_eager_attend
from harness.model.kernels import row_linear
from model_helpers import SMALL, make_batch, run_batch, small_model, tiny_reference_fia

KINDS = ["random", "canary"]
DTYPES = ["float32", "bfloat16"]


def _mixed_batch(cache):
    """A prefill (7 tokens) and a chunk continuing an existing request (3 tokens at pos 5)."""
    cache.allocator.allocate("b", 5)
    return [("a", [3, 1, 4, 1, 5, 9, 2], 0), ("b", [6, 5, 3], 5)]


def _prime(model, cache):
    """Fill request b's first 5 positions."""
    b = make_batch(cache, [("b", [2, 7, 1, 8, 2], 0)])
    run_batch(model, cache, b)


@pytest.mark.parametrize("kind", KINDS)
def test_same_seed_bitwise_same(kind):
    m1, m2 = small_model(kind, seed=3), small_model(kind, seed=3)
    for (n1, p1), (n2, p2) in zip(m1.state_dict().items(), m2.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2), n1
    outs = []
    for m in (m1, m2):
        cache = PagedKVCache(m.config)
        outs.append(run_batch(m, cache, make_batch(cache, [("a", [1, 2, 3, 4], 0)])))
    assert outs[0].dtype == torch.float32 and outs[0].shape == (4, SMALL["vocab_size"])
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("kind", KINDS)
def test_different_seed_differs(kind):
    a, b = small_model(kind, seed=0).state_dict(), small_model(kind, seed=1).state_dict()
    assert any(not torch.equal(a[k], b[k]) for k in a)


def test_global_rng_untouched():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    small_model("random")
    small_model("canary")
    assert torch.equal(before, torch.get_rng_state())


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_forward_equals_pieces(kind, dtype):
    model = small_model(kind, dtype)
    assert model.num_pieces == model.config.num_layers + 1
    caches, outs = [], []
    for mode in ("forward", "pieces"):
        cache = PagedKVCache(model.config)
        _prime(model, cache)
        batch = make_batch(cache, _mixed_batch(cache))
        attend = make_eager_attend(model.config, batch.cum_q, batch.kv_lens, batch.block_table)
        args = (batch.positions, batch.slot_mapping, cache)
        if mode == "forward":
            out = model(batch.input_ids, *args, attend)
        else:
            o = model.piece(0, (batch.input_ids,), *args)
            assert len(o) == 2 and o[0].shape == (10, model.config.num_heads, model.config.head_dim)
            for i in range(model.config.num_layers):
                a = attend(i, o[0], cache.key_cache[i], cache.value_cache[i])
                o = model.piece(i + 1, (a, o[1]), *args)
            assert len(o) == 1
            out = o[0]
        caches.append(cache)
        outs.append(out)
    assert torch.equal(outs[0], outs[1])
    for k0, k1 in zip(caches[0].key_cache + caches[0].value_cache, caches[1].key_cache + caches[1].value_cache):
        assert torch.equal(k0, k1)


def test_piece_index_checked():
    model = small_model()
    cache = PagedKVCache(model.config)
    with pytest.raises(IndexError):
        model.piece(3, (), torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long), cache)


def test_row_linear_batch_invariant():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(96, 64, generator=g)
    x = torch.randn(40, 64, generator=g)
    full = row_linear(x, w)
    for t in (1, 2, 3, 5, 7, 8, 13):
        assert torch.equal(row_linear(x[:t], w), full[:t])
    torch.testing.assert_close(full, x @ w.t(), rtol=1e-5, atol=1e-5)


_BATCH_SIZES = [*range(1, 71), 127, 128, 129, 255, 256, 257, 511, 512, 513]


def _prefix_mismatches(linear, x, w, g) -> list[int]:
    """Batch sizes T where rows 0..T-1 of ``linear`` differ from the same rows computed in the
    600-row batch, with other rows behind them (the padding a bucket adds)."""
    full = linear(x, w)
    bad = []
    for t in _BATCH_SIZES:
        tail = torch.randn(t % 9, x.shape[1], generator=g).to(x.dtype)
        if not torch.equal(linear(torch.cat([x[:t], tail]), w)[:t], full[:t]):
            bad.append(t)
    return bad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("in_features, out_features", [(32, 32), (64, 96), (64, 512)])
def test_row_linear_bitwise_invariant_across_batch_sizes(dtype, in_features, out_features):
    """Row i's result is bitwise the same for every T > i and whatever rows follow it."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(out_features, in_features, generator=g).to(dtype)
    x = torch.randn(600, in_features, generator=g).to(dtype)
    assert _prefix_mismatches(row_linear, x, w, g) == []
    full = row_linear(x, w)
    assert full.dtype == dtype and full.shape == (600, out_features)
    torch.testing.assert_close(full.float(), x.float() @ w.float().t(), rtol=2e-2, atol=2e-2)


def test_invariance_check_catches_a_plain_gemm():
    """The control: the same check fails for F.linear, whose rows change with T on CPU."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(96, 64, generator=g)
    x = torch.randn(600, 64, generator=g)
    if not _prefix_mismatches(torch.nn.functional.linear, x, w, g):
        pytest.skip("this CPU's GEMM happens to be batch-invariant for these shapes")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("real, padded", [(5, 8), (10, 16), (37, 64)])
def test_padding_invariance(kind, dtype, real, padded):
    """Real rows' logits and real cache blocks are bitwise the same with slot -1 padding."""
    model = small_model(kind, dtype)
    logits, caches = [], []
    for pad_to in (None, padded):
        cache = PagedKVCache(model.config)
        _prime(model, cache)
        if real == 5:
            reqs = [("a", [3, 1], 0), ("b", [6, 5, 3], 5)]
        else:
            reqs = [("a", list(range(1, real - 2)), 0), ("b", [6, 5, 3], 5)]
        batch = make_batch(cache, reqs, pad_to=pad_to)
        assert batch.num_tokens == (pad_to or real)
        logits.append(run_batch(model, cache, batch))
        caches.append(cache)
    assert torch.equal(logits[0], logits[1][:real]), (logits[0] - logits[1][:real]).abs().max()
    for t0, t1 in zip(caches[0].key_cache + caches[0].value_cache, caches[1].key_cache + caches[1].value_cache):
        assert torch.equal(t0[1:], t1[1:])  # only the null block may differ


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_prefill_then_decode_matches_full_prefill(kind, dtype):
    model = small_model(kind, dtype)
    seq = [11, 7, 200, 3, 5, 9, 42, 17, 8, 1, 77, 31]
    split = 5
    c1 = PagedKVCache(model.config)
    run_batch(model, c1, make_batch(c1, [("r", seq[:split], 0)]))
    for p in range(split, len(seq)):
        last = run_batch(model, c1, make_batch(c1, [("r", [seq[p]], p)]))[-1]
    c2 = PagedKVCache(model.config)
    full = run_batch(model, c2, make_batch(c2, [("r", seq, 0)]))[-1]
    if dtype == "float32":
        torch.testing.assert_close(last, full, rtol=1e-5, atol=1e-5)
    else:
        torch.testing.assert_close(last, full, rtol=0.05, atol=0.05)
    assert int(last.argmax()) == int(full.argmax())


@pytest.mark.parametrize("kind", KINDS)
def test_bf16_finite_and_close_to_fp32(kind):
    m32, m16 = small_model(kind, "float32"), small_model(kind, "bfloat16")
    assert all(p.dtype == torch.bfloat16 for p in m16.parameters())
    outs = []
    for m in (m32, m16):
        cache = PagedKVCache(m.config)
        assert cache.key_cache[0].dtype == m.config.torch_dtype
        outs.append(run_batch(m, cache, make_batch(cache, [("a", list(range(40)), 0)])))
    assert outs[1].dtype == torch.float32 and torch.isfinite(outs[1]).all()
    assert torch.isfinite(outs[0]).all()
    if kind == "canary":
        assert torch.equal(outs[0].argmax(-1), outs[1].argmax(-1))


def test_matches_private_reference_attention():
    model = small_model("random")
    outs = []
    for fia in (None, tiny_reference_fia):
        cache = PagedKVCache(model.config)
        _prime(model, cache, ) if fia is None else run_batch(model, cache, make_batch(cache, [("b", [2, 7, 1, 8, 2], 0)]), fia=fia)
        outs.append(run_batch(model, cache, make_batch(cache, _mixed_batch(cache)), fia=fia))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-4, atol=1e-4)


def test_stale_kv_lengths_change_random_logits():
    model = small_model("random")
    cache = PagedKVCache(model.config)
    run_batch(model, cache, make_batch(cache, [("r", [1, 2, 3, 4, 5, 6], 0)]))
    batch = make_batch(cache, [("r", [7], 6)])
    good = run_batch(model, cache, batch)
    batch.kv_lens = [4]
    stale = run_batch(model, cache, batch)
    assert not torch.equal(good, stale)
