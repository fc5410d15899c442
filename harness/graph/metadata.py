"""Host-side attention metadata for one step, and the padding that graph buckets force.

The fused infer attention op (FIA, TND layout) takes the per-request query boundaries as a
host list ``actual_seq_lengths`` (cumulative: ``query_start_loc[1:]``) and rejects a call
unless its last element equals the token count ``T`` of the query tensor (CANN error
561002). Graph buckets pad ``T``; so do SP, DP and MTP. The metadata must then be padded
too, and this module is where that happens (vLLM Ascend ``_pad_query_start_loc_for_fia``,
PR #6475, corrected by PR #7460):

* **uniform** batch: append *fake requests* of ``q`` tokens each after the last real one;
* **mixed** batch: append *one dummy request* that absorbs every padding token;
* padded/dummy requests get KV length 0 and a zero block-table row; padding tokens get
  slot ``-1`` (the cache write skips them) and position 0.

vLLM Ascend pads the requests only where the attention sees every padded row: a FULL runtime,
or sequence parallel (``model_runner_v1.py``: ``cudagraph_mode == FULL or (enable_sp() and not
use_mla) and dcp_size == 1``). Everywhere else (PIECEWISE and NONE without SP) the lists stay
unpadded and the attention slices the query to the real tokens, ``query[:actual_seq_lengths_q[-1]]``
(``attention_v1.py``): :func:`slice_attention_metadata`, marked ``query_slice``.

With the fix off, only the token-level lists are padded and ``actual_seq_lengths[-1] < T``:
the known-bad metadata that the FIA contract check must catch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields

from harness.graph.dispatcher import is_uniform_decode
from harness.graph.modes import CUDAGraphMode

__all__ = [
    "AttentionMetadata",
    "ScheduledRequest",
    "build_attention_metadata",
    "pad_attention_metadata",
    "slice_attention_metadata",
]

#: Slot-mapping value for a token that must not be written to the KV cache.
PAD_SLOT_ID = -1


@dataclass(frozen=True)
class ScheduledRequest:
    """One request's share of a step.

    ``num_computed_tokens``: KV entries already in the cache before this step;
    ``num_new_tokens``: query tokens scheduled now (1 for plain decode, ``q`` for spec
    decode, the chunk length for prefill); ``block_ids``: the request's KV blocks in order.
    """

    req_id: str
    num_computed_tokens: int
    num_new_tokens: int
    block_ids: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.num_computed_tokens < 0:
            raise ValueError(f"{self.req_id}: num_computed_tokens must be >= 0")
        if self.num_new_tokens < 1:
            raise ValueError(f"{self.req_id}: num_new_tokens must be >= 1")

    @property
    def seq_len(self) -> int:
        """KV length after this step: what attention reads for this request."""
        return self.num_computed_tokens + self.num_new_tokens


@dataclass(frozen=True)
class AttentionMetadata:
    """The host lists one attention call consumes, padded or not.

    Request-indexed lists have ``num_reqs_padded`` entries (``query_start_loc`` one more);
    token-indexed lists have ``num_input_tokens`` entries. Fields are plain lists so that
    contract checks and reports can compare them directly; nothing here mutates them.
    """

    num_reqs: int
    num_reqs_padded: int
    num_actual_tokens: int
    num_input_tokens: int
    query_start_loc: list[int]
    actual_seq_lengths: list[int]
    seq_lens: list[int]
    block_table: list[list[int]]
    slot_mapping: list[int]
    positions: list[int]
    query_lens: list[int]
    padding_source: str = field(default="none")
    #: the attention reads only the first ``actual_seq_lengths[-1]`` query rows (no padded request)
    query_slice: bool = False

    @property
    def query_rows(self) -> int | None:
        """The query rows the attention reads (``None``: all of them; see ``query_slice``)."""
        if not self.query_slice:
            return None
        return self.actual_seq_lengths[-1] if self.actual_seq_lengths else 0

    @property
    def num_padding_tokens(self) -> int:
        return self.num_input_tokens - self.num_actual_tokens

    @property
    def num_padding_reqs(self) -> int:
        return self.num_reqs_padded - self.num_reqs


def _cumsum0(values: Sequence[int]) -> list[int]:
    out = [0]
    for v in values:
        out.append(out[-1] + v)
    return out


def build_attention_metadata(
    requests: Sequence[ScheduledRequest], block_size: int, max_blocks_per_req: int
) -> AttentionMetadata:
    """The unpadded metadata of one step: what eager mode would pass.

    Token ``pos`` of a request (absolute position in its sequence) is written to slot
    ``block_ids[pos // block_size] * block_size + pos % block_size``.
    """
    if not requests:
        raise ValueError("a step needs at least one request")
    if block_size < 1 or max_blocks_per_req < 1:
        raise ValueError("block_size and max_blocks_per_req must be >= 1")
    query_lens: list[int] = []
    seq_lens: list[int] = []
    block_table: list[list[int]] = []
    slot_mapping: list[int] = []
    positions: list[int] = []
    for req in requests:
        needed = -(-req.seq_len // block_size)
        if len(req.block_ids) < needed:
            raise ValueError(
                f"{req.req_id}: {req.seq_len} tokens need {needed} blocks of {block_size}, "
                f"got {len(req.block_ids)}"
            )
        if len(req.block_ids) > max_blocks_per_req:
            raise ValueError(
                f"{req.req_id}: {len(req.block_ids)} blocks exceed max_blocks_per_req="
                f"{max_blocks_per_req}"
            )
        query_lens.append(req.num_new_tokens)
        seq_lens.append(req.seq_len)
        block_table.append(list(req.block_ids) + [0] * (max_blocks_per_req - len(req.block_ids)))
        for pos in range(req.num_computed_tokens, req.seq_len):
            slot_mapping.append(req.block_ids[pos // block_size] * block_size + pos % block_size)
            positions.append(pos)
    qsl = _cumsum0(query_lens)
    return AttentionMetadata(
        num_reqs=len(requests),
        num_reqs_padded=len(requests),
        num_actual_tokens=qsl[-1],
        num_input_tokens=qsl[-1],
        query_start_loc=qsl,
        actual_seq_lengths=qsl[1:],
        seq_lens=seq_lens,
        block_table=block_table,
        slot_mapping=slot_mapping,
        positions=positions,
        query_lens=query_lens,
    )


def _uniform_request_count(
    meta: AttentionMetadata,
    num_tokens_padded: int,
    q: int,
    runtime_mode: CUDAGraphMode,
    configured_mode: CUDAGraphMode,
    uniform: bool | None = None,
) -> int | None:
    """The padded request count when the batch replays a *uniform* FULL decode graph.

    That graph was captured for ``num_tokens_padded // q`` requests of ``q`` tokens, and
    the metadata must describe the same shape. This is the case exactly when the
    dispatcher picked a uniform FULL key: a dual mode with a FULL decode routine
    (FULL_DECODE_ONLY, FULL_AND_PIECEWISE), runtime FULL, a uniform-decode batch, and a
    bucket divisible by ``q``. ``None`` otherwise: the batch then keeps its real request
    count and, if tokens were padded, gets one dummy request.

    Pure FULL mode (configured FULL, runtime FULL) never counts as uniform: its one
    graph per bucket is the mixed graph, captured without a fixed request count, so its
    requests are not padded to ``T / q`` (vLLM Ascend PR #7460: only pure FULL takes the
    real ``num_reqs``; FULL_DECODE_ONLY had wrongly done the same, so its uniform decode
    replays got one dummy request instead of the ``T / q`` requests the graph was
    captured with, which cost accuracy).
    """
    if runtime_mode is not CUDAGraphMode.FULL:
        return None
    if not (configured_mode.separate_routine() and configured_mode.decode_mode() is CUDAGraphMode.FULL):
        return None
    if uniform is None:
        uniform = is_uniform_decode(meta.query_lens, q)
    if not uniform or num_tokens_padded % q:
        return None
    return num_tokens_padded // q


def pad_attention_metadata(
    meta: AttentionMetadata,
    num_tokens_padded: int,
    *,
    uniform_decode_query_len: int,
    runtime_mode: CUDAGraphMode,
    configured_mode: CUDAGraphMode,
    fia_padding_fix: bool = True,
    uniform: bool | None = None,
) -> AttentionMetadata:
    """Pad unpadded metadata to ``num_tokens_padded`` tokens.

    ``uniform``: whether the dispatcher picked a uniform key (None: read from the query lengths;
    under spec decode a batch of ``q``-token requests is not uniform when one is a fresh prompt).

    Tokens are always padded: slot ``-1``, position 0. Requests:

    * ``fia_padding_fix=False``: left as they are, so ``actual_seq_lengths[-1] < T``
      whenever tokens were padded (the metadata an engine without PR #6475 produces);
    * no padding tokens: unchanged (vLLM Ascend's mixed branch would append a zero-length
      dummy here; we do not, since the FIA contract already holds);
    * uniform case (see ``_uniform_request_count``): fake requests of ``q`` tokens up to
      ``num_tokens_padded // q`` requests;
    * otherwise, including pure FULL mode and every PIECEWISE / NONE runtime: one dummy
      request absorbing all padding tokens.

    Padded/dummy requests get KV length 0 and a zero block-table row. With the fix on,
    ``actual_seq_lengths[-1] == num_input_tokens`` always holds (asserted).
    """
    q = uniform_decode_query_len
    if q < 1:
        raise ValueError(f"uniform_decode_query_len must be >= 1, got {q}")
    if meta.num_input_tokens != meta.num_actual_tokens or meta.num_reqs_padded != meta.num_reqs:
        raise ValueError("pad_attention_metadata takes unpadded metadata (pad once)")
    if num_tokens_padded < meta.num_actual_tokens:
        raise ValueError(
            f"cannot pad {meta.num_actual_tokens} tokens down to {num_tokens_padded}"
        )
    pad = num_tokens_padded - meta.num_actual_tokens
    if pad == 0:
        return meta
    slot_mapping = meta.slot_mapping + [PAD_SLOT_ID] * pad
    positions = meta.positions + [0] * pad
    tokens_only = dict(
        num_input_tokens=num_tokens_padded, slot_mapping=slot_mapping, positions=positions
    )
    if not fia_padding_fix:
        last = meta.query_start_loc[-1]
        return _replace(
            meta,
            **tokens_only,
            padding_source=(
                f"unpadded metadata: last element < T ({last} < {num_tokens_padded})"
            ),
        )

    uniform_reqs = _uniform_request_count(meta, num_tokens_padded, q, runtime_mode, configured_mode, uniform)
    if uniform_reqs is not None:
        extra = [q] * (uniform_reqs - meta.num_reqs)
        source = f"uniform: {len(extra)} fake requests"
    else:
        extra = [pad]
        source = f"mixed: one dummy request absorbing {pad} tokens"
    width = len(meta.block_table[0]) if meta.block_table else 0
    query_lens = meta.query_lens + extra
    qsl = _cumsum0(query_lens)
    padded = _replace(
        meta,
        **tokens_only,
        num_reqs_padded=len(query_lens),
        query_start_loc=qsl,
        actual_seq_lengths=qsl[1:],
        seq_lens=meta.seq_lens + [0] * len(extra),
        block_table=meta.block_table + [[0] * width for _ in extra],
        query_lens=query_lens,
        padding_source=source,
    )
    assert padded.actual_seq_lengths[-1] == padded.num_input_tokens, padded
    return padded


def slice_attention_metadata(meta: AttentionMetadata, num_tokens_padded: int) -> AttentionMetadata:
    """Pad the tokens to ``num_tokens_padded`` and leave the requests alone: the attention slices.

    The non-FULL path of vLLM Ascend without SP: ``query_start_loc`` keeps the real requests, so
    ``actual_seq_lengths[-1]`` is the real token count, and the attention runs on
    ``query[:actual_seq_lengths[-1]]`` (the FIA host check then holds with no dummy request).
    Padding tokens still get slot ``-1`` and position 0; their attention rows are zero.
    """
    if meta.num_input_tokens != meta.num_actual_tokens or meta.num_reqs_padded != meta.num_reqs:
        raise ValueError("slice_attention_metadata takes unpadded metadata (pad once)")
    pad = num_tokens_padded - meta.num_actual_tokens
    if pad < 0:
        raise ValueError(f"cannot pad {meta.num_actual_tokens} tokens down to {num_tokens_padded}")
    if pad == 0:
        return meta
    return _replace(meta, num_input_tokens=num_tokens_padded, slot_mapping=meta.slot_mapping + [PAD_SLOT_ID] * pad,
                    positions=meta.positions + [0] * pad, query_slice=True,
                    padding_source=f"sliced: attention reads the first {meta.num_actual_tokens} of "
                                   f"{num_tokens_padded} rows (no dummy request)")


def _replace(meta: AttentionMetadata, **changes: object) -> AttentionMetadata:
    """``dataclasses.replace`` with fresh copies of every list (no aliasing between steps)."""
    values = {f.name: getattr(meta, f.name) for f in fields(meta)}
    values.update(changes)
    for name, value in values.items():
        if isinstance(value, list):
            values[name] = [list(v) if isinstance(v, list) else v for v in value]
    return AttentionMetadata(**values)
