"""Greedy sampling and the acceptance of draft tokens: what one step's logits give each request.

Kept apart from the pipeline as vLLM keeps its sampler and rejection sampler apart from the model
runner: every path (reference, padded, graph, the plain greedy run) reads its step the same way,
so a difference between paths is never a difference in how their logits were read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from harness.graph.metadata import AttentionMetadata
from harness.graph.scheduler import Step

__all__ = ["Accepted", "OutputBudget", "accept"]


class OutputBudget(Protocol):
    """How many tokens a request may still generate (the batcher knows its output length)."""

    def remaining_output(self, req_id: str) -> int: ...


@dataclass
class Accepted:
    """What a step gave, per request.

    ``advanced``: the KV entries the step made valid; ``generated``: how many tokens it added to
    the text; ``verified``: the greedy tokens up to the first rejected draft, in step order (the
    accepted drafts and the bonus token; without drafts, the sampled token). The per-step
    comparison looks at ``verified``: two paths whose bonus tokens differ part there."""

    advanced: dict[str, int] = field(default_factory=dict)
    generated: dict[str, int] = field(default_factory=dict)
    verified: list[list[int]] = field(default_factory=list)

    @property
    def sampled(self) -> list[int]:
        """The first greedy token of each request (what reports show per step)."""
        return [tokens[0] for tokens in self.verified]


def accept(step: Step, meta: AttentionMetadata, logits: torch.Tensor, tokens: dict[str, list[int]],
           drafts: dict[str, list[int]], budget: OutputBudget) -> Accepted:
    """Greedy sampling, and greedy acceptance of draft tokens (the longest agreeing prefix).

    Extends ``tokens`` (each request's known text) with what the step generated."""
    out = Accepted()
    starts = meta.query_start_loc
    greedy = logits.argmax(dim=-1).tolist()  # one host read of the step's tokens
    for i, req in enumerate(step.requests):
        rows = greedy[starts[i] : starts[i + 1]]
        proposal = drafts.get(req.req_id, [])
        known = tokens[req.req_id]
        if proposal:  # verify: rows[j] is the target's token after input j
            accepted = 0
            while accepted < len(proposal) and proposal[accepted] == rows[accepted]:
                accepted += 1
            new = rows[: accepted + 1][: budget.remaining_output(req.req_id)]
            known.extend(new)
            out.advanced[req.req_id], out.generated[req.req_id] = accepted + 1, len(new)
            out.verified.append([int(t) for t in rows[: accepted + 1]])
        else:
            if req.seq_len == len(known):  # the step reached the end of the known text
                known.append(int(rows[-1]))
            out.advanced[req.req_id], out.generated[req.req_id] = req.num_new_tokens, 1
            out.verified.append([int(rows[-1])])
    return out
