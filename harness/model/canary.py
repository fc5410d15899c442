"""Canary weights: greedy output counts up with the attended KV length; stale lengths repeat.

Idea. Every layer's attention attends (sharply) to the LAST KV position it is allowed to see
and copies that position's binary code into the residual; the LM head maps "attended position
p" to token ``(p + 1) mod vocab``. A decode query at position ``p`` with correct FIA lengths sees
KV ``0..p`` (the cache already holds its own token), so it emits ``p + 1``: the generated text
counts up and never repeats. With ``actual_seq_lengths_kv`` frozen at a capture-time value
``n0`` every step attends to ``n0 - 1`` and emits ``n0`` again and again: literally repeated
text. The model never looks at the token ids for its argmax (they only feed a small random
part of the logits), so the output is a pure function of what attention was allowed to see.

Residual channels (``b = config.canary_bits = ceil(log2(max(vocab, max_model_len)))``):

* channel 0: constant bias ``1`` (every row of the position table carries it);
* channels ``1 .. b``: the token's own position ``p`` as a +-1 code (bit ``i`` set -> ``+1``);
* per layer ``l``: ``b`` channels receiving the code of the position that layer attended to;
* the rest: token channels, a seeded random +-1 sign pattern per token id.

Every channel has a fixed magnitude (``1``, or the layer's attention output magnitude), so
every row has exactly the same sum of squares and RMSNorm scales all rows by the same number:
keys/queries are exact (powers of two times one shared scale) in float32 AND bfloat16.

Attention of layer ``l`` (all heads identical, GQA-agnostic): query dim ``i < b`` reads the bias
channel with weight ``s_l * 2**i``; key and value dim ``i`` read own-position bit ``i`` with
weight 1. So ``q.k(j) = c * (2j - (2**b - 1))``: strictly increasing in the key position ``j``,
with a gap of ``~16..32`` logits between consecutive positions after the softmax scale, which
makes the softmax pick the last visible position (weight of the runner-up ``< e**-16``). The
value is the +-1 code of that position; o_proj sums the heads into the layer's channels.
The MLP has seeded random gate/up weights and a zero down projection (it runs, adds nothing,
and keeps row norms exact). The LM head row of token ``t`` is ``G * code((t - 1) mod vocab)``
on every layer's channels (runner-up logit gap ``2 * G * ...`` ~ 8) plus a random part on the
token channels bounded by a quarter of that gap.

Limits:

* positions ``0 .. max_model_len - 1`` with ``vocab_size >= max_model_len`` (validated), so
  the count never wraps inside a sequence; ``b <= 16``.
* Sharpness relies on attention scores computed in float32 (FIA and the harness reference
  upcast); bf16 *weights and activations* are fine because queries/keys are exact.
  Scores rounded to bf16 would blur positions beyond ~128.
* All layers copy the same code and their votes are summed: staleness in every layer gives
  repeats; staleness in only some layers changes the logits (caught by eager-vs-replay) but
  with >= 3 layers the correct layers outvote it.
* Repetition scores are meant for generated tokens only (prompt tokens are arbitrary).
* A stale KV length LARGER than the real one exposes not-yet-written slots (zero keys score 0,
  above the negative scores of low positions); the output is then still step-independent
  (repeats) as long as those slots hold zeros, but is not ``expected_next_token`` of anything.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from harness.model.config import ModelConfig


def position_code(values: Tensor | Sequence[int], bits: int) -> Tensor:
    """float32 ``[len(values), bits]``: bit ``i`` of each value as ``+1`` (set) or ``-1``."""
    v = torch.as_tensor(values, dtype=torch.int64).reshape(-1, 1)
    shifts = torch.arange(bits, dtype=torch.int64).reshape(1, -1)
    return ((v >> shifts) & 1).to(torch.float32) * 2.0 - 1.0


def _pow2_at_least(x: float) -> float:
    return 2.0 ** math.ceil(math.log2(x))


def _pow2_near(x: float) -> float:
    return 2.0 ** round(math.log2(x))


def canary_layout(config: ModelConfig) -> dict[str, object]:
    """Channel layout of the canary residual (for docs and tests)."""
    b, num_layers, h = config.canary_bits, config.num_layers, config.hidden_size
    layer_groups = [list(range(1 + b * (l + 1), 1 + b * (l + 2))) for l in range(num_layers)]
    token_start = 1 + b * (num_layers + 1)
    return {
        "bits": b,
        "bias": 0,
        "own_position": list(range(1, 1 + b)),
        "layers": layer_groups,
        "token": list(range(token_start, h)),
    }


def canary_state_dict(config: ModelConfig) -> dict[str, Tensor]:
    """float32 canary weights for :class:`~harness.model.decoder.DecoderLM` (deterministic)."""
    if config.kind != "canary":
        raise ValueError(f"canary_state_dict needs kind='canary', got {config.kind!r}")
    g = torch.Generator(device="cpu").manual_seed(config.seed)
    layout = canary_layout(config)
    b: int = layout["bits"]  # type: ignore[assignment]
    own: list[int] = layout["own_position"]  # type: ignore[assignment]
    groups: list[list[int]] = layout["layers"]  # type: ignore[assignment]
    tok: list[int] = layout["token"]  # type: ignore[assignment]
    h, n, nkv, d, m, vocab = (
        config.hidden_size,
        config.num_heads,
        config.num_kv_heads,
        config.head_dim,
        config.mlp_size,
        config.vocab_size,
    )
    scale = 1.0 / math.sqrt(d)
    eps = config.rms_norm_eps

    # Embeddings: bias + own position code; token sign patterns.
    embed_positions = torch.zeros(config.max_model_len, h)
    embed_positions[:, 0] = 1.0
    embed_positions[:, own] = position_code(range(config.max_model_len), b)
    embed_tokens = torch.zeros(vocab, h)
    signs = torch.randint(0, 2, (vocab, len(tok)), generator=g).to(torch.float32) * 2.0 - 1.0
    embed_tokens[:, tok] = signs

    state: dict[str, Tensor] = {
        "embed_tokens.weight": embed_tokens,
        "embed_positions.weight": embed_positions,
    }
    sum_sq = 1.0 + b + len(tok)  # per-row sum of squares of the residual entering layer 0
    kappas: list[float] = []
    for l in range(config.num_layers):
        p = f"layers.{l}."
        r = 1.0 / math.sqrt(sum_sq / h + eps)  # RMSNorm factor: the same for every row
        # consecutive-position score gap = 2 * scale * s * r^2, made >= 16 with a power of two
        s = _pow2_at_least(16.0 / (2.0 * scale * r * r))
        w_o = _pow2_near(1.0 / (n * r))  # attention-channel magnitude kappa = n * r * w_o ~ 1
        q = torch.zeros(n * d, h)
        k = torch.zeros(nkv * d, h)
        v = torch.zeros(nkv * d, h)
        o = torch.zeros(h, n * d)
        for head in range(n):
            for i in range(b):
                q[head * d + i, 0] = s * 2.0**i
                o[groups[l][i], head * d + i] = w_o
        for head in range(nkv):
            for i in range(b):
                k[head * d + i, own[i]] = 1.0
                v[head * d + i, own[i]] = 1.0
        state[p + "input_norm.weight"] = torch.ones(h)
        state[p + "q_proj.weight"] = q
        state[p + "k_proj.weight"] = k
        state[p + "v_proj.weight"] = v
        state[p + "o_proj.weight"] = o
        state[p + "post_norm.weight"] = torch.ones(h)
        state[p + "gate_proj.weight"] = (torch.rand(m, h, generator=g) * 2 - 1) * 0.1
        state[p + "up_proj.weight"] = (torch.rand(m, h, generator=g) * 2 - 1) * 0.1
        state[p + "down_proj.weight"] = torch.zeros(h, m)  # MLP adds exactly nothing
        kappa = n * r * w_o
        kappas.append(kappa)
        sum_sq += b * kappa * kappa

    # LM head: token t <- code((t - 1) mod vocab) on every layer's channels, plus a bounded
    # random part on the token channels.
    r_f = 1.0 / math.sqrt(sum_sq / h + eps)
    vote = r_f * sum(kappas)  # logit contribution of one agreeing bit with G = 1
    big_g = _pow2_near(8.0 / (2.0 * vote))  # runner-up gap 2 * G * vote ~ 8
    gap = 2.0 * big_g * vote
    lm_head = torch.zeros(vocab, h)
    targets = position_code([(t - 1) % vocab for t in range(vocab)], b) * big_g
    for l in range(config.num_layers):
        lm_head[:, groups[l]] = targets
    if tok:
        sigma = 0.25 * gap / (len(tok) * r_f)  # |random part| <= sigma * len(tok) * r_f
        lm_head[:, tok] = (torch.rand(vocab, len(tok), generator=g) * 2 - 1) * sigma
    state["norm.weight"] = torch.ones(h)
    state["lm_head.weight"] = lm_head
    return state


def expected_next_token(attended_position: int, config: ModelConfig) -> int:
    """The token the canary emits after attending to ``attended_position``."""
    return (attended_position + 1) % config.vocab_size


def repetition_score(tokens: Sequence[int]) -> float:
    """Share of adjacent pairs that repeat: ``#{i >= 1 : t[i] == t[i-1]} / (len - 1)``.

    In ``[0, 1]``; 0.0 for fewer than two tokens. A healthy canary run scores 0.0; a run with
    KV lengths frozen at the first step scores ``(n - 2) / (n - 1)`` (all but the first step
    repeat). Apply it to generated tokens only.
    """
    toks = [int(t) for t in tokens]
    if len(toks) < 2:
        return 0.0
    same = sum(1 for a, c in zip(toks, toks[1:]) if a == c)
    return same / (len(toks) - 1)


def longest_repeat_run(tokens: Sequence[int]) -> int:
    """Length of the longest run of identical consecutive tokens (0 if empty, 1 if none repeat)."""
    best = run = 0
    prev: int | None = None
    for t in tokens:
        t = int(t)
        run = run + 1 if t == prev else 1
        prev = t
        best = max(best, run)
    return best
