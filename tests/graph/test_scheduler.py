"""Continuous batching: admission, budgets, arrivals, finishing, speculative query length."""

from __future__ import annotations

import pytest

from harness.graph.kv_slots import kv_slots
from harness.graph.scheduler import Batcher, ExplicitBatcher, RequestPlan


def _run(batcher: Batcher, accepted: int = 0):
    steps = []
    while not batcher.done and len(steps) < 50:
        step = batcher.next_step()
        steps.append(step)
        if step is None:
            batcher.commit(None, {}, {})
            continue
        advanced = {r.req_id: (accepted + 1 if d else r.num_new_tokens) for r, d in zip(step.requests, step.decodes)}
        generated = {r.req_id: (accepted + 1 if d else 1) for r, d in zip(step.requests, step.decodes)}
        batcher.commit(step, advanced, generated)
    return steps


def _lens(step):
    return [r.num_new_tokens for r in step.requests]


def test_prefill_then_decodes_until_output_len():
    steps = _run(Batcher([RequestPlan("a", 5, 3)], 16, 16, 8, 512))
    assert [_lens(s) for s in steps] == [[5], [1], [1]]
    assert [s.requests[0].num_computed_tokens for s in steps] == [0, 5, 6]


def test_arrivals_mix_prefills_with_decodes_and_idle_steps_advance_the_clock():
    plans = [RequestPlan("a", 4, 4), RequestPlan("b", 3, 2, arrival_step=2), RequestPlan("c", 2, 1, arrival_step=9)]
    steps = _run(Batcher(plans, 16, 32, 8, 512))
    shapes = [_lens(s) if s else None for s in steps]
    assert shapes[:4] == [[4], [1], [1, 3], [1, 1]]
    assert None in shapes and shapes[-1] == [2]  # idle until c arrives at step 9


def test_token_and_sequence_budgets_hold_back_prefills():
    plans = [RequestPlan(f"r{i}", 6, 2) for i in range(3)]
    steps = _run(Batcher(plans, 16, 32, max_num_seqs=2, max_num_batched_tokens=8))
    assert _lens(steps[0]) == [6]  # the second prompt does not fit the 8-token budget
    assert all(len(s.requests) <= 2 for s in steps if s)


def test_speculative_decode_steps_carry_q_tokens_and_follow_acceptance():
    steps = _run(Batcher([RequestPlan("a", 4, 7)], 16, 16, 8, 512, decode_query_len=3), accepted=2)
    assert [_lens(s) for s in steps] == [[4], [3], [3]]  # 1 + 3 + 3 generated tokens
    assert [s.requests[0].num_computed_tokens for s in steps] == [0, 4, 7]


def test_explicit_steps_are_taken_as_written_and_checked_against_the_model_length():
    batcher = ExplicitBatcher([[("a", 5)], [("a", 1), ("b", 3)]], block_size=4, num_blocks=16, max_model_len=16)
    assert [_lens(s) for s in batcher.steps] == [[5], [1, 3]]
    assert batcher.steps[1].decodes == (True, False)
    with pytest.raises(ValueError, match="past max_model_len=4"):
        ExplicitBatcher([[("a", 5)]], block_size=4, num_blocks=16, max_model_len=4)


def test_a_request_is_given_the_slots_it_can_write_and_one_at_max_model_len_fits():
    """kv_slots: the prompt, every generated token but the last, and the drafts of the last
    spec-decode step; a request of exactly max_model_len tokens needs its table's width, no more."""
    assert kv_slots(4, 4) == 7
    assert kv_slots(4, 1, decode_query_len=4) == 4  # ends with its prefill: no decode, no drafts
    assert kv_slots(4, 12, decode_query_len=2) == 16  # MTP k 1: at most max_model_len
    steps = _run(Batcher([RequestPlan("a", 4, 4)], block_size=4, num_blocks=3, max_num_seqs=8, max_num_batched_tokens=512))
    assert [len(s.requests[0].block_ids) for s in steps] == [2, 2, 2, 2]  # 8 tokens: ceil(7 / 4) blocks


def test_a_request_waits_for_free_blocks_and_blocks_the_queue_behind_it():
    """As vLLM's scheduler: admission fails when allocate_slots cannot, and FCFS keeps order."""
    plans = [RequestPlan("a", 4, 5), RequestPlan("b", 4, 5), RequestPlan("c", 1, 2)]
    # 8 slots each = 2 blocks of 4; 4 free blocks hold two requests, the third waits for one to end
    steps = _run(Batcher(plans, block_size=4, num_blocks=5, max_num_seqs=8, max_num_batched_tokens=512))
    ids = [[r.req_id for r in s.requests] for s in steps]
    assert ids[0] == ["a", "b"]
    first_c = next(i for i, names in enumerate(ids) if "c" in names)
    assert all(len(names) == 2 for names in ids[1:first_c]) and "a" not in ids[first_c]
    assert ids[-1] == ["c"]


def test_explicit_requests_share_the_cache_when_they_do_not_overlap():
    batcher = ExplicitBatcher([[("a", 8)], [("b", 8)]], block_size=4, num_blocks=3, max_model_len=8)
    assert batcher.steps[0].requests[0].block_ids == batcher.steps[1].requests[0].block_ids == (1, 2)
