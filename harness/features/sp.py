"""Sequence parallel (flashcomm): hidden states split along tokens across the TP ranks.

T must divide evenly among tp ranks, so every step's T is a multiple of tp even in eager mode,
and capture sizes tp does not divide are dropped (vLLM Ascend PRs #3334, #7801). The rounding
adds tokens the attention metadata must account for: the ``sp_padding`` fix pads the metadata
for them (a dummy request), and without it the FIA host check sees ``actual_seq_lengths[-1] < T``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from harness.features.base import (
    MAX_AXIS_RANKS,
    FeatureSettings,
    FixSwitch,
    RankAxisFeature,
    RankContext,
    SizeConstraint,
)
from harness.plain import Kwargs

if TYPE_CHECKING:  # pragma: no cover
    from harness.model import DecoderLM
    from harness.model.config import ModelConfig


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
    ledger_colour = "#e45756"
    size_key = "tp"

    @property
    def tp(self) -> int:
        return self.size

    def size_constraints(self) -> list[SizeConstraint]:
        return [SizeConstraint(self.tp, "keep", f"sequence parallel with tp={self.tp}")]

    def token_multiple(self) -> int:
        return self.tp

    def budget_inputs(self) -> Kwargs:
        return {"tp": self.tp}

    def model_problem(self, config: ModelConfig) -> tuple[str, str] | None:
        """A model whose heads or MLP columns ``tp`` ranks cannot split evenly (the MLP width is
        twice ``model.hidden_size``: that is the field to change)."""
        from harness.model.parallel import tp_split_problem

        split = tp_split_problem(config, self.tp)
        if split is None:
            return None
        field, message = split
        return (f"model.{'hidden_size' if field == 'intermediate_size' else field}",
                f"{message}, with features.sp.tp={self.tp}")

    def rank_model(self, model: DecoderLM, ctx: RankContext) -> DecoderLM:
        """This rank's tensor-parallel shard, its residual stream split along tokens."""
        from harness.model import DecoderLM
        from harness.model.parallel import ParallelContext

        axis = self.rank_axis(ctx)
        if axis.size == 1:
            return model
        parallel = ParallelContext(axis.size, axis.rank, axis.group, sequence_parallel=True)
        return DecoderLM(model.config, parallel).place(model.device)
