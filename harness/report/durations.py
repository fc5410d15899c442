"""pytest-split's durations file from results files (``graph-harness durations``).

pytest-split (``--splits N --group i``) cuts a suite into groups of equal expected time from a
JSON file of node id -> seconds (``.test_durations`` in the working directory by default). Its
own ``--store-durations`` records each item's wall time; a scenario item on several ranks keeps
that many processes (devices, on hardware; cores, on the emulator) busy for its wall time, so
its cost to a runner is its wall time times its world size. This module writes that cost, in
rank-seconds, from the records a run already wrote: no second run with timing on.

Pure: reads JSON, imports neither pytest nor torch.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from harness.plain import JsonObject

__all__ = ["MIN_COST_S", "item_cost", "durations", "durations_text"]

#: The least an item costs (seconds): a point skipped at collection still takes a worker's turn
#: (its report, its record), and a zero would let pytest-split pile any number on one group.
MIN_COST_S = 0.001


def world_size(scenario: Mapping[str, object]) -> int:
    """The ranks an item's features spread it over, as the harness resolved them (1 when the
    scenario as run cannot be read: a record of an item that crashed before resolution)."""
    from harness.features import point_world_size

    try:
        return max(1, point_world_size(scenario))
    except (TypeError, ValueError, KeyError, AttributeError):
        return 1


def item_cost(record: Mapping[str, object]) -> float:
    """What one item costs a runner, in rank-seconds: its wall time times its world size."""
    duration = record.get("duration")
    seconds = float(duration) if isinstance(duration, (int, float)) else 0.0
    scenario = record.get("scenario")
    ranks = world_size(scenario) if isinstance(scenario, Mapping) else 1
    return max(MIN_COST_S, round(seconds * ranks, 4))


def durations(results: Iterable[JsonObject]) -> dict[str, float]:
    """Node id -> cost for every item of ``results`` (results files' JSON, in order: where two
    files hold the same item, the later one's figure wins, as a newer night's would)."""
    found: dict[str, float] = {}
    for data in results:
        for record in data.get("items") or []:
            nodeid = record.get("nodeid")
            if nodeid:
                found[str(nodeid)] = item_cost(record)
    return dict(sorted(found.items()))


def durations_text(table: Mapping[str, float]) -> str:
    """The file as pytest-split writes it (sorted keys, indented), so a refresh diffs line by line."""
    return json.dumps(dict(table), sort_keys=True, indent=4) + "\n"
