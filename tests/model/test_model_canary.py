import pytest
import torch

from harness.model import (
    ModelConfig,
    PagedKVCache,
    build_model,
    expected_next_token,
    generate_greedy,
    longest_repeat_run,
    position_code,
    repetition_score,
)
from model_helpers import make_batch, run_batch

DTYPES = ["float32", "bfloat16"]


def test_repetition_metrics():
    assert repetition_score([]) == 0.0 and repetition_score([4]) == 0.0
    assert repetition_score([1, 2, 3, 4]) == 0.0
    assert repetition_score([7, 7, 7, 7]) == 1.0
    assert repetition_score([1, 2, 2, 2, 3]) == 0.5
    assert longest_repeat_run([]) == 0
    assert longest_repeat_run([1, 2, 3]) == 1
    assert longest_repeat_run([1, 2, 2, 2, 3, 3]) == 3


def test_position_code():
    assert position_code([0, 5], 3).tolist() == [[-1, -1, -1], [1, -1, 1]]


@pytest.mark.parametrize("dtype", DTYPES)
def test_counts_up_over_full_range(dtype):
    """Default canary (max_model_len 512): from a 3-token prompt to the last position."""
    model = build_model(ModelConfig.canary(dtype=dtype))
    cfg = model.config
    prompt = [17, 400, 9]
    steps = cfg.max_model_len - len(prompt) + 1
    toks, logits = generate_greedy(model, prompt, steps, return_logits=True)
    assert len(toks) == steps
    assert toks == [expected_next_token(p, cfg) for p in range(len(prompt) - 1, cfg.max_model_len)]
    assert repetition_score(toks) == 0.0 and longest_repeat_run(toks) == 1
    # robust margin between the winner and the runner-up at every step
    top2 = torch.stack(logits).topk(2, dim=-1).values
    assert float((top2[:, 0] - top2[:, 1]).min()) > 2.0


@pytest.mark.parametrize("dtype", DTYPES)
def test_stale_kv_lengths_repeat(dtype):
    model = build_model(ModelConfig.canary(dtype=dtype))
    prompt = [5, 6, 7, 8]
    toks = generate_greedy(model, prompt, 40, stale_kv_lengths=True)
    # prefill emits len(prompt); the first decode sees the right length (frozen from then on)
    assert toks[:2] == [4, 5] and set(toks[1:]) == {5}
    assert repetition_score(toks) > 0.95
    assert longest_repeat_run(toks) == 39


def test_output_ignores_token_ids():
    model = build_model(ModelConfig.canary(max_model_len=128, vocab_size=128, num_blocks=17))
    a = generate_greedy(model, [1, 2, 3], 20)
    b = generate_greedy(model, [90, 0, 64], 20)
    assert a == b == list(range(3, 23))


def test_vocab_wrap_at_end():
    """vocab == max_model_len: the last position emits token 0, still no repeat."""
    cfg = ModelConfig.canary(max_model_len=64, vocab_size=64, block_size=8, num_blocks=9)
    model = build_model(cfg)
    toks = generate_greedy(model, list(range(60)), 10)  # stops at the last position
    assert toks == [60, 61, 62, 63, 0]
    assert repetition_score(toks) == 0.0


@pytest.mark.parametrize("dtype", DTYPES)
def test_batched_requests_count_independently(dtype):
    """Two requests at different lengths decoded together; one stale -> only it repeats."""
    model = build_model(ModelConfig.canary(dtype=dtype, max_model_len=256, vocab_size=256, num_blocks=40))
    cache = PagedKVCache(model.config)
    run_batch(model, cache, make_batch(cache, [("a", [1] * 10, 0), ("b", [2] * 30, 0)]))
    lens = {"a": 10, "b": 30}
    out = {"a": [], "b": []}
    stale_b = None
    for step in range(20):
        batch = make_batch(cache, [("a", [0], lens["a"]), ("b", [0], lens["b"])])
        if stale_b is None:
            stale_b = batch.kv_lens[1]
        batch.kv_lens[1] = stale_b  # request b keeps its first-step KV length
        logits = run_batch(model, cache, batch)
        for i, r in enumerate(("a", "b")):
            out[r].append(int(logits[i].argmax()))
            lens[r] += 1
    assert out["a"] == list(range(11, 31)) and repetition_score(out["a"]) == 0.0
    assert out["b"] == [31] * 20 and repetition_score(out["b"]) == 1.0


@pytest.mark.parametrize("num_layers", [1, 3])
def test_other_shapes(num_layers):
    cfg = ModelConfig.canary(num_layers=num_layers, hidden_size=96, num_heads=8, num_kv_heads=1,
                             head_dim=12, vocab_size=1000, max_model_len=1000, block_size=32,
                             num_blocks=40, seed=7)
    model = build_model(cfg)
    toks = generate_greedy(model, list(range(900)), 30)
    assert toks == list(range(900, 930))
    stale = generate_greedy(model, list(range(900)), 30, stale_kv_lengths=True)
    assert repetition_score(stale) > 0.95
