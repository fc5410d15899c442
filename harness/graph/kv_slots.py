"""How many KV cache slots a request of the workload can write: what it is given on admission.

Apart from the scheduler (which needs the block allocator, hence torch) because the scenario
schema refuses, before anything runs, a request whose slots would not fit ``max_model_len``.
"""

from __future__ import annotations

__all__ = ["kv_slots"]


def kv_slots(prompt_len: int, output_len: int, decode_query_len: int = 1) -> int:
    """KV entries a request can write over its life: the blocks it is given on admission.

    Its prompt, then every generated token but the last (which is never fed back); with
    speculative decoding its last decode step also writes the ``decode_query_len - 1`` drafts
    behind the token it feeds, however many of them it will accept. A request that ends with
    its prefill writes only its prompt."""
    if output_len <= 1:
        return prompt_len
    return prompt_len + output_len - 1 + decode_query_len - 1
