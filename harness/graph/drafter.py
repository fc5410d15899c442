"""The draft model of speculative decoding (MTP / EAGLE), run on every path that speculates.

Kept apart from the pipeline because it is a small pipeline of its own: k rounds per step on a
cut-down copy of the target, with metadata of its own. Shaped as vLLM Ascend's proposer
(``vllm_ascend/spec_decode/llm_base_proposer.py`` at v0.23.0) with its padded drafter batch
(vLLM's default, ``disable_padded_drafter_batch=False``):

* the first pass has the target step's shape: every request of the step, a prefill with its
  chunk, a decode with ``q = 1 + k`` tokens (here the last ``q`` known tokens; the harness
  drafts before the target verifies, not after), each sampled at its last token;
* rounds 2..k feed one token per request, the previous round's draft at the next position
  (``attn_update_stack_num_spec_norm``: KV length + 1 a round; a position past the request's
  KV slots is clamped, slot -1, KV length 1, as upstream clamps past ``max_model_len``).

Its metadata is its own and unpadded (the ``drafter_unpadded`` fix): without the fix the eager
rounds 2..k are handed the target's padded host lists for a one-token-per-request input. On
the graph path the rounds run through :class:`~harness.graph.draft_runner.DraftGraphRunner`
(the draft model's own graphs), which dispatches them and pads their metadata itself.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Sequence

from harness.graph.metadata import (
    PAD_SLOT_ID,
    AttentionMetadata,
    ScheduledRequest,
    build_attention_metadata,
)
from harness.graph.plan import StepPlan
from harness.graph.runner import EagerRunner, StepInputs
from harness.graph.scheduler import Step
from harness.model import DecoderLM, PagedKVCache
from harness.ops import fia_call_tags
from harness.plain import JsonObject

if TYPE_CHECKING:  # pragma: no cover - draft_runner imports this module
    from harness.graph.draft_runner import DraftGraphRunner

__all__ = ["DraftBatch", "Drafter", "draft_batch", "draft_model", "round_metadata"]


def draft_model(target: DecoderLM, num_layers: int = 1) -> DecoderLM:
    """A single-rank model of the target's first ``num_layers`` layers, its embeddings, final
    norm and LM head, loaded from the target's weights (none generated from the seed).

    Built once per item and shared by the drafters of every path: the model is stateless
    (each drafter has its own KV cache)."""
    config = replace(target.config, num_layers=min(num_layers, target.config.num_layers))
    kept = {k: v for k, v in target.state_dict().items()
            if not k.startswith("layers.") or int(k.split(".")[1]) < config.num_layers}
    return DecoderLM(config, state=kept).place(target.device)


@dataclass(frozen=True)
class DraftBatch:
    """One step's drafting, decided on the host before any round runs (vLLM Ascend builds every
    round's metadata, ``multi_steps_attn_metadata``, before the merged draft runs).

    ``first`` is the first pass's unpadded metadata and ``input_ids`` its tokens; ``rounds`` the
    unpadded metadata of rounds 2..k (one token per request, whatever the draft tokens are);
    ``sample_rows`` each request's row of the first pass whose token it drafts from."""

    requests: tuple[ScheduledRequest, ...]
    decodes: tuple[bool, ...]
    input_ids: list[int]
    first: AttentionMetadata
    rounds: tuple[AttentionMetadata, ...]
    sample_rows: list[int]

    @property
    def num_reqs(self) -> int:
        return len(self.requests)

    @property
    def num_tokens(self) -> int:
        return self.first.num_actual_tokens

    @property
    def metadata(self) -> tuple[AttentionMetadata, ...]:
        """Every round's unpadded metadata, the first pass's first."""
        return (self.first, *self.rounds)


def round_metadata(requests: Sequence[ScheduledRequest], round_: int, block_size: int, max_blocks: int,
                   max_model_len: int) -> AttentionMetadata:
    """Round ``round_`` (2..k) of a draft: one token per request at ``seq_len + round_ - 2``.

    The draft of round ``round_ - 1`` sits right after the first pass's last token. A position
    past the request's KV slots (its blocks, or ``max_model_len``) is clamped as vLLM's proposer
    clamps one past ``max_model_len``: position 0, slot -1 (no cache write), KV length 1; its
    draft is never used."""
    positions, slots, seq_lens, table = [], [], [], []
    for req in requests:
        pos = req.seq_len + round_ - 2
        capacity = min(len(req.block_ids) * block_size, max_model_len)
        if pos < capacity:
            positions.append(pos)
            slots.append(req.block_ids[pos // block_size] * block_size + pos % block_size)
            seq_lens.append(pos + 1)
        else:
            positions.append(0)
            slots.append(PAD_SLOT_ID)
            seq_lens.append(1)
        table.append(list(req.block_ids) + [0] * (max_blocks - len(req.block_ids)))
    n = len(requests)
    starts = list(range(n + 1))
    return AttentionMetadata(num_reqs=n, num_reqs_padded=n, num_actual_tokens=n, num_input_tokens=n,
                             query_start_loc=starts, actual_seq_lengths=starts[1:], seq_lens=seq_lens,
                             block_table=table, slot_mapping=slots, positions=positions, query_lens=[1] * n,
                             padding_source=f"draft round {round_}: one token per request")


def draft_batch(step: Step, tokens: dict[str, list[int]], seen: dict[str, int], k: int, block_size: int,
                max_blocks: int, max_model_len: int) -> DraftBatch:
    """The first pass of ``step``'s draft (the target step's requests, each with the tokens
    described in the module docstring) and the metadata of its later rounds.

    A request starts at the first position whose draft KV may be stale (``seen``), if that is
    earlier than its window: the draft cache must hold every position before the window."""
    q = 1 + k
    requests: list[ScheduledRequest] = []
    ids: list[int] = []
    for req, is_decode in zip(step.requests, step.decodes):
        known = tokens[req.req_id]
        end = len(known) if is_decode else req.seq_len
        window = max(end - q, 0) if is_decode else req.num_computed_tokens
        start = min(seen.get(req.req_id, 0), window)
        requests.append(ScheduledRequest(req.req_id, start, end - start, req.block_ids))
        ids.extend(known[start:end])
    first = build_attention_metadata(requests, block_size, max_blocks)
    rounds = tuple(round_metadata(requests, r, block_size, max_blocks, max_model_len) for r in range(2, k + 1))
    rows = [end - 1 for end in first.query_start_loc[1:]]
    return DraftBatch(tuple(requests), tuple(step.decodes), ids, first, rounds, rows)


class Drafter:
    """The draft model of speculative decoding: the target's first layers, ``k`` rounds a step.

    ``graphs``: the graph path's :class:`~harness.graph.draft_runner.DraftGraphRunner` (the
    draft model's own graphs and dispatch); None runs every round eagerly (the comparison paths).
    """

    def __init__(self, model: DecoderLM, num_speculative_tokens: int, graphs: DraftGraphRunner | None = None,
                 kv_cache: PagedKVCache | None = None) -> None:
        """``model``: the draft model (:func:`draft_model`), shared with other paths' drafters;
        ``kv_cache``: the drafter's own (the graph runner's, when it has one)."""
        config = model.config
        self.model = model
        self.kv_cache = kv_cache if kv_cache is not None else PagedKVCache(config, device=model.device)
        self.k = num_speculative_tokens
        self.seen: dict[str, int] = {}
        self.max_blocks = -(-config.max_model_len // config.block_size)
        self.block_size = config.block_size
        self.graphs = graphs
        self.last: JsonObject | None = None  # how the last step's rounds ran (graph path: its record)

    def propose(self, step: Step, tokens: dict[str, list[int]], plan: StepPlan, *,
                fix_on: bool = True) -> dict[str, list[int]]:
        """``k`` draft tokens for each decode request of ``step`` (``fix_on``: the
        ``drafter_unpadded`` fix). Every step drafts, a prefill too: its first pass fills the
        draft cache with the prompt, as upstream's proposer runs after every target step."""
        config = self.model.config
        self.last = None
        batch = draft_batch(step, tokens, self.seen, self.k, self.block_size, self.max_blocks, config.max_model_len)
        with fia_call_tags(model="draft"):
            if self.graphs is not None:
                rounds, self.last = self.graphs.propose(batch, plan, eager=lambda: self._eager(batch, plan, fix_on))
            else:
                rounds = self._eager(batch, plan, fix_on)
        # The rounds wrote draft KV up to seq_len + k - 2. No rewind after the target's verdict:
        # the next step's window re-feeds the last 1 + k known tokens, which covers every position
        # a rejected draft wrote (as upstream's proposer, which reruns on the accepted tokens).
        for req in batch.requests:
            self.seen[req.req_id] = req.seq_len + self.k - 1
        return {req.req_id: [r[i] for r in rounds]
                for i, (req, is_decode) in enumerate(zip(batch.requests, batch.decodes)) if is_decode}

    def _eager(self, batch: DraftBatch, plan: StepPlan, fix_on: bool) -> list[list[int]]:
        """Every round eagerly, on its own unpadded metadata: the drafts of each round, one a
        request (one host read a round)."""
        runner = EagerRunner(self.model, self.kv_cache)
        with fia_call_tags(draft_round=1):
            logits = runner.execute(StepInputs(batch.first, batch.input_ids))
        greedy = logits.argmax(dim=-1).tolist()
        drafts = [[int(greedy[row]) for row in batch.sample_rows]]
        for round_, meta in enumerate(batch.rounds, 2):
            if not fix_on:  # the known-bad pipeline: the target's padded lists
                meta = _lengths_from(meta, plan.padded)  # for a one-token-per-request input
            with fia_call_tags(draft_round=round_):
                logits = runner.execute(StepInputs(meta, drafts[-1]))
            drafts.append([int(t) for t in logits.argmax(dim=-1).tolist()])
        return drafts


def _lengths_from(meta: AttentionMetadata, padded: AttentionMetadata) -> AttentionMetadata:
    """The drafter bug: attention host lists copied from the target's padded metadata."""
    return replace(meta, query_start_loc=list(padded.query_start_loc), actual_seq_lengths=list(padded.actual_seq_lengths),
                   seq_lens=list(padded.seq_lens), block_table=[list(r) for r in padded.block_table],
                   num_reqs_padded=padded.num_reqs_padded, padding_source="drafter given the target's padded metadata")
