"""Speculative decoding (MTP / EAGLE) with k draft tokens.

A draft model proposes k tokens per request, the target verifies 1 + k tokens per request
with greedy acceptance, so a uniform decode batch has ``q = 1 + k`` tokens per request and
capture sizes are rounded up to multiples of q (vLLM ``adjust_cudagraph_sizes_for_spec_decode``,
issue #28207; composed with the other features' constraints in graph.capture_sizes). The
drafter (:mod:`harness.graph.drafter`) runs with *unpadded* metadata: the ``drafter_unpadded``
fix. Without it the drafter is handed the target's padded metadata for an unpadded input, a
last element beyond T that both FIA contracts reject. On the graph path the draft model has
graphs of its own (:mod:`harness.graph.draft_runner`) whose FIA host lists are updated after
every replay: the ``drafter_param_update`` fix. Greedy speculative output must equal greedy
plain output.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from harness.features.base import MAX_DRAFT_TOKENS, Feature, FeatureSettings, FixSwitch, Loc, SizeConstraint
from harness.graph.kv_slots import kv_slots
from harness.plain import Kwargs, PlainData


class MTPSettings(FeatureSettings):
    k: int = Field(0, ge=0, le=MAX_DRAFT_TOKENS, description="Draft tokens per step; canonical spec-decode count.")


class SpeculativeDecoding(Feature):
    name = "mtp"
    Settings = MTPSettings
    settings: MTPSettings  # (the base validates it as Settings)
    fixes = {"drafter_unpadded": FixSwitch("the drafter gets its own unpadded metadata",
                                           "the drafter's last element > T: both FIA contracts reject"),
             "drafter_param_update": FixSwitch("the draft model's FULL graphs get their FIA host lists updated "
                                               "after every replay (vLLM Ascend _draft_graph_params)",
                                               "the draft graphs replay their capture-time lists: stale params")}
    marker = "speculative decoding (k > 0)"
    ledger = "spec"
    ledger_colour = "#72b7b2"
    size_key = "k"
    mirrors = {"graph.num_speculative_tokens": "k"}  # vLLM's name for k; k is canonical

    @property
    def k(self) -> int:
        return self.settings.k

    def enabled(self) -> bool:
        return self.k > 0

    def extra_query_tokens(self) -> int:
        return self.k

    def size_constraints(self) -> list[SizeConstraint]:
        q = 1 + self.k
        return [SizeConstraint(q, "round_up", f"speculative decoding with q={q}")]

    def budget_inputs(self) -> Kwargs:
        return {"draft_layers": 1}

    def scenario_issues(self, scenario: Any) -> list[tuple[Loc, str]]:
        """A decode step of ``1 + k`` tokens must fit the token budget, and a request's KV
        slots, its last step's drafts included, must fit ``max_model_len``."""
        issues: list[tuple[Loc, str]] = []
        k, budget = self.k, scenario.workload.max_num_batched_tokens
        max_len = scenario.model.max_model_len
        if scenario.workload.requests and 1 + k > budget:
            issues.append((("workload", "max_num_batched_tokens"),
                           f"a decode step of one request takes 1 + k = {1 + k} tokens (features.mtp.k {k}), "
                           f"above max_num_batched_tokens {budget}: no request would ever decode"))
        for i, r in enumerate(scenario.workload.requests or []):
            slots = kv_slots(r.prompt_len, r.output_len, 1 + k)
            if r.prompt_len + r.output_len <= max_len < slots:  # too long without drafts: the schema says so
                issues.append((("workload", "requests", i),
                               f"with features.mtp.k {k} the request's last decode step writes KV for its drafts "
                               f"too: prompt_len + output_len - 1 + k = {slots} slots, above model.max_model_len "
                               f"{max_len} (vLLM trims drafts at max_model_len, this harness does not): "
                               f"lower output_len by {slots - max_len} or raise max_model_len"))
        return issues

    def unsupported(self, scenario: PlainData) -> str | None:
        # (where the real engine refuses speculation with SP, the capture sizes say so:
        # harness.graph.capture_sizes.spec_decode_rounding, read by harness.resolve)
        if scenario.get("workload", {}).get("steps"):
            return "speculative decoding needs a request workload: explicit steps fix the token counts"
        return None
