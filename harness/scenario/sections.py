"""The sections of a scenario that stand alone: the model, the graph mode, the workload, the
features and fixes (generated from the feature registry), the tolerance and the engine.

Each validates its own fields and the rules within it; rules across sections are the
scenario's (:mod:`.rules`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Field, PlainValidator, WithJsonSchema, field_validator, model_validator

from . import bounds as L
from .fields import (
    ConsistencyError,
    GraphMode,
    Loc,
    NonNeg,
    NonNegFloat,
    Pos,
    _Base,
)
from .feature_schema import build_features_model, build_fixes_model, mirrored_by
from harness.graph.capability import ATTENTION_BACKENDS

__all__ = ["EngineSpec", "Features", "Fixes", "GraphSpec", "ModelSpec", "RequestSpec", "StepEntry", "Tolerance",
           "Workload"]


# ------------------------------------------------------------------------------------------ model


class ModelSpec(_Base):
    """The decoder LM under test (built by ``harness.model``)."""

    kind: Literal["canary", "random"] = "canary"
    layers: Pos(L.MAX_LAYERS) = 2
    hidden_size: Pos(L.MAX_HIDDEN_SIZE) = 64
    num_heads: Pos(L.MAX_HEADS) = 4
    num_kv_heads: Pos(L.MAX_HEADS) = 2
    head_dim: Pos(L.MAX_HEAD_DIM) = 16
    vocab_size: Pos(L.MAX_VOCAB_SIZE) = 512
    dtype: Literal["float32", "bfloat16"] = "float32"
    seed: NonNeg(L.MAX_SEED) = 0
    block_size: Pos(L.MAX_BLOCK_SIZE) = 16
    num_blocks: Pos(L.MAX_NUM_BLOCKS) = 128
    max_model_len: Pos(L.MAX_MODEL_LEN) = 512

    @model_validator(mode="after")
    def _consistent(self) -> "ModelSpec":
        issues: list[tuple[Loc, str]] = []
        if self.num_kv_heads > self.num_heads:
            issues.append(
                (
                    ("num_kv_heads",),
                    f"{self.num_kv_heads} KV heads exceed {self.num_heads} heads",
                )
            )
        elif self.num_heads % self.num_kv_heads:
            issues.append(
                (
                    ("num_kv_heads",),
                    f"{self.num_heads} heads are not divisible by {self.num_kv_heads} KV heads",
                )
            )
        if self.kind == "canary" and self.vocab_size < self.max_model_len:
            issues.append(
                (
                    ("vocab_size",),
                    f"the canary needs vocab_size >= max_model_len ({self.vocab_size} < "
                    f"{self.max_model_len}): its next token encodes the attended length",
                )
            )
        usable = (self.num_blocks - 1) * self.block_size  # block 0 is reserved (vLLM's null block)
        if self.max_model_len > usable:
            issues.append(
                (
                    ("max_model_len",),
                    f"max_model_len {self.max_model_len} does not fit the KV cache "
                    f"({self.num_blocks} blocks, block 0 reserved: {self.num_blocks - 1} x "
                    f"{self.block_size} = {usable} slots), so a request of that length could never run",
                )
            )
        weights = self.weight_elements
        if weights > L.MAX_WEIGHT_ELEMENTS:
            issues.append(((), f"the model has about {weights} weights, above the maximum of "
                               f"{L.MAX_WEIGHT_ELEMENTS}: lower layers, hidden_size, heads, "
                               "vocab_size or max_model_len"))
        kv = 2 * self.layers * self.num_blocks * self.block_size * self.num_kv_heads * self.head_dim
        if kv > L.MAX_KV_ELEMENTS:
            issues.append((("num_blocks",), f"the KV cache has {kv} elements (2 x layers x num_blocks "
                                             f"x block_size x num_kv_heads x head_dim), above the "
                                             f"maximum of {L.MAX_KV_ELEMENTS}"))
        if issues:
            raise ConsistencyError(issues)
        return self

    @property
    def weight_elements(self) -> int:
        """Weights of the decoder (embeddings + per-layer attention and MLP), an estimate that is
        exact enough to bound memory."""
        h, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        per_layer = 2 * h * q + 2 * h * kv + 3 * h * 2 * h
        return (2 * self.vocab_size + self.max_model_len) * h + self.layers * per_layer


# ------------------------------------------------------------------------------------------ graph


class GraphSpec(_Base):
    """Graph-mode configuration (vLLM ``CompilationConfig`` / vLLM Ascend equivalents)."""

    mode: GraphMode = "FULL"
    capture_sizes: Annotated[list[Pos(L.MAX_CAPTURE_SIZE)], Field(max_length=L.MAX_CAPTURE_SIZES)] | None = Field(
        default=None,
        description="Explicit capture sizes (deduplicated and sorted on load); "
        "null = the platform default rule.",
    )
    max_num_seqs: Pos(L.MAX_NUM_SEQS) = 8
    num_speculative_tokens: NonNeg(L.MAX_SPEC_TOKENS) = Field(
        default=0, description=mirrored_by("graph.num_speculative_tokens")
    )
    platform: Literal["npu", "gpu"] = "npu"
    max_capture_size: Pos(L.MAX_CAPTURE_SIZE) | None = Field(
        default=None, description="User max capture size; null = the platform default max."
    )
    warmup_runs: NonNeg(L.MAX_WARMUP_RUNS) = 1
    attention_backend: Literal[tuple(ATTENTION_BACKENDS)] = Field(  # type: ignore[valid-type]
        default="ascend", description="The attention backend whose declared graph support (AttentionCGSupport) "
        "the engine resolves the graph mode from: " + ", ".join(
            f"{b.name} ({b.support.name})" for b in ATTENTION_BACKENDS.values()) + ".")
    attention_metadata: Literal["auto", "host_lists", "device_buffers"] = Field(
        default="auto", description="Where FULL graphs keep attention's lengths: host lists updated in the graph "
        "after each replay (ACL graph task groups), device buffers refreshed before each replay (FlashAttention "
        "on CUDA), or auto: host lists where the engine can update them, device buffers elsewhere.")
    async_scheduling: bool = Field(
        default=False, description="vLLM's async scheduling (--async-scheduling): the host schedules and launches "
        "step i+1 before it has read step i's tokens, which the device copies into the next inputs itself; the "
        "host reads each step's results one step late. Not with speculative decoding (not modelled).")
    debug_input_addresses: bool = Field(
        default=False, description="Check at every replay that each input is at its captured address and "
        "raise when not (vLLM's debug mode, VLLM_LOGGING_LEVEL=DEBUG); off by default, as upstream.")
    compilation_mode: Literal["VLLM_COMPILE", "NONE", "STOCK_TORCH_COMPILE", "DYNAMO_TRACE_ONCE"] = Field(
        default="VLLM_COMPILE", description="vLLM's CompilationConfig.mode: only VLLM_COMPILE splits the "
        "model for piecewise graphs; any other turns PIECEWISE and FULL_AND_PIECEWISE into NONE, and on "
        "the NPU the two torch.compile modes turn graphs off (or, on main, compilation off).")

    @field_validator("mode", "compilation_mode", mode="before")
    @classmethod
    def _normalise_mode(cls, v: Any) -> Any:
        if isinstance(v, str):
            return v.strip().upper().replace("-", "_")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "GraphSpec":
        issues: list[tuple[Loc, str]] = []
        sizes = self.capture_sizes
        if sizes is not None:
            if not sizes:
                issues.append(
                    (
                        ("capture_sizes",),
                        "capture_sizes is an empty list; give at least one size, "
                        "or null for the default rule",
                    )
                )
        if issues:
            raise ConsistencyError(issues)
        if sizes is not None:
            self.capture_sizes = sorted(set(sizes))
        return self


# --------------------------------------------------------------------------------------- workload


class RequestSpec(_Base):
    prompt_len: Pos(L.MAX_TOKENS)
    output_len: Pos(L.MAX_TOKENS)
    arrival_step: NonNeg(L.MAX_STEPS) = Field(
        default=0, description="The step the request arrives at; must be below `steps`.")
    repeat: Pos(L.MAX_REQUESTS) = Field(default=1, description="That many identical requests.")


def _check_req(v: Any) -> Union[str, int]:
    if isinstance(v, bool) or not isinstance(v, (str, int)) or v == "":
        raise ValueError(f"req must be a request name (string) or number, got {v!r}")
    return v


ReqName = Annotated[
    Union[str, int],
    PlainValidator(_check_req),
    WithJsonSchema({"anyOf": [{"type": "string", "minLength": 1}, {"type": "integer"}]}),
]


class StepEntry(_Base):
    req: ReqName = Field(description="Request name or number.")
    new_tokens: Pos(L.MAX_TOKENS)


class Workload(_Base):
    """Either ``requests`` (scheduled by the harness) or ``steps`` (explicit per-step batches)."""

    requests: Annotated[list[RequestSpec], Field(max_length=L.MAX_REQUESTS)] | None = None
    steps: Annotated[
        list[Annotated[list[StepEntry], Field(min_length=1, max_length=L.MAX_REQUESTS)]],
        Field(max_length=L.MAX_STEPS),
    ] | None = None
    max_num_batched_tokens: Pos(L.MAX_TOKENS) = 512
    prompt_seed: NonNeg(L.MAX_SEED) = 0

    @model_validator(mode="after")
    def _consistent(self) -> "Workload":
        issues: list[tuple[Loc, str]] = []
        if self.requests is None and self.steps is None:
            issues.append(((), "give exactly one of 'requests' or 'steps' (neither given)"))
        elif self.requests is not None and self.steps is not None:
            issues.append((("steps",), "give exactly one of 'requests' or 'steps', not both"))
        for key in ("requests", "steps"):
            val = getattr(self, key)
            if val is not None and not val:
                issues.append(((key,), f"'{key}' is an empty list"))
        total = sum(r.repeat for r in self.requests or [])
        if total > L.MAX_REQUESTS:
            issues.append((("requests",), f"{total} requests (each repeat counted), above the maximum "
                                          f"of {L.MAX_REQUESTS}"))
        for i, step in enumerate(self.steps or []):
            seen: set[str] = set()
            tokens = 0
            for j, entry in enumerate(step):
                rk = str(entry.req)
                if rk in seen:
                    issues.append(
                        (("steps", i, j, "req"), f"request {entry.req!r} appears twice in step {i}")
                    )
                seen.add(rk)
                tokens += entry.new_tokens
            if tokens > self.max_num_batched_tokens:
                issues.append(
                    (
                        ("steps", i),
                        f"step {i} schedules {tokens} tokens, above max_num_batched_tokens "
                        f"{self.max_num_batched_tokens}",
                    )
                )
        if issues:
            raise ConsistencyError(issues)
        return self


# ------------------------------------------------------------------------------------ fixes, etc.


# Generated from the feature registry: each feature owns its settings and its fix switches.
Fixes = build_fixes_model(_Base, ConsistencyError)
Features = build_features_model(_Base, ConsistencyError)
# Built at run time, but importable by these names: a scenario pickles (ranks receive resolved items).
Fixes.__module__ = Features.__module__ = __name__


class Tolerance(_Base):
    atol: NonNegFloat = 0.0
    rtol: NonNegFloat = 0.0


class EngineSpec(_Base):
    stream_pool: Pos(L.MAX_STREAM_POOL) = 2048
    streams_per_graph: Pos(L.MAX_STREAMS_PER_GRAPH) = 1
    budget_policy: Literal["legacy", "none"] | None = Field(
        None, description="The stream budget: legacy (vLLM Ascend update_aclgraph_sizes) or none (PR #9962); "
        "null = the stack's (see `stack`).")
    hccl_mode: Literal["AIV", "default"] = "default"
