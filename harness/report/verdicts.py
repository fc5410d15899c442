"""Two runs of the same items on two backends, verdict by verdict (``graph-harness verdicts``).

The emulator is the harness's model of the device; a device run is the device. Where they give
an item different verdicts (its outcome, or the set of checks that failed), either a rule of the
emulator is not the device's or the device (or the harness on it) has a bug, so every such item
is a difference, named in the table, and the command exits 1. One kind of disagreement is not:
an item the device run had to skip for a reason of the machine, not of the item: fewer devices
than the item's ranks (``needs N devices, found M``) or a stream budget on a device without a
graph stream pool. Those rows are listed with their reason and not counted.

Items are matched by their results-file key (node id with the graph mode), which names no
backend. Plain functions over the results files' JSON: no pytest, no torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from harness.plain import JsonObject

__all__ = ["DEVICE_REASONS", "Row", "compare", "compare_files", "device_reason", "differences", "render_markdown",
           "render_text"]

DEVICE_REASONS: tuple[tuple[str, re.Pattern[str]], ...] = (
    # harness.ranks.devices.too_few_devices: one device per rank
    ("too few devices", re.compile(r"needs \d+ devices, found \d+")),
    # harness.engine.cuda.reset_device: a stream budget where captures draw on no stream pool
    ("no graph stream pool", re.compile(r"no graph stream pool")),
)
"""The skip reasons that belong to the machine rather than to the item, by name."""


@dataclass(frozen=True)
class Row:
    """One item's verdicts in the two runs (``emulated``: the reference run, A; ``device``: B)."""

    item: str
    emulated: str
    device: str
    emulated_failed: tuple[str, ...]
    device_failed: tuple[str, ...]
    agree: bool
    device_verdict: str
    device_reason: str = ""
    """Where the two disagree only because one run skipped the item for a machine's reason:
    which reason (then the row is not counted as a difference)."""

    @property
    def differs(self) -> bool:
        return not self.agree and not self.device_reason


def device_reason(record: JsonObject) -> str:
    """The name of the machine's reason a skipped item gives (:data:`DEVICE_REASONS`), else ``""``."""
    if record.get("outcome") != "skipped":
        return ""
    verdict = str(record.get("verdict") or "")
    return next((name for name, pattern in DEVICE_REASONS if pattern.search(verdict)), "")


def _key(record: JsonObject, root: Path | None) -> str:
    """The results file's key; for records without one (hand-made, or older), file::id."""
    if record.get("key"):
        return str(record["key"])
    path = str(record.get("source", "")).rsplit(":", 1)[0]
    if root is not None:
        try:
            path = str(Path(path).resolve().relative_to(root))
        except ValueError:
            pass
    return f"{path}::{record.get('id') or record.get('name')}"


def compare(reference: JsonObject, other: JsonObject, root: Path | None = None) -> list[Row]:
    """Match the items of two results payloads; an item missing on one side is ``"missing"`` there."""
    left = {_key(i, root): i for i in reference.get("items", []) if isinstance(i, dict)}
    right = {_key(i, root): i for i in other.get("items", []) if isinstance(i, dict)}
    rows = []
    for key in sorted(set(left) | set(right)):
        a, b = left.get(key, {}), right.get(key, {})
        a_out, b_out = a.get("outcome", "missing"), b.get("outcome", "missing")
        a_failed = tuple(sorted(a.get("failed_checks") or ()))
        b_failed = tuple(sorted(b.get("failed_checks") or ()))
        agree = a_out == b_out and a_failed == b_failed
        reason = "" if agree else (device_reason(b) or device_reason(a))
        rows.append(Row(key, a_out, b_out, a_failed, b_failed, agree, str(b.get("verdict", ""))[:160], reason))
    return rows


def differences(rows: list[Row]) -> list[Row]:
    """The rows that count: different verdicts, not explained by a machine's skip reason."""
    return [r for r in rows if r.differs]


def _cell(outcome: str, failed: tuple[str, ...]) -> str:
    return outcome + (f" [{','.join(failed)}]" if failed else "")


def _mark(row: Row) -> str:
    if row.agree:
        return ""
    return f"skipped: {row.device_reason}" if row.device_reason else "DIFF"


def _summary(rows: list[Row], reference: str, device: str) -> str:
    excused = sum(1 for r in rows if r.device_reason)
    text = f"{len(rows)} item(s), {len(differences(rows))} differ between {reference} and {device}"
    return text + (f"; {excused} skipped for a device reason (not counted)" if excused else "")


def render_text(rows: list[Row], device_name: str, reference_name: str = "emulated") -> str:
    """The table as aligned text; a counted difference is marked ``DIFF``, a machine's skip
    ``skipped: <reason>``."""
    lines = [("item", reference_name, device_name, "")] + [
        (r.item, _cell(r.emulated, r.emulated_failed), _cell(r.device, r.device_failed), _mark(r)) for r in rows
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(3)]
    text = [f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c:<{widths[2]}}  {d}".rstrip() for a, b, c, d in lines]
    text.append(f"\n{_summary(rows, reference_name, device_name)}")
    return "\n".join(text)


def render_markdown(rows: list[Row], device_name: str, reference_name: str = "emulated") -> str:
    """Counted differences first, then the machine's skips (a CI step summary: the agreeing
    rows would drown them; their count is in the summary line)."""
    def md(text: str) -> str:
        return text.replace("|", "\\|")

    out = [f"## Verdicts: {md(reference_name)} vs {md(device_name)}", "", _summary(rows, reference_name, device_name),
           ""]
    shown = [r for r in rows if not r.agree]
    if shown:
        out += [f"| item | {md(reference_name)} | {md(device_name)} | |", "|---|---|---|---|"]
        out += [f"| `{md(r.item)}` | {md(_cell(r.emulated, r.emulated_failed))} | "
                f"{md(_cell(r.device, r.device_failed))} | {md(_mark(r))} |"
                for r in sorted(shown, key=lambda r: (not r.differs, r.item))]
    return "\n".join(out) + "\n"


def _backend(payload: JsonObject, fallback: str) -> str:
    given = payload.get("environment")
    environment = given if isinstance(given, dict) else {}
    return str(environment.get("backend") or fallback)


def compare_files(reference: str | Path, other: str | Path) -> tuple[list[Row], str, str]:
    """Rows of two results files and the names of their columns (each run's backend; the file
    names where both ran on one backend). Raises :class:`harness.report.diff.ResultsFileError`
    naming a file that cannot be read."""
    from harness.report.diff import load_results

    a, b = load_results(reference), load_results(other)
    names = _backend(a, Path(reference).stem), _backend(b, Path(other).stem)
    if names[0] == names[1]:
        names = (f"{Path(reference).name} ({names[0]})", f"{Path(other).name} ({names[1]})")
    return compare(a, b), names[0], names[1]
