"""The feature interface: what a parallel or speculative feature declares and does to a step.

Every feature that changes the token count collides with the FIA check, with stale host
parameters and with the stream budget (reference section 5). A feature owns its axis of the
scenario space, declared as class attributes the harness reads generically:

* ``name`` and ``Settings``: its key under ``features:`` and the pydantic model of its
  settings (the scenario schema is generated from these);
* ``fixes``: its fix switches under ``fixes:``, each with a default and what the known-bad
  pipeline does when it is off (:class:`FixSwitch`);
* ``marker``: the pytest marker its items carry while it is enabled;
* ``axis``: the name of its rank axis when it spreads a step over ranks (``world_size()``
  ranks; the harness lays the axes out and gives it a process group, :mod:`.layout`);
* ``size_constraints()`` and ``token_multiple()``: what it demands of capture sizes and of
  every step's token count ``T``;
* ``budget_inputs()``: what the legacy stream-budget formula reads from it.

Per step it answers through hooks that default to the identity: ``agree`` (DP), ``rank_metadata``
and ``attention_style`` (CP), ``before_forward`` (a guard), ``unsupported`` (a skip reason).

Model-level mechanics (sharded weights, collectives, LSE merges) live in :mod:`harness.model`;
a feature only wires them into the pipeline. Feature modules import neither torch nor the
model at import time (the scenario schema is generated from them); hooks import what they run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Mapping

from pydantic import BaseModel, ConfigDict

from harness.graph.capture_sizes import SizeConstraint
from harness.graph.shape import SINGLE_RANK, RankContext, RunShape, StepShape

if TYPE_CHECKING:  # pragma: no cover
    from harness.graph.metadata import AttentionMetadata

__all__ = ["Feature", "FeatureSettings", "FixSwitch", "RankAxisFeature", "RankContext", "SINGLE_RANK",
           "SizeConstraint", "StepShape"]


MAX_AXIS_RANKS = 16
"""Ranks along one feature axis; also the maximum world size of an item (the product of the axes,
checked at collection: harness.scenario.bounds.MAX_WORLD_SIZE)."""
MAX_DRAFT_TOKENS = 16
"""Speculative tokens per step (harness.scenario.bounds.MAX_SPEC_TOKENS)."""


class FeatureSettings(BaseModel):
    """Base of every feature's settings: strict, unknown keys rejected (a typo is an error)."""

    model_config = ConfigDict(extra="forbid", strict=True)


@dataclass(frozen=True)
class FixSwitch:
    """One switch under ``fixes:``: on by default; ``known_bad`` says what turning it off breaks."""

    description: str
    known_bad: str
    default: bool = True


class Feature:
    """Base class: every hook is the identity, so a feature overrides only what it changes."""

    name: ClassVar[str]  # its key under the scenario's `features:`
    Settings: ClassVar[type[FeatureSettings]] = FeatureSettings
    fixes: ClassVar[Mapping[str, FixSwitch]] = {}  # its switches under `fixes:`
    marker: ClassVar[str] = ""  # what its pytest marker means ("" = no marker)
    axis: ClassVar[str | None] = None  # its rank axis (a process group), if it has one
    ledger: ClassVar[str] = ""  # its column in the padding ledger

    def __init__(self, settings: FeatureSettings | Mapping[str, Any] | None = None,
                 fixes: Mapping[str, bool] | None = None) -> None:
        if not isinstance(settings, FeatureSettings):
            settings = self.Settings.model_validate(dict(settings or {}))
        self.settings = settings
        fixes = fixes or {}
        self.fix_states = {name: bool(fixes.get(name, switch.default)) for name, switch in self.fixes.items()}

    @property
    def fix_on(self) -> bool:
        """True when every fix switch of this feature is on (the fixed pipeline)."""
        return all(self.fix_states.values())

    @property
    def fixes_off(self) -> list[str]:
        return [name for name, on in self.fix_states.items() if not on]

    def enabled(self) -> bool:
        raise NotImplementedError

    # -- declarations read before the run ------------------------------------------------------
    def world_size(self) -> int:
        """Ranks along this feature's axis (1 for a feature without one)."""
        return 1

    def extra_query_tokens(self) -> int:
        """Tokens per request beyond 1 in a uniform decode batch (MTP: k draft tokens)."""
        return 0

    def size_constraints(self) -> list[SizeConstraint]:
        """What every capture size must be a multiple of (composed in graph.capture_sizes)."""
        return []

    def token_multiple(self) -> int:
        """What every step's token count must be a multiple of, even in eager mode (SP: tp)."""
        return 1

    def budget_inputs(self) -> dict[str, Any]:
        """Its inputs to the legacy stream-budget formula (harness.graph.stream_budget)."""
        return {}

    def unsupported(self, scenario: Mapping[str, Any]) -> str | None:
        """A reason this combination cannot run here (the item becomes a skip), or None."""
        return None

    def share_requests(self, plans: list[Any], ctx: RankContext) -> list[Any]:
        """This rank's share of the workload's requests (DP splits them among its ranks)."""
        return plans

    def splits_requests(self) -> bool:
        """Whether ranks along this feature's axis get different requests: true of a feature
        that overrides :meth:`share_requests` (DP), false of one that splits a step's work
        (SP, CP), whose ranks all run the same requests."""
        return type(self).share_requests is not Feature.share_requests

    # -- per-step hooks ---------------------------------------------------------------------------
    def agree(self, shape: StepShape, ctx: RankContext) -> StepShape:
        """The shape every rank runs, from this rank's (DP: an all-reduce); before dispatch."""
        return shape

    def any_rank(self, flag: bool, ctx: RankContext) -> bool:
        """Whether ``flag`` holds on any rank of this feature's group, from whether it holds
        here (DP: an all-reduce). Every rank asks at the same point of the same step."""
        return flag

    def rank_metadata(self, meta: AttentionMetadata, ctx: RankContext, block_size: int) -> AttentionMetadata:
        """This rank's attention metadata (context parallel shards it)."""
        return meta

    def attention_style(self, ctx: RankContext) -> Any:
        """How attention runs on this rank (None: the default causal FIA)."""
        return None

    def before_forward(self, shape: RunShape, ctx: RankContext, step: int) -> None:
        """Called on the graph path right before the forward (a guard, never a fix)."""


class RankAxisFeature(Feature):
    """A feature that spreads a step over ranks along one axis, sized by one setting."""

    size_key: ClassVar[str] = "size"

    @property
    def size(self) -> int:
        return int(getattr(self.settings, self.size_key))

    def enabled(self) -> bool:
        return self.size > 1

    def world_size(self) -> int:
        return self.size
