"""The terminal's account of a scenario item: one line that names what failed, and where.

A failed item's block leads with the scenario file and line and the first failing check's
summary; the lines below add the fix switch the file turned off (the usual explanation of a
known-bad item), every check's state (the words the HTML report's badges use, so that a check
that looked at nothing reads *not evaluated* here too) and the verdict. pytest's short summary
("FAILED node id - ...") shows a shorter line of its own (:func:`summary_line`): the node id
already names the file, so it gives the failing check first, then the line, step and bucket,
where a terminal's width still shows them. The reports are named once, at the end of the run
(:func:`reports_line`), not in every block. Pure: no pytest.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Callable, Protocol

from harness.report.html import fixes_sentence
from harness.report.view import check_states, first_failure, fixes_off

__all__ = ["FailureRepr", "failure_text", "known_bad_line", "reports_line", "states_line", "summary_line"]


#: ``locate(path, field)``: the line of a field in a scenario file, None when it is not written.
Locate = Callable[[str, str], "int | None"]


def _fix_lines(record: Mapping, path: str | None, locate: Locate | None) -> str:
    sentence = fixes_sentence(record)
    if not sentence:
        return ""
    if path and locate is not None:
        found = [locate(path, name) for name in fixes_off(record.get("scenario"))]
        lines = [str(n) for n in found if n]
        if lines:
            sentence += f" (line {', '.join(dict.fromkeys(lines))})"
    return sentence


def reports_line(reports: Sequence[tuple[str, str | Path | None]]) -> str:
    """``reports: HTML reports/x.html, JSON reports/x.json`` for the reports this run writes."""
    named = [f"{kind} {path}" for kind, path in reports if path]
    return "reports: " + ", ".join(named) if named else ""


def _headline(record: Mapping) -> str:
    """What failed: the first failing check with its step and bucket, or the verdict."""
    first = first_failure(record)
    if first is None:
        return str(record.get("verdict") or "")
    at = ", ".join(part for part in (f"step {first.step}" if first.step is not None else "",
                                     f"bucket {first.bucket}" if first.bucket is not None else "") if part)
    return f"{first.check} failed{f' at {at}' if at else ''}: {first.summary}"


def states_line(record: Mapping) -> str:
    """``checks: fia_invariant PASS, stale_params FAIL, equality explained by stale_params``."""
    states = check_states(record)
    return "checks: " + ", ".join(f"{s.name} {s.label}" for s in states) if states else ""


def failure_text(record: Mapping, *, where: str, path: str | None = None, locate: Locate | None = None) -> str:
    """The failure block of a failed (or known-bad, failed as expected) scenario item.

    ``where`` is ``file:line`` of the scenario; ``locate(path, field)`` finds the line of a
    field in the file (the scenario loader's), to point at the fix switch.
    """
    head = f"{where}: {_headline(record)}"
    first = first_failure(record)
    verdict = str(record.get("verdict") or "")
    said = f"verdict: {verdict}" if first is not None and verdict and first.summary not in verdict else ""
    states = states_line(record)
    extra = [f"  {line}" for line in (_fix_lines(record, path, locate), states, said) if line]
    return "\n".join([head, *extra])


_UNEXPECTED_PASS = re.compile(r"known-bad scenario passed unexpectedly: expected (?P<checks>.+?) to fail(?P<rest>.*)")


def summary_line(record: Mapping, line: int | None) -> str:
    """The message pytest's short summary shows after ``FAILED <node id> -``, cut to the
    terminal's width: the failing check first, then its step, bucket and the scenario's line
    (the node id names the file), then the check's summary."""
    where = f"line {line or 1}"
    first = first_failure(record)
    if first is not None:
        at = "".join(f", {name} {value}" for name, value in (("step", first.step), ("bucket", first.bucket))
                     if value is not None)
        return f"{first.check} failed ({where}{at}): {first.summary}"
    verdict = str(record.get("verdict") or "")
    unexpected = _UNEXPECTED_PASS.fullmatch(verdict)
    if unexpected:  # a known-bad item whose check did not fail: name the check first
        return f"{unexpected['checks']} did not fail ({where}): known-bad scenario passed{unexpected['rest']}"
    return f"{where}: {verdict}"


class _Lines(Protocol):
    """What a failure block is written to: pytest's terminal writer (private to pytest)."""

    def line(self, s: str) -> None: ...


@dataclass(frozen=True)
class CrashLine:
    """What pytest reads as a failure's one-line message (``longrepr.reprcrash.message``)."""

    message: str


class FailureRepr:
    """A scenario item's failure as pytest shows it: the whole block in the failures section
    (and in junit and pytest-html), :func:`summary_line` in the short summary."""

    def __init__(self, text: str, summary: str) -> None:
        self.text = text
        self.reprcrash = CrashLine(summary)

    def toterminal(self, tw: _Lines) -> None:
        for line in self.text.splitlines():
            tw.line(line)

    def __str__(self) -> str:
        return self.text


def known_bad_line(sources: Iterable[str]) -> str:
    """One line for every known-bad item that failed exactly as its file expects (they are
    expected: a line each would bury the lines that need reading)."""
    sources = list(sources)
    folders: dict[str, int] = {}
    for source in sources:
        folder = str(PurePosixPath(source.rpartition(":")[0] or source).parent)
        folders[folder] = folders.get(folder, 0) + 1
    where = ", ".join(f"{folder}: {n}" for folder, n in sorted(folders.items()))
    return (f"XFAIL [{len(sources)}] known-bad scenario items failed exactly the checks their files name "
            f"({where}); -vv lists each")
