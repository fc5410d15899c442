"""Where a rank sits, and the shapes ranks agree on: shared by the planner and the features."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, Protocol

from harness.graph.modes import CUDAGraphMode

if TYPE_CHECKING:  # types only: the features import this module at collection, without torch
    from torch.distributed import ProcessGroup

    from harness.graph.metadata import AttentionMetadata
    from harness.ops.attention import AttentionStyle


@dataclass(frozen=True)
class RankAxis:
    """One rank axis (a feature's): its size, this rank's index on it, its group."""

    size: int = 1
    rank: int = 0
    group: ProcessGroup | None = None  # None when the axis has one rank


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


class StepFeature(Protocol):
    """What the pipeline under test asks of a feature, step by step.

    :class:`harness.features.Feature` implements it; the planner and the pipeline know features
    only through it, so that ``graph`` never imports ``features`` (they import ``graph``)."""

    @property
    def name(self) -> str: ...
    @property
    def ledger(self) -> str: ...  # its column in the padding ledger ("": its name)
    @property
    def fix_states(self) -> Mapping[str, bool]: ...  # its fix switches, on or off

    @property
    def fix_on(self) -> bool: ...  # every fix switch on
    @property
    def fixes_off(self) -> list[str]: ...
    def extra_query_tokens(self) -> int: ...
    def token_multiple(self) -> int: ...
    def pads_requests_without_full(self) -> bool | None: ...
    def agree(self, shape: StepShape, ctx: RankContext) -> StepShape: ...
    def any_rank(self, flag: bool, ctx: RankContext) -> bool: ...
    def rank_metadata(self, meta: AttentionMetadata, ctx: RankContext, block_size: int) -> AttentionMetadata: ...
    def attention_style(self, ctx: RankContext) -> AttentionStyle | None: ...
    def before_forward(self, shape: RunShape, ctx: RankContext, step: int) -> None: ...
