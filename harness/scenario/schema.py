"""The scenario schema: pydantic v2 models for one graph-mode scenario.

The root model, :class:`Scenario`, is here; its parts each have a module of their own:

* :mod:`.fields`: the strict base model, bounded ints and :class:`ConsistencyError` (a
  cross-field failure carrying located issues, which the loader expands into one error each);
* :mod:`.sections`: the sections that stand alone (model, graph, workload, features and fixes,
  tolerance, engine);
* :mod:`.expect`: the expected outcome and the dispatch table;
* :mod:`.matrix`: the matrix axes and exclusions (their paths checked against :class:`Scenario`
  by :func:`check_matrix_path` and :func:`matrix_issues` here);
* :mod:`.rules`: the rules across sections, one named step each.

Every name is importable from here as before. ``python -m harness.scenario.schema`` prints the
JSON Schema.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal, Mapping, Sequence

from pydantic import Field, field_validator, model_validator

from harness.plain import JsonObject

from . import bounds as L
from .expect import DISPATCH_METADATA, DispatchKey, DispatchMetadata, DispatchRow, Expect, RuntimeMode
from .fields import (
    CHECK_NAMES,
    GRAPH_MODES,
    CheckName,
    ConsistencyError,
    GraphMode,
    Loc,
    NonNeg,
    NonNegFloat,
    NonNegInt,
    Pos,
    PosInt,
    Text,
    _NAME,
    _Base,
)
from .matrix import AxisValue, axes_issues, exclude_issues, path_issue
from .rules import scenario_issues
from .sections import (
    EngineSpec,
    Features,
    Fixes,
    GraphSpec,
    ModelSpec,
    RequestSpec,
    StepEntry,
    Tolerance,
    Workload,
)
from harness.stacks import DEFAULT_STACK, stack_names

__all__ = [
    "CHECK_NAMES",
    "DISPATCH_METADATA",
    "GRAPH_MODES",
    "CheckName",
    "ConsistencyError",
    "DispatchKey",
    "DispatchMetadata",
    "DispatchRow",
    "EngineSpec",
    "Expect",
    "Features",
    "Fixes",
    "GraphMode",
    "GraphSpec",
    "Loc",
    "ModelSpec",
    "NonNeg",
    "NonNegFloat",
    "NonNegInt",
    "Pos",
    "PosInt",
    "RequestSpec",
    "RuntimeMode",
    "Scenario",
    "StepEntry",
    "Text",
    "Tolerance",
    "Workload",
    "check_matrix_path",
    "exclude_issues",
    "export_json_schema",
    "matrix_issues",
]


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
    steps: Annotated[int, Pos(L.MAX_STEPS)] = Field(16, description="Maximum decode steps to run.")
    engine: EngineSpec = Field(default_factory=EngineSpec)
    stack: Annotated[str, Field(json_schema_extra={"enum": stack_names()})] | None = Field(
        None, description="The release the run models (version profiles, docs/conformance.md): one of "
        f"{', '.join(stack_names())}; null = --stack, else {DEFAULT_STACK} (the newest release).")
    expect: Expect = Field(default_factory=Expect)
    matrix: dict[str, Annotated[list[Any], Field(min_length=1)]] | None = Field(
        None,
        description="Dotted path -> list of values; the cross product expands the file.",
    )
    matrix_exclude: list[JsonObject] = Field(
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
        """The rules across sections (:mod:`.rules`, one named step each)."""
        issues = scenario_issues(self)
        if issues:
            raise ConsistencyError(issues)
        return self


def check_matrix_path(path: str) -> str | None:
    """Return None if ``path`` is a dotted path into :class:`Scenario` usable as a matrix axis
    or override, else a message saying why not."""
    return path_issue(path, Scenario)


def matrix_issues(matrix: Mapping[str, Sequence[AxisValue]] | None) -> list[tuple[Loc, str]]:
    """Located problems with the matrix keys and values (relative to ``matrix``)."""
    return axes_issues(matrix, Scenario)


def export_json_schema() -> JsonObject:
    """The JSON Schema of a scenario file (for editors and docs)."""
    schema = Scenario.model_json_schema()
    schema.setdefault("title", "graph-harness scenario")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema


def main() -> None:
    print(json.dumps(export_json_schema(), indent=2, sort_keys=False))


if __name__ == "__main__":
    main()
