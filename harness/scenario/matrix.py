"""The matrix of a scenario file: its axes (dotted paths into the scenario), their values, the
exclusions and the matrix's size, checked before any point is built (the ids its values give:
:mod:`.ids`).

The paths are checked against the root model that the caller names (:mod:`.schema` binds them
to :class:`~harness.scenario.schema.Scenario`): the root validates its own matrix with these
functions, so they cannot import it.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Mapping, Sequence, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field

from harness.plain import JsonObject

from .bounds import MAX_MATRIX_POINTS, MAX_MATRIX_WORK
from .fields import Loc

__all__ = ["AxisValue", "axes_issues", "exclude_issues", "path_issue"]

#: One value of a matrix axis as the file gives it: whatever YAML holds there (a scalar, a list,
#: a mapping with an optional ``_id``). The matrix code compares, copies and renders values;
#: only a point's validation gives one a type.
AxisValue = object


_MATRIX_NOT_AXES = {"matrix", "matrix_exclude", "name"}


def path_issue(path: str, root: type[BaseModel]) -> str | None:
    """Return None if ``path`` is a dotted path into ``root`` usable as a matrix axis or
    override, else a message saying why not."""
    if not isinstance(path, str) or not path:
        return "a matrix key must be a non-empty dotted path"
    parts = path.split(".")
    if parts[0] in _MATRIX_NOT_AXES:
        return f"{parts[0]!r} cannot be a matrix axis"
    cls: object = root
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


def _model_of(tp: object) -> type[BaseModel] | None:
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


def axes_issues(matrix: Mapping[str, Sequence[AxisValue]] | None,
                root: type[BaseModel]) -> list[tuple[Loc, str]]:
    """Located problems with the matrix keys (paths into ``root``) and values (relative to
    ``matrix``)."""
    if not matrix:
        return []
    issues: list[tuple[Loc, str]] = []
    for key, values in matrix.items():
        why = path_issue(key, root)
        if why:
            issues.append(((key,), why))
            continue
        seen: list[AxisValue] = []
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
    matrix: Mapping[str, Sequence[AxisValue]] | None, exclude: list[JsonObject]
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


# -- checked by the loader, on the file as written -------------------------------------------------


class _MatrixPart(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    matrix: dict[str, Annotated[list[Any], Field(min_length=1)]] | None = None
    matrix_exclude: list[JsonObject] = Field(default_factory=list)


def _size_issue(matrix: Mapping[str, Sequence[AxisValue]] | None, values: int) -> str | None:
    """Refuse a matrix too large to expand before expanding it."""
    if not matrix:
        return None
    lengths = [len(v) for v in matrix.values()]
    points = math.prod(lengths)
    shape = " x ".join(map(str, lengths))
    if points > MAX_MATRIX_POINTS:
        return f"the matrix has {points} points ({shape}), above the maximum of {MAX_MATRIX_POINTS}"
    if points * values > MAX_MATRIX_WORK:
        return (f"the matrix has {points} points ({shape}) of {values} values each: "
                f"{points * values} values to validate, above the maximum of {MAX_MATRIX_WORK}")
    return None
