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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness.graph.capture_sizes import PaddedSizeTable
from harness.graph.modes import CUDAGraphMode

__all__ = ["BatchDescriptor", "DispatchDecision", "Dispatcher", "is_uniform_decode"]


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
        self.table = PaddedSizeTable(capture_sizes)
        self.full_keys: frozenset[BatchDescriptor] = frozenset()
        self.piecewise_keys: frozenset[BatchDescriptor] = frozenset()
        if mode is not CUDAGraphMode.NONE:
            self._build_keys()

    def _build_keys(self) -> None:
        q = self.uniform_decode_query_len
        full: set[BatchDescriptor] = set()
        piecewise: set[BatchDescriptor] = set()
        mixed = self.mode.mixed_mode()
        if mixed is CUDAGraphMode.FULL:
            full.update(self._mixed_full_key(size) for size in self.table.sizes)
        elif mixed is CUDAGraphMode.PIECEWISE:
            piecewise.update(BatchDescriptor(size) for size in self.table.sizes)
        if self.mode.separate_routine() and self.mode.decode_mode() is CUDAGraphMode.FULL:
            cap = None if self.max_num_seqs is None else self.max_num_seqs * q
            full.update(
                BatchDescriptor(size, size // q, True)
                for size in self.table.sizes
                if size % q == 0 and (cap is None or size <= cap)
            )
        self.full_keys = frozenset(full)
        self.piecewise_keys = frozenset(piecewise)

    def _mixed_full_key(self, size: int) -> BatchDescriptor:
        """The key of the mixed-batch FULL graph of ``size`` tokens (pure FULL mode)."""
        if self.mixed_full_key_num_reqs and self.max_num_seqs is not None:
            return BatchDescriptor(size, min(size, self.max_num_seqs))
        return BatchDescriptor(size)

    @property
    def capture_sizes(self) -> tuple[int, ...]:
        return self.table.sizes

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
            return BatchDescriptor(num_tokens_padded, num_tokens_padded // q, True)
        return BatchDescriptor(num_tokens_padded)

    def dispatch(
        self,
        num_tokens: int,
        num_reqs: int,
        uniform_decode: bool,
        *,
        disable_full: bool = False,
    ) -> DispatchDecision:
        """Decide how one batch runs.

        ``uniform_decode`` must agree with the counts (``num_tokens == num_reqs * q``);
        a caller that claims otherwise has a bug upstream of the dispatcher, so it raises.
        ``disable_full`` skips FULL keys (cascade attention cannot run in a full graph).
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
        if self.mode is CUDAGraphMode.NONE:
            return self._eager(num_tokens, "graph mode NONE")
        padded = self.table.padded_size(num_tokens)
        if padded is None:
            return self._eager(
                num_tokens, f"{num_tokens} tokens above the largest capture size {self.table.max_size}"
            )
        key = self._padded_key(padded, uniform_decode)
        relaxed = key.relaxed()
        if not disable_full:
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
        if relaxed in self.piecewise_keys:
            return DispatchDecision(
                CUDAGraphMode.PIECEWISE,
                relaxed,
                padded,
                f"relaxed PIECEWISE key for {padded} tokens",
            )
        kind = "uniform decode" if uniform_decode else "mixed"
        return self._eager(
            num_tokens,
            f"no {self.mode} graph for a {kind} batch of {num_tokens} tokens"
            + (" (FULL disabled)" if disable_full else ""),
        )

    def _eager(self, num_tokens: int, reason: str) -> DispatchDecision:
        """NONE: no graph, the token count rounded up to ``token_multiple`` only."""
        m = self.token_multiple
        padded = -(-num_tokens // m) * m
        if padded != num_tokens:
            reason += f"; rounded to {padded}, a multiple of {m}"
        return DispatchDecision(CUDAGraphMode.NONE, None, padded, reason)
