"""A matrix point: one runnable item of a scenario file, every axis fixed."""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.plain import JsonObject

from .errors import SourceLocation
from .schema import Scenario

__all__ = ["ScenarioPoint", "modes_of"]


@dataclass(frozen=True)
class ScenarioPoint:
    """One runnable item: a scenario with every matrix axis fixed.

    ``id``: ``""`` without a matrix, else the axis values rendered and joined by ``-``
    (see :func:`render_id`). ``axes``: axis path -> value for this point (empty without a
    matrix). ``scenario.matrix`` is None and ``scenario.matrix_exclude`` empty: they have been
    applied. ``source``: the file and the line of the scenario (first key) or of ``matrix:``.
    """

    id: str
    scenario: Scenario
    axes: JsonObject = field(default_factory=dict)
    source: SourceLocation = field(default_factory=lambda: SourceLocation("<scenario>"))
    #: axis -> the index of this point's value in the file's ``matrix`` (to find its line)
    axis_index: dict[str, int] = field(default_factory=dict)
    #: the line of each ``expect.dispatch`` row (None where unknown), read when the file is
    #: loaded so that a mismatching row is named by its line without reading the file again
    dispatch_lines: tuple[int | None, ...] = ()

    @property
    def name(self) -> str:
        return self.scenario.name or ""

    @property
    def display_name(self) -> str:
        """``name`` or ``name[id]`` (pytest style)."""
        return f"{self.name}[{self.id}]" if self.id else self.name


def modes_of(point: ScenarioPoint) -> str:
    """The graph mode a point runs in (upper case, e.g. ``"FULL_DECODE_ONLY"``)."""
    return point.scenario.graph.mode
