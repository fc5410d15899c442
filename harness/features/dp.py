"""Data parallel: every rank runs its own batch, but all ranks must run the same graph.

Each rank first dispatches its own batch; then the ranks all-reduce what each proposes over a
CPU group: its bucket-padded token count and its own runtime mode (vLLM Ascend
``_sync_metadata_across_dp``, ``_sync_batch_across_dp`` before it; vLLM ``dp_utils.py``). The
agreed mode is the min (one eager rank makes the step eager), and a rank takes the group's max
count when it accepts DP padding (``allow_dp_padding``: its own mode is not eager, or SP; every
rank on older stacks, ``StackProfile.dp_padding``), else it keeps its own count; each then
re-dispatches at that count within the agreed mode. A rank with fewer tokens, or none (it runs
``execute_dummy_batch``: one uniform request of ``1 + k`` tokens), still runs the agreed graph.
Without the ``dp_sync`` fix the ranks decide alone; ranks that disagree hang in the collectives
of the forward (PRs #25906, #30173).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, ValidationInfo, field_validator

from harness.features.base import MAX_AXIS_RANKS, FeatureSettings, FixSwitch, RankAxisFeature, RankContext
from harness.graph.shape import RunShape, StepShape
from harness.plain import Kwargs

if TYPE_CHECKING:
    from torch import Tensor
    from torch.distributed import ProcessGroup

    from harness.graph.scheduler import RequestPlan


class DPDisagreement(RuntimeError):
    """Ranks entered a step with different sizes or modes: on hardware, a hang."""


class DPSettings(FeatureSettings):
    size: int = Field(1, ge=1, le=MAX_AXIS_RANKS, description="Data-parallel ranks (1: DP off).")
    batches: Literal["equal", "unequal", "idle"] = Field(
        "equal", description="equal: round robin; unequal: rank 0 takes two thirds (others idle more); "
        "idle: the last rank gets no request at all (it runs dummy batches throughout).")

    @field_validator("batches")
    @classmethod
    def _needs_ranks(cls, value: str, info: ValidationInfo) -> str:
        if value != "equal" and info.data.get("size", 1) < 2:
            raise ValueError(f"{value!r} batches need dp size >= 2 (size is {info.data.get('size', 1)})")
        return value


class DataParallel(RankAxisFeature):
    name = "dp"
    Settings = DPSettings
    settings: DPSettings  # (the base validates it as Settings)
    fixes = {"dp_sync": FixSwitch("the all-reduce of each step's shape before it is dispatched",
                                  "ranks disagree on size or mode and hang in collectives (execution)")}
    marker = "data parallel (size > 1)"
    axis = "dp"
    ledger = "dp"
    ledger_colour = "#b279a2"

    def budget_inputs(self) -> Kwargs:
        return {"dp": self.size}

    def share_requests(self, plans: list[RequestPlan], ctx: RankContext) -> list[RequestPlan]:
        """Round robin, (unequal) rank 0 takes two thirds of the requests, or (idle) the last
        rank takes none."""
        size, rank = self.rank_axis(ctx).size, self.rank_axis(ctx).rank
        if size == 1:
            return plans
        if self.settings.batches == "equal":
            return plans[rank::size]
        if self.settings.batches == "idle":  # the others share round robin
            return [] if rank == size - 1 else plans[rank :: size - 1]
        cut = -(-2 * len(plans) // 3)
        if rank == 0:
            return plans[:cut]
        return plans[cut:][rank - 1 :: size - 1]

    def agree(self, shape: StepShape, ctx: RankContext) -> StepShape:
        if _group(ctx) is None or not self.fix_on:
            return shape
        import torch

        from harness.graph.modes import CUDAGraphMode

        mode = shape.mode if shape.mode is not None else CUDAGraphMode.FULL
        # one max-reduce: tokens (max), minus the mode's value (so: the min mode), any work
        mine = torch.tensor([shape.num_tokens, -mode.value, int(shape.has_work)], dtype=torch.int64)
        _all_reduce_max(mine, ctx)
        tokens, neg_mode, work = mine.tolist()
        return StepShape(tokens if shape.accepts_padding else shape.num_tokens, shape.uniform_decode, bool(work),
                         mode=CUDAGraphMode(-neg_mode), accepts_padding=shape.accepts_padding)

    def any_rank(self, flag: bool, ctx: RankContext) -> bool:
        if _group(ctx) is None or not self.fix_on:
            return flag
        import torch

        mine = torch.tensor([int(flag)], dtype=torch.int64)
        _all_reduce_max(mine, ctx)
        return bool(mine.item())

    def before_forward(self, shape: RunShape, ctx: RankContext, step: int) -> None:
        check_agreement(shape, ctx, step, agreed=self.fix_on)


def check_agreement(shape: RunShape, ctx: RankContext, step: int, agreed: bool = True) -> None:
    """What the forward's collectives would enforce by hanging: every DP rank runs one graph mode,
    and in a graph mode one token count (graphs of different sizes issue different collectives).

    An eager step may run different counts on different ranks: upstream a rank whose own mode was
    eager keeps its own count (vLLM Ascend PR #7297), and the forward's collectives take every
    rank's count from the agreement (``num_tokens_across_dp``). Without the agreement
    (``agreed=False``: the ``dp_sync`` fix off) no rank knows its peers' counts, so any
    difference hangs. Gathers every rank's shape (all ranks see the same list, so all raise
    together: the harness reports the disagreement instead of hanging in it).
    """
    axis = ctx.axis(DataParallel.axis)
    if axis.group is None:
        return
    import torch

    from harness.graph.modes import CUDAGraphMode
    from harness.model.parallel import collective_ops

    mine = torch.tensor([shape.num_tokens, shape.runtime_mode.value], dtype=torch.int64)
    shapes = torch.empty((axis.size, 2), dtype=torch.int64)
    ops = collective_ops()
    ops.wait_tensor(ops.all_gather_into_tensor_out(mine.view(1, 2), axis.size, axis.group.group_name, out=shapes))
    seen = [(tokens, CUDAGraphMode(mode)) for tokens, mode in shapes.tolist()]
    modes = {m for _, m in seen}
    if len(modes) > 1 or ((modes != {CUDAGraphMode.NONE} or not agreed) and len(set(seen)) > 1):
        listing = ", ".join(f"dp rank {r}: {t} tokens {m}" for r, (t, m) in enumerate(seen))
        raise DPDisagreement(f"step {step}: DP ranks disagree ({listing}); on hardware they hang in "
                             "the forward's collectives")


def _all_reduce_max(values: Tensor, ctx: RankContext) -> None:
    """Element-wise max of ``values`` (a host int64 tensor) over the DP group, in place."""
    from harness.model.parallel import collective_ops

    group = _group(ctx)
    assert group is not None  # the callers return early with one DP rank
    ops = collective_ops()
    ops.wait_tensor(ops.all_reduce_(values, "max", group.group_name))


def _group(ctx: RankContext) -> ProcessGroup | None:
    """The DP ranks' process group (None with one DP rank)."""
    return ctx.axis(DataParallel.axis).group
