"""The scenario schema: pydantic v2 models for one graph-mode scenario.

Every model forbids unknown keys and validates strictly (YAML already gives native types:
``"2"`` is not accepted for an int, ``true`` is not accepted for an int).

Cross-field rules raise :class:`ConsistencyError`, a ``ValueError`` that carries a list of
``(relative_loc, message)`` issues; the loader expands each issue into its own error pointing at
the offending field. Used from plain Python, the same error reads as one message.

``python -m harness.scenario.schema`` prints the JSON Schema.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    PlainValidator,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

from . import bounds as L
from harness.graph.capability import ATTENTION_BACKENDS
from harness.graph.modes import CUDAGraphMode
from harness.names import CheckName as _CheckName
from harness.stacks import DEFAULT_STACK, stack_names
from harness.features import registry
from harness.scenario.feature_schema import build_features_model, build_fixes_model

__all__ = [
    "CHECK_NAMES",
    "GRAPH_MODES",
    "ConsistencyError",
    "EngineSpec",
    "DispatchRow",
    "Expect",
    "Features",
    "Fixes",
    "GraphSpec",
    "ModelSpec",
    "RequestSpec",
    "Scenario",
    "StepEntry",
    "Tolerance",
    "Workload",
    "check_matrix_path",
    "exclude_issues",
    "matrix_issues",
    "export_json_schema",
]

GRAPH_MODES = tuple(m.name for m in CUDAGraphMode)
CHECK_NAMES = tuple(c.value for c in _CheckName)

GraphMode = Literal[GRAPH_MODES]  # type: ignore[valid-type]
CheckName = Literal[CHECK_NAMES]  # type: ignore[valid-type]  # one enum: harness.checks.result.CheckName

PosInt = Annotated[int, Field(ge=1)]
NonNegInt = Annotated[int, Field(ge=0)]
NonNegFloat = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]


def Pos(maximum: int) -> Any:
    """An int in ``1..maximum`` (the bounds of docs/scenarios.md, "Limits")."""
    return Annotated[int, Field(ge=1, le=maximum)]


def NonNeg(maximum: int) -> Any:
    """An int in ``0..maximum``."""
    return Annotated[int, Field(ge=0, le=maximum)]


Text = Annotated[str, Field(max_length=L.MAX_STRING_CHARS)]
_NAME = r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$"

Loc = tuple[Union[str, int], ...]


class ConsistencyError(ValueError):
    """A cross-field validation failure carrying one or more located issues.

    ``issues`` is a list of ``(loc, message)``; ``loc`` is relative to the model whose validator
    raised (pydantic reports the error at that model's location; the loader appends ``loc``).
    """

    def __init__(self, issues: list[tuple[Loc, str]]):
        self.issues = list(issues)
        super().__init__(
            "; ".join(f"{_fmt_loc(loc)}: {msg}" if loc else msg for loc, msg in self.issues)
        )


def _fmt_loc(loc: Loc) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


class _Base(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


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
        default=0, description="Kept equal to features.mtp.k (either may be given)."
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


RuntimeMode = Literal["NONE", "PIECEWISE", "FULL"]
#: Host lists of a step that a dispatch row may pin (the graph path's, as the record keeps them).
DISPATCH_METADATA = ("query_start_loc", "actual_seq_lengths", "actual_seq_lengths_kv", "block_table",
                     "slot_mapping")
_HostList = Annotated[list[Annotated[int, Field(ge=-1, le=L.MAX_CAPTURE_SIZE * L.MAX_NUM_BLOCKS)]],
                      Field(max_length=L.MAX_CAPTURE_SIZE)]


class DispatchKey(_Base):
    """A batch descriptor: the key of the graph a step replays (vLLM's ``BatchDescriptor``)."""

    num_tokens: Pos(L.MAX_CAPTURE_SIZE)
    num_reqs: Pos(L.MAX_CAPTURE_SIZE) | None = None
    uniform_decode: bool = False


class DispatchMetadata(_Base):
    """Exact host lists of the graph path at one step (after padding and this rank's view)."""

    query_start_loc: _HostList | None = None
    actual_seq_lengths: _HostList | None = None
    actual_seq_lengths_kv: _HostList | None = None
    slot_mapping: _HostList | None = None
    block_table: Annotated[list[_HostList], Field(max_length=L.MAX_CAPTURE_SIZE)] | None = None


class DispatchRow(_Base):
    """One row of a dispatch table: what the pipeline must decide at one step (on one rank).

    Every field but ``step`` is optional; a row pins what it names and nothing else. Compared
    with the graph path's step record (``harness.checks.dispatch_table``).
    """

    step: NonNeg(L.MAX_STEPS)
    rank: NonNeg(L.MAX_WORLD_SIZE - 1) | None = Field(None, description="Global rank; null: every rank.")
    for_mode: GraphMode | None = Field(None, description="Applies only to items of this configured mode.")
    for_stack: Annotated[str, Field(json_schema_extra={"enum": stack_names()})] | None = Field(
        None, description="Applies only to items that model this stack (one table for a `stack` matrix).")
    mode: RuntimeMode | None = Field(None, description="The runtime mode: NONE, PIECEWISE or FULL.")
    bucket: Pos(L.MAX_CAPTURE_SIZE * 8) | None = Field(None, description="Padded token count T.")
    num_tokens: NonNeg(L.MAX_CAPTURE_SIZE * 8) | None = Field(None, description="Real tokens on this rank.")
    padded_tokens: NonNeg(L.MAX_CAPTURE_SIZE * 8) | None = Field(None, description="bucket - num_tokens.")
    uniform: bool | None = Field(None, description="This rank's batch is uniform decode.")
    num_reqs: NonNeg(L.MAX_CAPTURE_SIZE * 8) | None = None
    num_reqs_padded: NonNeg(L.MAX_CAPTURE_SIZE * 8) | None = None
    dummy_requests: NonNeg(L.MAX_CAPTURE_SIZE * 8) | None = Field(
        None, description="num_reqs_padded - num_reqs: fake or dummy requests the padding added.")
    descriptor: DispatchKey | None = Field(
        None, description="The key of the graph replayed; give `descriptor: null` with `mode: NONE`.")
    ledger: dict[Annotated[str, Field(max_length=32)], NonNeg(L.MAX_CAPTURE_SIZE * 8)] | None = Field(
        None, description="The padding ledger, exactly (real, bucket, spec, sp, dp, cp, ...).")
    metadata: DispatchMetadata | None = None

    @field_validator("for_mode", "mode", mode="before")
    @classmethod
    def _mode_name(cls, v: Any) -> Any:
        return v.strip().upper().replace("-", "_") if isinstance(v, str) else v

    @field_validator("for_stack")
    @classmethod
    def _known_stack(cls, v: str | None) -> str | None:
        if v is not None and v not in stack_names():
            raise ValueError(f"unknown stack {v!r}; known: {', '.join(stack_names())}")
        return v

    @model_validator(mode="after")
    def _pins_something(self) -> "DispatchRow":
        pinned = self.model_fields_set - {"step", "rank", "for_mode", "for_stack"}
        if not pinned:
            raise ConsistencyError([((), "a dispatch row pins nothing: name at least one of mode, bucket, "
                                          "num_tokens, padded_tokens, uniform, num_reqs, num_reqs_padded, "
                                          "dummy_requests, descriptor, ledger, metadata")])
        if self.metadata is not None and not self.metadata.model_fields_set:
            raise ConsistencyError([(("metadata",), "empty: name at least one of " + ", ".join(DISPATCH_METADATA))])
        if self.mode == "NONE" and self.descriptor is not None:
            raise ConsistencyError([(("descriptor",), "mode NONE replays no graph: its descriptor is null")])
        return self

    def pinned(self) -> dict[str, Any]:
        """The fields this row pins, as plain data (what the check compares)."""
        out = self.model_dump(mode="json", include=self.model_fields_set - {"step", "rank", "for_mode", "for_stack"})
        if "metadata" in out:
            out["metadata"] = self.metadata.model_dump(mode="json", include=self.metadata.model_fields_set)
        return out


class Expect(_Base):
    """Expected outcome. YAML: ``pass`` | ``{fail: [checks], reason: ...}`` | ``{skip: reason}``,
    each with an optional ``dispatch`` table (``{dispatch: [rows]}`` alone means pass)."""

    fail: list[CheckName] | None = None
    skip: Text | None = None
    reason: Text = ""
    dispatch: Annotated[list[DispatchRow], Field(max_length=L.MAX_STEPS)] | None = Field(
        None, description="Rows that pin the runtime mode, bucket and padding chosen at chosen steps.")

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, v: Any) -> Any:
        if isinstance(v, str):
            if v.strip().lower() == "pass":
                return {}
            raise ValueError(
                f"expect must be 'pass', {{fail: [checks]}} or {{skip: reason}}, got {v!r}"
            )
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "Expect":
        issues: list[tuple[Loc, str]] = []
        if self.fail is not None and self.skip is not None:
            issues.append((("skip",), "give 'fail' or 'skip', not both"))
        if self.fail is not None:
            if not self.fail:
                issues.append((("fail",), "'fail' is empty: list the checks expected to fail"))
            seen: set[str] = set()
            for i, name in enumerate(self.fail):
                if name in seen:
                    issues.append((("fail", i), f"check {name!r} is listed twice"))
                seen.add(name)
        if self.dispatch is not None:
            if not self.dispatch:
                issues.append((("dispatch",), "'dispatch' is empty: list rows or leave it out"))
            if self.skip is not None:
                issues.append((("dispatch",), "a skipped item runs nothing: 'dispatch' goes with pass or fail"))
            seen_rows: set[tuple] = set()
            for i, row in enumerate(self.dispatch):
                key = (row.step, row.rank, row.for_mode, row.for_stack)
                if key in seen_rows:
                    issues.append((("dispatch", i), f"step {row.step}"
                                   + (f", rank {row.rank}" if row.rank is not None else "")
                                   + (f", for_mode {row.for_mode}" if row.for_mode else "")
                                   + (f", for_stack {row.for_stack}" if row.for_stack else "")
                                   + " is pinned twice: merge the rows"))
                seen_rows.add(key)
        if self.fail is not None and "dispatch" in self.fail and not self.dispatch:
            issues.append((("fail",), "'dispatch' can fail only against a 'dispatch' table: add one"))
        if self.skip is not None:
            if not self.skip.strip():
                issues.append((("skip",), "'skip' needs a reason"))
            if self.reason:
                issues.append((("reason",), "'reason' goes with 'fail'; for skip the value is the reason"))
        if issues:
            raise ConsistencyError(issues)
        return self

    @property
    def outcome(self) -> Literal["pass", "fail", "skip"]:
        if self.skip is not None:
            return "skip"
        if self.fail is not None:
            return "fail"
        return "pass"

    @property
    def failing_checks(self) -> frozenset[str]:
        return frozenset(self.fail or ())

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        obj = handler(schema)
        return {"anyOf": [{"type": "string", "const": "pass"}, obj]}


# ------------------------------------------------------------------------------------------ matrix


_MATRIX_NOT_AXES = {"matrix", "matrix_exclude", "name"}


def check_matrix_path(path: str) -> str | None:
    """Return None if ``path`` is a dotted path into :class:`Scenario` usable as a matrix axis
    or override, else a message saying why not."""
    if not isinstance(path, str) or not path:
        return "a matrix key must be a non-empty dotted path"
    parts = path.split(".")
    if parts[0] in _MATRIX_NOT_AXES:
        return f"{parts[0]!r} cannot be a matrix axis"
    cls: Any = Scenario
    for i, part in enumerate(parts):
        model = _model_of(cls)
        if model is None:
            done = ".".join(parts[:i])
            return f"unknown path {path!r}: {done!r} has no sub-fields"
        if part not in model.model_fields:
            done = ".".join(parts[:i]) or "the scenario"
            known = ", ".join(sorted(model.model_fields))
            return f"unknown path {path!r}: {done} has no field {part!r} (fields: {known})"
        cls = model.model_fields[part].annotation
    return None


def _model_of(tp: Any) -> type[BaseModel] | None:
    """The BaseModel inside ``tp`` (plain, Optional[...] or Annotated[...]), else None."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return tp
    origin = get_origin(tp)
    if origin is Annotated:
        return _model_of(get_args(tp)[0])
    if origin is Union or str(origin) == "<class 'types.UnionType'>":
        models = [m for m in (_model_of(a) for a in get_args(tp)) if m is not None]
        if len(models) == 1:
            return models[0]
    return None


def matrix_issues(matrix: dict[str, list[Any]] | None) -> list[tuple[Loc, str]]:
    """Located problems with the matrix keys and values (relative to ``matrix``)."""
    if not matrix:
        return []
    issues: list[tuple[Loc, str]] = []
    for key, values in matrix.items():
        why = check_matrix_path(key)
        if why:
            issues.append(((key,), why))
            continue
        seen: list[Any] = []
        for i, val in enumerate(values):
            if val in seen:
                issues.append(((key, i), f"value {val!r} is listed twice for axis {key!r}"))
            seen.append(val)
    keys = sorted(matrix)
    for a in keys:
        for b in keys:
            if a != b and b.startswith(a + "."):
                issues.append(((b,), f"axis {b!r} overlaps axis {a!r}"))
    return issues


def exclude_issues(
    matrix: dict[str, list[Any]] | None, exclude: list[dict[str, Any]]
) -> list[tuple[Loc, str]]:
    """Located problems with ``matrix_exclude`` (relative to the scenario root)."""
    issues: list[tuple[Loc, str]] = []
    if exclude and not matrix:
        return [(("matrix_exclude",), "matrix_exclude needs a matrix")]
    for i, entry in enumerate(exclude):
        if not entry:
            issues.append((("matrix_exclude", i), "an exclude entry must name at least one axis"))
        for key, val in entry.items():
            if key not in matrix:  # type: ignore[operator]
                issues.append(
                    (("matrix_exclude", i, key), f"{key!r} is not a matrix axis")
                )
            elif val not in matrix[key]:  # type: ignore[index]
                issues.append(
                    (
                        ("matrix_exclude", i, key),
                        f"{val!r} is not one of the values of axis {key!r}",
                    )
                )
    return issues


# -------------------------------------------------------------------------------------- scenario


class Scenario(_Base):
    """One scenario file (before matrix expansion) or one matrix point (after)."""

    name: Annotated[str, Field(json_schema_extra={"pattern": _NAME})] | None = Field(
        None, description="Default: the file stem. Letters, digits, '_', '.', '+', '-' (a pytest "
        "item name: no spaces, brackets or line breaks).")
    description: Text = ""
    model: ModelSpec = Field(default_factory=ModelSpec)
    graph: GraphSpec = Field(default_factory=GraphSpec)
    workload: Workload
    fixes: Fixes = Field(default_factory=Fixes)
    features: Features = Field(default_factory=Features)
    fia_contract: Literal["strict", "relaxed"] = "strict"
    tolerance: Tolerance | None = Field(
        None, description="null = the backend default (bitwise on the emulator)."
    )
    steps: Pos(L.MAX_STEPS) = Field(16, description="Maximum decode steps to run.")
    engine: EngineSpec = Field(default_factory=EngineSpec)
    stack: Annotated[str, Field(json_schema_extra={"enum": stack_names()})] | None = Field(
        None, description="The release the run models (version profiles, docs/conformance.md): one of "
        f"{', '.join(stack_names())}; null = --stack, else {DEFAULT_STACK} (the newest release).")
    expect: Expect = Field(default_factory=Expect)
    matrix: dict[str, Annotated[list[Any], Field(min_length=1)]] | None = Field(
        None,
        description="Dotted path -> list of values; the cross product expands the file.",
    )
    matrix_exclude: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Points matching every key/value of any entry are dropped.",
    )
    matrix_selection: Literal["full", "pairwise"] = Field(
        "full",
        description="Which matrix points run by default: every one, or a pairwise covering "
        "array (every pair of axis values in some item); --matrix=full runs every point.",
    )
    timeout_s: Annotated[float, Field(gt=0, le=L.MAX_ITEM_TIMEOUT_S, allow_inf_nan=False)] | None = Field(
        None, description="Wall-clock limit of each item in seconds; null = the harness default."
    )
    slow: bool = Field(False, description="A long-running kind: its items carry the 'slow' marker.")

    @field_validator("name")
    @classmethod
    def _item_name(cls, v: str | None) -> str | None:
        # The name is a pytest item name: node ids, -k and --lf must parse it back unchanged.
        if v is not None and (len(v) > L.MAX_NAME_CHARS or not re.fullmatch(_NAME, v)):
            shown = v if len(v) <= 40 else v[:40] + "..."
            raise ValueError(
                f"a name is 1 to {L.MAX_NAME_CHARS} letters, digits, '_', '.', '+' or '-', "
                f"starting with a letter, digit or '_' (no spaces, brackets or line breaks); got {shown!r}"
            )
        return v

    @field_validator("stack")
    @classmethod
    def _known_stack(cls, v: str | None) -> str | None:
        if v is not None and v not in stack_names():
            raise ValueError(f"unknown stack {v!r}; known: {', '.join(stack_names())}")
        return v

    @field_validator("matrix")
    @classmethod
    def _matrix_paths(cls, v: dict[str, list[Any]] | None) -> dict[str, list[Any]] | None:
        issues = matrix_issues(v)
        if issues:
            raise ConsistencyError(issues)
        return v

    @model_validator(mode="after")
    def _excludes(self) -> "Scenario":
        issues = exclude_issues(self.matrix, self.matrix_exclude)
        if issues:
            raise ConsistencyError(issues)
        return self

    @model_validator(mode="after")
    def _consistent(self) -> "Scenario":
        """The rules across sections, each a named step; a feature's own are its
        (``Feature.mirrors``, ``Feature.scenario_issues``)."""
        issues = [*_mirror_issues(self), *_capture_size_issues(self), *_feature_issues(self),
                  *_request_issues(self), *_explicit_step_issues(self)]
        if issues:
            raise ConsistencyError(issues)
        return self


def _mirror_issues(scenario: Scenario) -> list[tuple[Loc, str]]:
    """A field that mirrors a feature's setting follows it, or it follows the field: either may
    be given; given both, they must agree (the setting is canonical)."""
    issues: list[tuple[Loc, str]] = []
    for name, cls in registry().items():
        section = getattr(scenario.features, name, None)
        for path, setting in cls.mirrors.items():
            *parents, leaf = path.split(".")
            holder: Any = scenario
            for part in parents:
                holder = getattr(holder, part)
            if section is None or holder is None:
                continue
            mirror_given = leaf in holder.model_fields_set
            setting_given = setting in section.model_fields_set
            mirror, value = getattr(holder, leaf), getattr(section, setting)
            if mirror_given and setting_given and mirror != value:
                issues.append((tuple(path.split(".")),
                               f"{leaf} {mirror} differs from features.{name}.{setting} {value}"))
            elif mirror_given and not setting_given:
                setattr(section, setting, mirror)
            elif setting_given and not mirror_given:
                setattr(holder, leaf, value)
    return issues


def _capture_size_issues(scenario: Scenario) -> list[tuple[Loc, str]]:
    """Explicit capture sizes and a max capture size must agree, as vLLM refuses both otherwise;
    sizes above max_num_batched_tokens are dropped first (the filters of the features are
    applied by the preflight, which sees them)."""
    sizes, top = scenario.graph.capture_sizes, scenario.graph.max_capture_size
    if not sizes or top is None:
        return []
    kept = [s for s in sizes if s <= scenario.workload.max_num_batched_tokens]
    if kept and kept[-1] != top:
        return [(("graph", "max_capture_size"),
                 f"customized max_cudagraph_capture_size(={top}) should be consistent with the "
                 f"max value of cudagraph_capture_sizes(={kept[-1]}): give one of the two")]
    return []


def _feature_issues(scenario: Scenario) -> list[tuple[Loc, str]]:
    """Every enabled feature's own cross-field rules (``Feature.scenario_issues``)."""
    issues: list[tuple[Loc, str]] = []
    fixes = dict(scenario.fixes)
    for name, cls in registry().items():
        section = getattr(scenario.features, name, None)
        if section is None:
            continue
        feature = cls(section, fixes)
        if feature.enabled():
            issues.extend(feature.scenario_issues(scenario))
    return issues


def _request_issues(scenario: Scenario) -> list[tuple[Loc, str]]:
    """Each request arrives before the last step, and its prompt and length fit the budget and
    the model."""
    issues: list[tuple[Loc, str]] = []
    budget, max_len = scenario.workload.max_num_batched_tokens, scenario.model.max_model_len
    for i, r in enumerate(scenario.workload.requests or []):
        if r.arrival_step >= scenario.steps:
            issues.append((("workload", "requests", i, "arrival_step"),
                           f"the request arrives at step {r.arrival_step}, after the last step "
                           f"(steps is {scenario.steps}): it would never run"))
        if r.prompt_len > budget:
            issues.append((("workload", "requests", i, "prompt_len"),
                           f"prompt_len {r.prompt_len} is above workload.max_num_batched_tokens {budget}: the "
                           "harness prefills a prompt in one step (no chunked prefill; vLLM without it "
                           "refuses such a request too), so it would never be scheduled"))
        if r.prompt_len + r.output_len > max_len:
            issues.append((("workload", "requests", i),
                           f"prompt_len {r.prompt_len} + output_len {r.output_len} = "
                           f"{r.prompt_len + r.output_len} exceeds model.max_model_len {max_len}"))
    return issues


def _explicit_step_issues(scenario: Scenario) -> list[tuple[Loc, str]]:
    """Explicit steps fit the run's steps, each request's tokens fit the model, and the live
    requests' KV blocks fit the cache."""
    steps = scenario.workload.steps
    if not steps:
        return []
    issues: list[tuple[Loc, str]] = []
    max_len = scenario.model.max_model_len
    if len(steps) > scenario.steps:
        issues.append((("workload", "steps"),
                       f"{len(steps)} explicit steps, but steps is {scenario.steps}: the "
                       "later ones would never run"))
    totals: dict[str, int] = {}
    for step in steps:
        for e in step:
            totals[str(e.req)] = totals.get(str(e.req), 0) + e.new_tokens
    for req, total in totals.items():
        if total > max_len:
            issues.append((("workload", "steps"),
                           f"request {req!r} reaches {total} tokens, above model.max_model_len {max_len}"))
    issues.extend(_explicit_blocks_issue(steps, totals, scenario.model))
    return issues


def _explicit_blocks_issue(steps: list[list[StepEntry]], totals: dict[str, int], model: ModelSpec) -> list[tuple[Loc, str]]:
    """The first explicit step whose live requests (from their first step to their last, each
    holding blocks for all its tokens) need more KV blocks than the cache has."""
    blocks = {req: -(-total // model.block_size) for req, total in totals.items()}
    last = {str(e.req): i for i, step in enumerate(steps) for e in step}
    free = model.num_blocks - 1  # block 0 is reserved
    held: set[str] = set()
    in_use = 0
    for i, step in enumerate(steps):
        arrived = {str(e.req) for e in step} - held
        held |= arrived
        in_use += sum(blocks[req] for req in arrived)
        if in_use > free:
            return [(("workload", "steps", i),
                     f"at step {i} the {len(held)} requests holding KV (from their first step to their last) "
                     f"need {in_use} blocks of {model.block_size} slots, the cache has {free} (model.num_blocks "
                     f"{model.num_blocks}, block 0 reserved): raise model.num_blocks")]
        ended = {str(e.req) for e in step if last[str(e.req)] == i}
        held -= ended
        in_use -= sum(blocks[req] for req in ended)
    return []


def export_json_schema() -> dict[str, Any]:
    """The JSON Schema of a scenario file (for editors and docs)."""
    schema = Scenario.model_json_schema()
    schema.setdefault("title", "graph-harness scenario")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema


def main() -> None:
    print(json.dumps(export_json_schema(), indent=2, sort_keys=False))


if __name__ == "__main__":
    main()
