"""An item's verdict per check, from the verdicts of its ranks.

Every rank of a multi-rank item runs the four checks on its own evidence. The item's check
fails when any rank's fails, and says whose; a pass that only some ranks could judge (the
reference runs on the first rank of a TP/CP group) says which ranks judged it."""

from __future__ import annotations

from collections.abc import Sequence

from harness.checks.result import CheckResult

__all__ = ["merge_rank_checks"]


def merge_rank_checks(per_rank: Sequence[dict[str, CheckResult]]) -> tuple[dict[str, CheckResult], int]:
    """The item's checks from each rank's (rank order), and the rank whose evidence to show:
    the first with a failed check, else rank 0."""
    world = len(per_rank)
    merged: dict[str, CheckResult] = {}
    for name in per_rank[0]:
        results = [(rank, checks[name]) for rank, checks in enumerate(per_rank) if name in checks]
        failing = [(rank, r) for rank, r in results if not r.passed]
        evaluated = [(rank, r) for rank, r in results if r.evaluated]
        rank, chosen = (failing or evaluated or results)[0]
        if failing:
            summary = f"rank {rank}: {chosen.summary}"
        elif len(evaluated) in (0, len(results)):
            summary = f"{chosen.summary} (all {world} ranks)"
        else:  # a pass some ranks could not judge: say whose it is
            judged = ", ".join(str(r) for r, _ in evaluated)
            summary = f"{chosen.summary} (ranks {judged} of {world}; the others not evaluated)"
        merged[name] = CheckResult(name, not failing, summary, chosen.first_step,
                                   {**chosen.details, "ranks_failing": [r for r, _ in failing]},
                                   evaluated=bool(failing or evaluated))
    for rank, checks in enumerate(per_rank):  # a check that failed on some rank only
        for name, check in checks.items():
            if name not in merged:
                merged[name] = CheckResult(name, check.passed, f"rank {rank}: {check.summary}", check.first_step,
                                           check.details, evaluated=check.evaluated)
    shown = next((rank for rank, checks in enumerate(per_rank) if any(not c.passed for c in checks.values())), 0)
    return merged, shown
