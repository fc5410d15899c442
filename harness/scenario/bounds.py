"""Upper bounds on everything a scenario file can make the harness allocate, spawn or repeat.

Why: a scenario is untrusted input. Without a bound, ``layers: 100000`` exhausts memory,
``dp.size: 1000`` forks a thousand interpreters, ``warmup_runs: 1000000`` never ends, and a
few hundred bytes of nested YAML aliases expand to billions of values. Every bound here is
checked when the file is loaded (``python -m harness.scenario check`` and pytest collection
alike) and reported as the usual ``file:line: field: message`` error. The values are generous
for a graph-mode scenario on the CPU emulator (the shipped scenarios use a small fraction of
each) and are documented in docs/scenarios.md, section "Limits".
"""

from __future__ import annotations

# The feature settings (owned by harness.features) carry these two bounds themselves.
from harness import ranks
from harness.features.base import MAX_DRAFT_TOKENS

# -- the file itself (checked before and while parsing the YAML) --------------------------------
MAX_FILE_BYTES = 1024 * 1024
"""A scenario file is at most 1 MiB."""
MAX_VALUES = 50_000
"""Values in a file: scalars (mapping keys included), mappings and sequences, each alias counted
as what it expands to."""
MAX_DEPTH = 32
"""Nesting levels of mappings and sequences (through aliases)."""
MAX_INT_DIGITS = 30
"""Digits of an integer literal; longer ones are refused before Python converts them."""
MAX_STRING_CHARS = 10_000
"""Characters of a free-text field (description, reasons)."""
MAX_NAME_CHARS = 100
"""Characters of a scenario name or a matrix ``_id``."""

# -- the matrix (checked before any point is built) ---------------------------------------------
MAX_MATRIX_POINTS = 8192
"""Product of the matrix axis lengths, before ``matrix_exclude``."""
MAX_MATRIX_WORK = 1_000_000
"""Matrix points x values per point: what validating every point costs."""

# -- the model ----------------------------------------------------------------------------------
MAX_LAYERS = 64
MAX_HIDDEN_SIZE = 4096
MAX_HEADS = 128
MAX_HEAD_DIM = 512
MAX_VOCAB_SIZE = 262_144
MAX_SEED = 2**32 - 1
MAX_BLOCK_SIZE = 1024
MAX_NUM_BLOCKS = 65_536
MAX_MODEL_LEN = 65_536
MAX_WEIGHT_ELEMENTS = 2**27
"""Weights of the model (embeddings, attention, MLP): 512 MiB in float32."""
MAX_KV_ELEMENTS = 2**27
"""Elements of the paged KV cache, keys and values of every layer: 512 MiB in float32."""

# -- graph mode ---------------------------------------------------------------------------------
MAX_CAPTURE_SIZE = 8192
MAX_CAPTURE_SIZES = 512
"""Entries of an explicit ``capture_sizes`` list."""
MAX_NUM_SEQS = 1024
MAX_SPEC_TOKENS = MAX_DRAFT_TOKENS
MAX_WARMUP_RUNS = 16

# -- workload and run length --------------------------------------------------------------------
MAX_STEPS = 4096
"""Decode steps of a run (``steps``), explicit ``workload.steps`` entries, arrival steps."""
MAX_REQUESTS = 4096
"""Requests of a workload, each ``repeat`` counted."""
MAX_TOKENS = 65_536
"""Prompt, output and per-step token counts, ``max_num_batched_tokens``."""

# -- ranks and engine resources -----------------------------------------------------------------
MAX_WORLD_SIZE = ranks.MAX_WORLD_SIZE
"""Processes of one multi-rank item: the product of every feature's rank axis (dp x tp x cp)."""
MAX_STREAM_POOL = 65_536
MAX_STREAMS_PER_GRAPH = 64
MAX_ITEM_TIMEOUT_S = 86_400.0
"""An item's ``timeout_s``: one day."""
