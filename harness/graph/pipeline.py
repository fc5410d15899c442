"""Run a workload through the three execution paths in lockstep and record everything.

Every step runs three times, each path with its own KV cache and its own generated text:

* ``reference``: eager, unpadded metadata (what the model should compute);
* ``padded``: eager, with the padding the graph path uses (separates padding effects from
  graph effects);
* ``graph``: the pipeline under test (dispatch, padding fixes, capture/replay, updates).

A path that raises stops; the others go on, and the record keeps where and why, so the
checks can say which failure came first and a report is written whatever happened.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from harness.graph.metadata import AttentionMetadata
from harness.graph.record import PATHS, PathError, RunRecord, StepRecord
from harness.graph.runner import EagerRunner, GraphConfig, GraphRunner, StepInputs, step_inputs
from harness.graph.scheduler import Step
from harness.model import ModelConfig, PagedKVCache, build_model
from harness.ops import fia_call_tags, fia_contract, observe_fia_calls, register_updatable_ops


@dataclass(frozen=True)
class PipelineSpec:
    model: ModelConfig
    graph: GraphConfig
    steps: tuple[Step, ...]
    prompts: dict[str, list[int]]
    fia_contract: str = "strict"


def run_pipeline(spec: PipelineSpec, engine: Any, record: RunRecord) -> RunRecord:
    """Execute ``spec`` on ``engine``, filling ``record`` (also when something raises)."""
    register_updatable_ops(engine)
    model = build_model(spec.model)
    caches = {path: PagedKVCache(spec.model) for path in PATHS}
    eager = {path: EagerRunner(model, caches[path]) for path in ("reference", "padded")}
    max_blocks = -(-spec.model.max_model_len // spec.model.block_size)
    runner = GraphRunner(engine, model, caches["graph"], spec.graph, max_blocks_per_req=max_blocks)
    tokens = {path: {req: list(ids) for req, ids in spec.prompts.items()} for path in PATHS}
    alive = set(PATHS)
    with observe_fia_calls() as calls, fia_contract(spec.fia_contract):  # type: ignore[arg-type]
        record.fia_calls = calls
        started = time.perf_counter()
        try:
            with fia_call_tags(path="graph"):
                runner.capture()
        except Exception as error:  # noqa: BLE001 - a failed capture is a finding, not a crash
            record.errors.append(PathError("graph", None, "capture", type(error).__name__, str(error)))
            alive.discard("graph")
        record.capture_seconds = time.perf_counter() - started
        record.graphs_captured = runner.graphs_captured
        record.stream_usage = dict(engine.stream_usage())
        record.memory = dict(engine.memory_report())
        for step in spec.steps:
            if not alive:
                break
            record.steps.append(_run_step(step, runner, eager, tokens, alive, record, spec))
    record.texts = {
        path: {req: ids[len(spec.prompts[req]):] for req, ids in tokens[path].items()} for path in PATHS
    }
    runner.release()
    return record


def _run_step(step: Step, runner: GraphRunner, eager: dict[str, EagerRunner],
              tokens: dict[str, dict[str, list[int]]], alive: set[str], record: RunRecord,
              spec: PipelineSpec) -> StepRecord:
    meta = runner.metadata(step.requests)
    decision = runner.decide(meta)
    padded = runner.pad(meta, decision)
    rec = StepRecord(
        step=step.index,
        requests=[(r.req_id, r.num_computed_tokens, r.num_new_tokens) for r in step.requests],
        num_tokens=meta.num_actual_tokens,
        uniform_decode=runner.is_uniform(meta),
        runtime_mode=str(decision.runtime_mode),
        num_tokens_padded=decision.num_tokens_padded,
        num_reqs=meta.num_reqs,
        num_reqs_padded=padded.num_reqs_padded,
        padding_source=padded.padding_source,
        dispatch_reason=decision.reason,
        ledger={"real": meta.num_actual_tokens, "bucket": decision.num_tokens_padded - meta.num_actual_tokens},
        metadata=_host_lists(padded),
        reference_metadata=_host_lists(meta),
    )
    tags = dict(step=step.index, bucket=decision.num_tokens_padded, runtime_mode=str(decision.runtime_mode),
                padding=padded.padding_source)
    for path in PATHS:
        if path not in alive:
            continue
        path_meta = meta if path == "reference" else padded
        inputs = step_inputs(step.requests, tokens[path], path_meta)
        try:
            with fia_call_tags(path=path, phase="step", **tags):
                if path == "graph":
                    logits, rec.executed = runner.execute(inputs, decision)
                    rec.host_lists_unverifiable = rec.runtime_mode == "FULL" and rec.executed is None
                else:
                    logits = eager[path].execute(inputs)
        except Exception as error:  # noqa: BLE001 - recorded; the other paths go on
            record.errors.append(PathError(path, step.index, "step", type(error).__name__, str(error),
                                           bucket=decision.num_tokens_padded))
            alive.discard(path)
            continue
        rec.logits[path] = logits
        rec.sampled[path] = _sample(step, meta, logits, tokens[path])
    return rec


def _sample(step: Step, meta: AttentionMetadata, logits: torch.Tensor,
            tokens: dict[str, list[int]]) -> list[int]:
    """Greedy: the argmax of each sampling request's last row, appended to its text."""
    picked = []
    ends = meta.query_start_loc[1 : meta.num_reqs + 1]
    rows = logits[[end - 1 for end in ends]].argmax(dim=-1).tolist()
    for req, samples, token in zip(step.requests, step.samples, rows):
        if samples and req.seq_len == len(tokens[req.req_id]):
            tokens[req.req_id].append(int(token))
        picked.append(int(token))
    return picked


def _host_lists(meta: AttentionMetadata) -> dict[str, Any]:
    return {
        "query_start_loc": list(meta.query_start_loc),
        "actual_seq_lengths": list(meta.actual_seq_lengths),
        "actual_seq_lengths_kv": list(meta.seq_lens),
        "block_table": [list(row) for row in meta.block_table],
        "slot_mapping": list(meta.slot_mapping),
        "num_input_tokens": meta.num_input_tokens,
    }


def prompt_tokens(req_ids: Sequence[str], lengths: Sequence[int], vocab_size: int, seed: int) -> dict[str, list[int]]:
    """Seeded prompt token ids, one list per request."""
    generator = torch.Generator().manual_seed(seed)
    return {
        req: torch.randint(0, vocab_size, (n,), generator=generator).tolist()
        for req, n in zip(req_ids, lengths)
    }
