"""Per-batch dispatch: which captured graph (if any) runs this batch, at what padded size.

One decision, one place, data in, decision out (after vLLM's ``CudagraphDispatcher``).
At construction the dispatcher turns the configured mode and the capture sizes into two
key sets, the graphs that exist:

* mixed routine (``mode.mixed_mode()``) ``!= NONE``: one *relaxed* key
  ``(size, num_reqs=None, uniform_decode=False)`` per capture size, under that routine
  (PIECEWISE, or FULL for pure FULL mode, whose one graph serves every batch shape);
* dual modes with a FULL decode routine (FULL_DECODE_ONLY, FULL_AND_PIECEWISE): one
  *uniform* FULL key ``(size, size // q, True)`` per capture size that is a multiple of
  ``q`` (``q <= size``), and, when ``max_num_seqs`` is given, ``size <= max_num_seqs * q``
  (a decode batch can never have more requests than that).

At dispatch the token count is padded to its bucket, and the decision is: the exact FULL
key, else the relaxed key under FULL, else the relaxed key under PIECEWISE, else NONE with
the token count left unpadded. A batch above the largest capture size runs eagerly,
unpadded. ``token_multiple`` (features that split tokens across ranks: SP's tp) rounds an
eager batch up to a multiple; every capture size is one already (graph.capture_sizes).

``valid_modes`` / ``invalid_modes`` restrict the runtime modes one dispatch may pick (vLLM's
``CudagraphDispatcher.dispatch`` since vLLM Ascend PR #6944 took it up: DP re-dispatches within
the agreed mode, cascade attention leaves FULL out); ``disable_full`` is the older spelling of
``invalid_modes={FULL}``. A uniform FULL key carries ``min(T // q, max_num_seqs)`` requests
(vLLM ``_create_padded_batch_descriptor``). Mode NONE has no capture sizes at all (vLLM
``_set_cudagraph_sizes``: ``[]``, max 0), so every batch runs eagerly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness.graph.capture_sizes import PaddedSizeTable
from harness.graph.modes import CUDAGraphMode

__all__ = ["BatchDescriptor", "DispatchDecision", "Dispatcher", "RUNTIME_MODES", "is_uniform_decode"]

#: vLLM's ``CUDAGraphMode.valid_runtime_modes()``: what a dispatch may answer.
RUNTIME_MODES = frozenset({CUDAGraphMode.NONE, CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL})


@dataclass(frozen=True)
class BatchDescriptor:
    """The key of one captured graph.

    ``num_reqs`` is set for uniform-decode keys (a full decode graph is captured for exactly
    ``num_tokens // q`` requests) and, on newer vLLM, for mixed FULL keys as
    ``min(num_tokens, max_num_seqs)`` (PR #34043: the request count the graph was captured
    with, no longer the batch's own); ``None`` is a relaxed key that serves any request count.
    """

    num_tokens: int
    num_reqs: int | None = None
    uniform_decode: bool = False

    def relaxed(self) -> BatchDescriptor:
        """The more general key a uniform batch may fall back to (any request count)."""
        return BatchDescriptor(num_tokens=self.num_tokens)


@dataclass(frozen=True)
class DispatchDecision:
    """What runs one batch.

    ``batch_descriptor`` is the key of the graph that replays it (``None`` for NONE),
    ``num_tokens_padded`` the token count the forward runs with (the bucket for FULL and
    PIECEWISE; the real count for NONE), ``reason`` one line for reports.
    """

    runtime_mode: CUDAGraphMode
    batch_descriptor: BatchDescriptor | None
    num_tokens_padded: int
    reason: str

    @property
    def graph_key(self) -> BatchDescriptor:
        """The key of the graph that replays the batch (a FULL or PIECEWISE decision has one)."""
        if self.batch_descriptor is None:
            raise RuntimeError(f"a {self.runtime_mode} decision without a batch descriptor")
        return self.batch_descriptor


def is_uniform_decode(query_lens: Sequence[int], q: int) -> bool:
    """True when every request has exactly ``q = 1 + num_speculative_tokens`` new tokens.

    An empty batch is not uniform decode (there is no graph to pick for it).
    """
    return bool(query_lens) and all(n == q for n in query_lens)


class Dispatcher:
    """Maps ``(num_tokens, num_reqs, uniform_decode)`` to a :class:`DispatchDecision`.

    The key sets built here are the only source of truth for which graphs exist: the
    runner captures exactly ``capture_keys()`` and replays only what ``dispatch`` names.
    """

    def __init__(
        self,
        mode: CUDAGraphMode,
        capture_sizes: Sequence[int],
        uniform_decode_query_len: int = 1,
        max_num_seqs: int | None = None,
        token_multiple: int = 1,
        mixed_full_key_num_reqs: bool = False,
    ) -> None:
        if token_multiple < 1:
            raise ValueError(f"token_multiple must be >= 1, got {token_multiple}")
        if uniform_decode_query_len < 1:
            raise ValueError(
                f"uniform_decode_query_len must be >= 1, got {uniform_decode_query_len}"
            )
        if max_num_seqs is not None and max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        self.mode = mode
        self.uniform_decode_query_len = uniform_decode_query_len
        self.max_num_seqs = max_num_seqs
        self.token_multiple = token_multiple
        # vLLM after PR #34043: mixed FULL keys carry min(T, max_num_seqs) requests (a profile rule)
        self.mixed_full_key_num_reqs = mixed_full_key_num_reqs
        if not capture_sizes and mode is not CUDAGraphMode.NONE:
            raise ValueError(f"graph mode {mode} needs capture sizes (only NONE has none)")
        # The mode's two routines: the graphs of mixed batches, and of uniform decode batches
        # where the mode keeps a separate one.
        mixed = mode.mixed_mode()
        decode = mode.decode_mode() if mode.separate_routine() else None
        self.table = PaddedSizeTable(capture_sizes) if capture_sizes else None
        self.full_keys: frozenset[BatchDescriptor] = frozenset()
        self.piecewise_keys: frozenset[BatchDescriptor] = frozenset()
        if self.table is not None and mode is not CUDAGraphMode.NONE:
            self._build_keys(self.table, mixed, decode)

    def _build_keys(self, table: PaddedSizeTable, mixed: CUDAGraphMode, decode: CUDAGraphMode | None) -> None:
        q = self.uniform_decode_query_len
        full: set[BatchDescriptor] = set()
        piecewise: set[BatchDescriptor] = set()
        if mixed is CUDAGraphMode.FULL:
            full.update(self._mixed_full_key(size) for size in table.sizes)
        elif mixed is CUDAGraphMode.PIECEWISE:
            piecewise.update(BatchDescriptor(size) for size in table.sizes)
        if decode is CUDAGraphMode.FULL:
            cap = None if self.max_num_seqs is None else self.max_num_seqs * q
            full.update(
                self._uniform_key(size)
                for size in table.sizes
                if size % q == 0 and (cap is None or size <= cap)
            )
        self.full_keys = frozenset(full)
        self.piecewise_keys = frozenset(piecewise)

    def _mixed_full_key(self, size: int) -> BatchDescriptor:
        """The key of the mixed-batch FULL graph of ``size`` tokens (pure FULL mode)."""
        if self.mixed_full_key_num_reqs and self.max_num_seqs is not None:
            return BatchDescriptor(size, min(size, self.max_num_seqs))
        return BatchDescriptor(size)

    def _uniform_key(self, size: int) -> BatchDescriptor:
        """The uniform FULL key of ``size`` tokens: ``min(size // q, max_num_seqs)`` requests."""
        reqs = size // self.uniform_decode_query_len
        return BatchDescriptor(size, reqs if self.max_num_seqs is None else min(reqs, self.max_num_seqs), True)

    @property
    def capture_sizes(self) -> tuple[int, ...]:
        return self.table.sizes if self.table else ()

    def capture_keys(self) -> list[tuple[CUDAGraphMode, BatchDescriptor]]:
        """Every graph to capture: PIECEWISE first, then FULL, largest first within each
        (largest first so later, smaller captures reuse the memory pool)."""
        out: list[tuple[CUDAGraphMode, BatchDescriptor]] = []
        for mode, keys in (
            (CUDAGraphMode.PIECEWISE, self.piecewise_keys),
            (CUDAGraphMode.FULL, self.full_keys),
        ):
            ordered = sorted(keys, key=lambda k: (k.num_tokens, k.uniform_decode), reverse=True)
            out.extend((mode, key) for key in ordered)
        return out

    def _padded_key(self, num_tokens_padded: int, uniform_decode: bool) -> BatchDescriptor:
        q = self.uniform_decode_query_len
        if (
            uniform_decode
            and self.mode.has_full_cudagraphs()
            and num_tokens_padded % q == 0
        ):
            return self._uniform_key(num_tokens_padded)
        return BatchDescriptor(num_tokens_padded)

    def dispatch(
        self,
        num_tokens: int,
        num_reqs: int,
        uniform_decode: bool,
        *,
        disable_full: bool = False,
        valid_modes: frozenset[CUDAGraphMode] | set[CUDAGraphMode] | None = None,
        invalid_modes: frozenset[CUDAGraphMode] | set[CUDAGraphMode] | None = None,
    ) -> DispatchDecision:
        """Decide how one batch runs.

        ``uniform_decode`` must agree with the counts (``num_tokens == num_reqs * q``);
        a caller that claims otherwise has a bug upstream of the dispatcher, so it raises.
        ``valid_modes`` (None: every runtime mode) minus ``invalid_modes`` are the modes it may
        answer; ``disable_full`` adds FULL to ``invalid_modes`` (cascade attention cannot run in a
        full graph). Only NONE allowed: NONE at once. No graph found and NONE not allowed: vLLM
        asserts ("No matching cudagraph found and NONE is not in allowed_modes"), here a
        ``ValueError`` with the same words.
        """
        if num_tokens < 1 or num_reqs < 1:
            raise ValueError(
                f"a batch needs num_tokens >= 1 and num_reqs >= 1, got {num_tokens}, {num_reqs}"
            )
        q = self.uniform_decode_query_len
        if uniform_decode and num_tokens != num_reqs * q:
            raise ValueError(
                f"uniform decode batch with {num_reqs} requests of q={q} must have "
                f"{num_reqs * q} tokens, got {num_tokens}"
            )
        allowed = set(valid_modes) if valid_modes else set(RUNTIME_MODES)
        allowed -= set(invalid_modes or ()) | ({CUDAGraphMode.FULL} if disable_full else set())
        if not allowed:
            raise ValueError(f"No allowed cudagraph modes: valid_modes={valid_modes}, invalid_modes={invalid_modes}")
        if self.mode is CUDAGraphMode.NONE or self.table is None:
            return self._eager(num_tokens, "graph mode NONE")
        if allowed <= {CUDAGraphMode.NONE}:
            return self._eager(num_tokens, "only NONE allowed (the modes the DP ranks agreed on)")
        padded = self.table.padded_size(num_tokens)
        if padded is None:
            return self._eager(
                num_tokens, f"{num_tokens} tokens above the largest capture size {self.table.max_size}"
            )
        key = self._padded_key(padded, uniform_decode)
        relaxed = key.relaxed()
        if CUDAGraphMode.FULL in allowed:
            if key in self.full_keys:
                return DispatchDecision(
                    CUDAGraphMode.FULL, key, padded, f"exact FULL key for {padded} tokens"
                )
            mixed = self._mixed_full_key(padded)
            if mixed in self.full_keys:  # a mixed batch's own key, or a uniform batch's fallback
                how = "relaxed" if key.uniform_decode else "exact"
                return DispatchDecision(
                    CUDAGraphMode.FULL, mixed, padded, f"{how} FULL key for {padded} tokens"
                )
        if CUDAGraphMode.PIECEWISE in allowed and relaxed in self.piecewise_keys:
            return DispatchDecision(
                CUDAGraphMode.PIECEWISE,
                relaxed,
                padded,
                f"relaxed PIECEWISE key for {padded} tokens",
            )
        if CUDAGraphMode.NONE not in allowed:
            raise ValueError(f"No matching cudagraph found and NONE is not in allowed_modes="
                             f"{sorted(m.name for m in allowed)} ({num_tokens} tokens)")
        kind = "uniform decode" if uniform_decode else "mixed"
        return self._eager(
            num_tokens,
            f"no {self.mode} graph for a {kind} batch of {num_tokens} tokens"
            + ("" if CUDAGraphMode.FULL in allowed else " (FULL not allowed)"),
        )

    def _eager(self, num_tokens: int, reason: str) -> DispatchDecision:
        """NONE: no graph, the token count rounded up to ``token_multiple`` only."""
        m = self.token_multiple
        padded = -(-num_tokens // m) * m
        if padded != num_tokens:
            reason += f"; rounded to {padded}, a multiple of {m}"
        return DispatchDecision(CUDAGraphMode.NONE, None, padded, reason)
