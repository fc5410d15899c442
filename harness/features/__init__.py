"""Parallel and speculative features as composable scenario axes (see docs/features.md).

Built-in features: SP, DP, MTP, CP. More can come from other packages through the
``graph_harness.features`` entry-point group: each entry point names a :class:`Feature`
subclass whose ``name`` is its key under a scenario's ``features:``.
"""

from __future__ import annotations

import sys
from importlib.metadata import entry_points
from typing import Any, Mapping

from harness.features.base import MODE_ORDER, SINGLE_RANK, Feature, RankAxisFeature, RankContext, StepShape
from harness.features.cp import ContextParallel
from harness.features.dp import DataParallel, DPDisagreement, check_agreement
from harness.features.mtp import SpeculativeDecoding
from harness.features.sp import SequenceParallel

ENTRY_POINT_GROUP = "graph_harness.features"
BUILTIN: tuple[type[Feature], ...] = (SequenceParallel, DataParallel, SpeculativeDecoding, ContextParallel)


_REGISTRY_CACHE: dict[tuple[str, ...], dict[str, type[Feature]]] = {}


def registry() -> dict[str, type[Feature]]:
    """Feature classes by name: the built-ins, then any installed through entry points.

    Scanning the installed distributions costs milliseconds, and collection asks once per
    matrix point, so the answer is kept per ``sys.path`` (a changed path scans again)."""
    key = tuple(sys.path)
    found = _REGISTRY_CACHE.get(key)
    if found is None:
        found = {cls.name: cls for cls in BUILTIN}
        for entry in entry_points(group=ENTRY_POINT_GROUP):
            cls = entry.load()
            found.setdefault(cls.name, cls)
        _REGISTRY_CACHE[key] = found
    return dict(found)


def active_features(features: Mapping[str, Any], fixes: Mapping[str, bool]) -> list[Feature]:
    """The enabled features of a scenario, in registry order."""
    classes = registry()
    active = []
    for name, settings in features.items():
        if name not in classes:
            raise ValueError(f"unknown feature {name!r}; known: {', '.join(sorted(classes))}")
        feature = classes[name](settings or {}, fixes)
        if feature.enabled():
            active.append(feature)
    return active


__all__ = [
    "BUILTIN", "ENTRY_POINT_GROUP", "MODE_ORDER", "SINGLE_RANK", "ContextParallel", "DPDisagreement",
    "DataParallel", "Feature", "RankAxisFeature", "RankContext", "SequenceParallel", "SpeculativeDecoding", "StepShape",
    "active_features", "check_agreement", "registry",
]
