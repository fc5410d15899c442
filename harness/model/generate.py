"""A single-request, eager greedy-decoding loop (for tests and quick checks).

Prefill the prompt in one forward, then one decode step per token. ``stale_kv_lengths=True``
freezes ``actual_seq_lengths_kv`` at the first decode step's value, which is what a captured
graph without the task-group update replays: with the canary model this gives repeated text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from harness.model.decoder import DecoderLM, make_eager_attend
from harness.model.kv_cache import PagedKVCache


def generate_greedy(
    model: DecoderLM,
    prompt_ids: Sequence[int],
    steps: int,
    *,
    stale_kv_lengths: bool = False,
    kv_cache: PagedKVCache | None = None,
    fia: Callable[..., tuple[Tensor, Tensor]] | None = None,
    req_id: object = "greedy",
    return_logits: bool = False,
) -> list[int] | tuple[list[int], list[Tensor]]:
    """Greedy-decode ``steps`` tokens after ``prompt_ids``; returns the generated tokens.

    The first generated token comes from the prefill, each later one from a one-token decode
    step. Stops early when a new token's position would reach ``max_model_len``. With
    ``return_logits``, also returns each step's last-row float32 logits ``[vocab]``.
    """
    config = model.config
    if not prompt_ids:
        raise ValueError("prompt_ids must not be empty")
    if len(prompt_ids) > config.max_model_len:
        raise ValueError(f"prompt of {len(prompt_ids)} tokens > max_model_len {config.max_model_len}")
    device = next(model.parameters()).device
    cache = kv_cache if kv_cache is not None else PagedKVCache(config, device=device)
    alloc = cache.allocator
    max_blocks = config.max_blocks_per_seq
    tokens = [int(t) for t in prompt_ids]
    generated: list[int] = []
    all_logits: list[Tensor] = []
    frozen_kv: int | None = None

    def step(new_tokens: list[int], start: int) -> Tensor:
        nonlocal frozen_kv
        total = start + len(new_tokens)
        alloc.allocate(req_id, total)
        positions = list(range(start, total))
        kv_len = total
        if stale_kv_lengths and start > 0:  # decode step
            if frozen_kv is None:
                frozen_kv = total
            kv_len = frozen_kv
        attend = make_eager_attend(
            config,
            [len(new_tokens)],
            [kv_len],
            alloc.block_table([req_id], max_blocks, device=device),
            fia=fia,
        )
        logits: Tensor = model(
            torch.tensor(new_tokens, dtype=torch.int64, device=device),
            torch.tensor(positions, dtype=torch.int64, device=device),
            torch.tensor(alloc.slots(req_id, positions), dtype=torch.int64, device=device),
            cache,
            attend,
        )
        return logits[-1]

    try:
        last = step(tokens, 0)
        for i in range(steps):
            if i > 0:
                if len(tokens) > config.max_model_len:
                    break  # the new token's position would be max_model_len
                last = step([tokens[-1]], len(tokens) - 1)
            nxt = int(torch.argmax(last).item())
            generated.append(nxt)
            all_logits.append(last)
            tokens.append(nxt)
    finally:
        alloc.free(req_id)
    return (generated, all_logits) if return_logits else generated
