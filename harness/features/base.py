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

Everything else the harness needs to know of a feature it also asks the feature, so that a
feature from another package does all a built-in one does (nothing outside this package names
a feature):

* the scenario schema: ``mirrors`` (fields outside ``features.<name>`` that follow one of its
  settings) and ``scenario_issues()`` (its cross-field rules, located);
* the model: ``model_problem()`` (a model it cannot split, found before any rank starts) and
  ``rank_model()`` (this rank's model: SP's tensor-parallel shard);
* the planner: ``pads_requests_without_full()`` (whether a non-FULL batch pads its requests);
* reports: ``size_key`` and ``label()`` (``sp2`` in a combination) and ``ledger_colour`` (its
  padding-ledger column in the charts).

Model-level mechanics (sharded weights, collectives, LSE merges) live in :mod:`harness.model`;
a feature only wires them into the pipeline. Feature modules import neither torch nor the
model at import time (the scenario schema is generated from them); hooks import what they run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Sequence

from pydantic import BaseModel, ConfigDict

from harness.graph.capture_sizes import SizeConstraint
from harness.graph.shape import SINGLE_RANK, RankAxis, RankContext, RunShape, StepShape
from harness.plain import Kwargs, Loc, PlainData

if TYPE_CHECKING:  # pragma: no cover
    from harness.graph.metadata import AttentionMetadata
    from harness.graph.scheduler import RequestPlan
    from harness.ops.attention import AttentionStyle
    from harness.model import DecoderLM
    from harness.model.config import ModelConfig

__all__ = ["Feature", "FeatureSettings", "FixSwitch", "Loc", "RankAxis", "RankAxisFeature", "RankContext",
           "SINGLE_RANK", "SizeConstraint", "StepShape"]


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
    ledger_colour: ClassVar[str] = ""  # that column's colour in the report's charts ("": a neutral one)
    size_key: ClassVar[str] = ""  # the integer setting that sizes it (its label: ``sp2``), if one does
    #: Scenario fields outside ``features.<name>`` that mirror one of its settings (dotted path ->
    #: setting): either may be given, and given both they must agree (MTP: vLLM's
    #: ``graph.num_speculative_tokens`` and its ``k``).
    mirrors: ClassVar[Mapping[str, str]] = {}

    def __init__(self, settings: FeatureSettings | PlainData | None = None,
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

    def budget_inputs(self) -> Kwargs:
        """Its inputs to the legacy stream-budget formula (harness.graph.stream_budget)."""
        return {}

    def unsupported(self, scenario: PlainData) -> str | None:
        """A reason this combination cannot run here (the item becomes a skip), or None."""
        return None

    def unsupported_beside(self, others: Sequence[Feature]) -> str | None:
        """A reason it cannot run beside the item's other enabled features (the item becomes
        a skip), or None. Asked of their properties, never of their names, so a feature from
        outside meets the same rule."""
        return None

    def shards_model(self) -> bool:
        """Whether each rank runs its own part of the model (it overrides :meth:`rank_model`)."""
        return type(self).rank_model is not Feature.rank_model

    def scenario_issues(self, scenario: Any) -> list[tuple[Loc, str]]:
        """Its cross-field rules on a validated scenario (a ``harness.scenario.Scenario``, its
        mirrors applied): ``(location from the root, message)`` per problem. The schema calls
        it for every enabled feature, and reports each problem at its location in the file."""
        return []

    def model_problem(self, config: ModelConfig) -> tuple[str, str] | None:
        """A model this feature cannot split as ``config`` stands, as ``(scenario field to
        change, message)``; None when it can. Checked before any rank starts."""
        return None

    def rank_model(self, model: DecoderLM, ctx: RankContext) -> DecoderLM:
        """This rank's model, from the one the features before it left (at first the
        single-rank model, on its device): SP's tensor-parallel shard."""
        return model

    def pads_requests_without_full(self) -> bool | None:
        """Whether a batch that does not run a FULL graph pads its requests up to its tokens
        (a dummy request): True makes it so (vLLM Ascend with SP), False forbids it (with CP),
        None leaves it to the others. By default a feature that splits tokens across ranks
        (a token multiple above 1) makes it so."""
        return True if self.token_multiple() > 1 else None

    @classmethod
    def label(cls, settings: PlainData) -> str | None:
        """How it names itself in an item's feature combination (``sp2``), from its settings as
        a report's record keeps them (plain data); None when it is off there. By default its
        name and its ``size_key`` setting, when that is off its default."""
        if not cls.size_key or cls.size_key not in cls.Settings.model_fields:
            return None
        value = settings.get(cls.size_key) if isinstance(settings, Mapping) else None
        if isinstance(value, int) and value != cls.Settings.model_fields[cls.size_key].default:
            return f"{cls.name}{value}"
        return None

    def share_requests(self, plans: list[RequestPlan], ctx: RankContext) -> list[RequestPlan]:
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

    def attention_style(self, ctx: RankContext) -> AttentionStyle | None:
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

    def rank_axis(self, ctx: RankContext) -> RankAxis:
        """This rank's place on the feature's axis: its size, index and process group."""
        return ctx.axis(self.axis or "")

    def enabled(self) -> bool:
        return self.size > 1

    def world_size(self) -> int:
        return self.size
