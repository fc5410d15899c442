"""The injected bugs of the mutation run (``benchmarks/mutation.py``), as data.

Each mutant is one realistic mistake in the pipeline: the exact source text it replaces (which
must occur exactly once in its file: ``tests/benchmarks/test_mutants.py`` keeps this list from
rotting), its replacement, the rule it breaks, and a probe: the part of the shipped scenario
library or the unit tests expected to catch it first. The probe only orders the work (cheapest
first); a mutant the probe misses still runs the whole library and then the whole unit suite
before it counts as surviving.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MUTANTS", "RULES", "Mutant"]

#: The rules and fixes of issue 10, point 4, each needing at least one killed mutant.
RULES: dict[str, str] = {
    "dummy_mixed": "dummy-request padding, mixed branch: one dummy absorbs every padding token",
    "dummy_uniform": "dummy-request padding, uniform branch: fake requests of q tokens (T / q requests)",
    "pure_full": "pure FULL mode does not pad requests to T / q (PR #7460)",
    "kv_len_zero": "padded requests have KV length 0",
    "zero_rows": "padded requests have a zeroed block-table row",
    "slot_minus_one": "padding tokens have slot -1",
    "bucket_choice": "the bucket is the smallest capture size >= T",
    "oversize_eager": "a batch above the largest capture size runs eagerly, unpadded",
    "fdo_mixed": "FULL_DECODE_ONLY runs mixed batches eagerly",
    "uniform_keys": "uniform FULL keys exist up to max_num_seqs * q",
    "full_exclusion": "a batch that excludes FULL (cascade attention) never replays a FULL graph",
    "task_group_update": "task-group update of every layer with the current lists",
    "event_ordering": "event ordering: the layer's event is recorded after its update; the graph waits",
    "static_inputs": "inputs are copied into the captured static buffers before replay",
    "dp_max": "DP: every rank pads to the group's max token count",
    "dp_min": "DP: the agreed mode is the min (uniform only if every busy rank is); idle ranks do not veto",
    "dp_wave": "DP: a rank with no requests left keeps stepping, idle, until every rank is done",
    "ledger": "the padding ledger names each feature's share of T",
    "sp_rounding": "SP: T is a multiple of tp even in eager mode",
    "mtp_acceptance": "MTP: greedy acceptance of the longest agreeing draft prefix",
    "drafter_metadata": "MTP: the drafter runs on its own unpadded metadata",
    "cp_zero_padding": "CP: per-rank KV lengths, zero-padded for the padding tokens",
    "cp_lse_merge": "CP: partial outputs merged by their softmax LSE",
    "budget_formula": "legacy stream budget: the update_aclgraph_sizes formula",
    "budget_sampling": "legacy stream budget: kept sizes evenly spaced in index space",
}


@dataclass(frozen=True)
class Mutant:
    id: str
    rule: str  # a key of RULES
    file: str  # relative to the repository root
    before: str  # exact source text, occurring exactly once in the file
    after: str
    bug: str  # the mistake, as an engineer would describe it
    probe: tuple[str, ...]  # pytest arguments: the cheapest place expected to catch it


_M = "harness/graph/metadata.py"
_D = "harness/graph/dispatcher.py"
_P = "harness/graph/plan.py"
_R = "harness/graph/runner.py"
_A = "harness/ops/attention.py"
_DP = "harness/features/dp.py"
_PL = "harness/graph/pipeline.py"
_DR = "harness/graph/drafter.py"
_CP = "harness/model/context_parallel.py"
_SB = "harness/graph/stream_budget.py"
_CS = "harness/graph/capture_sizes.py"

_TABLE = ("scenarios/rules/dispatch_table.yaml",)
_DP_RULES = ("scenarios/rules/dp_agreement.yaml", "scenarios/rules/dp_idle_rank.yaml")

MUTANTS: tuple[Mutant, ...] = (
    # -- the FIA padding fix ------------------------------------------------------------------
    Mutant("pad-piecewise-skipped", "dummy_mixed", _M,
           "    if not fia_padding_fix:\n        last = meta.query_start_loc[-1]",
           "    if not fia_padding_fix or runtime_mode is not CUDAGraphMode.FULL:\n"
           "        last = meta.query_start_loc[-1]",
           "the dummy request added only for FULL replays: SP's padding in eager and PIECEWISE runs uncovered",
           ("scenarios/rules/sp_padding.yaml",)),
    Mutant("pad-mixed-dummy-short", "dummy_mixed", _M,
           "        extra = [pad]\n",
           "        extra = [pad - 1] if pad > 1 else [pad]\n",
           "the dummy absorbs one token too few (an off-by-one in the mixed branch)",
           ("scenarios/mixed_prefill_decode.yaml",)),
    Mutant("pad-uniform-as-mixed", "dummy_uniform", _M,
           "    if not (configured_mode.separate_routine() and configured_mode.decode_mode() is CUDAGraphMode.FULL):",
           "    if configured_mode is not CUDAGraphMode.FULL_AND_PIECEWISE:",
           "FULL_DECODE_ONLY treated like pure FULL: one dummy instead of T/q fake requests (the PR #7460 bug)",
           _TABLE),
    Mutant("pad-pure-full-uniform", "pure_full", _M,
           "    if not (configured_mode.separate_routine() and configured_mode.decode_mode() is CUDAGraphMode.FULL):\n"
           "        return None\n",
           "",
           "pure FULL mode pads uniform batches to T/q requests as if its graph had a fixed request count",
           _TABLE),
    Mutant("pad-kv-length-q", "kv_len_zero", _M,
           "        seq_lens=meta.seq_lens + [0] * len(extra),",
           "        seq_lens=meta.seq_lens + list(extra),",
           "padded requests get a KV length equal to their query length instead of 0",
           _TABLE),
    Mutant("pad-row-copied", "zero_rows", _M,
           "        block_table=meta.block_table + [[0] * width for _ in extra],",
           "        block_table=meta.block_table + [list(meta.block_table[-1]) for _ in extra],",
           "padded requests reuse the last real request's block-table row instead of a zeroed one",
           _TABLE),
    Mutant("pad-slot-zero", "slot_minus_one", _M,
           "    slot_mapping = meta.slot_mapping + [PAD_SLOT_ID] * pad",
           "    slot_mapping = meta.slot_mapping + [0] * pad",
           "padding tokens get slot 0 instead of -1",
           _TABLE),
    Mutant("idle-kv-length", "kv_len_zero", _P,
           "query_lens=[num_tokens], seq_lens=[0],",
           "query_lens=[num_tokens], seq_lens=[num_tokens],",
           "an idle DP rank's dummy request gets a KV length of its token count instead of 0",
           _DP_RULES),
    # -- buckets and dispatch -----------------------------------------------------------------
    Mutant("bucket-off-by-one", "bucket_choice", _D,
           "        padded = self.table.padded_size(num_tokens)\n",
           "        padded = self.table.padded_size(num_tokens + 1)\n",
           "the bucket looked up for T + 1: a batch exactly at a capture size pads to the next one",
           _TABLE),
    Mutant("bucket-largest-excluded", "bucket_choice", _CS,
           "        if num_tokens > self.max_size:\n            return None",
           "        if num_tokens >= self.max_size:\n            return None",
           "a batch exactly at the largest capture size treated as oversize (runs eagerly)",
           _TABLE),
    Mutant("oversize-clamped", "oversize_eager", _CS,
           "        if num_tokens > self.max_size:\n            return None",
           "        if num_tokens > self.max_size:\n            return self.max_size",
           "an oversize batch clamped to the largest capture size instead of running eagerly",
           ("scenarios/oversize_batch.yaml",)),
    Mutant("oversize-padded-up", "oversize_eager", _D,
           "            return self._eager(\n                num_tokens, f\"{num_tokens} tokens above",
           "            return self._eager(\n                num_tokens + 1, f\"{num_tokens} tokens above",
           "an oversize batch padded by one token on its way to eager mode (it must run unpadded)",
           _TABLE),
    Mutant("fdo-mixed-piecewise", "fdo_mixed", _D,
           "        elif mixed is CUDAGraphMode.PIECEWISE:\n",
           "        elif mixed is not CUDAGraphMode.FULL:\n",
           "FULL_DECODE_ONLY captures PIECEWISE graphs for mixed batches instead of running them eagerly",
           _TABLE),
    Mutant("uniform-cap-strict", "uniform_keys", _D,
           "if size % q == 0 and (cap is None or size <= cap)",
           "if size % q == 0 and (cap is None or size < cap)",
           "no uniform FULL key at exactly max_num_seqs * q (a strict bound)",
           _TABLE),
    Mutant("full-exclusion-dropped", "full_exclusion", _D,
           "        if not disable_full:\n",
           "        if disable_full is not None:\n",
           "the FULL exclusion tested for None instead of its value: cascade batches replay FULL graphs",
           ("tests/graph/test_dispatcher.py",)),
    # -- the runner: task-group update, events, static inputs ---------------------------------
    Mutant("update-first-layer-only", "task_group_update", _A,
           "                update_task_group(engine, stream, task, key_cache, value_cache, kwargs)",
           "                update_task_group(engine, stream, task, key_cache, value_cache, kwargs, update=layer == 0)",
           "only the first layer's host lists updated after replay; later layers replay capture-time lists",
           ("scenarios/known_bad/no_host_param_update.yaml", "scenarios/decode_buckets.yaml")),
    Mutant("update-layer0-cache", "task_group_update", _A,
           "enumerate(zip(tasks, caches))",
           "enumerate(zip(tasks, [caches[0]] * len(tasks)))",
           "every layer's update re-issued against layer 0's KV cache",
           ("scenarios/decode_buckets.yaml",)),
    Mutant("update-unpadded-lists", "task_group_update", _R,
           "                self._update_full_graph_params(key, live.kwargs)\n",
           "                self._update_full_graph_params(key, self._live(plan.meta, self.block_table).kwargs)\n",
           "the update given the unpadded metadata, not the padded lists the graph runs",
           ("scenarios/decode_buckets.yaml",)),
    Mutant("event-before-update", "event_ordering", _A,
           "    if update:\n        engine.graph_task_update_begin(stream, task.handle)",
           "    task.event.record(stream)\n    if update:\n        engine.graph_task_update_begin(stream, task.handle)",
           "the layer's event recorded before its update is issued (the graph may run on old lists)",
           ("scenarios/decode_buckets.yaml",)),
    Mutant("event-reset-before-wait", "event_ordering", _A,
           "    event.wait(stream)\n    event.reset(stream)",
           "    event.reset(stream)\n    event.wait(stream)",
           "at capture the event is reset before the wait is recorded (an early record is lost: a hang)",
           ("tests/engine/test_fia_graph.py",)),
    Mutant("static-slots-skipped", "static_inputs", _R,
           "        self.slot_mapping[:n].copy_(torch.tensor(meta.slot_mapping, dtype=torch.int64))\n",
           "",
           "the slot mapping not copied into its static buffer before replay",
           ("scenarios/decode_buckets.yaml",)),
    Mutant("static-real-tokens-only", "static_inputs", _R,
           "        n = meta.num_input_tokens\n        if not self.config.fixes.static_inputs:",
           "        n = meta.num_actual_tokens\n        if not self.config.fixes.static_inputs:",
           "only the real tokens copied: the padding rows keep the previous step's ids and slots",
           ("scenarios/decode_buckets.yaml", "scenarios/mixed_prefill_decode.yaml")),
    Mutant("static-piece-output", "static_inputs", _R,
           "        buffer.copy_(out)\n",
           "",
           "PIECEWISE: the attention output not copied into the next piece's static input",
           ("scenarios/decode_buckets.yaml",)),
    # -- DP --------------------------------------------------------------------------------------
    Mutant("dp-own-tokens", "dp_max", _DP,
           "        return StepShape(tokens, bool(-neg_uniform), bool(work))",
           "        return StepShape(shape.num_tokens, bool(-neg_uniform), bool(work))",
           "each DP rank keeps its own token count after the all-reduce (pads to its own bucket)",
           _DP_RULES),
    Mutant("dp-mode-max", "dp_min", _DP,
           "[shape.num_tokens, -int(shape.uniform_decode), int(shape.has_work)]",
           "[shape.num_tokens, int(shape.uniform_decode), int(shape.has_work)]",
           "the agreed mode inverted from min to max: uniform if any rank is uniform",
           _DP_RULES),
    Mutant("dp-idle-vetoes", "dp_min", _P,
           "        shape = StepShape(real, uniform or meta is None, has_work=meta is not None)",
           "        shape = StepShape(real, uniform, has_work=meta is not None)",
           "an idle DP rank proposes a non-uniform batch and vetoes the busy ranks' FULL decode graph",
           _DP_RULES),
    Mutant("dp-rank-stops-alone", "dp_wave", _PL,
           '                path.finished = not (pending if name == "reference" else self.planners[name].any_rank_pending(pending))',
           "                path.finished = not pending",
           "a DP rank stops when its own requests are done, while a peer still has some (the peer hangs)",
           ("scenarios/rules/dp_late_arrivals.yaml",)),
    # -- ledger and SP -------------------------------------------------------------------------
    Mutant("ledger-features-dropped", "ledger", _P,
           "tuple((f.ledger or f.name, n) for f, n in added.items() if n))",
           "())",
           "the padding ledger's feature entries dropped (DP and SP shares vanish)",
           _DP_RULES + ("scenarios/rules/sp_padding.yaml",)),
    Mutant("ledger-spec-as-real", "ledger", _P,
           "        ledger = PaddingLedger(real - drafts, drafts, bucket,",
           "        ledger = PaddingLedger(real, drafts, bucket,",
           "draft tokens counted both as real and as spec in the ledger",
           ("scenarios/rules/mtp_padding.yaml",)),
    Mutant("sp-round-always-adds", "sp_rounding", _D,
           "        padded = -(-num_tokens // m) * m\n",
           "        padded = (num_tokens // m + 1) * m if m > 1 else num_tokens\n",
           "SP's eager rounding written as floor + 1: a batch already a multiple of tp gets tp more tokens",
           ("scenarios/rules/sp_padding.yaml",)),
    # -- MTP ---------------------------------------------------------------------------------------
    Mutant("mtp-accept-shifted", "mtp_acceptance", _PL,
           "proposal[accepted] == rows[accepted]",
           "proposal[accepted] == rows[accepted + 1]",
           "each draft compared with the target's token one position later",
           ("scenarios/rules/mtp_padding.yaml",)),
    Mutant("mtp-advance-all-drafts", "mtp_acceptance", _PL,
           "            advanced[req.req_id], generated[req.req_id] = accepted + 1, len(new)",
           "            advanced[req.req_id], generated[req.req_id] = len(proposal) + 1, len(new)",
           "every draft's KV entry kept as valid, accepted or not",
           ("scenarios/rules/mtp_padding.yaml",)),
    Mutant("drafter-rows-off-by-one", "drafter_metadata", _DR,
           "            ends = meta.query_start_loc[1 : len(batch) + 1]",
           "            ends = meta.query_start_loc[: len(batch)]",
           "the drafter reads each request's logits at the previous request's boundary",
           ("tests/graph/test_drafter.py",)),
    Mutant("drafter-skips-unseen", "drafter_metadata", _DR,
           "                start = self.seen.get(r.req_id, 0) if round_ == 0 else len(known) - 1",
           "                start = len(known) - 1",
           "the drafter's first round feeds only the last token, skipping tokens it has not seen",
           ("tests/graph/test_drafter.py",)),
    Mutant("drafter-no-rewind", "drafter_metadata", _DR,
           "            self.seen[r.req_id] = min(self.seen.get(r.req_id, 0), valid)",
           "            self.seen[r.req_id] = self.seen.get(r.req_id, 0)",
           "the drafter keeps the KV entries of rejected drafts",
           ("tests/graph/test_drafter.py",)),
    # -- CP ------------------------------------------------------------------------------------------
    Mutant("cp-kv-padded-with-one", "cp_zero_padding", _CP,
           "        actual_seq_lengths_kv=kv_lens + ([0] * pad if pad_kv_lengths else []),",
           "        actual_seq_lengths_kv=kv_lens + ([1] * pad if pad_kv_lengths else []),",
           "the padding tokens' per-rank KV lengths padded with 1 instead of 0",
           ("scenarios/rules/cp_padding.yaml",)),
    Mutant("cp-local-kv-off-by-one", "cp_zero_padding", _CP,
           "    return (position - rank) // cp + 1\n",
           "    return (position - rank) // cp\n",
           "a rank's KV length for a token misses the token's own position",
           ("scenarios/rules/cp_padding.yaml",)),
    Mutant("cp-no-lse-merge", "cp_lse_merge", _CP,
           "    merged, _ = merge_attention_states(gathered[..., :d], gathered[..., d:])\n    return merged.to(out.dtype)",
           "    return out",
           "the ranks' partial outputs never merged: each rank keeps its own part",
           ("scenarios/rules/cp_padding.yaml",)),
    Mutant("cp-merge-unweighted", "cp_lse_merge", _CP,
           "    out = (w * outs.float()).sum(dim=0) / torch.where(seen, denom, torch.ones_like(denom))",
           "    out = outs.float().mean(dim=0)",
           "partial outputs averaged instead of weighted by their LSE",
           ("scenarios/rules/cp_padding.yaml",)),
    # -- the legacy stream budget ------------------------------------------------------------------
    Mutant("budget-per-size", "budget_formula", _SB,
           "    per_size = num_layers + 1 + (draft_layers + 1 if draft_layers else 0)",
           "    per_size = num_layers + (draft_layers + 1 if draft_layers else 0)",
           "per-size cost L instead of L + 1 (the graph after the last attention forgotten)",
           ("tests/graph/test_stream_budget.py",)),
    Mutant("budget-comm-reserve", "budget_formula", _SB,
           "        reserved = _DEFAULT_HCCL_STREAMS_PER_GROUP * groups",
           "        reserved = _DEFAULT_HCCL_STREAMS_PER_GROUP",
           "the default-HCCL reserve taken once, not once per communication group",
           ("tests/graph/test_stream_budget.py",)),
    Mutant("budget-sampling-floor", "budget_sampling", _SB,
           "    indices = [round(i * step) for i in range(n)]",
           "    indices = [int(i * step) for i in range(n)]",
           "kept sizes chosen by truncation instead of rounding the evenly spaced indices",
           ("tests/graph/test_stream_budget.py",)),
    Mutant("budget-sampling-smallest", "budget_sampling", _SB,
           "    if n <= 1:\n        return ordered[-1:]",
           "    if n <= 1:\n        return ordered[:1]",
           "with room for one size, the smallest kept instead of the largest",
           ("tests/graph/test_stream_budget.py",)),
)
