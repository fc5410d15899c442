"""A small continuous-batching scheduler: the per-step batches a workload produces.

Batches must change over time the way a serving engine's do (prefills arriving among
decodes, requests finishing), because each change of shape picks another bucket, another
padding and another set of host parameters. The schedule depends only on lengths, never on
token values, so every execution path of a scenario (eager reference, padded eager, graph)
runs exactly the same batches and can be compared step by step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness.graph.metadata import ScheduledRequest
from harness.model.kv_cache import BlockAllocator


@dataclass(frozen=True)
class RequestPlan:
    """A request of the workload: a prompt, how many tokens to generate, when it arrives."""

    req_id: str
    prompt_len: int
    output_len: int
    arrival_step: int = 0


@dataclass(frozen=True)
class Step:
    """One engine step: the scheduled requests and which of them sample a token now."""

    index: int
    requests: tuple[ScheduledRequest, ...]
    samples: tuple[bool, ...]  # True where the step ends a prefill or is a decode

    @property
    def num_tokens(self) -> int:
        return sum(r.num_new_tokens for r in self.requests)

    @property
    def query_lens(self) -> list[int]:
        return [r.num_new_tokens for r in self.requests]


def schedule(
    requests: Sequence[RequestPlan],
    *,
    block_size: int,
    num_blocks: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    max_steps: int,
    decode_query_len: int = 1,
) -> list[Step]:
    """Plan the steps of a workload, first come first served.

    Running requests decode ``decode_query_len`` tokens a step (``1 + k`` with speculative
    decoding); a waiting request is admitted, its whole prompt prefilled in one step, when it
    has arrived and both the sequence and token budgets allow. Blocks for the whole request
    (prompt + output) are allocated on admission and freed when it finishes.
    """
    allocator = BlockAllocator(num_blocks, block_size)
    waiting = sorted(requests, key=lambda r: (r.arrival_step, r.req_id))
    running: dict[str, tuple[RequestPlan, tuple[int, ...], int, int]] = {}  # id -> plan, blocks, computed, generated
    steps: list[Step] = []
    index = 0
    while (waiting or running) and len(steps) < max_steps:
        scheduled: list[ScheduledRequest] = []
        samples: list[bool] = []
        budget = max_num_batched_tokens
        for req_id, (plan, blocks, computed, generated) in running.items():
            new = min(decode_query_len, budget)
            if new < 1:
                break
            scheduled.append(ScheduledRequest(req_id, computed, new, blocks))
            samples.append(True)
            budget -= new
        while waiting and waiting[0].arrival_step <= index and len(scheduled) < max_num_seqs:
            plan = waiting[0]
            if plan.prompt_len > budget:
                break
            waiting.pop(0)
            total = plan.prompt_len + plan.output_len * decode_query_len
            blocks = tuple(allocator.allocate(plan.req_id, total))
            scheduled.append(ScheduledRequest(plan.req_id, 0, plan.prompt_len, blocks))
            samples.append(True)
            budget -= plan.prompt_len
            running[plan.req_id] = (plan, blocks, 0, 0)
        if scheduled:
            steps.append(Step(index, tuple(scheduled), tuple(samples)))
        for req in scheduled:
            plan, blocks, computed, generated = running[req.req_id]
            computed += req.num_new_tokens
            generated += 1
            if generated >= plan.output_len:
                del running[req.req_id]
                allocator.free(req.req_id)
            else:
                running[req.req_id] = (plan, blocks, computed, generated)
        index += 1
    return steps


def explicit_steps(
    batches: Sequence[Sequence[tuple[str, int]]], *, block_size: int, num_blocks: int, max_model_len: int
) -> list[Step]:
    """Steps given one by one as ``[(req_id, new_tokens), ...]``.

    A request's first appearance is its prefill; later appearances continue it (1 token is a
    decode, more is another chunk). Each request gets blocks for all the tokens it will have.
    """
    totals: dict[str, int] = {}
    for batch in batches:
        for req_id, new in batch:
            totals[req_id] = totals.get(req_id, 0) + new
    for req_id, total in totals.items():
        if total > max_model_len:
            raise ValueError(f"request {req_id} grows to {total} tokens, past max_model_len={max_model_len}")
    allocator = BlockAllocator(num_blocks, block_size)
    blocks = {req_id: tuple(allocator.allocate(req_id, total)) for req_id, total in totals.items()}
    computed = dict.fromkeys(totals, 0)
    steps = []
    for index, batch in enumerate(batches):
        scheduled = []
        for req_id, new in batch:
            scheduled.append(ScheduledRequest(req_id, computed[req_id], new, blocks[req_id]))
            computed[req_id] += new
        steps.append(Step(index, tuple(scheduled), tuple(True for _ in scheduled)))
    return steps
