"""How long an item may run: one limit per item, and the rank timeout derived from it.

Two clocks guard a multi-rank item. The outer one is the item's wall-clock limit (enforced by
pytest-timeout, so a hang fails that item and never the session); the inner one is the rank
timeout of :func:`harness.ranks.run_ranks`, which ends the ranks and reports each rank's log and
state. The inner one must fire first, or a rank hang would be reported as a bare pytest-timeout
instead of with the ranks' logs, so it is a fixed fraction of the outer one. Rank start-up is
not counted by the inner clock (the warm server forks ranks in milliseconds), so the margin
left for start-up, the checks and the teardown is what separates them.
"""

from __future__ import annotations

from .schema import Scenario

DEFAULT_ITEM_TIMEOUT_S = 600.0
"""Limit of an item whose scenario sets no ``timeout_s``: ten times the slowest shipped kind
(a 40-layer stream-budget item, ~60 s on an idle 2-core machine) to survive a loaded one."""

RANK_SHARE = 0.8
"""The rank timeout as a share of the item's limit (the rest: start-up, checks, teardown)."""


def item_timeout(scenario: Scenario) -> float:
    """Wall-clock seconds this item may run: its ``timeout_s``, else the default."""
    return float(scenario.timeout_s) if scenario.timeout_s is not None else DEFAULT_ITEM_TIMEOUT_S


def rank_timeout(scenario: Scenario) -> float:
    """Seconds the ranks of this item may run once started; fires before :func:`item_timeout`."""
    return RANK_SHARE * item_timeout(scenario)
