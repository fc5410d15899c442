"""Model configuration: one frozen dataclass for both model kinds.

Two kinds:

* ``"canary"``: hand-built weights (:mod:`harness.model.canary`) whose greedy output counts
  up with the attended context length, so stale FIA KV lengths show up as repeated tokens;
* ``"random"``: seeded random weights, for eager-vs-replay equality.

All sizes are validated in ``__post_init__``; a bad value raises ``ValueError`` naming it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal, Union

import torch

ModelKind = Literal["canary", "random"]
MODEL_KINDS: tuple[str, ...] = ("canary", "random")

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}

DTypeLike = Union[torch.dtype, str]


def resolve_dtype(dtype: DTypeLike) -> torch.dtype:
    """``torch.float32`` / ``torch.bfloat16`` from a dtype or its name ("float32", "bf16", ...)."""
    if isinstance(dtype, torch.dtype):
        if dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"dtype: only float32 and bfloat16 are supported, got {dtype}")
        return dtype
    if isinstance(dtype, str):
        key = dtype.lower().removeprefix("torch.")
        if key in _DTYPES:
            return _DTYPES[key]
    raise ValueError(f"dtype: expected float32/bfloat16 (dtype or name), got {dtype!r}")


def _bits_for(n: int) -> int:
    """Bits needed to write the integers ``0 .. n-1`` (at least 1)."""
    return max(1, math.ceil(math.log2(max(n, 2))))


@dataclass(frozen=True)
class ModelConfig:
    """Shape and weights of a small decoder LM plus its paged KV cache.

    Attributes:
        kind: ``"canary"`` or ``"random"``.
        num_layers: decoder layers (>= 1); a PIECEWISE forward has ``num_layers + 1`` pieces.
        hidden_size: residual width.
        num_heads / num_kv_heads: query and KV heads (GQA: ``num_heads % num_kv_heads == 0``).
        head_dim: per-head width.
        vocab_size: tokens; canary needs ``vocab_size >= max_model_len``.
        dtype: weights/activations dtype (``torch.float32``/``torch.bfloat16`` or the names);
            logits are always float32. ``torch_dtype`` gives the resolved ``torch.dtype``.
        seed: weights come from a local ``torch.Generator`` seeded with it.
        block_size: KV tokens per cache block.
        num_blocks: cache blocks, block 0 included (it is the reserved null block).
        max_model_len: longest sequence (positions ``0 .. max_model_len-1``).
        intermediate_size: MLP width; ``None`` means ``2 * hidden_size``.
        rms_norm_eps: RMSNorm epsilon.
    """

    kind: str = "random"
    num_layers: int = 2
    hidden_size: int = 64
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    vocab_size: int = 512
    dtype: DTypeLike = "float32"
    seed: int = 0
    block_size: int = 16
    num_blocks: int = 129
    max_model_len: int = 512
    intermediate_size: int | None = None
    rms_norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        if self.kind not in MODEL_KINDS:
            raise ValueError(f"kind: expected one of {MODEL_KINDS}, got {self.kind!r}")
        for name in (
            "num_layers",
            "hidden_size",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "vocab_size",
            "block_size",
            "num_blocks",
            "max_model_len",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected a positive int, got {value!r}")
        if self.intermediate_size is not None and (
            isinstance(self.intermediate_size, bool)
            or not isinstance(self.intermediate_size, int)
            or self.intermediate_size < 1
        ):
            raise ValueError(
                f"intermediate_size: expected a positive int or None, got {self.intermediate_size!r}"
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed: expected a non-negative int, got {self.seed!r}")
        if not (isinstance(self.rms_norm_eps, (int, float)) and self.rms_norm_eps > 0):
            raise ValueError(f"rms_norm_eps: expected a positive float, got {self.rms_norm_eps!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads})"
            )
        if self.num_blocks < 2:
            raise ValueError(
                f"num_blocks: need >= 2 (block 0 is the reserved null block), got {self.num_blocks}"
            )
        resolve_dtype(self.dtype)  # raises ValueError on a bad dtype
        if self.kind == "canary":
            self._check_canary()

    def _check_canary(self) -> None:
        bits = self.canary_bits
        if self.vocab_size < self.max_model_len:
            raise ValueError(
                f"canary: vocab_size ({self.vocab_size}) must be >= max_model_len "
                f"({self.max_model_len}) so that 'attended position p -> token p+1' never wraps "
                "inside a sequence"
            )
        if self.head_dim < bits:
            raise ValueError(
                f"canary: head_dim ({self.head_dim}) must be >= {bits} bits (position code for "
                f"max(vocab_size, max_model_len) = {max(self.vocab_size, self.max_model_len)})"
            )
        need = 1 + bits * (self.num_layers + 1) + 1
        if self.hidden_size < need:
            raise ValueError(
                f"canary: hidden_size ({self.hidden_size}) must be >= {need} "
                f"(1 bias + {bits} position bits + {bits} per layer + >= 1 token channel)"
            )
        if bits > 16:
            raise ValueError(
                f"canary: position code of {bits} bits (max(vocab_size, max_model_len) > 65536) "
                "is not supported"
            )

    # ----------------------------------------------------------------------------- derived
    @property
    def torch_dtype(self) -> torch.dtype:
        """The resolved weight/activation dtype."""
        return resolve_dtype(self.dtype)

    @property
    def mlp_size(self) -> int:
        """MLP intermediate width."""
        return self.intermediate_size if self.intermediate_size is not None else 2 * self.hidden_size

    @property
    def canary_bits(self) -> int:
        """Width of the canary's binary position code: bits for ``max(vocab, max_model_len)``."""
        return _bits_for(max(self.vocab_size, self.max_model_len))

    @property
    def max_blocks_per_seq(self) -> int:
        """Block-table width needed for a ``max_model_len`` sequence."""
        return -(-self.max_model_len // self.block_size)

    @property
    def num_slots(self) -> int:
        """Cache slots in all, null block included."""
        return self.num_blocks * self.block_size

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def canary(cls, **overrides: Any) -> ModelConfig:
        """Canary defaults (2 layers, hidden 64, 4/2 heads x 16, vocab 512, max_model_len 512)."""
        return cls(**{"kind": "canary", **overrides})

    @classmethod
    def random(cls, **overrides: Any) -> ModelConfig:
        """Random-weights defaults (same shapes as the canary defaults)."""
        return cls(**{"kind": "random", **overrides})
