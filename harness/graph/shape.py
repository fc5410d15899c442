"""Where a rank sits, and the shapes ranks agree on: shared by the planner and the features."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from harness.graph.modes import CUDAGraphMode


@dataclass(frozen=True)
class RankAxis:
    """One rank axis (a feature's): its size, this rank's index on it, its group."""

    size: int = 1
    rank: int = 0
    group: Any = None  # a torch.distributed group; None when the axis has one rank


@dataclass(frozen=True)
class RankContext:
    """Where this process sits among a scenario's ranks, one :class:`RankAxis` per axis.

    The axes come from the feature registry (``harness.features.layout``); an axis no active
    feature declares reads as size 1. Each feature reads its own axis by the name it declares
    (``ctx.axis(feature.axis)``): the harness knows no axis by name.
    """

    rank: int = 0
    world_size: int = 1
    axes: Mapping[str, RankAxis] = field(default_factory=dict)

    def axis(self, name: str) -> RankAxis:
        return self.axes.get(name, _SINGLE_AXIS)


_SINGLE_AXIS = RankAxis()
SINGLE_RANK = RankContext()


@dataclass(frozen=True)
class StepShape:
    """What a rank proposes to its peers *before* the step is dispatched, and what they agree on.

    As vLLM Ascend's ``_determine_batch_execution_and_padding``: each rank first dispatches its own
    batch, then proposes ``num_tokens``, its **bucket-padded** token count, and ``mode``, its own
    runtime mode; DP agreement returns the group's max count (to a rank that ``accepts_padding``:
    upstream's ``allow_dp_padding``, its own mode not eager, or SP) and the group's min mode.
    ``uniform_decode`` is this rank's own (each rank re-dispatches its own batch), ``has_work``
    whether any rank of the group has requests (an idle rank runs the agreed shape on a dummy).
    ``mode`` None: no dispatch happened (a caller outside the planner).
    """

    num_tokens: int
    uniform_decode: bool
    has_work: bool = True
    mode: CUDAGraphMode | None = None
    accepts_padding: bool = True


@dataclass(frozen=True)
class RunShape:
    """What one rank runs after the decision: every DP rank must run the same one."""

    num_tokens: int  # padded token count
    runtime_mode: CUDAGraphMode
