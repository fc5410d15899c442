"""Data parallel: every rank runs its own batch, but all ranks must run the same graph.

Before each step the ranks all-reduce (padded num_tokens, graph mode) over a CPU group: every
rank pads to the group's max and the agreed mode is the min, so one eager rank makes all ranks
eager (vLLM ``coordinate_batch_across_dp``, vLLM Ascend ``_sync_batch_across_dp``, PR #30173).
A rank with fewer tokens, or none, still runs the padded graph with dummy requests. Without the
``dp_sync`` fix the ranks decide alone; ranks that disagree on size or mode hang in the
collectives of the forward (PRs #25906, #30173).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from harness.features.base import MODE_ORDER, RankAxisFeature, RankContext, StepShape


class DPDisagreement(RuntimeError):
    """Ranks entered a step with different sizes or modes: on hardware, a hang."""


class DataParallel(RankAxisFeature):
    name = "dp"
    fix = "dp_sync"
    ledger = "dp"

    def agree(self, shape: StepShape, ctx: RankContext) -> StepShape:
        if ctx.dp_group is None or not self.fix_on:
            return shape
        mine = torch.tensor([shape.num_tokens, -MODE_ORDER.index(shape.runtime_mode),
                             -int(shape.uniform_decode), int(shape.has_work)], dtype=torch.int64)
        dist.all_reduce(mine, op=dist.ReduceOp.MAX, group=ctx.dp_group)
        tokens, neg_mode, neg_uniform, work = mine.tolist()
        return StepShape(tokens, MODE_ORDER[-neg_mode], bool(-neg_uniform), bool(work))

    def before_forward(self, shape: StepShape, ctx: RankContext, step: int) -> None:
        check_agreement(shape, ctx, step)


def check_agreement(shape: StepShape, ctx: RankContext, step: int) -> None:
    """What the forward's collectives would enforce by hanging: every DP rank runs one shape.

    Gathers every rank's shape (all ranks see the same list, so all raise together: the
    harness reports the disagreement instead of hanging in it).
    """
    if ctx.dp_group is None:
        return
    mine = torch.tensor([shape.num_tokens, MODE_ORDER.index(shape.runtime_mode)], dtype=torch.int64)
    shapes = [torch.zeros_like(mine) for _ in range(ctx.dp)]
    dist.all_gather(shapes, mine, group=ctx.dp_group)
    seen = [(int(s[0]), MODE_ORDER[int(s[1])]) for s in shapes]
    if len(set(seen)) > 1:
        listing = ", ".join(f"dp rank {r}: {t} tokens {m}" for r, (t, m) in enumerate(seen))
        raise DPDisagreement(f"step {step}: DP ranks disagree ({listing}); on hardware they hang in "
                             "the forward's collectives")
