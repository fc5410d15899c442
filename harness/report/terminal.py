"""The terminal's account of a scenario item: one line that names what failed, and where.

pytest's short summary shows the first line of an item's failure text, so that line leads
with the scenario file and line, and the first failing check's summary; the lines below add
the fix switch the file turned off (the usual explanation of a known-bad item), the verdict,
and where the HTML and JSON reports are. Pure: no pytest.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.report.html import fixes_sentence
from harness.report.view import fixes_off, first_failure

__all__ = ["failure_text", "reports_line"]


def _fix_lines(record: Mapping, path: str | None, locate: Any) -> str:
    sentence = fixes_sentence(record)
    if not sentence:
        return ""
    if path and locate is not None:
        lines = [locate(path, name) for name in fixes_off(record.get("scenario"))]
        lines = [str(n) for n in lines if n]
        if lines:
            sentence += f" (line {', '.join(dict.fromkeys(lines))})"
    return sentence


def reports_line(reports: Sequence[tuple[str, str | Path | None]]) -> str:
    """``reports: HTML reports/x.html, JSON reports/x.json`` for the reports this run writes."""
    named = [f"{kind} {path}" for kind, path in reports if path]
    return "reports: " + ", ".join(named) if named else ""


def failure_text(record: Mapping, *, where: str, path: str | None = None, locate: Any = None,
                 reports: Sequence[tuple[str, str | Path | None]] = ()) -> str:
    """The failure text of a failed (or known-bad, failed as expected) scenario item.

    ``where`` is ``file:line`` of the scenario; ``locate(path, field)`` finds the line of a
    field in the file (the scenario loader's), to point at the fix switch.
    """
    first = first_failure(record)
    verdict = str(record.get("verdict") or "")
    if first is None:
        head = f"{where}: {verdict}"
        extra = []
    else:
        at = ", ".join(part for part in (f"step {first.step}" if first.step is not None else "",
                                         f"bucket {first.bucket}" if first.bucket is not None else "") if part)
        head = f"{where}: {first.check} failed{f' at {at}' if at else ''}: {first.summary}"
        said = f"verdict: {verdict}" if verdict and first.summary not in verdict else ""
        extra = [f"  {line}" for line in (_fix_lines(record, path, locate), said) if line]
    tail = reports_line(reports)
    return "\n".join([head, *extra, *([f"  {tail}"] if tail else [])])
