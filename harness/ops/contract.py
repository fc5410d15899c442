"""Host-side contracts of the fused infer attention op (FIA).

On Ascend, FIA's *host tiling* inspects the host lists ``actual_seq_lengths`` (cumulative
query lengths) and ``actual_seq_lengths_kv`` (per-request KV lengths) before the kernel is
launched. CANN today rejects a TND call unless the last cumulative length equals the query's
token count T (error 561002). The harness evaluates that rule next to a proposed relaxed one,
so the rule is a parameter here, not a constant:

* ``"strict"``  (CANN today): ``actual_seq_lengths[-1] == T``.
* ``"relaxed"`` (reference section 4 proposal): only ``actual_seq_lengths[-1] > T`` is an error
  (it would read past the query); a smaller value is legal and the rows beyond it are padding.
* ``"off"``: no last-element rule at all. The kernel still refuses to read out of bounds.

The last-element rule belongs to TND, where ``actual_seq_lengths`` is cumulative. In dense BNSD
(query ``[B, N, S, D]``) both lists are per-batch valid lengths, so any value in ``[0, S]`` is
legal and the rule does not exist (:func:`bnsd_length_violation`).

Independently of the contract, some inputs are never acceptable (decreasing or negative
lengths, mismatched list lengths, KV lengths beyond the block table, too few block-table
rows, heads that do not divide). Those raise :class:`FiaArgumentError` whatever the contract.

The default contract is held in a :class:`contextvars.ContextVar` so that a test or a thread
that changes it with :func:`fia_contract` cannot leak the change to another.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import operator
from collections.abc import Iterator, Sequence
from typing import Literal, get_args

FiaContract = Literal["strict", "relaxed", "off"]
FIA_CONTRACTS: tuple[str, ...] = get_args(FiaContract)

#: CANN's error code for the TND last-element rule (vLLM Ascend issue #9088).
FIA_LAST_ELEMENT_CODE = 561002

_CURRENT_CONTRACT: contextvars.ContextVar[str] = contextvars.ContextVar(
    "harness_fia_contract", default="strict"
)


class FiaContractError(RuntimeError):
    """The host tiling refused the call under the active contract (the last-element rule).

    ``code`` is CANN's error code; ``str(err)`` starts with it, as CANN's log line does.
    """

    def __init__(self, message: str, *, code: int = FIA_LAST_ELEMENT_CODE) -> None:
        super().__init__(f"[{code}] {message}")
        self.code = code


class FiaArgumentError(ValueError):
    """Inputs that no contract accepts; the message names the offending argument."""

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(f"{argument}: {message}")
        self.argument = argument


def current_fia_contract() -> FiaContract:
    """The contract used when a wrapper is called with ``contract=None``."""
    return _CURRENT_CONTRACT.get()  # type: ignore[return-value]


def resolve_contract(contract: str | None) -> FiaContract:
    """``None`` -> the current default; anything else must name a known contract."""
    name = current_fia_contract() if contract is None else contract
    if name not in FIA_CONTRACTS:
        raise ValueError(f"unknown FIA contract {name!r}; expected one of {FIA_CONTRACTS}")
    return name  # type: ignore[return-value]


@contextlib.contextmanager
def fia_contract(name: FiaContract) -> Iterator[FiaContract]:
    """Make ``name`` the default contract inside the ``with`` block (context-local)."""
    token = _CURRENT_CONTRACT.set(resolve_contract(name))
    try:
        yield name
    finally:
        _CURRENT_CONTRACT.reset(token)


def bounds_violation(
    actual_seq_lengths: Sequence[int],
    actual_seq_lengths_kv: Sequence[int],
    block_table_shape: Sequence[int],
    block_size: int,
) -> tuple[str, str] | None:
    """First contract-independent problem with the host lists, as ``(argument, message)``.

    Shared by :func:`check_fia_lengths` (which raises :class:`FiaArgumentError`) and by the
    reference kernel (which raises a plain ``RuntimeError`` rather than read garbage when it
    is called directly, bypassing the wrapper).
    """
    q_cum = list(actual_seq_lengths)
    kv = list(actual_seq_lengths_kv)
    if len(q_cum) == 0:
        return "actual_seq_lengths", "must hold at least one request"
    if len(q_cum) != len(kv):
        return (
            "actual_seq_lengths_kv",
            f"has {len(kv)} entries but actual_seq_lengths has {len(q_cum)} (one per request)",
        )
    # The loops below find and word a problem; a valid list (the common case, up to max_num_seqs
    # entries per call) is recognised at C speed first.
    q_ok = min(q_cum) >= 0 and all(map(operator.le, q_cum, itertools.islice(q_cum, 1, None)))
    for i, value in enumerate(() if q_ok else q_cum):
        if value < 0:
            return "actual_seq_lengths", f"element {i} is negative ({value})"
        if i > 0 and value < q_cum[i - 1]:
            return (
                "actual_seq_lengths",
                f"is cumulative and must not decrease, but element {i} ({value}) "
                f"< element {i - 1} ({q_cum[i - 1]})",
            )
    if len(block_table_shape) != 2:
        return "block_table", f"must be 2-D [num_reqs, max_blocks], got shape {tuple(block_table_shape)}"
    if block_size <= 0:
        return "block_size", f"must be positive for paged KV, got {block_size}"
    rows, max_blocks = int(block_table_shape[0]), int(block_table_shape[1])
    if len(q_cum) > rows:
        return "block_table", f"has {rows} rows but the call has {len(q_cum)} requests"
    capacity = max_blocks * block_size
    kv_ok = not kv or (min(kv) >= 0 and max(kv) <= capacity)
    for i, value in enumerate(() if kv_ok else kv):
        if value < 0:
            return "actual_seq_lengths_kv", f"element {i} is negative ({value})"
        if value > capacity:
            return (
                "actual_seq_lengths_kv",
                f"element {i} ({value}) exceeds the block table's capacity "
                f"({max_blocks} blocks x block_size {block_size} = {capacity})",
            )
    return None


def check_fia_lengths(
    T: int,
    actual_seq_lengths: Sequence[int],
    actual_seq_lengths_kv: Sequence[int],
    block_table_shape: Sequence[int],
    block_size: int,
    contract: FiaContract | None = None,
) -> None:
    """Raise if the host tiling would refuse these lengths under ``contract``.

    A pure function of host values (no tensor data is read), so it is legal during a graph
    capture and reusable by the harness's checks to ask "would relaxed have accepted this?".

    Raises:
        FiaArgumentError: a contract-independent problem (see :func:`bounds_violation`).
        FiaContractError: the last-element rule of ``contract`` is broken.
    """
    name = resolve_contract(contract)
    problem = bounds_violation(actual_seq_lengths, actual_seq_lengths_kv, block_table_shape, block_size)
    if problem is not None:
        raise FiaArgumentError(*problem)
    last = int(actual_seq_lengths[-1])
    if name == "strict" and last != T:
        raise FiaContractError(
            f"When layout is TND, queryT({T}) must be equal to the last element of "
            f"actualSequenceLengthQ({last})"
        )
    if name == "relaxed" and last > T:
        raise FiaContractError(
            f"When layout is TND, the last element of actualSequenceLengthQ({last}) must not "
            f"exceed queryT({T}) (relaxed contract: a larger value reads past the query)"
        )


FiaLayout = Literal["TND", "BNSD"]
FIA_LAYOUTS: tuple[str, ...] = get_args(FiaLayout)


def kv_head_dim(shape: Sequence[int], kv_heads: int) -> int | None:
    """Head dim of a paged KV cache, 4-D ``[blocks, block_size, N_kv, D]`` or flat 3-D.

    vLLM Ascend hands FIA the cache as the flat view ``(num_blocks, block_size, N_kv * D)``
    (``key_cache.view(num_block, block_size, -1)`` in attention_v1.py); CANN reads N_kv from
    ``num_key_value_heads``. ``None`` when the last dim does not split into ``kv_heads``.
    """
    if len(shape) == 4:
        return int(shape[3])
    if len(shape) == 3 and kv_heads > 0 and shape[2] % kv_heads == 0:
        return int(shape[2]) // kv_heads
    return None


def shape_violation(
    query_shape: Sequence[int],
    key_shape: Sequence[int],
    value_shape: Sequence[int],
    *,
    block_size: int,
    num_heads: int,
    num_key_value_heads: int,
    input_layout: str = "TND",
    sparse_mode: int = 0,
) -> tuple[str, str] | None:
    """First problem with the tensor shapes and head/layout arguments, as ``(argument, message)``.

    Only shapes are read, so this runs on meta tensors too (it backs the fake kernels).
    TND takes a paged KV cache (4-D, or the flat 3-D view); BNSD takes dense, non-paged
    ``[B, N_kv, S_kv, D]`` key/value (the harness does not model paged BNSD).
    """
    if input_layout not in FIA_LAYOUTS:
        return "input_layout", f"the harness models {' and '.join(FIA_LAYOUTS)}, got {input_layout!r}"
    if sparse_mode not in (0, 3):
        return "sparse_mode", f"only 0 (no mask) and 3 (right-down causal) are supported, got {sparse_mode}"
    if num_heads <= 0:
        return "num_heads", f"must be positive, got {num_heads}"
    if num_key_value_heads < 0:
        return "num_key_value_heads", f"must be >= 0 (0 means num_heads), got {num_key_value_heads}"
    kv_heads = num_key_value_heads or num_heads
    if num_heads % kv_heads != 0:
        return (
            "num_key_value_heads",
            f"num_heads ({num_heads}) must be divisible by num_key_value_heads ({kv_heads})",
        )
    if input_layout == "BNSD":
        return _bnsd_shape_violation(query_shape, key_shape, value_shape, num_heads, kv_heads)
    if len(query_shape) != 3:
        return "query", f"TND layout needs a 3-D query [T, N, D], got shape {tuple(query_shape)}"
    if query_shape[1] != num_heads:
        return "query", f"has {query_shape[1]} heads but num_heads is {num_heads}"
    for name, shape in (("key", key_shape), ("value", value_shape)):
        if len(shape) not in (3, 4):
            return name, (
                f"paged KV needs [num_blocks, block_size, num_kv_heads, D] or the flat view "
                f"[num_blocks, block_size, num_kv_heads * D], got {tuple(shape)}"
            )
        if shape[1] != block_size:
            return name, f"dim 1 ({shape[1]}) must equal block_size ({block_size})"
        if len(shape) == 4 and shape[2] != kv_heads:
            return name, f"has {shape[2]} KV heads but num_key_value_heads is {kv_heads}"
        if kv_head_dim(shape, kv_heads) is None:
            return name, f"last dim {shape[2]} of the flat 3-D view does not split into {kv_heads} KV heads"
    if kv_head_dim(key_shape, kv_heads) != query_shape[2]:
        return "key", f"head dim {kv_head_dim(key_shape, kv_heads)} differs from the query's ({query_shape[2]})"
    if tuple(key_shape[:2]) != tuple(value_shape[:2]) or (
        len(key_shape) == 4 and len(value_shape) == 4 and key_shape[2] != value_shape[2]
    ):
        return "value", f"shape {tuple(value_shape)} does not match key {tuple(key_shape)}"
    return None


def _bnsd_shape_violation(
    query_shape: Sequence[int],
    key_shape: Sequence[int],
    value_shape: Sequence[int],
    num_heads: int,
    kv_heads: int,
) -> tuple[str, str] | None:
    if len(query_shape) != 4:
        return "query", f"BNSD layout needs a 4-D query [B, N, S, D], got shape {tuple(query_shape)}"
    if query_shape[1] != num_heads:
        return "query", f"has {query_shape[1]} heads (dim 1) but num_heads is {num_heads}"
    for name, shape in (("key", key_shape), ("value", value_shape)):
        if len(shape) != 4:
            return name, f"dense BNSD needs [B, N_kv, S_kv, D], got {tuple(shape)}"
        if shape[0] != query_shape[0]:
            return name, f"batch {shape[0]} differs from the query's ({query_shape[0]})"
        if shape[1] != kv_heads:
            return name, f"has {shape[1]} KV heads (dim 1) but num_key_value_heads is {kv_heads}"
    if key_shape[3] != query_shape[3]:
        return "key", f"head dim {key_shape[3]} differs from the query's ({query_shape[3]})"
    if key_shape[2] != value_shape[2]:
        return "value", f"S_kv {value_shape[2]} differs from the key's ({key_shape[2]})"
    return None


def bnsd_length_violation(
    query_shape: Sequence[int],
    key_shape: Sequence[int],
    actual_seq_lengths: Sequence[int] | None,
    actual_seq_lengths_kv: Sequence[int] | None,
) -> tuple[str, str] | None:
    """BNSD's host lists: PER-BATCH valid lengths (not cumulative, unlike TND).

    ``actual_seq_lengths[b]`` is how many of batch b's S query rows are real, and
    ``actual_seq_lengths_kv[b]`` how many of its S_kv keys; ``None`` means all of them. So
    there is no last-element rule here: any value in ``[0, S]`` is legal, in any order.
    The harness asks for exactly B entries.
    """
    batch, seq, seq_kv = int(query_shape[0]), int(query_shape[2]), int(key_shape[2])
    for name, values, bound in (("actual_seq_lengths", actual_seq_lengths, seq),
                                ("actual_seq_lengths_kv", actual_seq_lengths_kv, seq_kv)):
        if values is None:
            continue
        if len(values) != batch:
            return name, f"has {len(values)} entries; BNSD needs one per batch (B={batch})"
        for i, value in enumerate(values):
            if not 0 <= int(value) <= bound:
                return name, (f"element {i} ({value}) is outside [0, {bound}] "
                              f"(a per-batch length, at most the {'S' if bound == seq else 'S_kv'} dim)")
    return None
