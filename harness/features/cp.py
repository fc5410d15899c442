"""Decode context parallel: the KV cache sharded across cp ranks, partial attention merged.

KV position p lives on rank ``p % cp``. Every query token becomes its own length-1 request
(``actual_seq_lengths = arange(n) + 1``, the MLA+CP form of vLLM Ascend PR #5641) with this
rank's KV length for it, and the ranks' partial outputs are merged with the softmax LSE. When
T is padded, the per-rank KV lengths (``cp_seq_len``) must be zero-padded to the padded request
count: the ``cp_kv_padding`` fix; without it FIA sees fewer KV lengths than requests. The
attention mechanics are :mod:`harness.model.context_parallel`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Sequence

from pydantic import Field

from harness.features.base import MAX_AXIS_RANKS, Feature, FeatureSettings, FixSwitch, RankAxisFeature, RankContext
from harness.graph.metadata import AttentionMetadata
from harness.plain import Kwargs

if TYPE_CHECKING:
    from torch import Tensor

    from harness.ops.attention import AttentionStyle


class CPSettings(FeatureSettings):
    size: int = Field(1, ge=1, le=MAX_AXIS_RANKS, description="Context-parallel ranks the KV cache is sharded over (1: CP off).")


class ContextParallel(RankAxisFeature):
    name = "cp"
    Settings = CPSettings
    fixes = {"cp_kv_padding": FixSwitch("per-rank KV lengths zero-padded to the padded request count",
                                        "FIA: fewer KV lengths than requests")}
    marker = "context parallel (size > 1)"
    axis = "cp"
    ledger = "cp"
    ledger_colour = "#eeca3b"

    def budget_inputs(self) -> Kwargs:
        return {"dcp": self.size}

    def unsupported_beside(self, others: Sequence[Feature]) -> str | None:
        shard = next((o for o in others if o.shards_model()), None)
        if shard is not None:
            return (f"CP with a tensor-parallel model shard ({shard.name}): vLLM Ascend's DCP splits the "
                    "TP ranks' KV; this harness models CP on ranks of its own, so the combination is not modelled")
        return None

    def pads_requests_without_full(self) -> bool | None:
        """Never: vLLM Ascend pads the requests of a non-FULL batch with SP only without DCP."""
        return False

    def rank_metadata(self, meta: AttentionMetadata, ctx: RankContext, block_size: int) -> AttentionMetadata:
        """This rank's view: one-token requests, its KV lengths, its slots."""
        from harness.model.context_parallel import cp_metadata_from_attention_metadata

        axis = self.rank_axis(ctx)
        local = cp_metadata_from_attention_metadata(meta, block_size=block_size, cp=axis.size, rank=axis.rank,
                                                    pad_kv_lengths=self.fix_on)
        width = len(meta.block_table[0]) if meta.block_table else 1
        n = len(local.actual_seq_lengths)
        return replace(
            meta,
            num_reqs=meta.num_actual_tokens,
            num_reqs_padded=n,
            query_start_loc=[0, *local.actual_seq_lengths],
            actual_seq_lengths=list(local.actual_seq_lengths),
            query_lens=[1] * n,
            seq_lens=list(local.actual_seq_lengths_kv),
            block_table=[list(row) + [0] * (width - len(row)) for row in local.block_table],
            slot_mapping=list(local.slot_mapping),
            padding_source=f"{meta.padding_source}; cp rank {axis.rank}/{axis.size}: one-token requests"
            + ("" if self.fix_on else ", KV lengths not zero-padded"),
        )

    def attention_style(self, ctx: RankContext) -> AttentionStyle:
        from harness.model.context_parallel import cp_combine
        from harness.ops.attention import AttentionStyle

        axis = self.rank_axis(ctx)

        def combine(out: Tensor, lse: Tensor) -> Tensor:
            return cp_combine(out, lse, axis.size, axis.group)

        return AttentionStyle(sparse_mode=0, combine=combine)
