"""Sequence parallel (flashcomm): hidden states split along tokens across the TP ranks.

T must divide evenly among tp ranks, so every step's T is a multiple of tp even in eager mode,
and capture sizes tp does not divide are dropped (vLLM Ascend PRs #3334, #7801). The rounding
adds tokens the attention metadata must account for: the ``sp_padding`` fix pads the metadata
for them (a dummy request), and without it the FIA host check sees ``actual_seq_lengths[-1] < T``.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from harness.features.base import MAX_AXIS_RANKS, FeatureSettings, FixSwitch, RankAxisFeature, SizeConstraint


class SPSettings(FeatureSettings):
    tp: int = Field(1, ge=1, le=MAX_AXIS_RANKS, description="TP ranks the tokens are split across (1: SP off).")


class SequenceParallel(RankAxisFeature):
    name = "sp"
    Settings = SPSettings
    fixes = {"sp_padding": FixSwitch("the metadata covers the tokens SP adds to reach a multiple of tp",
                                     "FIA 561002: actual_seq_lengths[-1] < T")}
    marker = "sequence parallel (tp > 1)"
    axis = "tp"
    ledger = "sp"
    size_key = "tp"

    @property
    def tp(self) -> int:
        return self.size

    def size_constraints(self) -> list[SizeConstraint]:
        return [SizeConstraint(self.tp, "keep", f"sequence parallel with tp={self.tp}")]

    def token_multiple(self) -> int:
        return self.tp

    def budget_inputs(self) -> dict[str, Any]:
        return {"tp": self.tp}
