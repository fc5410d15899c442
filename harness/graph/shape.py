"""What ranks agree on before a step, and where a rank sits: shared by pipeline and features."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Graph modes in the order DP consensus takes the minimum of (any eager rank: all eager).
MODE_ORDER = ("NONE", "PIECEWISE", "FULL")


@dataclass(frozen=True)
class RankContext:
    """Where this process sits among a scenario's ranks, with its process groups.

    Ranks are laid out as ``rank = (dp_rank * tp + tp_rank) * cp + cp_rank``; a group is
    ``None`` when its axis has one rank.
    """

    rank: int = 0
    world_size: int = 1
    dp: int = 1
    dp_rank: int = 0
    dp_group: Any = None
    tp: int = 1
    tp_rank: int = 0
    tp_group: Any = None
    cp: int = 1
    cp_rank: int = 0
    cp_group: Any = None


SINGLE_RANK = RankContext()


@dataclass(frozen=True)
class StepShape:
    """The shape of one step on one rank: what DP ranks must agree on."""

    num_tokens: int  # padded token count
    runtime_mode: str  # NONE / PIECEWISE / FULL
    uniform_decode: bool
    has_work: bool = True
