"""A small decoder LM over a paged KV cache, with attention injected by the caller.

Per layer: RMSNorm -> one fused q/k/v projection (vLLM's ``QKVParallelLinear``) split into q, k
and v -> K/V written to the paged cache -> attention (the injected :data:`Attend`) -> o_proj ->
residual add -> RMSNorm -> one fused gate/up projection (``MergedColumnParallelLinear``) ->
SiLU-and-mul -> down projection -> residual add. Weights are generated, and sharded under TP, as
separate q/k/v and gate/up matrices and stacked at load time, as vLLM's ``load_weights`` stacks
checkpoint tensors (``stacked_params_mapping``).
Token embedding plus a learned absolute-position embedding in front, final RMSNorm and LM head
(float32 logits) at the end. No RoPE (positions enter only through the position embedding).

The model holds no graph logic. The forward is cut into ``num_layers + 1`` **pieces** at the
attention calls, so that a PIECEWISE runner can capture each piece and run attention eagerly in
between; :meth:`DecoderLM.forward` is literally the composition of the pieces with ``attend``
between them, so both paths run the same arithmetic (bitwise equal).

Everything inside a piece is graph-safe: no host syncs (``.item()``, ``.tolist()``,
``bool(tensor)``), no data-dependent shapes or boolean-mask indexing, no branching on tensor
values, no RNG. Every op except attention works row by row, and projections use a batched
fixed-block GEMM (:func:`~harness.model.kernels.row_linear`, float32 accumulate) rather than a plain GEMM, so
a real token's result does not depend on how many padded rows follow it (bitwise on CPU).

Tensor / sequence parallel (:mod:`harness.model.parallel`): ``DecoderLM(config, parallel=ctx)``
builds the FULL weights from ``config.seed`` and keeps this rank's shard (q/k/v, gate/up column
parallel by whole heads / MLP columns; o_proj, down row parallel, followed by an all-reduce, or
by a reduce-scatter under sequence parallel). What a caller must do to run one rank:

* every rank gets the same ``input_ids`` / ``positions`` / ``slot_mapping`` of the full ``T``
  and makes the same allocator calls (so block tables and slots agree);
* KV cache: :func:`harness.model.parallel.make_kv_cache` ``(config, ctx)`` (``num_kv_heads/tp``
  heads per layer; this rank's heads only);
* attention: :func:`make_eager_attend` ``(..., parallel=ctx)`` (FIA gets ``num_heads/tp`` and
  ``num_kv_heads/tp``); a custom :data:`Attend` receives ``query [T, num_heads/tp, D]`` and this
  rank's caches and must return ``[T, num_heads/tp, D]``;
* sequence parallel: ``T`` must be a multiple of tp, also in eager mode
  (:func:`harness.model.parallel.padded_num_tokens`; pad with slot -1 and a dummy request);
  a ``ValueError`` is raised otherwise;
* the logits are the full ``[T, vocab]`` on every rank (TP and SP).

Pieces under TP/SP: boundaries carry ``(query [T, N/tp, D], residual)`` with ``residual``
``[T/tp, H]`` under SP (this rank's token rows) and ``[T, H]`` otherwise; piece 0 takes the
full ``(input_ids,)``. Collectives are ``_c10d_functional`` ops (graph-capturable; see
:mod:`harness.model.parallel`), so every rank must run the same pieces in the same order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Union, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import harness.model.kernels  # noqa: F401 - registers the harness:: ops the layers call
from harness.model.config import ModelConfig
from harness.model.kv_cache import PagedKVCache
from harness.model.parallel import (
    SINGLE,
    ParallelContext,
    all_gather_rows,
    all_reduce_,
    check_num_tokens,
    check_parallel_config,
    local_rows,
    reduce_scatter_rows,
    shard_state_dict,
)

#: ``attend(layer_index, query [T, N, D], key_cache, value_cache) -> [T, N, D]``.
Attend = Callable[[int, Tensor, Tensor, Tensor], Tensor]

HostList = Union[Sequence[int], Tensor]

# The fused kernels (harness.model.kernels): one op each, so one node per call in a graph.
# the ops' schemas: row_linear(Tensor x, Tensor weight) -> Tensor, rms_norm(Tensor x, Tensor weight, float eps) -> Tensor
_ROW_LINEAR: Callable[[Tensor, Tensor], Tensor] = torch.ops.harness.row_linear.default
_RMS_NORM: Callable[[Tensor, Tensor, float], Tensor] = torch.ops.harness.rms_norm.default
_SILU_AND_MUL = torch.ops.harness.silu_and_mul.default


def attention_scale(config: ModelConfig) -> float:
    """Softmax scale used by both model kinds: ``1 / sqrt(head_dim)``."""
    return 1.0 / math.sqrt(config.head_dim)


class RMSNorm(nn.Module):
    """Row-wise RMSNorm computed in float32, cast back to the input dtype (one fused op)."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return _RMS_NORM(x, self.weight, self.eps)


class RowLinear(nn.Module):
    """Bias-free linear layer (``weight [out, in]``): :func:`~harness.model.kernels.row_linear`."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.zeros(out_features, in_features), requires_grad=False)

    def forward(self, x: Tensor) -> Tensor:
        return _ROW_LINEAR(x, self.weight)


class Embedding(nn.Module):
    """Lookup table (``weight [num, dim]``); unlike ``nn.Embedding`` it never draws from the
    global RNG at construction (weights are loaded from a local generator afterwards)."""

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(num_embeddings, embedding_dim), requires_grad=False)

    def forward(self, ids: Tensor) -> Tensor:
        return F.embedding(ids, self.weight)


def _linear(in_features: int, out_features: int) -> RowLinear:
    return RowLinear(in_features, out_features)


class DecoderLayer(nn.Module):
    """One decoder layer, split at attention into :meth:`pre_attention` / :meth:`post_attention`."""

    def __init__(
        self, config: ModelConfig, index: int, parallel: ParallelContext | None = None
    ) -> None:
        super().__init__()
        ctx = parallel if parallel is not None else SINGLE
        tp = ctx.tp
        h, n, nkv, d, m = (
            config.hidden_size,
            config.num_heads // tp,
            config.num_kv_heads // tp,
            config.head_dim,
            config.mlp_size // tp,
        )
        self.index = index
        self.parallel = ctx
        self.num_heads, self.num_kv_heads, self.head_dim = n, nkv, d
        self.qkv_sizes = (n * d, nkv * d, nkv * d)
        self.input_norm = RMSNorm(h, config.rms_norm_eps)
        self.qkv_proj = _linear(h, sum(self.qkv_sizes))
        self.o_proj = _linear(n * d, h)
        self.post_norm = RMSNorm(h, config.rms_norm_eps)
        self.gate_up_proj = _linear(h, 2 * m)
        self.down_proj = _linear(m, h)

    def _reduce(self, partial: Tensor) -> Tensor:
        """Sum a row-parallel partial over the ranks (all-reduce; reduce-scatter under SP)."""
        if self.parallel.sp:
            return reduce_scatter_rows(partial, self.parallel)
        return all_reduce_(partial, self.parallel)

    def _gather(self, x: Tensor) -> Tensor:
        """Under SP, all-gather this rank's token rows into the full ``[T, H]``."""
        return all_gather_rows(x, self.parallel) if self.parallel.sp else x

    def pre_attention(
        self, residual: Tensor, slot_mapping: Tensor, kv_cache: PagedKVCache
    ) -> Tensor:
        """Norm, projections, K/V cache write; returns the query ``[T, N, D]``.

        Under TP ``N`` is this rank's ``num_heads / tp`` heads (K/V: its ``num_kv_heads / tp``);
        under SP ``residual`` holds this rank's ``T / tp`` rows and the normed hidden is
        all-gathered to the full ``T`` first.
        """
        x = self._gather(self.input_norm(residual))
        t = x.shape[0]
        qkv: tuple[Tensor, ...] = self.qkv_proj(x).split(self.qkv_sizes, dim=-1)  # torch's split is untyped
        q, k, v = qkv
        kv_cache.write(self.index, k.view(t, self.num_kv_heads, self.head_dim),
                       v.view(t, self.num_kv_heads, self.head_dim), slot_mapping)
        return q.view(t, self.num_heads, self.head_dim)

    def post_attention(self, attn_out: Tensor, residual: Tensor) -> Tensor:
        """o_proj + residual, then the MLP block + residual; returns the new residual.

        Under TP the row-parallel o_proj / down partials are all-reduced; under SP they are
        reduce-scattered to this rank's rows and the normed hidden is all-gathered before the MLP.
        """
        t = attn_out.shape[0]
        h = residual + self._reduce(self.o_proj(attn_out.reshape(t, -1).to(residual.dtype)))
        x = self._gather(self.post_norm(h))
        return h + self._reduce(self.down_proj(_SILU_AND_MUL(self.gate_up_proj(x))))


class DecoderLM(nn.Module):
    """Decoder LM (``config.kind`` "canary" or "random") with deterministic weights.

    Weights come from ``config.seed`` through a local ``torch.Generator`` (the global RNG is
    never touched) and are stored in ``config.torch_dtype``. Logits are float32.

    With ``parallel`` (a :class:`~harness.model.parallel.ParallelContext` with ``tp > 1``) this
    is one TP rank: the full weights are generated as without it and this rank keeps its shard
    (see the module docstring for what the caller must do). ``num_heads`` and ``num_kv_heads``
    (and the MLP width) must be divisible by tp (``ValueError`` otherwise).
    """

    def __init__(self, config: ModelConfig, parallel: ParallelContext | None = None, *,
                 state: dict[str, Tensor] | None = None) -> None:
        """``state``: the full (unsharded) weights to load instead of generating them from the
        seed (a draft model cut from its target); the keys must be exactly this model's."""
        super().__init__()
        self.config = config
        self.parallel: ParallelContext = parallel if parallel is not None else SINGLE
        check_parallel_config(config, self.parallel)
        h = config.hidden_size
        self.embed_tokens = Embedding(config.vocab_size, h)
        self.embed_positions = Embedding(config.max_model_len, h)
        self.layers = nn.ModuleList(
            DecoderLayer(config, i, self.parallel) for i in range(config.num_layers)
        )
        self.norm = RMSNorm(h, config.rms_norm_eps)
        self.lm_head = _linear(h, config.vocab_size)
        for p in self.parameters():
            p.requires_grad_(False)
        self._load_initial_weights(state)
        self.eval()

    # ------------------------------------------------------------------ weights
    def _load_initial_weights(self, state: dict[str, Tensor] | None = None) -> None:
        if state is None and self.config.kind == "canary":
            from harness.model.canary import canary_state_dict

            state = canary_state_dict(self.config)
        elif state is None:
            state = random_state_dict(self.config)
        state = stack_projections(shard_state_dict(state, self.parallel), self.config.num_layers)
        own = self.state_dict()
        missing = set(own) - set(state)
        extra = set(state) - set(own)
        if missing or extra:  # pragma: no cover - internal consistency
            raise RuntimeError(f"weight init mismatch: missing {missing}, extra {extra}")
        dtype = self.config.torch_dtype
        with torch.no_grad():
            for name, tensor in own.items():
                tensor.copy_(state[name].to(dtype))
        self.to(dtype)

    @property
    def num_layers(self) -> int:
        return self.config.num_layers

    @property
    def local_num_heads(self) -> int:
        """Query heads on this rank (``num_heads / tp``): the attention's ``N``."""
        return self.config.num_heads // self.parallel.tp

    @property
    def local_num_kv_heads(self) -> int:
        """KV heads on this rank (``num_kv_heads / tp``): the cache's head count."""
        return self.config.num_kv_heads // self.parallel.tp

    @property
    def num_pieces(self) -> int:
        """``num_layers + 1``: the PIECEWISE split."""
        return self.config.num_layers + 1

    @property
    def attention_scale(self) -> float:
        return attention_scale(self.config)

    @property
    def dtype(self) -> torch.dtype:
        return self.config.torch_dtype

    @property
    def device(self) -> torch.device:
        """Where the weights live: the device every input, cache and buffer of this model needs."""
        return self.embed_tokens.weight.device

    def place(self, device: torch.device | str) -> "DecoderLM":
        """Copy every weight to ``device`` (a host-to-device copy, as loading a checkpoint is) and
        return the model. Parameter by parameter rather than ``Module.to``, whose conversion
        imports torch's fake-tensor and DTensor machinery (sympy: seconds in a fresh rank)."""
        device = torch.device(device)
        for module in self.modules():
            for name, param in module._parameters.items():
                if param is not None and param.device != device:
                    module._parameters[name] = nn.Parameter(param.detach().to(device), requires_grad=False)
        return self

    # ------------------------------------------------------------------ pieces
    def piece(
        self,
        i: int,
        inputs: tuple[Tensor, ...],
        positions: Tensor,
        slot_mapping: Tensor,
        kv_cache: PagedKVCache,
    ) -> tuple[Tensor, ...]:
        """Piece ``i`` of the forward (``0 <= i <= num_layers``).

        * piece 0: ``(input_ids,) -> (query_0, residual)`` (embeddings, layer 0 up to attention,
          layer 0's K/V written);
        * piece i in 1..L-1: ``(attn_out_{i-1}, residual) -> (query_i, residual)``;
        * piece L: ``(attn_out_{L-1}, residual) -> (logits,)`` with float32 logits ``[T, vocab]``.

        ``positions`` is used by piece 0 only; ``slot_mapping`` by pieces 0..L-1.

        Under TP the query has this rank's ``num_heads / tp`` heads; under SP ``residual`` is
        this rank's ``[T / tp, H]`` rows (piece 0 still takes the full ``input_ids``, and the
        logits are the full ``[T, vocab]`` on every rank).
        """
        num_layers = self.config.num_layers
        if not 0 <= i <= num_layers:
            raise IndexError(f"piece index {i} outside 0..{num_layers}")
        with torch.no_grad():
            if i == 0:
                (input_ids,) = inputs
                if self.parallel.sp:
                    check_num_tokens(input_ids.shape[0], self.parallel)
                    input_ids = local_rows(input_ids, self.parallel)
                    positions = local_rows(positions, self.parallel)
                residual = self.embed_tokens(input_ids) + self.embed_positions(positions)
            else:
                attn_out, residual = inputs
                residual = self._layer(i - 1).post_attention(attn_out, residual)
            if i == num_layers:
                hidden = self.norm(residual)
                if self.parallel.sp:
                    hidden = all_gather_rows(hidden, self.parallel)
                return (self.lm_head(hidden).float(),)
            query = self._layer(i).pre_attention(residual, slot_mapping, kv_cache)
            return (query, residual)

    def _layer(self, i: int) -> DecoderLayer:
        """Layer ``i`` as its own class (a ModuleList's items are typed as any Module)."""
        return cast(DecoderLayer, self.layers[i])

    def forward(
        self,
        input_ids: Tensor,
        positions: Tensor,
        slot_mapping: Tensor,
        kv_cache: PagedKVCache,
        attend: Attend,
    ) -> Tensor:
        """Full forward: the pieces composed with ``attend`` between them; float32 logits."""
        outs = self.piece(0, (input_ids,), positions, slot_mapping, kv_cache)
        for layer in range(self.config.num_layers):
            query, residual = outs
            attn_out = attend(layer, query, kv_cache.key_cache[layer], kv_cache.value_cache[layer])
            outs = self.piece(layer + 1, (attn_out, residual), positions, slot_mapping, kv_cache)
        return outs[0]


#: vLLM's ``stacked_params_mapping``: the checkpoint matrices each fused projection stacks, in order.
STACKED_PROJECTIONS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def stack_projections(state: dict[str, Tensor], num_layers: int) -> dict[str, Tensor]:
    """``state`` with each layer's q/k/v and gate/up matrices stacked into the fused projections
    the layers hold (entries already fused, such as a draft model cut from its target, stay)."""
    out = dict(state)
    for i in range(num_layers):
        for fused, parts in STACKED_PROJECTIONS.items():
            names = [f"layers.{i}.{part}.weight" for part in parts]
            if all(name in out for name in names):
                out[f"layers.{i}.{fused}.weight"] = torch.cat([out.pop(name) for name in names])
    return out


def random_state_dict(config: ModelConfig) -> dict[str, Tensor]:
    """Seeded random float32 weights (local generator), small enough to stay finite in bf16."""
    g = torch.Generator(device="cpu").manual_seed(config.seed)
    h, n, nkv, d, m, v = (
        config.hidden_size,
        config.num_heads,
        config.num_kv_heads,
        config.head_dim,
        config.mlp_size,
        config.vocab_size,
    )

    def normal(*shape: int, std: float) -> Tensor:
        return torch.randn(shape, generator=g, dtype=torch.float32) * std

    def norm_weight() -> Tensor:
        return 1.0 + normal(h, std=0.05)

    state: dict[str, Tensor] = {
        "embed_tokens.weight": normal(v, h, std=1.0),
        "embed_positions.weight": normal(config.max_model_len, h, std=0.5),
    }
    for i in range(config.num_layers):
        p = f"layers.{i}."
        state[p + "input_norm.weight"] = norm_weight()
        state[p + "q_proj.weight"] = normal(n * d, h, std=1.0 / math.sqrt(h))
        state[p + "k_proj.weight"] = normal(nkv * d, h, std=1.0 / math.sqrt(h))
        state[p + "v_proj.weight"] = normal(nkv * d, h, std=1.0 / math.sqrt(h))
        state[p + "o_proj.weight"] = normal(h, n * d, std=0.5 / math.sqrt(n * d))
        state[p + "post_norm.weight"] = norm_weight()
        state[p + "gate_proj.weight"] = normal(m, h, std=1.0 / math.sqrt(h))
        state[p + "up_proj.weight"] = normal(m, h, std=1.0 / math.sqrt(h))
        state[p + "down_proj.weight"] = normal(h, m, std=0.5 / math.sqrt(m))
    state["norm.weight"] = norm_weight()
    state["lm_head.weight"] = normal(v, h, std=1.0 / math.sqrt(h))
    return state


def build_model(
    config: ModelConfig,
    device: torch.device | str = "cpu",
    parallel: ParallelContext | None = None,
) -> DecoderLM:
    """A :class:`DecoderLM` for ``config`` (weights deterministic in ``config.seed``) on ``device``
    (one TP rank's shard with ``parallel``)."""
    return DecoderLM(config, parallel).place(device)


def _host_list(values: HostList) -> list[int]:
    if isinstance(values, Tensor):
        return [int(x) for x in values.tolist()]
    return [int(x) for x in values]


def make_eager_attend(
    config: ModelConfig,
    actual_seq_lengths: HostList,
    actual_seq_lengths_kv: HostList,
    block_table: Tensor,
    *,
    scale: float | None = None,
    fia: Callable[..., tuple[Tensor, Tensor]] | None = None,
    parallel: ParallelContext | None = None,
) -> Attend:
    """The default eager :data:`Attend`: FIA, TND layout, causal (``sparse_mode=3``).

    Args:
        actual_seq_lengths: CUMULATIVE query lengths (last element = T under the strict contract).
        actual_seq_lengths_kv: PER-REQUEST KV lengths (this step's tokens already in the cache).
        block_table: int32 ``[B, max_blocks]``.
        scale: softmax scale; default :func:`attention_scale` (``1/sqrt(head_dim)``).
        fia: the op to call; default ``harness.ops.npu_fused_infer_attention_score``
            (imported at call time). Tests may pass a stand-in with the same signature.
        parallel: the model's :class:`~harness.model.parallel.ParallelContext` when it is one
            TP rank: FIA then gets this rank's ``num_heads / tp`` and ``num_kv_heads / tp``
            (the query and caches hold only those heads). ``None``: the full head counts.

    The host lists are read (copied to Python ints) at every call, so a caller that mutates the
    list objects between steps is seen live.
    """
    from harness.ops.attention import AttentionHeads, attend_eager, fia_kwargs

    softmax_scale = attention_scale(config) if scale is None else float(scale)
    tp = 1 if parallel is None else parallel.tp
    heads = AttentionHeads(config.block_size, config.num_heads // tp, config.num_kv_heads // tp, softmax_scale)

    def attend(layer: int, query: Tensor, key_cache: Tensor, value_cache: Tensor) -> Tensor:
        kwargs = fia_kwargs(heads, _host_list(actual_seq_lengths), _host_list(actual_seq_lengths_kv), block_table)
        return attend_eager(query, key_cache, value_cache, kwargs, op=fia)

    return attend
