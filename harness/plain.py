"""Names for the plain data that crosses the harness untyped, so a signature says which it is.

Three kinds of value are dictionaries by nature, and their values are whatever they hold:

* :data:`JsonObject`: one JSON object the harness writes or reads back (a check's details, a
  step's evidence, a results file's item, a report's row). Its values are what JSON holds; a
  reader checks what it takes from one.
* :data:`PlainData`: a scenario, or a part of one, as the YAML (or a results file) gave it,
  before or beside validation: the cross product's raw points, a record's ``scenario``.
* :data:`Kwargs`: keyword arguments handed through to a callee that owns their meaning (a fused
  attention op's keywords, a constructor's options).

:data:`Loc` is a place in such data: the keys and list indexes from its root, as pydantic
reports an error's ``loc`` (``("features", "mtp", "k")``, ``("workload", "requests", 1)``), or a
:class:`RawKey` for a key that is no text.

Typing them as ``dict[str, Any]`` says only that nothing is known; these names say what is known.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

__all__ = ["JsonObject", "Kwargs", "Loc", "PlainData", "RawKey"]

JsonObject = dict[str, Any]
PlainData = Mapping[str, Any]
Kwargs = dict[str, Any]


@dataclass(frozen=True)
class RawKey:
    """A mapping key that is not text (YAML reads an unquoted ``true``, ``null`` or ``3`` as a
    bool, None or a number): a place pydantic names only by a lossy stand-in (``True`` as 1)."""

    value: object


Loc = tuple[str | int | RawKey, ...]
