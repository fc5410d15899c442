"""The ACL graph stream budget: how many capture sizes a device can afford.

Every captured ACL graph takes hardware streams from a fixed pool (2048 per device).
PIECEWISE capture multiplies the graph count (``L + 1`` graphs per bucket for ``L``
attention layers, plus the draft model's), and communication inside a graph needs streams
of its own. The *legacy* policy, vLLM Ascend ``update_aclgraph_sizes()``
(``vllm_ascend/utils.py``, PRs #771 ... #9572), therefore computes a maximum number of
sizes ``n`` from the model and parallel layout and, when the list is longer, keeps ``n``
sizes evenly spaced in index space. Newer stacks (PR #9962) dropped the budget: the
``none`` policy keeps every size and lets capture fail loudly instead.

Pure: inputs are ints and flags, output a :class:`BudgetDecision` with the arithmetic
spelled out, so a report can say why a bucket disappeared.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from harness.graph.capture_sizes import EngineRefusal
from harness.graph.modes import CUDAGraphMode

__all__ = [
    "BudgetDecision",
    "HcclMode",
    "LEGACY_MAX_STREAMS",
    "OLD_LEGACY_MAX_STREAMS",
    "StreamBudgetPolicy",
    "downsample_sizes",
    "legacy_stream_budget",
    "no_stream_budget",
    "stream_budget",
]

HcclMode = Literal["AIV", "default"]
StreamBudgetPolicy = Literal["legacy", "none"]
#: Which release's ``update_aclgraph_sizes`` the legacy policy is (see :func:`legacy_stream_budget`).
LegacyRelease = Literal["v0.18.0", "pr9572"]

#: 2048 streams minus 248 kept as a buffer (since vLLM Ascend PR #2827).
LEGACY_MAX_STREAMS = 1800
#: 2048 minus 128: the cap before PR #2827 (old stacks).
OLD_LEGACY_MAX_STREAMS = 1920
#: Streams the default (FFTS+ / AICPU) HCCL expansion reserves per communication group.
_DEFAULT_HCCL_STREAMS_PER_GROUP = 40
#: Streams reserved for each of prefill / decode context parallel (default HCCL only).
_CP_ADDITIONAL_STREAMS = 100


@dataclass(frozen=True)
class BudgetDecision:
    """The outcome of a stream-budget policy.

    ``max_graphs``: the stream budget left after every deduction (before the division);
    ``max_num_sizes``: ``n``, the most sizes that fit (``None`` when no budget applies);
    ``per_size``: graphs one bucket costs; ``parallel_factor``: the divisor for
    communication streams; ``explanation``: the arithmetic, for reports.
    """

    sizes_kept: list[int]
    sizes_dropped: list[int]
    max_graphs: int
    per_size: int
    parallel_factor: int
    explanation: str
    max_num_sizes: int | None = None


def downsample_sizes(sizes: Sequence[int], n: int) -> list[int]:
    """Keep ``n`` of ``sizes``, evenly spaced in *index* space, first and last forced.

    ``step = (len - 1) / (n - 1)``, indices ``round(i * step)`` with Python's banker's
    rounding (as the engine does, so the kept set matches it exactly). ``n <= 1`` keeps
    only the largest size: one big bucket still serves every smaller batch.
    """
    ordered = list(sizes)
    if n >= len(ordered):
        return ordered
    if n <= 1:
        return ordered[-1:]
    step = (len(ordered) - 1) / (n - 1)
    indices = [round(i * step) for i in range(n)]
    indices[0], indices[-1] = 0, len(ordered) - 1
    return [ordered[i] for i in indices]


def no_stream_budget(capture_sizes: Sequence[int], reason: str = "policy 'none'") -> BudgetDecision:
    """Keep every size (newer stacks: capture is attempted, failure reported)."""
    return BudgetDecision(
        sizes_kept=list(capture_sizes),
        sizes_dropped=[],
        max_graphs=0,
        per_size=0,
        parallel_factor=0,
        explanation=f"{reason}: all {len(capture_sizes)} sizes kept",
        max_num_sizes=None,
    )


def legacy_stream_budget(
    capture_sizes: Sequence[int],
    *,
    num_layers: int,
    mode: CUDAGraphMode,
    draft_layers: int = 0,
    dp: int = 1,
    tp: int = 1,
    expert_parallel: bool = False,
    pcp: int = 1,
    dcp: int = 1,
    hccl_mode: HcclMode = "default",
    is_moe: bool = False,
    multistream_overlap_shared_expert: bool = False,
    max_streams: int = LEGACY_MAX_STREAMS,
    release: LegacyRelease = "pr9572",
) -> BudgetDecision:
    """``update_aclgraph_sizes()`` as a pure function.

    ``release`` picks the version of the function: ``"pr9572"`` (``utils.py`` at 5f2ef5a0b2^, the
    last before PR #9962 removed it) or ``"v0.18.0"`` (``utils.py`` at v0.18.0, and v0.15.0rc1,
    read line by line: the same formula without the FULL_AND_PIECEWISE deduction, which PR #9572
    added with FULL_AND_PIECEWISE itself, and without the ``n <= 1`` guard: there ``step =
    (len - 1) / (n - 1)`` divides by zero at ``n == 1`` and ``indices[0] = 0`` fails on the empty
    list at ``n <= 0``, so the engine does not start: :class:`EngineRefusal` with Python's text).

    Applies only to PIECEWISE and FULL_AND_PIECEWISE (the modes that capture piecewise
    graphs); FULL / FULL_DECODE_ONLY / NONE keep every size. With ``MAX = max_streams``:

    * FULL_AND_PIECEWISE: ``MAX = max(0, MAX - len(sizes))`` (its full decode graphs);
    * ``per_size = L + 1`` (``+ draft_layers + 1`` with a draft model);
    * ``g = (dp > 1) + (tp > 1)`` communication groups;
    * ``hccl_mode == "AIV"``: ``pf = 1 + g + expert_parallel + multistream_overlap``;
      MoE adds ``(dp > 1)`` to ``pf``; dense models instead do ``MAX -= pf * per_size``
      (the dense all-reduce's extra streams); ``n = floor(MAX / per_size / pf)``;
    * otherwise (FFTS+ on A2, AICPU on A3): ``MAX -= 100`` for ``pcp > 1`` and again for
      ``dcp > 1``; ``n = floor((MAX - 40 g) / per_size / (1 + 2 g))``;
    * ``n < len(sizes)``: :func:`downsample_sizes`.

    ``expert_parallel`` is the engine's ``enable_expert_parallel`` flag (it adds 1, not
    the EP size).
    """
    sizes = list(capture_sizes)
    if mode not in (CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL_AND_PIECEWISE):
        return no_stream_budget(sizes, reason=f"mode {mode} captures no piecewise graphs")
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    if draft_layers < 0:
        raise ValueError(f"draft_layers must be >= 0, got {draft_layers}")
    if hccl_mode not in ("AIV", "default"):
        raise ValueError(f"hccl_mode must be 'AIV' or 'default', got {hccl_mode!r}")

    steps: list[str] = [f"MAX={max_streams}"]
    budget = max_streams
    if release not in ("pr9572", "v0.18.0"):
        raise ValueError(f"release must be 'pr9572' or 'v0.18.0', got {release!r}")
    if mode is CUDAGraphMode.FULL_AND_PIECEWISE and release == "pr9572":
        # clamped at 0 (vLLM Ascend: max(0, MAX - len(sizes))): more sizes than streams leaves
        # no budget, never a negative one
        budget = max(0, budget - len(sizes))
        steps.append(f"FULL_AND_PIECEWISE: MAX=max(0, MAX-{len(sizes)} full decode graphs) -> {budget}")
    per_size = num_layers + 1 + (draft_layers + 1 if draft_layers else 0)
    steps.append(
        f"per_size=L+1={num_layers + 1}"
        + (f"+draft {draft_layers}+1={per_size}" if draft_layers else "")
    )
    groups = int(dp > 1) + int(tp > 1)

    if hccl_mode == "AIV":
        pf = 1 + groups + int(expert_parallel) + int(multistream_overlap_shared_expert)
        if is_moe:
            pf += int(dp > 1)
        else:
            budget -= pf * per_size
            steps.append(f"dense AIV: MAX-={pf}*{per_size} -> {budget}")
        n = math.floor(budget / per_size / pf)
        steps.append(f"AIV: pf={pf}, n=floor({budget}/{per_size}/{pf})={n}")
    else:
        if pcp > 1:
            budget -= _CP_ADDITIONAL_STREAMS
            steps.append(f"PCP>1: MAX-={_CP_ADDITIONAL_STREAMS} -> {budget}")
        if dcp > 1:
            budget -= _CP_ADDITIONAL_STREAMS
            steps.append(f"DCP>1: MAX-={_CP_ADDITIONAL_STREAMS} -> {budget}")
        pf = 1 + 2 * groups
        reserved = _DEFAULT_HCCL_STREAMS_PER_GROUP * groups
        n = math.floor((budget - reserved) / per_size / pf)
        steps.append(f"default HCCL: g={groups}, n=floor(({budget}-{reserved})/{per_size}/{pf})={n}")

    if release == "v0.18.0" and n < len(sizes) and n <= 1:
        error = "ZeroDivisionError: division by zero" if n == 1 else "IndexError: list assignment index out of range"
        raise EngineRefusal(f"update_aclgraph_sizes at vLLM Ascend v0.18.0 keeps n={n} of {len(sizes)} capture sizes "
                            f"and has no guard for n <= 1: {error} ({'; '.join(steps)})")
    kept = downsample_sizes(sizes, n)
    kept_set = set(kept)
    dropped = [s for s in sizes if s not in kept_set]
    if n >= len(sizes):
        steps.append(f"n={n} >= {len(sizes)} sizes: all kept")
    elif n <= 1:
        steps.append(f"n={n} <= 1: only the largest size {kept[-1]} kept")
    else:
        steps.append(f"{len(sizes)} -> {len(kept)} sizes (evenly spaced in index space)")
    return BudgetDecision(
        sizes_kept=kept,
        sizes_dropped=dropped,
        max_graphs=budget,
        per_size=per_size,
        parallel_factor=pf,
        explanation="; ".join(steps),
        max_num_sizes=n,
    )


def stream_budget(
    policy: StreamBudgetPolicy, capture_sizes: Sequence[int], **legacy_kwargs: object
) -> BudgetDecision:
    """Apply the named policy: ``"legacy"`` (see :func:`legacy_stream_budget`) or
    ``"none"`` (keep all)."""
    if policy == "none":
        return no_stream_budget(capture_sizes)
    if policy == "legacy":
        return legacy_stream_budget(capture_sizes, **legacy_kwargs)  # type: ignore[arg-type]
    raise ValueError(f"unknown stream budget policy {policy!r}; valid: 'legacy', 'none'")
