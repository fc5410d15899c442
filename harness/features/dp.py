"""Data parallel: every rank runs its own batch, but all ranks must run the same graph.

Before each step is dispatched the ranks all-reduce its shape over a CPU group: every rank
takes the group's max token count, and the batch is uniform decode only if it is on every
rank, so the one dispatch that follows gives every rank the same padded size and graph mode
(vLLM ``coordinate_batch_across_dp``, vLLM Ascend ``_sync_batch_across_dp``, PR #30173). A
rank with fewer tokens, or none, still runs the agreed graph with dummy requests. Without the
``dp_sync`` fix the ranks decide alone; ranks that disagree on size or mode hang in the
collectives of the forward (PRs #25906, #30173).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from harness.features.base import MAX_AXIS_RANKS, FeatureSettings, FixSwitch, RankAxisFeature, RankContext
from harness.graph.shape import RunShape, StepShape


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
    fixes = {"dp_sync": FixSwitch("the all-reduce of each step's shape before it is dispatched",
                                  "ranks disagree on size or mode and hang in collectives (execution)")}
    marker = "data parallel (size > 1)"
    axis = "dp"
    ledger = "dp"

    def budget_inputs(self) -> dict[str, Any]:
        return {"dp": self.size}

    def share_requests(self, plans: list[Any], ctx: RankContext) -> list[Any]:
        """Round robin, (unequal) rank 0 takes two thirds of the requests, or (idle) the last
        rank takes none."""
        if ctx.dp == 1:
            return plans
        if self.settings.batches == "equal":
            return plans[ctx.dp_rank :: ctx.dp]
        if self.settings.batches == "idle":  # the others share round robin
            return [] if ctx.dp_rank == ctx.dp - 1 else plans[ctx.dp_rank :: ctx.dp - 1]
        cut = -(-2 * len(plans) // 3)
        if ctx.dp_rank == 0:
            return plans[:cut]
        return plans[cut:][ctx.dp_rank - 1 :: ctx.dp - 1]

    def agree(self, shape: StepShape, ctx: RankContext) -> StepShape:
        if ctx.dp_group is None or not self.fix_on:
            return shape
        import torch

        mine = torch.tensor([shape.num_tokens, -int(shape.uniform_decode), int(shape.has_work)], dtype=torch.int64,
                            device=ctx.device)
        _all_reduce_max(mine, ctx)
        tokens, neg_uniform, work = mine.tolist()
        return StepShape(tokens, bool(-neg_uniform), bool(work))

    def any_rank(self, flag: bool, ctx: RankContext) -> bool:
        if ctx.dp_group is None or not self.fix_on:
            return flag
        import torch

        mine = torch.tensor([int(flag)], dtype=torch.int64, device=ctx.device)
        _all_reduce_max(mine, ctx)
        return bool(mine.item())

    def before_forward(self, shape: RunShape, ctx: RankContext, step: int) -> None:
        check_agreement(shape, ctx, step)


def check_agreement(shape: RunShape, ctx: RankContext, step: int) -> None:
    """What the forward's collectives would enforce by hanging: every DP rank runs one shape.

    Gathers every rank's shape (all ranks see the same list, so all raise together: the
    harness reports the disagreement instead of hanging in it).
    """
    if ctx.dp_group is None:
        return
    import torch

    from harness.graph.modes import CUDAGraphMode
    from harness.model.parallel import collective_ops

    mine = torch.tensor([shape.num_tokens, shape.runtime_mode.value], dtype=torch.int64, device=ctx.device)
    shapes = torch.empty((ctx.dp, 2), dtype=torch.int64, device=ctx.device)
    ops = collective_ops()
    ops.wait_tensor(ops.all_gather_into_tensor_out(mine.view(1, 2), ctx.dp, ctx.dp_group.group_name, out=shapes))
    seen = [(tokens, CUDAGraphMode(mode)) for tokens, mode in shapes.tolist()]
    if len(set(seen)) > 1:
        listing = ", ".join(f"dp rank {r}: {t} tokens {m}" for r, (t, m) in enumerate(seen))
        raise DPDisagreement(f"step {step}: DP ranks disagree ({listing}); on hardware they hang in "
                             "the forward's collectives")


def _all_reduce_max(values: Any, ctx: RankContext) -> None:
    """Element-wise max of ``values`` (an int64 tensor on the rank's device) over the DP group, in place."""
    from harness.model.parallel import collective_ops

    ops = collective_ops()
    ops.wait_tensor(ops.all_reduce_(values, "max", ctx.dp_group.group_name))
