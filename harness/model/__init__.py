"""Small decoder LMs (canary, random) over a paged KV cache; attention is injected.

See :mod:`harness.model.decoder` for the forward / PIECEWISE split, :mod:`harness.model.canary`
for the stale-parameter canary, :mod:`harness.model.kv_cache` for the cache and allocator.
"""

from harness.model.canary import (
    expected_next_token,
    longest_repeat_run,
    position_code,
    repetition_score,
)
from harness.model.config import MODEL_KINDS, ModelConfig, resolve_dtype
from harness.model.decoder import (
    Attend,
    DecoderLM,
    attention_scale,
    build_model,
    make_eager_attend,
)
from harness.model.generate import generate_greedy
from harness.model.kv_cache import (
    NULL_BLOCK,
    SCRATCH_SLOT,
    BlockAllocator,
    OutOfBlocksError,
    PagedKVCache,
    make_block_table,
    write_kv,
)

__all__ = [
    "MODEL_KINDS",
    "NULL_BLOCK",
    "SCRATCH_SLOT",
    "Attend",
    "BlockAllocator",
    "DecoderLM",
    "ModelConfig",
    "OutOfBlocksError",
    "PagedKVCache",
    "attention_scale",
    "build_model",
    "expected_next_token",
    "generate_greedy",
    "longest_repeat_run",
    "make_block_table",
    "make_eager_attend",
    "position_code",
    "repetition_score",
    "resolve_dtype",
    "write_kv",
]
