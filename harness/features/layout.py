"""The rank layout of an item: one axis per active rank-axis feature, in registry order, and
what each rank holds of it (its process groups, its model shard, whether it runs the reference).

The first axis is the outermost: with dp, tp (SP) and cp, ``rank = (dp_rank * tp + tp_rank) *
cp + cp_rank``. Every rank creates every group of every axis, in the same order (a
``torch.distributed.new_group`` rule), and keeps the one it belongs to.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable, Sequence

from harness.features.base import Feature
from harness.graph.shape import RankAxis, RankContext

if TYPE_CHECKING:  # pragma: no cover
    from torch.distributed import ProcessGroup

    from harness.model import DecoderLM


def axis_sizes(features: Sequence[Feature]) -> list[tuple[str, int]]:
    """(axis, size) for every active feature that spreads over ranks, outermost first."""
    return [(f.axis, f.world_size()) for f in features if f.axis and f.world_size() > 1]


def runs_reference(features: Sequence[Feature], ctx: RankContext) -> bool:
    """Whether this rank runs the reference path (and the plain greedy decode of spec decode).

    Both are the unsplit model, eager and unpadded, on this rank's requests: the same
    computation, bit for bit, on every rank that gets the same requests, i.e. the ranks that
    differ only on axes whose feature does not split requests (the TP ranks of SP, the CP
    ranks). The first of those runs it and compares against it; the others skip it, and their
    graph and padded paths are still checked against each other. DP ranks, which get requests
    of their own, each run it.
    """
    return all(ctx.axis(f.axis).rank == 0 for f in features if f.axis and not f.splits_requests())


def rank_model(features: Sequence[Feature], ctx: RankContext) -> Callable[[DecoderLM], DecoderLM] | None:
    """What makes this rank's model from the single-rank one: every feature's
    :meth:`~Feature.rank_model` in registry order; None when no feature changes the model."""
    shards = [f for f in features if f.shards_model()]
    if not shards:
        return None

    def build(reference: DecoderLM) -> DecoderLM:
        model = reference
        for feature in shards:
            model = feature.rank_model(model, ctx)
        return model

    return build


def coordinates(sizes: Sequence[tuple[str, int]], rank: int) -> dict[str, int]:
    """This rank's index on every axis (row-major, the first axis outermost)."""
    coords: dict[str, int] = {}
    stride = math.prod(size for _, size in sizes)
    for name, size in sizes:
        stride //= size
        coords[name] = (rank // stride) % size
    return coords


def describe(sizes: Sequence[tuple[str, int]]) -> str:
    world = math.prod(size for _, size in sizes)
    return f"{world} ranks ({' x '.join(f'{name} {size}' for name, size in sizes)})"


def rank_context(features: Sequence[Feature], rank: int, world: int,
                 new_group: Callable[[list[int]], ProcessGroup] | None = None) -> RankContext:
    """This rank's place and process groups (``new_group``: ``torch.distributed.new_group``)."""
    sizes = axis_sizes(features)
    if math.prod(size for _, size in sizes) != world:
        raise ValueError(f"world size {world} does not match the layout {describe(sizes)}")
    if new_group is None:
        import torch.distributed as dist

        new_group = dist.new_group
    mine = coordinates(sizes, rank)
    axes: dict[str, RankAxis] = {}
    for name, size in sizes:
        members: dict[tuple[int, ...], list[int]] = {}
        for r in range(world):
            c = coordinates(sizes, r)
            key = tuple(v for axis, v in c.items() if axis != name)
            members.setdefault(key, []).append(r)
        for key in sorted(members):
            group = new_group(members[key])
            if rank in members[key]:
                axes[name] = RankAxis(size, mine[name], group)
    return RankContext(rank, world, axes)
