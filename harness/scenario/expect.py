"""What a scenario expects: pass, fail with named checks, or skip, and the dispatch table that
pins what the pipeline must decide at chosen steps."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, GetJsonSchemaHandler, field_validator, model_validator
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

from harness.plain import JsonObject

from . import bounds as L
from .fields import CheckName, ConsistencyError, GraphMode, Loc, NonNeg, Pos, Text, _Base
from harness.stacks import stack_names

__all__ = ["DISPATCH_METADATA", "DispatchKey", "DispatchMetadata", "DispatchRow", "Expect", "RuntimeMode"]


RuntimeMode = Literal["NONE", "PIECEWISE", "FULL"]
#: Host lists of a step that a dispatch row may pin (the graph path's, as the record keeps them).
DISPATCH_METADATA = ("query_start_loc", "actual_seq_lengths", "actual_seq_lengths_kv", "block_table",
                     "slot_mapping")
_HostList = Annotated[list[Annotated[int, Field(ge=-1, le=L.MAX_CAPTURE_SIZE * L.MAX_NUM_BLOCKS)]],
                      Field(max_length=L.MAX_CAPTURE_SIZE)]


class DispatchKey(_Base):
    """A batch descriptor: the key of the graph a step replays (vLLM's ``BatchDescriptor``)."""

    num_tokens: Annotated[int, Pos(L.MAX_CAPTURE_SIZE)]
    num_reqs: Annotated[int, Pos(L.MAX_CAPTURE_SIZE)] | None = None
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

    step: Annotated[int, NonNeg(L.MAX_STEPS)]
    rank: Annotated[int, NonNeg(L.MAX_WORLD_SIZE - 1)] | None = Field(None, description="Global rank; null: every rank.")
    for_mode: GraphMode | None = Field(None, description="Applies only to items of this configured mode.")
    for_stack: Annotated[str, Field(json_schema_extra={"enum": stack_names()})] | None = Field(
        None, description="Applies only to items that model this stack (one table for a `stack` matrix).")
    mode: RuntimeMode | None = Field(None, description="The runtime mode: NONE, PIECEWISE or FULL.")
    bucket: Annotated[int, Pos(L.MAX_CAPTURE_SIZE * 8)] | None = Field(None, description="Padded token count T.")
    num_tokens: Annotated[int, NonNeg(L.MAX_CAPTURE_SIZE * 8)] | None = Field(None, description="Real tokens on this rank.")
    padded_tokens: Annotated[int, NonNeg(L.MAX_CAPTURE_SIZE * 8)] | None = Field(None, description="bucket - num_tokens.")
    uniform: bool | None = Field(None, description="This rank's batch is uniform decode.")
    num_reqs: Annotated[int, NonNeg(L.MAX_CAPTURE_SIZE * 8)] | None = None
    num_reqs_padded: Annotated[int, NonNeg(L.MAX_CAPTURE_SIZE * 8)] | None = None
    dummy_requests: Annotated[int, NonNeg(L.MAX_CAPTURE_SIZE * 8)] | None = Field(
        None, description="num_reqs_padded - num_reqs: fake or dummy requests the padding added.")
    descriptor: DispatchKey | None = Field(
        None, description="The key of the graph replayed; give `descriptor: null` with `mode: NONE`.")
    ledger: dict[Annotated[str, Field(max_length=32)], Annotated[int, NonNeg(L.MAX_CAPTURE_SIZE * 8)]] | None = Field(
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

    def pinned(self) -> JsonObject:
        """The fields this row pins, as plain data (what the check compares)."""
        out = self.model_dump(mode="json", include=self.model_fields_set - {"step", "rank", "for_mode", "for_stack"})
        if "metadata" in out and self.metadata is not None:
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
