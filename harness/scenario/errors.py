"""Located scenario errors: ``path:line: field: message``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # .points imports this module (SourceLocation): for the annotation only
    from .points import ScenarioPoint

__all__ = ["ScenarioError", "ScenarioFileError", "SourceLocation", "shorten"]

MAX_MESSAGE_CHARS = 300
"""An error line quotes user values; a 1 MB value must not become a 1 MB error line."""
MAX_FIELD_CHARS = 120


def shorten(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` on one line, cut to ``limit`` characters (the cut says how much was left out)."""
    text = " ".join(str(text).splitlines())
    if len(text) <= limit:
        return text
    return f"{text[: limit - 30]}... [{len(text) - limit + 30} more characters]"


@dataclass(frozen=True)
class SourceLocation:
    """Where a scenario (or matrix point) is defined. ``line`` is 1-based."""

    path: str
    line: int | None = None

    def __str__(self) -> str:
        return f"{self.path}:{self.line}" if self.line is not None else self.path


class ScenarioError(Exception):
    """One problem in a scenario file.

    ``path``: the file; ``line``: 1-based line or None; ``field``: dotted path into the scenario
    (``model.num_kv_heads``, ``workload.requests[1].prompt_len``, ``matrix.graph.mode[1]``) or
    ``""`` for file-level problems; ``message``: what is wrong.
    """

    def __init__(
        self, message: str, *, path: str | None = None, line: int | None = None, field: str = ""
    ):
        self.path = path
        self.line = line
        self.field = shorten(field, MAX_FIELD_CHARS)
        self.message = shorten(message)
        super().__init__(str(self))

    def __str__(self) -> str:
        head = self.path or "<scenario>"
        if self.line is not None:
            head += f":{self.line}"
        if self.field:
            return f"{head}: {self.field}: {self.message}"
        return f"{head}: {self.message}"

    def __repr__(self) -> str:
        return (
            f"ScenarioError(path={self.path!r}, line={self.line!r}, field={self.field!r}, "
            f"message={self.message!r})"
        )

    def __reduce__(self):  # picklable (pytest-xdist ships exceptions between processes)
        return (_rebuild_error, (self.message, self.path, self.line, self.field))


def _rebuild_error(message, path, line, field):
    return ScenarioError(message, path=path, line=line, field=field)


class ScenarioFileError(ScenarioError):
    """All problems found in one file, sorted by line. ``str()`` has one error per line.

    Its own ``path``/``line``/``field``/``message`` are those of the first error, so code that
    catches :class:`ScenarioError` still gets a location.
    """

    def __init__(self, errors: list[ScenarioError]):
        if not errors:
            raise ValueError("ScenarioFileError needs at least one error")
        self.errors = list(errors)
        # What the rest of the file gives (the loader fills it): the points that validated and
        # those that did once the values the errors name were left out, with the fields each lost.
        self.points: list[tuple[ScenarioPoint, frozenset[str]]] = []
        first = self.errors[0]
        super().__init__(first.message, path=first.path, line=first.line, field=first.field)

    def __str__(self) -> str:
        return "\n".join(str(e) for e in self.errors)

    def __reduce__(self):
        return (ScenarioFileError, (self.errors,))
