"""Parallel and speculative features as composable scenario axes (see docs/features.md).

Built-in features: DP, SP, MTP, CP. More come from other packages through the
``graph_harness.features`` entry-point group: each entry point names a :class:`Feature`
subclass whose ``name`` is its key under a scenario's ``features:``. Everything the harness
knows about a feature (its settings schema and cross-field rules, fix switches, marker, rank
axis, capture-size and token constraints, budget inputs, model shard, report label) it reads
from the registry, so a feature from another package needs no change to any file of
graph-harness.

The registry is scanned once per ``sys.path`` (a test that installs a plugin at run time, by
prepending its directory to ``sys.path``, gets a fresh scan).
"""

from __future__ import annotations

import functools
import math
import sys
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

from harness.features.base import (
    SINGLE_RANK,
    Feature,
    FeatureSettings,
    FixSwitch,
    RankAxisFeature,
    RankContext,
    SizeConstraint,
    StepShape,
)
from harness.features.cp import ContextParallel
from harness.features.dp import DataParallel, DPDisagreement, check_agreement
from harness.features.mtp import SpeculativeDecoding
from harness.features.sp import SequenceParallel
from harness.plain import Kwargs, PlainData

if TYPE_CHECKING:  # pragma: no cover
    from harness.model.config import ModelConfig

ENTRY_POINT_GROUP = "graph_harness.features"
#: Registry order is rank-layout order, outermost axis first: rank = (dp_rank * tp + tp_rank) * cp + cp_rank.
BUILTIN: tuple[type[Feature], ...] = (DataParallel, SequenceParallel, SpeculativeDecoding, ContextParallel)


def registry() -> dict[str, type[Feature]]:
    """Feature classes by name: the built-ins, then any installed through entry points."""
    return dict(_scan(tuple(sys.path)))


@functools.lru_cache(maxsize=8)
def _scan(path: tuple[str, ...]) -> tuple[tuple[str, type[Feature]], ...]:
    found: dict[str, type[Feature]] = {cls.name: cls for cls in BUILTIN}
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        cls = entry.load()
        if not (isinstance(cls, type) and issubclass(cls, Feature)):
            raise TypeError(f"entry point {entry.name} = {entry.value} is not a harness.features.Feature subclass")
        found.setdefault(cls.name, cls)
    return tuple(found.items())


def all_fix_switches(classes: Iterable[type[Feature]] | None = None) -> dict[str, tuple[str, FixSwitch]]:
    """Every feature's fix switches: switch name -> (feature name, switch)."""
    out: dict[str, tuple[str, FixSwitch]] = {}
    for cls in classes if classes is not None else registry().values():
        for switch, spec in cls.fixes.items():
            out.setdefault(switch, (cls.name, spec))
    return out


def active_features(features: Mapping[str, FeatureSettings | PlainData | None],
                    fixes: Mapping[str, bool]) -> list[Feature]:
    """The enabled features of a scenario, in registry order (settings: models or mappings)."""
    classes = registry()
    unknown = [name for name in features if name not in classes]
    if unknown:
        raise ValueError(f"unknown feature {unknown[0]!r}; known: {', '.join(sorted(classes))}")
    active = []
    for name, cls in classes.items():
        if name in features:
            feature = cls(features[name], fixes)
            if feature.enabled():
                active.append(feature)
    return active


def world_size(features: Iterable[Feature]) -> int:
    """Ranks an item needs: the product of its features' axis sizes."""
    return math.prod(f.world_size() for f in features if f.axis)


def point_world_size(point: Mapping[str, object]) -> int:
    """Ranks a raw scenario point (its ``features`` and ``fixes`` sections) spreads over: what
    the matrix selection prices a point at and what a split counts an item's time by."""
    features = point.get("features") or {}
    fixes = point.get("fixes") or {}
    return world_size(active_features(features, fixes))  # type: ignore[arg-type]  # raw sections, judged there


def uniform_decode_query_len(features: Iterable[Feature]) -> int:
    """``q``: tokens per request in a uniform decode batch (1 + draft tokens)."""
    return 1 + sum(f.extra_query_tokens() for f in features)


def size_constraints(features: Iterable[Feature]) -> list[SizeConstraint]:
    return [c for f in features for c in f.size_constraints()]


def budget_inputs(features: Iterable[Feature]) -> Kwargs:
    out: Kwargs = {}
    for feature in features:
        out.update(feature.budget_inputs())
    return out


def model_problem(features: Iterable[Feature], config: ModelConfig) -> tuple[str, str] | None:
    """The first ``(field, message)`` of a feature that cannot split the model, else None."""
    return next((problem for f in features if (problem := f.model_problem(config)) is not None), None)


@dataclass(frozen=True)
class ItemFeatures:
    """An item's enabled features and everything its resolution asks of them, read in one pass
    (:func:`harness.resolve.resolve_item` reads nothing else of a feature)."""

    features: tuple[Feature, ...]
    uniform_decode_query_len: int  # q = 1 + the draft tokens a request verifies per step
    size_constraints: tuple[SizeConstraint, ...]
    world_size: int
    budget_inputs: Kwargs  # what the legacy stream-budget formula reads of them
    unsupported: str | None  # "<feature>: why" when a feature cannot run the point
    model_problem: tuple[str, str] | None  # (field, message) when a feature cannot split the model


def item_features(settings: PlainData, fixes: Mapping[str, bool], scenario: PlainData,
                  model: ModelConfig) -> ItemFeatures:
    """Make the enabled features (:func:`active_features`) and ask each what the item needs:
    ``scenario`` is the whole scenario as plain data (a feature's ``unsupported`` reads it)."""
    features = tuple(active_features(settings, fixes))
    return ItemFeatures(features, uniform_decode_query_len(features), tuple(size_constraints(features)),
                        world_size(features), budget_inputs(features), unsupported_reason(features, scenario),
                        model_problem(features, model))


def unsupported_reason(features: Sequence[Feature], scenario: PlainData) -> str | None:
    """``"<feature>: why"`` of the first feature that cannot run ``scenario`` (plain data) or
    cannot run beside the others, else None."""
    for f in features:
        others = [o for o in features if o is not f]
        if reason := f.unsupported(scenario) or f.unsupported_beside(others):
            return f"{f.name}: {reason}"
    return None


def feature_label(sections: PlainData) -> str:
    """An item's feature combination (``dp2+sp2+mtp1``, registry order) from its scenario's
    ``features:`` as plain data, or ``base`` when none is on."""
    parts = [label for name, cls in registry().items()
             if isinstance(section := sections.get(name), Mapping) and (label := cls.label(section))]
    return "+".join(parts) if parts else "base"


def ledger_colours() -> dict[str, str]:
    """Each feature's padding-ledger column and its colour in the report's charts."""
    return {cls.ledger or name: cls.ledger_colour for name, cls in registry().items() if cls.ledger_colour}


__all__ = [
    "BUILTIN", "ENTRY_POINT_GROUP", "SINGLE_RANK", "ContextParallel", "DPDisagreement", "DataParallel", "Feature",
    "FeatureSettings", "FixSwitch", "ItemFeatures", "RankAxisFeature", "RankContext", "SequenceParallel", "SizeConstraint",
    "SpeculativeDecoding", "StepShape", "active_features", "all_fix_switches", "budget_inputs", "check_agreement",
    "feature_label", "item_features", "ledger_colours", "model_problem", "point_world_size", "registry",
    "size_constraints", "uniform_decode_query_len", "unsupported_reason", "world_size",
]
