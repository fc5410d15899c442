"""Tensor parallel (TP) and sequence parallel (SP, vLLM Ascend's "flashcomm") for DecoderLM.

:class:`ParallelContext` says which TP rank a :class:`~harness.model.decoder.DecoderLM` is. Every
rank generates the FULL weights from ``config.seed`` and keeps its shard (:func:`column_shard`,
:func:`row_shard`):

* q/k/v and gate/up are **column parallel** (output features split; q/k/v by whole heads, so
  ``num_heads % tp == 0`` and ``num_kv_heads % tp == 0``; ``mlp_size % tp == 0``);
* o_proj and down are **row parallel** (input features split): each rank produces a partial
  ``[T, H]`` that is summed across ranks;
* embeddings, norms and the LM head are replicated.

TP (``sequence_parallel=False``): the residual stream is replicated ``[T, H]``; the partial sums
are **all-reduced**. SP (``sequence_parallel=True``): the residual stream is split along tokens,
rank ``r`` holding rows ``r*T/tp .. (r+1)*T/tp - 1`` (``[T/tp, H]``); the normed hidden is
**all-gathered** before the column-parallel projections and the partial sums are
**reduce-scattered** after the row-parallel ones; the final hidden is all-gathered before the
LM head, so every rank returns the full ``[T, vocab]`` logits. ``T`` must be a multiple of
``tp`` (:func:`padded_num_tokens`: the pipeline pads T up even in eager mode).

Collectives (graph capture). They are the ``_c10d_functional`` aten-level ops, so the emulated
graph engine records them as nodes (and counts communication groups by ``group_name``) and
re-runs them on replay. We use the IN-PLACE / ``out=`` members of that op family
(``all_reduce_``, ``all_gather_into_tensor_out``, ``reduce_scatter_tensor_out``) followed by
``wait_tensor`` on the written tensor, not the purely functional ones (``all_reduce``, ...) that
``torch.distributed._functional_collectives`` wraps. Reason: the collective is asynchronous (the
result is only valid after ``wait_tensor`` on the tensor the work was registered on). A
recorder replaying a functional node runs the op, which registers the work on a FRESH tensor,
and copies that fresh tensor into the captured output at once, before the communication is
done; the recorded ``wait_tensor`` then waits on the captured tensor, which has no work. In a
measured 2-rank gloo run the replay of a functional all-reduce returned the rank's own
un-reduced values. With the in-place/``out=`` ops the node is "mutating": it is not run during
capture (no communication at capture time, no meta kernel needed), the replay writes into the
captured buffer and registers the work on it, and the recorded ``wait_tensor`` on that same
buffer waits for it. All of these ops, and ``wait_tensor``, have Meta kernels, registered in
Python by ``torch.distributed._functional_collectives`` (imported here for that reason; without
it the C++ composite kernel would run for meta tensors and try to resolve the group), so the
recorder's shape inference never falls back to running a collective for real. A capture of a
TP/SP forward therefore communicates nothing: it even succeeds with a group name that no
process group is registered under (tests/model/test_model_parallel.py).

Which op family carries them is the engine's to say (:func:`use_collective_ops`): by default
``torch.ops._c10d_functional`` on the process group's backend; on the emulator the
``harness_comm`` ops of the same names, which exchange through shared memory and are done when
they return (their ``wait_tensor`` is the identity).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed._functional_collectives  # noqa: F401  (registers the Meta kernels)
from torch import Tensor
from torch.distributed import ProcessGroup

from harness.model.config import ModelConfig
from harness.model.kv_cache import PagedKVCache

if TYPE_CHECKING:  # the type only: the model imports no engine
    from harness.engine.protocol import CollectiveOps

__all__ = [
    "ParallelContext",
    "all_gather_rows",
    "all_reduce_",
    "check_parallel_config",
    "collective_ops",
    "column_shard",
    "local_rows",
    "make_kv_cache",
    "padded_num_tokens",
    "reduce_scatter_rows",
    "row_shard",
    "shard_state_dict",
    "tp_split_problem",
    "use_collective_ops",
]

_C10D = torch.ops._c10d_functional
_collective_ops: list[CollectiveOps] = [_C10D]


def collective_ops() -> CollectiveOps:
    """The op family this process issues its collectives through (see the module docstring)."""
    return _collective_ops[0]


def use_collective_ops(ops: CollectiveOps | None) -> None:
    """Issue collectives through ``ops`` (an engine's ``Capabilities.collective_ops()``: an object
    with ``_c10d_functional``'s op names), or through ``_c10d_functional`` itself when None."""
    _collective_ops[0] = _C10D if ops is None else ops


@dataclass(frozen=True)
class ParallelContext:
    """This process's place in the TP group.

    Attributes:
        tp: tensor-parallel size (ranks in ``group``).
        tp_rank: this process's rank inside ``group`` (``0 <= tp_rank < tp``).
        group: the ``torch.distributed`` ProcessGroup of the TP ranks; ``None`` when ``tp == 1``.
        sequence_parallel: split the residual stream along tokens (flashcomm); needs
            ``T % tp == 0``. A no-op with ``tp == 1``.
    """

    tp: int = 1
    tp_rank: int = 0
    group: ProcessGroup | None = None
    sequence_parallel: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.tp, bool) or not isinstance(self.tp, int) or self.tp < 1:
            raise ValueError(f"tp: expected a positive int, got {self.tp!r}")
        if (
            isinstance(self.tp_rank, bool)
            or not isinstance(self.tp_rank, int)
            or not 0 <= self.tp_rank < self.tp
        ):
            raise ValueError(f"tp_rank: expected an int in 0..{self.tp - 1}, got {self.tp_rank!r}")
        if self.tp > 1 and self.group is None:
            raise ValueError(f"tp={self.tp} needs the TP ProcessGroup (group=None)")
        if self.group is not None:
            size = self.group.size()
            if size != self.tp:
                raise ValueError(f"tp={self.tp} but the group has {size} ranks")

    @classmethod
    def from_group(cls, group: ProcessGroup, *, sequence_parallel: bool = False) -> ParallelContext:
        """Context for this process in ``group`` (tp = group size, tp_rank = rank in group)."""
        return cls(tp=group.size(), tp_rank=group.rank(), group=group,
                   sequence_parallel=sequence_parallel)

    @property
    def enabled(self) -> bool:
        """True when there is more than one rank (collectives run)."""
        return self.tp > 1

    @property
    def sp(self) -> bool:
        """Sequence parallel in effect (``sequence_parallel`` and ``tp > 1``)."""
        return self.sequence_parallel and self.tp > 1

    @property
    def group_name(self) -> str:
        """The group's name as the ``_c10d_functional`` ops take it."""
        if self.group is None:
            raise ValueError("tp == 1: no process group")
        return str(self.group.group_name)


SINGLE = ParallelContext()


def tp_split_problem(config: ModelConfig, tp: int) -> tuple[str, str] | None:
    """The first dimension of ``config`` that ``tp`` ranks cannot split evenly, as
    ``(ModelConfig field, message)``; None when every one splits.

    Apart from :func:`check_parallel_config` so that a scenario's preflight can refuse the file
    before any rank starts (no process group needed)."""
    for field, name, value in (
        ("num_heads", "num_heads", config.num_heads),
        ("num_kv_heads", "num_kv_heads", config.num_kv_heads),
        ("intermediate_size", "intermediate_size" if config.intermediate_size is not None
         else "the MLP width (2 x hidden_size)", config.mlp_size),
    ):
        if value % tp:
            return field, (f"tensor parallel: {name} ({value}) must be divisible by tp ({tp}) "
                           "(q/k/v are split by whole heads, gate/up/down by MLP columns)")
    return None


def check_parallel_config(config: ModelConfig, ctx: ParallelContext) -> None:
    """Raise ``ValueError`` when ``config`` cannot be split ``ctx.tp`` ways."""
    problem = tp_split_problem(config, ctx.tp)
    if problem is not None:
        raise ValueError(problem[1])


# ------------------------------------------------------------------------------- sharding
def _split(weight: Tensor, dim: int, tp: int, rank: int, what: str) -> Tensor:
    size = weight.shape[dim]
    if size % tp:
        raise ValueError(f"{what}: dimension {dim} of size {size} is not divisible by tp={tp}")
    if not 0 <= rank < tp:
        raise ValueError(f"{what}: rank {rank} outside 0..{tp - 1}")
    part = size // tp
    return weight.narrow(dim, rank * part, part).clone()


def column_shard(weight: Tensor, tp: int, rank: int) -> Tensor:
    """Column-parallel shard of a ``[out, in]`` weight: output rows ``rank*out/tp ..`` (a copy).

    For q/k/v (head-major ``[heads * head_dim, in]``) this is exactly heads
    ``rank*heads/tp .. (rank+1)*heads/tp - 1``.
    """
    return _split(weight, 0, tp, rank, "column_shard")


def row_shard(weight: Tensor, tp: int, rank: int) -> Tensor:
    """Row-parallel shard of a ``[out, in]`` weight: input columns ``rank*in/tp ..`` (a copy)."""
    return _split(weight, 1, tp, rank, "row_shard")


_COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
_ROW = ("o_proj", "down_proj")


def shard_state_dict(state: dict[str, Tensor], ctx: ParallelContext) -> dict[str, Tensor]:
    """This rank's shard of a FULL DecoderLM state dict (other entries returned as they are)."""
    if ctx.tp == 1:
        return dict(state)
    out: dict[str, Tensor] = {}
    for name, tensor in state.items():
        parts = name.split(".")
        module = parts[-2] if len(parts) >= 2 else ""
        if module in _COLUMN:
            out[name] = column_shard(tensor, ctx.tp, ctx.tp_rank)
        elif module in _ROW:
            out[name] = row_shard(tensor, ctx.tp, ctx.tp_rank)
        else:
            out[name] = tensor
    return out


# ------------------------------------------------------------------------------- tokens (SP)
def padded_num_tokens(num_tokens: int, ctx: ParallelContext | None) -> int:
    """T the forward must be given: ``num_tokens`` rounded up to a multiple of tp under SP."""
    if ctx is None or not ctx.sp:
        return num_tokens
    return -(-num_tokens // ctx.tp) * ctx.tp


def check_num_tokens(num_tokens: int, ctx: ParallelContext) -> None:
    """Under SP, raise ``ValueError`` unless ``num_tokens`` is a multiple of tp."""
    if ctx.sp and num_tokens % ctx.tp:
        raise ValueError(
            f"sequence parallel: T={num_tokens} tokens is not a multiple of tp={ctx.tp}; pad T "
            f"up to {padded_num_tokens(num_tokens, ctx)} (padded rows: slot -1, absorbed by a "
            "dummy request), even in eager mode"
        )


def local_rows(x: Tensor, ctx: ParallelContext) -> Tensor:
    """Under SP: this rank's ``T/tp`` rows of ``x`` (a view); otherwise ``x`` itself."""
    if not ctx.sp:
        return x
    t = x.shape[0]
    check_num_tokens(t, ctx)
    part = t // ctx.tp
    return x.narrow(0, ctx.tp_rank * part, part)


# ------------------------------------------------------------------------------- collectives
def all_reduce_(x: Tensor, ctx: ParallelContext) -> Tensor:
    """Sum ``x`` over the TP ranks. IN PLACE on ``x`` (pass an intermediate); returns the result.

    ``_c10d_functional.all_reduce_`` + ``wait_tensor``; identity (no op) when ``tp == 1``.
    """
    if not ctx.enabled:
        return x
    x = x.contiguous()
    ops = collective_ops()
    ops.all_reduce_(x, "sum", ctx.group_name)
    return ops.wait_tensor(x)


def all_gather_rows(x: Tensor, ctx: ParallelContext) -> Tensor:
    """Concatenate every rank's ``x`` ``[n, ...]`` along dim 0 in rank order: ``[tp * n, ...]``.

    ``_c10d_functional.all_gather_into_tensor_out`` + ``wait_tensor``; identity when ``tp == 1``.
    """
    if not ctx.enabled:
        return x
    x = x.contiguous()
    out = torch.empty((ctx.tp * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
    ops = collective_ops()
    ops.all_gather_into_tensor_out(x, ctx.tp, ctx.group_name, out=out)
    return ops.wait_tensor(out)


def reduce_scatter_rows(x: Tensor, ctx: ParallelContext) -> Tensor:
    """Sum ``x`` ``[T, ...]`` over the ranks and keep this rank's ``T/tp`` rows.

    ``_c10d_functional.reduce_scatter_tensor_out`` + ``wait_tensor``; identity when ``tp == 1``.
    """
    if not ctx.enabled:
        return x
    if x.shape[0] % ctx.tp:
        raise ValueError(f"reduce_scatter_rows: {x.shape[0]} rows not divisible by tp={ctx.tp}")
    x = x.contiguous()
    out = torch.empty((x.shape[0] // ctx.tp, *x.shape[1:]), dtype=x.dtype, device=x.device)
    ops = collective_ops()
    ops.reduce_scatter_tensor_out(x, "sum", ctx.tp, ctx.group_name, out=out)
    return ops.wait_tensor(out)


# ------------------------------------------------------------------------------- KV cache
def make_kv_cache(
    config: ModelConfig,
    parallel: ParallelContext | None = None,
    device: torch.device | str = "cpu",
) -> PagedKVCache:
    """The paged KV cache of one TP rank: ``num_kv_heads // tp`` heads per layer.

    ``cache.config`` is the full model's ``config`` (block size, block count and table width do
    not change with TP); only the head dimension of the cache tensors is per rank. Every rank
    runs the same allocator calls (same requests, same order), so block ids and slot mappings
    agree across ranks.
    """
    heads = config.num_kv_heads
    if parallel is not None and parallel.tp > 1:
        check_parallel_config(config, parallel)
        heads //= parallel.tp
    return PagedKVCache(config, device=device, num_kv_heads=heads)
