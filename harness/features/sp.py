"""Sequence parallel (flashcomm): hidden states split along tokens across the TP ranks.

T must divide evenly among tp ranks, so it is rounded up to a multiple of tp even in eager
mode, and capture sizes tp does not divide are dropped (vLLM Ascend PRs #3334, #7801). The
rounding adds tokens the attention metadata must account for: the ``sp_padding`` fix pads the
metadata for them (a dummy request), and without it the FIA host check sees
``actual_seq_lengths[-1] < T``.
"""

from __future__ import annotations

from harness.features.base import RankAxisFeature
from harness.graph.capture_sizes import sizes_for_sequence_parallel


class SequenceParallel(RankAxisFeature):
    name = "sp"
    fix = "sp_padding"
    ledger = "sp"
    size_key = "tp"

    @property
    def tp(self) -> int:
        return self.size

    def capture_sizes(self, sizes: list[int], max_size: int) -> list[int]:
        return sizes_for_sequence_parallel(sizes, self.tp)

    def pad_tokens(self, num_tokens: int) -> int:
        return -(-num_tokens // self.tp) * self.tp
