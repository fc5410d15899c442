"""The draft model of speculative decoding (MTP / EAGLE), run on every path that speculates.

Kept apart from the pipeline because it is a small pipeline of its own: k eager rounds per
step on a cut-down copy of the target, with metadata of its own. Its fix (the feature's
``drafter_unpadded`` switch) is whether that metadata is its own and unpadded; the known-bad
drafter is handed the target's padded host lists for a one-token-per-request input.
"""

from __future__ import annotations

from dataclasses import replace

from harness.graph.metadata import AttentionMetadata, ScheduledRequest, build_attention_metadata
from harness.graph.plan import StepPlan
from harness.graph.runner import EagerRunner, StepInputs
from harness.graph.scheduler import Step
from harness.model import DecoderLM, PagedKVCache
from harness.ops import fia_call_tags

__all__ = ["Drafter", "draft_model"]


def draft_model(target: DecoderLM, num_layers: int = 1) -> DecoderLM:
    """A single-rank model of the target's first ``num_layers`` layers, its embeddings, final
    norm and LM head, loaded from the target's weights (none generated from the seed).

    Built once per item and shared by the drafters of every path: the model is stateless
    (each drafter has its own KV cache)."""
    config = replace(target.config, num_layers=min(num_layers, target.config.num_layers))
    kept = {k: v for k, v in target.state_dict().items()
            if not k.startswith("layers.") or int(k.split(".")[1]) < config.num_layers}
    return DecoderLM(config, state=kept).place(target.device)


class Drafter:
    """The draft model of speculative decoding: the target's first layers, run eagerly.

    Round 1 feeds each decode request the tokens the drafter has not seen yet (a mixed batch);
    rounds 2..k feed one token per request (uniform). Its metadata is its own and unpadded, as
    the ``drafter_unpadded`` fix requires; without the fix it gets the target's padded
    metadata for an unpadded input.
    """

    def __init__(self, model: DecoderLM, num_speculative_tokens: int) -> None:
        """``model``: the draft model (:func:`draft_model`), shared with other paths' drafters."""
        config = model.config
        self.model = model
        self.kv_cache = PagedKVCache(config, device=model.device)
        self.k = num_speculative_tokens
        self.seen: dict[str, int] = {}
        self.max_blocks = -(-config.max_model_len // config.block_size)
        self.block_size = config.block_size

    def propose(self, step: Step, tokens: dict[str, list[int]], plan: StepPlan, *, fix_on: bool) -> dict[str, list[int]]:
        decoding = [r for r, is_decode in zip(step.requests, step.decodes) if is_decode]
        if not decoding:
            return {}
        runner = EagerRunner(self.model, self.kv_cache)
        drafts: dict[str, list[int]] = {r.req_id: [] for r in decoding}
        for round_ in range(self.k):
            batch = []
            for r in decoding:
                known = tokens[r.req_id] + drafts[r.req_id]
                start = self.seen.get(r.req_id, 0) if round_ == 0 else len(known) - 1
                batch.append(ScheduledRequest(r.req_id, start, len(known) - start, r.block_ids))
            meta = build_attention_metadata(batch, self.block_size, self.max_blocks)
            ids = [t for r, b in zip(decoding, batch) for t in (tokens[r.req_id] + drafts[r.req_id])[b.num_computed_tokens:]]
            if not fix_on and round_ > 0:  # the known-bad pipeline: the target's padded lists
                meta = _lengths_from(meta, plan.padded)  # for a one-token-per-request input
            with fia_call_tags(draft_round=round_ + 1):
                logits = runner.execute(StepInputs(meta, ids))
            ends = meta.query_start_loc[1 : len(batch) + 1]
            tokens_out = logits.argmax(dim=-1).tolist()  # one host read per round
            for r, end in zip(decoding, ends):
                drafts[r.req_id].append(int(tokens_out[end - 1]))
            for r, b in zip(decoding, batch):
                self.seen[r.req_id] = b.seq_len
        return drafts

    def rewind(self, step: Step, advanced: dict[str, int]) -> None:
        """Keep only the drafter's KV entries that the target accepted."""
        for r in step.requests:
            valid = r.num_computed_tokens + advanced[r.req_id]
            self.seen[r.req_id] = min(self.seen.get(r.req_id, 0), valid)


def _lengths_from(meta: AttentionMetadata, padded: AttentionMetadata) -> AttentionMetadata:
    """The drafter bug: attention host lists copied from the target's padded metadata."""
    return replace(meta, query_start_loc=list(padded.query_start_loc), actual_seq_lengths=list(padded.actual_seq_lengths),
                   seq_lens=list(padded.seq_lens), block_table=[list(r) for r in padded.block_table],
                   num_reqs_padded=padded.num_reqs_padded, padding_source="drafter given the target's padded metadata")
