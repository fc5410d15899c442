"""Decode context parallel (DCP/PCP-style) attention over a KV cache sharded across ranks.

Sharding (interleaved, as vLLM's DCP does): KV position ``p`` of a request is owned by rank
``p % cp`` and stored on that rank at LOCAL position ``p // cp`` of the request's blocks. Every
rank has its own :class:`~harness.model.kv_cache.PagedKVCache` of the same shape and uses the
same block ids for a request (allocate ``cp_local_capacity(seq_len, cp)`` tokens per request on
every rank: the deterministic allocator then hands out the same ids); only what is stored at a
local position differs.

Query metadata (the MLA+CP form, vLLM Ascend PR #5641): every query token (decode tokens, MTP
tokens flattened, prefill tokens too) becomes its own length-1 request, so on every rank

* ``actual_seq_lengths = [1, 2, ..., T]`` (cumulative; ``arange(T) + 1``);
* ``actual_seq_lengths_kv[t]`` = the number of positions ``<= pos_t`` this rank owns
  (``0 if pos_t < rank else (pos_t - rank) // cp + 1``): each one-token request attends ALL of
  its local KV (``sparse_mode=0``) and causality comes from these lengths alone;
* the block table has one row per token: its request's row, repeated.

Padding: when T is padded to a bucket, padded tokens are extra length-1 requests with KV length
0 and a zero block-table row (``cp_seq_len`` zero-padded to the padded request count), so
``actual_seq_lengths[-1] == T``. ``pad_kv_lengths=False`` reproduces the known-bad pipeline
that pads the query lengths but not ``cp_seq_len``: ``actual_seq_lengths_kv`` then has fewer
entries than ``actual_seq_lengths`` and the FIA host tiling refuses the call
(:class:`~harness.ops.contract.FiaArgumentError`, whatever the contract).

Attention (:func:`make_cp_attend`): each rank runs FIA on its shard with ``softmax_lse_flag``,
all-gathers ``(out, lse)`` across the CP group with one functional collective
(``torch.distributed._functional_collectives.all_gather_tensor``, which dispatches
``_c10d_functional`` ops and is therefore visible to a graph recorder), and merges the partial
results with the log-sum-exp (:func:`merge_attention_states`). Every rank ends up with the full
attention output, hence the full logits.

Everything except :func:`make_cp_attend` is a pure function of host values (no
``torch.distributed``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor
from torch.distributed import ProcessGroup

from harness.model.config import ModelConfig
from harness.model.decoder import Attend, attention_scale
from harness.model.parallel import collective_ops

if TYPE_CHECKING:  # the type only: harness.graph imports the model
    from harness.graph.metadata import AttentionMetadata

__all__ = [
    "CPRankMetadata",
    "PAD_SLOT_ID",
    "build_cp_metadata",
    "cp_local_capacity",
    "cp_local_kv_len",
    "cp_local_position",
    "cp_metadata_from_attention_metadata",
    "cp_owner",
    "cp_combine",
    "cp_slot_mapping",
    "make_cp_attend",
    "merge_attention_states",
]

#: Slot-mapping value for a token this rank must not write (same value as harness.graph).
PAD_SLOT_ID = -1


def _check_cp(cp: int, rank: int) -> None:
    if isinstance(cp, bool) or not isinstance(cp, int) or cp < 1:
        raise ValueError(f"cp: expected a positive int, got {cp!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < cp:
        raise ValueError(f"rank: expected an int in 0..{cp - 1}, got {rank!r}")


# --------------------------------------------------------------------------- ownership


def cp_owner(position: int, cp: int) -> int:
    """The rank that owns KV position ``position`` (interleaved: ``position % cp``)."""
    return position % cp


def cp_local_position(position: int, cp: int) -> int:
    """Where the owner stores ``position`` inside the request's blocks: ``position // cp``."""
    return position // cp


def cp_local_kv_len(position: int, cp: int, rank: int) -> int:
    """How many positions ``0..position`` (inclusive) ``rank`` owns.

    ``0 if position < rank else (position - rank) // cp + 1``: the KV length a one-token
    request at ``position`` reads on ``rank``. A negative position (nothing) gives 0.
    """
    _check_cp(cp, rank)
    if position < rank:
        return 0
    return (position - rank) // cp + 1


def cp_local_capacity(seq_len: int, cp: int) -> int:
    """Local KV tokens a request of ``seq_len`` needs on the fullest rank (rank 0):
    ``ceil(seq_len / cp)``. Allocate this many on every rank so block ids agree."""
    return -(-seq_len // cp)


def cp_slot_mapping(
    positions: Sequence[int],
    block_table_rows: Sequence[Sequence[int] | None],
    block_size: int,
    cp: int,
    rank: int,
) -> list[int]:
    """Per new token: its LOCAL cache slot if ``rank`` owns its position, else -1.

    ``block_table_rows[t]`` is the block list of token ``t``'s request (``None`` for a padding
    token, which always gets -1). The slot of an owned position ``p`` is
    ``row[l // block_size] * block_size + l % block_size`` with ``l = p // cp``.
    """
    _check_cp(cp, rank)
    if len(positions) != len(block_table_rows):
        raise ValueError(
            f"positions ({len(positions)}) and block_table_rows ({len(block_table_rows)}) "
            "must have one entry per token"
        )
    slots: list[int] = []
    for t, (pos, row) in enumerate(zip(positions, block_table_rows)):
        pos = int(pos)
        if row is None or pos % cp != rank:
            slots.append(PAD_SLOT_ID)
            continue
        local = pos // cp
        index, offset = divmod(local, block_size)
        if index >= len(row) or int(row[index]) < 0:
            raise ValueError(
                f"token {t}: local position {local} (global {pos}, rank {rank}/{cp}) is not "
                f"covered by its block-table row {list(row)}"
            )
        slots.append(int(row[index]) * block_size + offset)
    return slots


# --------------------------------------------------------------------------- per-rank metadata


@dataclass(frozen=True)
class CPRankMetadata:
    """The host lists one CP rank's FIA call and cache write consume for one step.

    Token-indexed, every list has ``num_input_tokens`` entries (``actual_seq_lengths_kv`` fewer
    when built with ``pad_kv_lengths=False``): each token is a one-token request.
    """

    cp: int
    rank: int
    num_actual_tokens: int
    num_input_tokens: int
    actual_seq_lengths: list[int]
    actual_seq_lengths_kv: list[int]
    block_table: list[list[int]]
    slot_mapping: list[int]
    positions: list[int]
    pad_kv_lengths: bool = True

    def block_table_tensor(self, device: torch.device | str = "cpu") -> Tensor:
        """int32 ``[num_input_tokens, max_blocks]``."""
        return torch.tensor(self.block_table, dtype=torch.int32, device=device)

    def slot_mapping_tensor(self, device: torch.device | str = "cpu") -> Tensor:
        """int64 ``[num_input_tokens]``: what the model's cache write takes."""
        return torch.tensor(self.slot_mapping, dtype=torch.int64, device=device)


def build_cp_metadata(
    query_lens: Sequence[int],
    seq_lens: Sequence[int],
    positions: Sequence[int],
    block_table: Sequence[Sequence[int]],
    *,
    block_size: int,
    cp: int,
    rank: int,
    num_tokens_padded: int | None = None,
    pad_kv_lengths: bool = True,
) -> CPRankMetadata:
    """Rank ``rank``'s CP metadata from the global (single-rank) host lists of one step.

    Args:
        query_lens: new tokens per real request.
        seq_lens: per real request, the GLOBAL KV length after this step.
        positions: global position of every real new token (``sum(query_lens)`` entries; any
            padding entries beyond that are ignored).
        block_table: one row per real request (block ids, zero-padded); the same ids on every
            rank, addressed by LOCAL positions.
        num_tokens_padded: the bucket T (default: no padding).
        pad_kv_lengths: zero-pad ``cp_seq_len`` for the padding tokens (the fix). ``False``
            gives the known-bad metadata: KV lengths for the real tokens only.
    """
    _check_cp(cp, rank)
    if len(query_lens) != len(seq_lens) or len(query_lens) > len(block_table):
        raise ValueError(
            f"query_lens ({len(query_lens)}), seq_lens ({len(seq_lens)}) and block_table "
            f"({len(block_table)} rows) must describe the same requests"
        )
    n = sum(int(q) for q in query_lens)
    if len(positions) < n:
        raise ValueError(f"positions has {len(positions)} entries for {n} query tokens")
    T = n if num_tokens_padded is None else int(num_tokens_padded)
    if T < n:
        raise ValueError(f"cannot pad {n} tokens down to {T}")
    width = max((len(r) for r in block_table), default=0)

    token_rows: list[list[int] | None] = []
    kv_lens: list[int] = []
    token_pos: list[int] = []
    t = 0
    for i, (q, s) in enumerate(zip(query_lens, seq_lens)):
        row = [int(b) for b in block_table[i]] + [0] * (width - len(block_table[i]))
        for _ in range(int(q)):
            pos = int(positions[t])
            if not 0 <= pos < int(s):
                raise ValueError(f"token {t}: position {pos} outside request {i}'s KV length {s}")
            token_rows.append(row)
            token_pos.append(pos)
            kv_lens.append(cp_local_kv_len(pos, cp, rank))
            t += 1
    slots = cp_slot_mapping(token_pos, token_rows, block_size, cp, rank)
    pad = T - n
    rows = [list(r) for r in token_rows if r is not None] + [[0] * width for _ in range(pad)]
    return CPRankMetadata(
        cp=cp,
        rank=rank,
        num_actual_tokens=n,
        num_input_tokens=T,
        actual_seq_lengths=list(range(1, T + 1)),
        actual_seq_lengths_kv=kv_lens + ([0] * pad if pad_kv_lengths else []),
        block_table=rows,
        slot_mapping=slots + [PAD_SLOT_ID] * pad,
        positions=token_pos + [0] * pad,
        pad_kv_lengths=pad_kv_lengths,
    )


def cp_metadata_from_attention_metadata(
    meta: AttentionMetadata, *, block_size: int, cp: int, rank: int, pad_kv_lengths: bool = True
) -> CPRankMetadata:
    """:func:`build_cp_metadata` from a (padded or not) ``harness.graph.AttentionMetadata``:
    real requests and tokens are taken from it, T is its ``num_input_tokens``."""
    r = meta.num_reqs
    return build_cp_metadata(
        meta.query_lens[:r], meta.seq_lens[:r], meta.positions[: meta.num_actual_tokens],
        meta.block_table[:r], block_size=block_size, cp=cp, rank=rank,
        num_tokens_padded=meta.num_input_tokens, pad_kv_lengths=pad_kv_lengths,
    )


# --------------------------------------------------------------------------- LSE merge


def merge_attention_states(outs: Tensor, lses: Tensor) -> tuple[Tensor, Tensor]:
    """Merge R partial attentions over disjoint key sets into the full attention.

    Args:
        outs: ``[R, T, N, D]`` partial outputs (each normalised over its own keys).
        lses: ``[R, T, N, 1]`` their float32 log-sum-exps; ``-inf`` where a part saw no key.

    Returns:
        ``(out [T, N, D] float32, lse [T, N, 1] float32)`` with
        ``out = sum_r exp(lse_r - m) out_r / sum_r exp(lse_r - m)``, ``m = max_r lse_r``.
        A row no part saw gets 0 / ``-inf`` (never NaN). Graph-safe: no host reads.
    """
    lses = lses.float()
    m = lses.amax(dim=0)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    w = torch.exp(lses - m.unsqueeze(0))  # exp(-inf) = 0 for parts that saw nothing
    denom = w.sum(dim=0)
    seen = denom > 0
    out = (w * outs.float()).sum(dim=0) / torch.where(seen, denom, torch.ones_like(denom))
    out = torch.where(seen, out, torch.zeros_like(out))
    return out, m + torch.log(denom)


# --------------------------------------------------------------------------- the Attend


def _host_list(values: Sequence[int] | Tensor) -> list[int]:
    if isinstance(values, Tensor):
        return [int(x) for x in values.tolist()]
    return [int(x) for x in values]


def make_cp_attend(
    config: ModelConfig,
    cp: int,
    rank: int,
    group: ProcessGroup,
    per_rank_metadata: CPRankMetadata,
    *,
    scale: float | None = None,
    block_table: Tensor | None = None,
    fia: Callable[..., tuple[Tensor, Tensor]] | None = None,
    gather: str = "functional",
) -> Attend:
    """An :data:`Attend` for CP rank ``rank``: local FIA, all-gather, LSE merge.

    Per layer: FIA over this rank's cache (``sparse_mode=0``, ``softmax_lse_flag=True``, the
    one-token-request lists of ``per_rank_metadata``), then ONE
    ``all_gather_tensor(cat([out, lse], -1), 0, group)`` (+ ``wait_tensor``) across the CP
    group, then :func:`merge_attention_states`. Returns ``[T, N, D]`` in the query dtype.

    ``group`` is a ``torch.distributed`` process group (or anything ``all_gather_tensor``
    accepts) of exactly ``cp`` ranks. ``block_table``: the int32 per-token table to bind (a
    graph runner's static buffer); default: built once from ``per_rank_metadata``. The host
    lists are read from ``per_rank_metadata`` at every call. ``fia`` defaults to
    ``harness.ops.npu_fused_infer_attention_score``.

    ``gather``: ``"functional"`` (default) issues what ``all_gather_tensor`` does (out-of-place
    ``_c10d_functional::all_gather_into_tensor`` + ``wait_tensor``); ``"out"`` gathers into a
    buffer allocated here with ``_c10d_functional::all_gather_into_tensor_out`` +
    ``wait_tensor`` on that buffer. Same ops family, same arithmetic; they differ only in how
    a graph recorder sees them (a functional vs a mutating node).
    """
    if gather not in ("functional", "out"):
        raise ValueError(f"gather: expected 'functional' or 'out', got {gather!r}")
    _check_cp(cp, rank)
    if per_rank_metadata.cp != cp or per_rank_metadata.rank != rank:
        raise ValueError(
            f"metadata was built for rank {per_rank_metadata.rank}/{per_rank_metadata.cp}, "
            f"not {rank}/{cp}"
        )
    from harness.ops.attention import AttentionHeads, AttentionStyle, attend_eager, fia_kwargs

    softmax_scale = attention_scale(config) if scale is None else float(scale)
    table = per_rank_metadata.block_table_tensor() if block_table is None else block_table
    heads = AttentionHeads(config.block_size, config.num_heads, config.num_kv_heads, softmax_scale)
    style = AttentionStyle(sparse_mode=0, combine=lambda out, lse: cp_combine(out, lse, cp, group, gather=gather))

    def attend(layer: int, query: Tensor, key_cache: Tensor, value_cache: Tensor) -> Tensor:
        kwargs = fia_kwargs(heads, _host_list(per_rank_metadata.actual_seq_lengths),
                            _host_list(per_rank_metadata.actual_seq_lengths_kv), table.to(query.device), style)
        return attend_eager(query, key_cache, value_cache, kwargs, style, op=fia)

    return attend


def cp_combine(out: Tensor, lse: Tensor, cp: int, group: ProcessGroup | None, *, gather: str = "functional") -> Tensor:
    """All-gather this rank's partial attention and merge the ranks' parts with their LSE.

    ONE ``all_gather`` of ``cat([out, lse], -1)`` across the CP group, then
    :func:`merge_attention_states`; returns ``[T, N, D]`` in ``out``'s dtype. Graph-capturable:
    the collective is a ``_c10d_functional`` op the recorder replays.
    """
    import torch.distributed._functional_collectives as funcol

    if cp == 1:
        return out
    assert group is not None, "cp > 1 needs the CP group"
    t, n, d = out.shape
    packed = torch.cat([out.float(), lse.float()], dim=-1)  # [T, N, D+1]: one collective
    group_name = funcol._resolve_group_name(group)
    ops = collective_ops()
    if gather == "out":  # into a buffer we own: the recorded wait is on that buffer
        gathered = packed.new_empty((cp * t, n, d + 1))
        ops.all_gather_into_tensor_out(packed, cp, group_name, out=gathered)
    else:
        # The ops all_gather_tensor(packed, 0, group) issues, without its AsyncCollectiveTensor
        # wrapper, whose eager path imports torch._dynamo (seconds per fresh rank).
        gathered = ops.all_gather_into_tensor(packed, cp, group_name)  # [cp*T, N, D+1]
    gathered = ops.wait_tensor(gathered).view(cp, t, n, d + 1)
    merged, _ = merge_attention_states(gathered[..., :d], gathered[..., d:])
    return merged.to(out.dtype)
