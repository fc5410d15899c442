"""Capture sizes (buckets): which padded token counts get a captured graph.

A captured graph freezes tensor shapes, so a serving engine captures one graph per
*capture size* and rounds every batch's token count up to the nearest one. This module
owns the rules that produce that list, in the order the engines apply them:

1. an explicit list from the user, or the default grid up to a default (or user) max;
2. every *keep* constraint (sequence parallel with ``tp > 1``: a size ``tp`` does not
   divide cannot be split across the ranks): drop the sizes it does not divide;
3. every *round-up* constraint (speculative decoding with ``q = 1 + k > 1``): round every
   size up to a multiple of the lcm of **all** constraints (``lcm(q, tp)`` with SP), drop
   what lands above the max, de-duplicate.

The constraints come from the active features (:class:`SizeConstraint`), so the same
function (:func:`resolve_capture_sizes`) serves the preflight check and the run.

It also owns the O(1) lookup from a token count to its padded size
(:class:`PaddedSizeTable`). Everything here is plain ints and lists so that the rules
can be tested exhaustively without a device.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "DEFAULT_MAX_CAPTURE_SIZE_CAP",
    "PaddedSizeTable",
    "Platform",
    "SizeConstraint",
    "compose_constraints",
    "default_capture_sizes",
    "default_max_capture_size",
    "resolve_capture_sizes",
    "sizes_for_sequence_parallel",
    "sizes_for_spec_decode",
    "truncate_to_grid",
]

Platform = Literal["npu", "gpu"]


@dataclass(frozen=True)
class SizeConstraint:
    """What one feature demands of every capture size: to be a multiple of ``multiple``.

    ``rule`` says what happens to a size that is not: ``"keep"`` drops it (sequence parallel:
    a bucket ``tp`` does not divide cannot be reduce-scattered), ``"round_up"`` rounds it up
    (speculative decoding: a decode bucket must hold whole requests of ``q`` tokens).
    ``source`` names the feature in error messages ("sequence parallel with tp=2").
    """

    multiple: int
    rule: Literal["keep", "round_up"]
    source: str

    def __post_init__(self) -> None:
        _require_positive("multiple", self.multiple)
        if self.rule not in ("keep", "round_up"):
            raise ValueError(f"rule must be 'keep' or 'round_up', got {self.rule!r}")


def compose_constraints(sizes: Sequence[int], constraints: Sequence[SizeConstraint]) -> list[int]:
    """Apply every constraint at once: keep-filters first, then one round-up to the lcm of all.

    Rounding to the lcm of *all* multiples is what makes SP and spec decode compose: with
    tp=2 and q=3 a size must be a multiple of 6, or a decode batch of whole requests cannot
    be split across the TP ranks (``T=3 is not a multiple of tp=2`` at capture).
    """
    sizes = sorted(set(sizes))
    keep = [c for c in constraints if c.rule == "keep" and c.multiple > 1]
    for c in keep:
        kept = [s for s in sizes if s % c.multiple == 0]
        if not kept:
            raise ValueError(f"{c.source} leaves no capture size: none of {sizes} is divisible by "
                             f"{c.multiple}")
        sizes = kept
    every = math.lcm(1, *(c.multiple for c in constraints))
    if all(s % every == 0 for s in sizes):
        return sizes
    why = " and ".join(dict.fromkeys(c.source for c in constraints if c.multiple > 1))
    try:
        return sizes_for_spec_decode(sizes, every, max(sizes))
    except ValueError:
        raise ValueError(f"no capture size left after rounding {sizes} up to multiples of {every} "
                         f"({why}) within max {max(sizes)}") from None

#: Upper bound of the default max capture size (upstream vLLM and vLLM Ascend; data-centre
#: Blackwell uses 1024 upstream, pass ``cap=1024`` for that).
DEFAULT_MAX_CAPTURE_SIZE_CAP = 512

# Grid boundaries: 1, 2, 4, then step 8 below 256, then step 16 from 256 on.
_SMALL_SIZES = (1, 2, 4)
_STEP8_START, _STEP16_START = 8, 256


def _require_positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def default_capture_sizes(max_size: int) -> list[int]:
    """The default capture-size grid, cut at ``max_size`` (inclusive).

    ``1, 2, 4``, every multiple of 8 below 256, every multiple of 16 from 256 up to
    ``max_size``. Dense steps where launch overhead dominates (small batches), coarse
    steps where padding costs real compute (large batches). At 512: 51 sizes.
    """
    _require_positive("max_size", max_size)
    sizes = [s for s in _SMALL_SIZES if s <= max_size]
    sizes += range(_STEP8_START, min(max_size + 1, _STEP16_START), 8)
    sizes += range(_STEP16_START, max_size + 1, 16)
    return sizes


def truncate_to_grid(max_size: int) -> int:
    """The last default-grid size ``<= max_size`` (257 -> 256).

    A user max that is off the grid would otherwise name a bucket the default list never
    contains; the engines keep the last grid size instead.
    """
    return default_capture_sizes(max_size)[-1]


def default_max_capture_size(
    max_num_seqs: int,
    num_speculative_tokens: int,
    platform: Platform,
    max_num_batched_tokens: int | None = None,
    cap: int = DEFAULT_MAX_CAPTURE_SIZE_CAP,
) -> int:
    """The default largest capture size when the user gives neither sizes nor a max.

    * ``gpu`` (upstream vLLM): ``min(max_num_seqs * (1 + k) * 2, cap)``;
    * ``npu`` (vLLM Ascend PR #7572): the same without ``* 2`` (fewer graphs, which
      matters under the ACL stream budget);

    then clamped to ``max_num_batched_tokens`` (a batch can never hold more tokens).
    The result is *not* snapped to the grid: ``resolve_capture_sizes`` builds the grid up
    to it, so an off-grid value leaves the largest decode batches uncaptured, exactly as
    in the engines (vLLM Ascend issue #16049).
    """
    _require_positive("max_num_seqs", max_num_seqs)
    if num_speculative_tokens < 0:
        raise ValueError(f"num_speculative_tokens must be >= 0, got {num_speculative_tokens}")
    _require_positive("cap", cap)
    factor = {"gpu": 2, "npu": 1}.get(platform)
    if factor is None:
        raise ValueError(f"platform must be 'npu' or 'gpu', got {platform!r}")
    size = min(max_num_seqs * (1 + num_speculative_tokens) * factor, cap)
    if max_num_batched_tokens is not None:
        _require_positive("max_num_batched_tokens", max_num_batched_tokens)
        size = min(size, max_num_batched_tokens)
    return size


def sizes_for_sequence_parallel(sizes: Sequence[int], tp: int) -> list[int]:
    """Keep only sizes divisible by ``tp`` (sequence parallel reduce-scatters tokens).

    With SP the hidden states are split along tokens across the TP ranks, so a bucket
    that ``tp`` does not divide cannot be split evenly (vLLM Ascend PRs #3334, #7801).
    ``tp <= 1`` keeps everything. An empty result is an error: the user would silently
    get no graphs at all.
    """
    _require_positive("tp", tp)
    if tp == 1:
        return sorted(set(sizes))
    kept = sorted({s for s in sizes if s % tp == 0})
    if not kept:
        raise ValueError(
            f"sequence parallel with tp={tp} leaves no capture size: none of "
            f"{sorted(sizes)} is divisible by tp={tp}"
        )
    return kept


def sizes_for_spec_decode(
    sizes: Sequence[int], q: int, max_size: int, tp: int = 1
) -> list[int]:
    """Round every size up to a multiple of ``q = 1 + num_speculative_tokens``.

    A uniform-decode graph holds ``num_reqs * q`` tokens; a bucket that ``q`` does not
    divide would route prefill-shaped batches into "decode" graphs (vLLM issue #28207).
    With sequence parallel (``tp > 1``) the multiple must also be divisible by ``tp``:
    we use ``lcm(q, tp)``. (Upstream ``adjust_cudagraph_sizes_for_spec_decode`` uses
    ``max(q, tp)`` and raises when that is not a common multiple; ``lcm`` agrees whenever
    upstream does not raise.) Sizes rounded above ``max_size`` are dropped, duplicates
    merged. If nothing is left but the multiple itself fits under ``max_size``, the
    multiple is kept (as upstream does); otherwise ``ValueError``.
    """
    _require_positive("q", q)
    _require_positive("max_size", max_size)
    _require_positive("tp", tp)
    multiple = math.lcm(q, tp)
    if multiple == 1:
        return sorted({s for s in sizes if s <= max_size})
    rounded = sorted({-(-s // multiple) * multiple for s in sizes} - {0})
    kept = [s for s in rounded if s <= max_size]
    if not kept and multiple <= max_size:
        kept = [multiple]
    if not kept:
        raise ValueError(
            f"no capture size left after rounding {sorted(sizes)} up to multiples of "
            f"{multiple} (q={q}, tp={tp}) within max {max_size}"
        )
    return kept


def _validate_explicit(sizes: Sequence[int], max_size: int | None) -> list[int]:
    if not sizes:
        raise ValueError("capture_sizes is empty: give at least one size or None")
    bad = [s for s in sizes if isinstance(s, bool) or not isinstance(s, int) or s < 1]
    if bad:
        raise ValueError(f"capture sizes must be positive ints, got {bad} in {list(sizes)}")
    if max_size is not None:
        above = sorted(s for s in sizes if s > max_size)
        if above:
            raise ValueError(
                f"capture sizes {above} are above the max capture size {max_size}"
            )
    return sorted(set(sizes))


def resolve_capture_sizes(
    *,
    max_num_seqs: int,
    platform: Platform = "npu",
    num_speculative_tokens: int = 0,
    capture_sizes: Sequence[int] | None = None,
    max_capture_size: int | None = None,
    max_num_batched_tokens: int | None = None,
    tp: int = 1,
    sequence_parallel: bool = False,
    cap: int = DEFAULT_MAX_CAPTURE_SIZE_CAP,
    constraints: Sequence[SizeConstraint] = (),
) -> list[int]:
    """The final capture sizes, ascending: every rule of this module in order.

    1. Base list. Explicit ``capture_sizes``: validated (non-empty, positive, none above
       ``max_capture_size`` or ``max_num_batched_tokens`` when given), de-duplicated.
       Otherwise the default grid up to a max: the user's ``max_capture_size`` (clamped to
       ``max_num_batched_tokens``, then truncated to the grid), or
       :func:`default_max_capture_size` for ``platform``.
    2. The constraints (:func:`compose_constraints`): ``constraints`` as the features
       declare them, plus the ones the keyword arguments name: sequence parallel
       (``sequence_parallel`` and ``tp > 1``) keeps multiples of ``tp``; speculative decoding
       (``num_speculative_tokens > 0``) rounds up to multiples of ``q``. The result is a
       multiple of the lcm of them all (``lcm(q, tp)`` with SP), within the max of the list
       after the keep-filters. ``num_speculative_tokens`` also sizes the default max.

    Raises ``ValueError`` whenever a step leaves nothing, so a misconfiguration never
    turns silently into "no graphs".
    """
    _require_positive("max_num_seqs", max_num_seqs)
    if num_speculative_tokens < 0:
        raise ValueError(f"num_speculative_tokens must be >= 0, got {num_speculative_tokens}")
    if max_capture_size is not None:
        _require_positive("max_capture_size", max_capture_size)
    if max_num_batched_tokens is not None:
        _require_positive("max_num_batched_tokens", max_num_batched_tokens)

    limit = max_capture_size
    if max_num_batched_tokens is not None:
        limit = max_num_batched_tokens if limit is None else min(limit, max_num_batched_tokens)

    if capture_sizes is not None:
        sizes = _validate_explicit(capture_sizes, limit)
    else:
        if max_capture_size is not None:
            top = truncate_to_grid(limit if limit is not None else max_capture_size)
        else:
            top = default_max_capture_size(
                max_num_seqs, num_speculative_tokens, platform, max_num_batched_tokens, cap
            )
        sizes = default_capture_sizes(top)

    every = list(constraints)
    if sequence_parallel and tp > 1:
        every.append(SizeConstraint(tp, "keep", f"sequence parallel with tp={tp}"))
    if num_speculative_tokens:
        q = 1 + num_speculative_tokens
        every.append(SizeConstraint(q, "round_up", f"speculative decoding with q={q}"))
    return compose_constraints(sizes, every)


@dataclass(frozen=True)
class PaddedSizeTable:
    """Token count -> padded capture size, one list index per lookup.

    Built once from the capture sizes; ``padded_size(n)`` is the smallest capture size
    ``>= n`` or ``None`` when ``n`` is above the largest size (that batch runs eagerly,
    unpadded). A list of length ``max + 1`` instead of a bisect, because the lookup runs
    on the host for every step and must stay constant-time.
    """

    sizes: tuple[int, ...]
    _table: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __init__(self, sizes: Sequence[int]) -> None:
        clean = tuple(_validate_explicit(sizes, None))
        table: list[int] = []
        for size in clean:
            table.extend([size] * (size + 1 - len(table)))
        object.__setattr__(self, "sizes", clean)
        object.__setattr__(self, "_table", tuple(table))

    @property
    def max_size(self) -> int:
        """The largest capture size; batches above it are not padded."""
        return self.sizes[-1]

    def padded_size(self, num_tokens: int) -> int | None:
        """The smallest capture size ``>= num_tokens``; ``None`` above ``max_size``.

        ``0`` maps to the smallest size (the literal rule; vLLM's table maps 0 to 0).
        """
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        if num_tokens > self.max_size:
            return None
        return self._table[num_tokens]
