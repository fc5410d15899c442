"""pydantic's validation errors in a scenario file's own words, each with its location.

"must be at most 16, got 100", never the validator's vocabulary ("Input should be a valid
dictionary or instance of DPSettings"); an unknown key with the nearest known one.
"""

from __future__ import annotations

import difflib
import types
from typing import Annotated, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from harness.plain import Loc, PlainData, RawKey

from .fields import ConsistencyError
from .schema import Scenario

__all__: list[str] = []



def _issues(exc: ValidationError) -> list[tuple[Loc, str, bool]]:
    """Flatten a ValidationError into ``(loc, message, at_key)``."""
    out: list[tuple[Loc, str, bool]] = []
    for e in exc.errors():
        loc = tuple(e["loc"])
        err = (e.get("ctx") or {}).get("error")
        if isinstance(err, ConsistencyError):
            for rel, msg in err.issues:
                out.append((loc + tuple(rel), msg, False))
            continue
        kind = e["type"]
        if kind == "extra_forbidden":
            out.append((loc, f"unknown key {loc[-1]!r}", True))
            continue
        if kind == "missing":
            out.append((loc, f"missing required key {loc[-1]!r}", False))
            continue
        if kind == "invalid_key":  # pydantic's loc stands True in for 1: the key itself locates it
            key = e.get("input")
            kind_of = {bool: " (a boolean)", int: " (an integer)", float: " (a number)"}.get(type(key), "")
            out.append((loc[:-1] + (RawKey(key),), f"a key YAML reads as {_yaml_text(key)}{kind_of} is not "
                        "text: quote it if it is a name", True))
            continue
        out.append((loc, _plain_message(e, loc), False))
    return out


def _yaml_text(value: object) -> str:
    """A scalar as YAML writes it (``true``, ``null``)."""
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _example(field: str, default: object, value: object) -> str:
    """``, such as {field: x}`` for a scalar written where settings go: the value itself when
    it is of the field's type (``mtp: 2`` -> ``{k: 2}``), else the field's default, else nothing."""
    if not isinstance(default, (bool, int, float, str)):
        return ""
    shown = value if type(value) is type(default) else default
    return f", such as {{{field}: {_yaml_text(shown)}}}"


def _got(value: object) -> str:
    """``, got 2``: the value the file gave, unless it is a whole mapping or list."""
    return "" if isinstance(value, (dict, list)) else f", got {value!r}"


def _plain_message(error: PlainData, loc: Loc) -> str:
    """A pydantic error in the scenario file's own words: what the value must be, and what it
    was ("must be at most 16, got 100"), never the validator's vocabulary ("Input should be a
    valid dictionary or instance of DPSettings")."""
    kind, ctx, value = error["type"], error.get("ctx") or {}, error.get("input")
    msg = str(error["msg"])
    if kind == "value_error":  # the schema's own validators already speak the file's words
        return msg[len("Value error, "):] if msg.startswith("Value error, ") else msg
    bounds = {"less_than_equal": ("at most", "le"), "less_than": ("below", "lt"),
              "greater_than_equal": ("at least", "ge"), "greater_than": ("above", "gt"),
              "multiple_of": ("a multiple of", "multiple_of")}
    if kind in bounds:
        words, key = bounds[kind]
        return f"must be {words} {ctx.get(key)}{_got(value)}"
    if kind in ("too_long", "too_short"):
        actual, limit = ctx.get("actual_length"), ctx.get("max_length", ctx.get("min_length"))
        if kind == "too_short":
            return f"is empty: give at least {limit}" if not actual else f"has {actual}, at least {limit} needed"
        return f"has {actual} {'entry' if actual == 1 else 'entries'}, at most {limit} allowed"
    if kind in ("string_too_long", "string_too_short"):
        length = len(value) if isinstance(value, str) else "?"
        if kind == "string_too_short" and not length:
            return "must not be empty"
        most = "at most" if kind == "string_too_long" else "at least"
        return f"is {length} characters long, {most} {ctx.get('max_length', ctx.get('min_length'))} allowed"
    if kind in ("literal_error", "enum"):
        return f"must be one of {ctx.get('expected')}{_got(value)}"
    kinds = {"int_type": "a whole number", "int_parsing": "a whole number", "int_from_float": "a whole number",
             "float_type": "a number", "float_parsing": "a number", "finite_number": "a finite number",
             "bool_type": "true or false", "bool_parsing": "true or false", "string_type": "text",
             "list_type": "a list", "tuple_type": "a list", "set_type": "a list"}
    if kind in kinds:
        return f"must be {kinds[kind]}{_got(value)}"
    if kind in ("dict_type", "model_type", "model_attributes_type", "mapping_type"):
        holder = _type_at(loc)
        if isinstance(holder, type) and issubclass(holder, BaseModel) and holder.model_fields:
            fields = list(holder.model_fields)
            example = _example(fields[0], holder.model_fields[fields[0]].default, value)
            return f"must be a mapping of its settings ({', '.join(fields)}){example}{_got(value)}"
        return f"must be a mapping (key: value){_got(value)}"
    return msg.replace("Input should be", "must be", 1) + _got(value)


def _unwrap(tp: object) -> object:
    while True:
        origin = get_origin(tp)
        if origin is Annotated:
            tp = get_args(tp)[0]
        elif origin is Union or origin is types.UnionType:
            args = [t for t in get_args(tp) if t is not type(None)]
            if len(args) != 1:
                return tp
            tp = args[0]
        else:
            return tp


def _type_at(loc: Loc, tp: object = Scenario) -> object:
    """The annotation at ``loc`` inside the schema (None if it cannot be followed)."""
    for part in loc:
        tp = _unwrap(tp)
        if isinstance(part, int) and get_origin(tp) is list:
            tp = get_args(tp)[0]
        elif isinstance(part, str) and isinstance(tp, type) and issubclass(tp, BaseModel):
            if part not in tp.model_fields:
                return None
            tp = tp.model_fields[part].annotation
        else:
            return None
    return _unwrap(tp)


def _suggest(loc: Loc) -> str:
    """' (did you mean ...?)' for an unknown key, from the fields of the model holding it."""
    if len(str(loc[-1])) > 64:
        return ""
    holder = _type_at(loc[:-1])
    if not (isinstance(holder, type) and issubclass(holder, BaseModel)):
        return ""
    close = difflib.get_close_matches(str(loc[-1]), list(holder.model_fields), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
