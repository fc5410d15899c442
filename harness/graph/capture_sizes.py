"""Capture sizes (buckets): which padded token counts get a captured graph.

A captured graph freezes tensor shapes, so a serving engine captures one graph per
*capture size* and rounds every batch's token count up to the nearest one. This module
owns the rules that produce that list, in the order the engines apply them (vLLM
``VllmConfig._set_cudagraph_sizes``, then ``CompilationConfig.adjust_cudagraph_sizes_for_spec_decode``):

1. an explicit list from the user, minus the sizes above ``max_num_batched_tokens``
   (dropped, with a warning, never an error); or the default grid up to a default (or user)
   max, plus the off-grid values some stacks add (``max_num_batched_tokens``, the decode
   ceiling ``max_num_seqs * q``);
2. every *keep* constraint (sequence parallel with ``tp > 1``: a size ``tp`` does not
   divide cannot be split across the ranks): drop the sizes it does not divide. A user max
   that then differs from the list's largest size is an error when the list was given too;
3. every *round-up* constraint (speculative decoding with ``q = 1 + k > 1``), only when the
   decode routine is FULL: round every size up to a multiple (``max(q, tp)`` with SP, and
   the engine refuses to start when that is not a common multiple; or, as a harness
   alternative, ``lcm(q, tp)``), drop what lands above the max, de-duplicate.

The constraints come from the active features (:class:`SizeConstraint`), so the same
function (:func:`resolve_sizes`) serves the preflight check and the run; its
:class:`SizeResolution` keeps the warnings the engine would log.

It also owns the O(1) lookup from a token count to its padded size
(:class:`PaddedSizeTable`). Everything here is plain ints and lists so that the rules
can be tested exhaustively without a device.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "DEFAULT_MAX_CAPTURE_SIZE_CAP",
    "EngineRefusal",
    "PaddedSizeTable",
    "Platform",
    "SizeConstraint",
    "SizeResolution",
    "SpecSpMultiple",
    "compose_constraints",
    "default_capture_sizes",
    "default_max_capture_size",
    "dummy_request_lens",
    "needs_tp_aligned_sizes",
    "resolve_capture_sizes",
    "resolve_sizes",
    "sizes_for_sequence_parallel",
    "sizes_for_spec_decode",
    "spec_decode_multiple",
    "spec_decode_rounding",
    "truncate_to_grid",
]

Platform = Literal["npu", "gpu"]
#: How spec decode's multiple meets SP's: upstream's ``max(q, tp)`` (refuses unless it is a
#: common multiple) or the harness's ``lcm(q, tp)``.
SpecSpMultiple = Literal["max", "lcm"]


class EngineRefusal(Exception):
    """The real engine refuses to start with this configuration (not a bad scenario file).

    Not a ``ValueError`` on purpose: a bad input is a collection error naming the file, while
    a configuration upstream rejects at start-up is a point that cannot run (a skip, with the
    engine's own message as the reason).
    """


@dataclass(frozen=True)
class SizeResolution:
    """The final capture sizes and what the engine would have logged on the way.

    ``dropped``: user sizes removed because they exceed ``max_num_batched_tokens``;
    ``notes``: the warnings, worded after the engine's own (a report shows them).
    """

    sizes: list[int]
    dropped: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


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


def compose_constraints(sizes: Sequence[int], constraints: Sequence[SizeConstraint], *,
                        decode_full: bool = True, spec_sp_multiple: SpecSpMultiple = "max") -> list[int]:
    """Apply every constraint: keep-filters first, then one round-up for all of them.

    The round-up is spec decode's ``adjust_cudagraph_sizes_for_spec_decode``, which upstream
    runs only when the decode routine is FULL (``decode_full``: FULL, FULL_DECODE_ONLY,
    FULL_AND_PIECEWISE); PIECEWISE and NONE keep the sizes as they are. Its multiple, when a
    keep-filter (SP's tp) is also active:

    * ``"max"`` (upstream): ``max(q, tp)``; when that is not a multiple of both, the engine
      refuses to start (:class:`EngineRefusal`, with vLLM's message);
    * ``"lcm"`` (the harness's alternative): ``lcm(q, tp)``, which agrees with ``max``
      whenever upstream starts, and composes where upstream refuses.
    """
    sizes = sorted(set(sizes))
    keep = [c for c in constraints if c.rule == "keep" and c.multiple > 1]
    for c in keep:
        kept = [s for s in sizes if s % c.multiple == 0]
        if not kept:
            raise ValueError(f"{c.source} leaves no capture size: none of {sizes} is divisible by "
                             f"{c.multiple}")
        sizes = kept
    multiple = spec_decode_rounding(constraints, decode_full=decode_full, spec_sp_multiple=spec_sp_multiple)
    if all(s % multiple == 0 for s in sizes):
        return sizes
    round_up = [c for c in constraints if c.rule == "round_up" and c.multiple > 1]
    why = " and ".join(dict.fromkeys(c.source for c in (*keep, *round_up)))
    try:
        return sizes_for_spec_decode(sizes, multiple, max(sizes))
    except ValueError:
        raise ValueError(f"no capture size left after rounding {sizes} up to multiples of {multiple} "
                         f"({why}) within max {max(sizes)}") from None

def spec_decode_rounding(constraints: Sequence[SizeConstraint], *, decode_full: bool = True,
                         spec_sp_multiple: SpecSpMultiple = "max") -> int:
    """The multiple spec decode rounds every capture size up to, from all the constraints: 1 when
    nothing rounds (no speculation, or a decode routine that is not FULL). Raises
    :class:`EngineRefusal` where the real engine refuses to start (:func:`spec_decode_multiple`)."""
    round_up = [c for c in constraints if c.rule == "round_up" and c.multiple > 1]
    if not round_up or not decode_full:
        return 1
    q = math.lcm(*(c.multiple for c in round_up))
    tp = math.lcm(1, *(c.multiple for c in constraints if c.rule == "keep" and c.multiple > 1))
    return spec_decode_multiple(q, tp, spec_sp_multiple)


def spec_decode_multiple(q: int, tp: int, how: SpecSpMultiple = "max") -> int:
    """What spec decode rounds capture sizes to, with SP's ``tp`` (1 without SP).

    ``"max"`` is vLLM's ``adjust_cudagraph_sizes_for_spec_decode``: ``max(q, tp)``, and when that
    is not a multiple of both the engine refuses to start (:class:`EngineRefusal`, vLLM's
    message); ``"lcm"`` is the harness's alternative, ``lcm(q, tp)``.
    """
    _require_positive("q", q)
    _require_positive("tp", tp)
    if how == "lcm":
        return math.lcm(q, tp)
    if how != "max":
        raise ValueError(f"spec_sp_multiple must be 'max' or 'lcm', got {how!r}")
    multiple = max(q, tp)
    if multiple % q or multiple % tp:
        raise EngineRefusal(
            f"Can't determine cudagraph shapes that are both a multiple of {q} (num_speculative_tokens + 1) "
            f"required by spec-decode and {tp} (tensor_parallel_size) required by sequence parallelism "
            "please adjust num_speculative_tokens or disable sequence parallelism")
    return multiple


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


def needs_tp_aligned_sizes(tp: int, *, sequence_parallel: bool, shared_expert_dp: bool = False,
                           dsa_cp: bool = False, tp_aligned_layouts: bool = False, graphs: bool = True) -> bool:
    """Whether the capture sizes must be multiples of ``tp`` (then :func:`sizes_for_sequence_parallel`).

    vLLM Ascend's ``_setup_compile_backend``: ``tp > 1``, graph mode not NONE, and a layout that
    shards tokens across the TP ranks: sequence parallel always; on stacks with
    ``tp_aligned_layouts`` (main, PR #13946) also the independent shared-expert DP
    (``enable_shared_expert_dp``) and DSA-CP (``enable_dsa_cp``), whose sharding needs a stable
    local token shape in every graph. The harness's models have neither layer, and TP comes with
    SP here, so only SP reaches this from a scenario.
    """
    _require_positive("tp", tp)
    layouts = sequence_parallel or (tp_aligned_layouts and (shared_expert_dp or dsa_cp))
    return tp > 1 and graphs and layouts


def sizes_for_spec_decode(
    sizes: Sequence[int], q: int, max_size: int, tp: int = 1
) -> list[int]:
    """Round every size up to a multiple of ``q = 1 + num_speculative_tokens``.

    A uniform-decode graph holds ``num_reqs * q`` tokens; a bucket that ``q`` does not
    divide would route prefill-shaped batches into "decode" graphs (vLLM issue #28207).
    With sequence parallel (``tp > 1``) the multiple must also be divisible by ``tp``:
    this low-level helper uses ``lcm(q, tp)``; the pipeline picks the multiple with
    :func:`spec_decode_multiple` (upstream's ``max(q, tp)`` and refusal, or ``lcm``) and passes
    it as ``q``. Sizes rounded above ``max_size`` are dropped, duplicates
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


def _validate_explicit(sizes: Sequence[int]) -> list[int]:
    if not sizes:
        raise ValueError("capture_sizes is empty: give at least one size or None")
    bad = [s for s in sizes if isinstance(s, bool) or not isinstance(s, int) or s < 1]
    if bad:
        raise ValueError(f"capture sizes must be positive ints, got {bad} in {list(sizes)}")
    return sorted(set(sizes))


def resolve_sizes(
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
    decode_full: bool = True,
    spec_sp_multiple: SpecSpMultiple = "max",
    capture_max_num_batched_tokens: bool = True,
    capture_max_num_seqs: bool = False,
    graphs: bool = True,
    mixed_graphs: bool = False,
    max_model_len: int | None = None,
) -> SizeResolution:
    """The final capture sizes, ascending, with the warnings on the way: every rule in order.

    0. ``graphs=False`` (graph mode NONE): no sizes at all and no rule applied, so none can
       fail (vLLM ``_set_cudagraph_sizes``: ``cudagraph_capture_sizes = []``,
       ``max_cudagraph_capture_size = 0``; v0.15 to v0.23 alike).

    1. Base list. Explicit ``capture_sizes``: de-duplicated, and the sizes above
       ``max_num_batched_tokens`` dropped (upstream logs "cudagraph_capture_sizes specified in
       compilation_config ... is overridden by config ..."; nothing is left: ``ValueError``).
       Otherwise the default grid up to a max: the user's ``max_capture_size`` or
       :func:`default_max_capture_size` for ``platform``, clamped to ``max_num_batched_tokens``;
       ``capture_max_num_batched_tokens`` (vLLM PR #40734) appends an off-grid
       ``max_num_batched_tokens`` that is within that max (257 stays 257, not 256);
       ``capture_max_num_seqs`` (vLLM Ascend PR #16623) appends the default decode ceiling
       ``max_num_seqs * q`` when no user max is given.
    2. The keep constraints (sequence parallel). Then the list's largest size is the max: a
       user ``max_capture_size`` that differs from it is an error when ``capture_sizes`` was
       given too (vLLM's "customized max_cudagraph_capture_size(=M) should be consistent with
       the max value of cudagraph_capture_sizes(=N)"), else truncated with a warning.
    3. The round-up constraints (speculative decoding), when ``decode_full``; see
       :func:`compose_constraints` for ``spec_sp_multiple``. ``num_speculative_tokens`` also
       sizes the default max.

    4. With ``mixed_graphs`` and a ``max_model_len``: no size may be captured on a dummy batch
       (:func:`dummy_request_lens`) with a request longer than ``max_model_len``, or the
       capture runs a shape no real batch has (``ValueError``, naming the size).

    ``constraints`` are the features' own; ``sequence_parallel``/``tp`` and
    ``num_speculative_tokens`` add SP's and spec decode's for callers without features.
    Raises ``ValueError`` whenever a step leaves nothing (a misconfiguration never turns
    silently into "no graphs"), and :class:`EngineRefusal` where the real engine would not start.
    """
    _require_positive("max_num_seqs", max_num_seqs)
    if num_speculative_tokens < 0:
        raise ValueError(f"num_speculative_tokens must be >= 0, got {num_speculative_tokens}")
    if max_capture_size is not None:
        _require_positive("max_capture_size", max_capture_size)
    if max_num_batched_tokens is not None:
        _require_positive("max_num_batched_tokens", max_num_batched_tokens)

    if not graphs:
        return SizeResolution([], notes=["graph mode NONE: no capture sizes (vLLM _set_cudagraph_sizes: "
                                         "cudagraph_capture_sizes [], max_cudagraph_capture_size 0)"])
    notes: list[str] = []
    dropped: list[int] = []
    if capture_sizes is not None:
        given = _validate_explicit(capture_sizes)
        sizes = [s for s in given if max_num_batched_tokens is None or s <= max_num_batched_tokens]
        dropped = [s for s in given if s not in sizes]
        if dropped:
            notes.append(f"cudagraph_capture_sizes {given} overridden by max_num_batched_tokens="
                         f"{max_num_batched_tokens}: {dropped} dropped, {sizes} kept")
        if not sizes:
            raise ValueError(f"every capture size of {given} is above max_num_batched_tokens "
                             f"{max_num_batched_tokens}: no graph would be captured")
    else:
        if max_capture_size is not None:
            top = max_capture_size
        else:
            top = default_max_capture_size(max_num_seqs, num_speculative_tokens, platform, None, cap)
        if max_num_batched_tokens is not None:
            top = min(top, max_num_batched_tokens)
        sizes = default_capture_sizes(top)
        extra: list[tuple[int, str]] = []
        if capture_max_num_batched_tokens and max_num_batched_tokens is not None and max_num_batched_tokens <= top:
            extra.append((max_num_batched_tokens, "max_num_batched_tokens"))
        if capture_max_num_seqs and max_capture_size is None:
            ceiling = max_num_seqs * (1 + num_speculative_tokens)
            if ceiling <= top:
                extra.append((ceiling, "the decode ceiling max_num_seqs * q"))
        for size, what in extra:
            if size not in sizes:
                sizes = sorted({*sizes, size})
                notes.append(f"{what} {size} is off the grid: added as a capture size")

    every = list(constraints)
    if sequence_parallel and tp > 1:
        every.append(SizeConstraint(tp, "keep", f"sequence parallel with tp={tp}"))
    if num_speculative_tokens:
        q = 1 + num_speculative_tokens
        every.append(SizeConstraint(q, "round_up", f"speculative decoding with q={q}"))
    sizes = compose_constraints(sizes, [c for c in every if c.rule == "keep"])
    if max_capture_size is not None and max_capture_size != sizes[-1]:
        if capture_sizes is not None:
            raise ValueError(f"customized max_cudagraph_capture_size(={max_capture_size}) should be consistent "
                             f"with the max value of cudagraph_capture_sizes(={sizes[-1]})")
        notes.append(f"Truncating max_cudagraph_capture_size {max_capture_size} to {sizes[-1]}")
    sizes = compose_constraints(sizes, every, decode_full=decode_full, spec_sp_multiple=spec_sp_multiple)
    for size in sizes if mixed_graphs else ():
        if max_model_len is not None and (longest := max(dummy_request_lens(size, max_num_seqs))) > max_model_len:
            raise ValueError(
                f"capture size {size} with graph.max_num_seqs {max_num_seqs} is captured on a dummy request of "
                f"{longest} tokens, above model.max_model_len {max_model_len}: no real batch has that shape; "
                "drop the size or raise max_num_seqs")
    return SizeResolution(sizes, dropped, notes)


def dummy_request_lens(num_tokens: int, max_num_seqs: int) -> list[int]:
    """The query lengths of the dummy batch a mixed graph of ``num_tokens`` is captured on.

    As vLLM's ``_dummy_run`` splits a non-uniform batch: ``min(T, max_num_seqs)`` requests
    of ``T // n`` tokens, the remainder on the last. (A long last request instead could outgrow
    ``max_model_len`` where no real batch of that size does.)"""
    n = max(1, min(num_tokens, max_num_seqs))
    return [num_tokens // n] * (n - 1) + [num_tokens // n + num_tokens % n]


def resolve_capture_sizes(**kwargs: Any) -> list[int]:
    """:func:`resolve_sizes` without the warnings: just the sizes."""
    return resolve_sizes(**kwargs).sizes


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
        clean = tuple(_validate_explicit(sizes))
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
