"""Speculative decoding (MTP / EAGLE) with k draft tokens.

A draft model proposes k tokens per request, the target verifies 1 + k tokens per request
with greedy acceptance, so a uniform decode batch has ``q = 1 + k`` tokens per request and
capture sizes are rounded up to multiples of q (vLLM ``adjust_cudagraph_sizes_for_spec_decode``,
issue #28207). The drafter runs its first round on each request's newly accepted tokens and
later rounds on one token per request, with *unpadded* metadata: the ``drafter_unpadded`` fix.
Without it the drafter is handed the target's padded metadata for an unpadded input, a last
element beyond T that both FIA contracts reject. The pipeline's spec-decode loop lives in
:mod:`harness.graph.pipeline`; greedy speculative output must equal greedy plain output.
"""

from __future__ import annotations

from typing import Any, Mapping

from harness.features.base import Feature
from harness.graph.capture_sizes import sizes_for_spec_decode


class SpeculativeDecoding(Feature):
    name = "mtp"
    fix = "drafter_unpadded"
    ledger = "spec"

    @property
    def k(self) -> int:
        return int(self.settings.get("k", 0))

    def enabled(self) -> bool:
        return self.k > 0

    def extra_query_tokens(self) -> int:
        return self.k

    def capture_sizes(self, sizes: list[int], max_size: int) -> list[int]:
        return sizes_for_spec_decode(sizes, 1 + self.k, max_size)

    def unsupported(self, scenario: Mapping[str, Any]) -> str | None:
        if scenario.get("workload", {}).get("steps"):
            return "speculative decoding needs a request workload: explicit steps fix the token counts"
        return None
