"""A small continuous-batching scheduler: the per-step batches a workload produces.

Batches must change over time the way a serving engine's do (prefills arriving among
decodes, requests finishing), because each change of shape picks another bucket, another
padding and another set of host parameters. Each execution path of a scenario owns a
:class:`Batcher`; without speculative decoding its steps depend only on lengths, so every path
runs the same batches; with it, a path's batches follow its own accepted tokens, and a path
that accepts differently shows up as a mismatch at the step where it did.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from harness.graph.kv_slots import kv_slots
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
    """One engine step: the scheduled requests; ``decodes`` marks the (spec-)decode ones."""

    index: int
    requests: tuple[ScheduledRequest, ...]
    decodes: tuple[bool, ...] = ()


@dataclass
class _Running:
    plan: RequestPlan
    blocks: tuple[int, ...]
    computed: int = 0  # KV entries written and valid
    generated: int = 0


@dataclass
class Batcher:
    """First come, first served continuous batching.

    Running requests decode ``decode_query_len`` tokens a step (``1 + k`` with speculative
    decoding); a waiting request is admitted, its whole prompt prefilled in one step, when it
    has arrived, the sequence and token budgets allow, and the KV cache has its blocks free
    (:func:`~harness.graph.kv_slots.kv_slots`, all allocated on admission, freed when it
    finishes). Otherwise it waits, and so does every request behind it, as in vLLM's scheduler
    when ``allocate_slots`` fails. After each step, :meth:`commit` says how many KV entries
    each request advanced and how many tokens it generated.
    """

    requests: Sequence[RequestPlan]
    block_size: int
    num_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    decode_query_len: int = 1
    index: int = 0
    _waiting: list[RequestPlan] = field(init=False)
    _running: dict[str, _Running] = field(init=False, default_factory=dict)
    _allocator: BlockAllocator = field(init=False)

    def __post_init__(self) -> None:
        self._waiting = sorted(self.requests, key=lambda r: (r.arrival_step, r.req_id))
        self._allocator = BlockAllocator(self.num_blocks, self.block_size)

    @property
    def done(self) -> bool:
        return not self._waiting and not self._running

    def next_step(self) -> Step | None:
        """The batch of the current step (None when nothing is runnable now)."""
        scheduled: list[ScheduledRequest] = []
        decodes: list[bool] = []
        budget = self.max_num_batched_tokens
        for req_id, state in self._running.items():
            if budget < self.decode_query_len:
                break
            scheduled.append(ScheduledRequest(req_id, state.computed, self.decode_query_len, state.blocks))
            decodes.append(True)
            budget -= self.decode_query_len
        while self._waiting and self._waiting[0].arrival_step <= self.index and len(scheduled) < self.max_num_seqs:
            plan = self._waiting[0]
            slots = kv_slots(plan.prompt_len, plan.output_len, self.decode_query_len)
            if plan.prompt_len > budget or self._allocator.blocks_needed(slots) > self._allocator.num_free:
                break
            self._waiting.pop(0)
            blocks = tuple(self._allocator.allocate(plan.req_id, slots))
            self._running[plan.req_id] = _Running(plan, blocks)
            scheduled.append(ScheduledRequest(plan.req_id, 0, plan.prompt_len, blocks))
            decodes.append(False)
            budget -= plan.prompt_len
        step = Step(self.index, tuple(scheduled), tuple(decodes)) if scheduled else None
        return step

    def commit(self, step: Step | None, advanced: Mapping[str, int], generated: Mapping[str, int]) -> None:
        """Record what a step did; finished requests free their blocks; the clock moves on."""
        for req in step.requests if step else ():
            state = self._running[req.req_id]
            state.computed += advanced[req.req_id]
            state.generated += generated[req.req_id]
            if state.generated >= state.plan.output_len:
                del self._running[req.req_id]
                self._allocator.free(req.req_id)
        self.index += 1

    def unfinished(self) -> list[str]:
        """Requests still waiting or running: what the run's step limit cut short."""
        return sorted([*(r.req_id for r in self._waiting), *self._running])

    def remaining_output(self, req_id: str) -> int:
        state = self._running[req_id]
        return state.plan.output_len - state.generated


class ExplicitBatcher:
    """Steps given one by one as ``[(req_id, new_tokens), ...]``.

    A request's first appearance is its prefill; later appearances continue it (1 token is a
    decode, more is another chunk). A request gets blocks for all the tokens it will have at its
    first appearance and gives them back after its last, so requests that never overlap share
    the cache (the schema checks that the ones that do overlap fit it).
    """

    def __init__(self, batches: Sequence[Sequence[tuple[str, int]]], *, block_size: int, num_blocks: int,
                 max_model_len: int) -> None:
        totals: dict[str, int] = {}
        for batch in batches:
            for req_id, new in batch:
                totals[req_id] = totals.get(req_id, 0) + new
        for req_id, total in totals.items():
            if total > max_model_len:
                raise ValueError(f"request {req_id} grows to {total} tokens, past max_model_len={max_model_len}")
        last = {req_id: index for index, batch in enumerate(batches) for req_id, _ in batch}
        allocator = BlockAllocator(num_blocks, block_size)
        blocks: dict[str, tuple[int, ...]] = {}
        computed = dict.fromkeys(totals, 0)
        self.steps: list[Step] = []
        for index, batch in enumerate(batches):
            scheduled, decodes = [], []
            for req_id, new in batch:
                if req_id not in blocks:
                    blocks[req_id] = tuple(allocator.allocate(req_id, totals[req_id]))
                decodes.append(computed[req_id] > 0 and new == 1)
                scheduled.append(ScheduledRequest(req_id, computed[req_id], new, blocks[req_id]))
                computed[req_id] += new
            self.steps.append(Step(index, tuple(scheduled), tuple(decodes)))
            for req_id, _ in batch:
                if last[req_id] == index:
                    allocator.free(req_id)
        self.index = 0
        self.prompt_lengths = totals  # teacher-forced: every input token is given, none sampled

    @property
    def done(self) -> bool:
        return self.index >= len(self.steps)

    def unfinished(self) -> list[str]:
        return []  # teacher-forced: a request is whatever its steps give it

    def remaining_output(self, req_id: str) -> int:
        """Teacher-forced: the steps give a request its tokens, and nothing caps them (no step
        of an explicit workload verifies drafts, the only reader of this)."""
        return sys.maxsize

    def next_step(self) -> Step | None:
        return self.steps[self.index] if not self.done else None

    def commit(self, step: Step | None, advanced: Mapping[str, int], generated: Mapping[str, int]) -> None:
        self.index += 1
