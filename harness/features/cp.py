"""Decode context parallel: the KV cache sharded across cp ranks, partial attention merged.

KV position p lives on rank ``p % cp``. Every query token becomes its own length-1 request
(``actual_seq_lengths = arange(n) + 1``, the MLA+CP form of vLLM Ascend PR #5641) with this
rank's KV length for it, and the ranks' partial outputs are merged with the softmax LSE. When
T is padded, the per-rank KV lengths (``cp_seq_len``) must be zero-padded to the padded request
count: the ``cp_kv_padding`` fix. The attention itself is :mod:`harness.model.context_parallel`.
"""

from __future__ import annotations

from harness.features.base import Feature


class ContextParallel(Feature):
    name = "cp"
    fix = "cp_kv_padding"
    ledger = "cp"

    @property
    def size(self) -> int:
        return int(self.settings.get("size", 1))

    def enabled(self) -> bool:
        return self.size > 1

    def ranks(self) -> int:
        return self.size
