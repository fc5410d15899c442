"""The ``features:`` and ``fixes:`` sections of the schema, generated from the feature registry.

Each registered feature contributes its settings model under ``features.<name>`` and its fix
switches under ``fixes.<switch>``, so a feature installed from another package gets a typed,
validated section (and a JSON Schema entry) without a change to this package. The models are
built when :mod:`harness.scenario.schema` is imported; a feature installed later in the same
process (a test that adds an entry point at run time) is validated the same way, against the
registry of the moment, as an extra key.
"""

from __future__ import annotations

from typing import Any, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator

from harness.features import all_fix_switches, registry
from harness.plain import Kwargs, Loc

__all__ = ["CORE_FIXES", "build_features_model", "build_fixes_model", "mirrored_by"]

#: The pipeline's own fixes (not any feature's): name -> description.
CORE_FIXES = {
    "device_placement": "The model, KV cache and static buffers in the engine's device memory (false: left in "
                        "host memory, as the pipeline of the first GPU run was: a graph around it captures nothing).",
    "fia_padding": "Dummy-request padding for the FIA check.",
    "host_param_update": "Per-layer task-group update of FIA host parameters after replay.",
    "static_inputs": "Copy inputs into the static buffers before replay (false: write to a fresh tensor).",
    "refresh_device_buffers": "Refresh the device buffer of the per-request KV lengths (seq_lens) before each "
                              "FULL replay on the device-buffer attention path (false: it keeps the capture's).",
    "sync_before_replay": "Synchronize the current stream before a FULL replay whose host lists are updated after "
                          "it (vLLM Ascend PR #4233; false: with async scheduling the update of one step races the "
                          "replay of the step before).",
}


def mirrored_by(path: str) -> str:
    """The description of a field that mirrors a feature's setting (``Feature.mirrors``): the
    feature that owns it is named by the registry, not by the schema."""
    owners = [f"features.{name}.{cls.mirrors[path]}" for name, cls in registry().items() if path in cls.mirrors]
    return f"Kept equal to {' and '.join(owners)} (either may be given)." if owners else ""


def _issues(error: ValidationError, prefix: Loc) -> list[tuple[Loc, str]]:
    out: list[tuple[Loc, str]] = []
    for e in error.errors():
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = f"unknown key {e['loc'][-1]!r}"
        out.append((prefix + tuple(e["loc"]), msg))
    return out


def build_features_model(base: type[BaseModel], consistency_error: type[Exception]) -> type[BaseModel]:
    """``features:``: one field per registered feature, typed by its settings model."""
    classes = registry()

    class _Features(base):  # type: ignore[misc, valid-type]
        model_config = ConfigDict(extra="allow", strict=True)

        @model_validator(mode="after")
        def _late_features(self) -> Any:
            """Keys the model was not built with: features registered since (else an error)."""
            now = registry()
            issues: list[tuple[Loc, str]] = []
            for name, value in list((self.__pydantic_extra__ or {}).items()):
                if name not in now:
                    issues.append(((name,), f"unknown feature {name!r}; known: {', '.join(sorted(now))}"))
                    continue
                try:
                    self.__pydantic_extra__[name] = now[name].Settings.model_validate(value or {})
                except ValidationError as error:
                    issues.extend(_issues(error, (name,)))
            if issues:
                raise consistency_error(issues)
            return self

    fields: Kwargs = {
        name: (cls.Settings, Field(default_factory=cls.Settings, description=cls.marker or None))
        for name, cls in classes.items()
    }
    model = cast("type[BaseModel]", create_model("Features", __base__=_Features, **fields))
    model.__doc__ = ("Features by name (the registry: built-ins and entry points), each with its typed "
                     "settings; see docs/features.md.")
    return model


def build_fixes_model(base: type[BaseModel], consistency_error: type[Exception]) -> type[BaseModel]:
    """``fixes:``: the core fixes, then every registered feature's switches (all on by default)."""
    switches = all_fix_switches()

    class _Fixes(base):  # type: ignore[misc, valid-type]
        model_config = ConfigDict(extra="allow", strict=True)

        @model_validator(mode="after")
        def _late_switches(self) -> Any:
            now = all_fix_switches()
            issues: list[tuple[Loc, str]] = []
            for name, value in (self.__pydantic_extra__ or {}).items():
                if name not in now:
                    known = ", ".join(sorted([*CORE_FIXES, *now]))
                    issues.append(((name,), f"unknown fix switch {name!r}; known: {known}"))
                elif not isinstance(value, bool):
                    issues.append(((name,), f"a fix switch is true or false (got {value!r})"))
            if issues:
                raise consistency_error(issues)
            return self

    fields: Kwargs = {name: (bool, Field(True, description=text)) for name, text in CORE_FIXES.items()}
    for name, (feature, switch) in switches.items():
        fields[name] = (bool, Field(switch.default, description=f"{feature}: {switch.description} "
                                                                 f"(off: {switch.known_bad})"))
    model = cast("type[BaseModel]", create_model("Fixes", __base__=_Fixes, **fields))
    model.__doc__ = "Fixes in the pipeline under test; ``false`` switches a fix off (the buggy pipeline)."
    return model
