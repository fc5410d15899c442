"""pytest glue for what a scenario run prints: failure lines, skip locations, known-bad items.

Kept apart from :mod:`harness.pytest_plugin` (which only registers it); the words themselves
come from :mod:`harness.report.terminal`. What it changes in pytest's terminal output:

* a failed scenario item's short-summary line (``FAILED <node id> - ...``) gives the failing
  check, then its line in the file, step and bucket, where pytest cut the repeated file path
  before (:class:`~harness.report.terminal.FailureRepr`); its failure block keeps the whole
  explanation;
* a skipped scenario item points at its scenario file and line, not at the harness line that
  called ``pytest.skip``;
* known-bad items that failed exactly as their files expect are one ``XFAIL [N]`` line of the
  short summary (``-vv`` lists each); other xfails keep their lines;
* failure blocks do not repeat pytest-xdist's ``[gw0] linux -- Python ...`` line.
"""

from __future__ import annotations


import pytest

from harness.report.record import report_record
from harness.report.terminal import FailureRepr, known_bad_line, summary_line

__all__ = ["TerminalGlue", "scenario_skip_location"]


def _line_of(source: str) -> int | None:
    line = str(source).rpartition(":")[2]
    return int(line) if line.isdigit() else None


def scenario_skip_location(report: pytest.TestReport, path: object, line: int | None) -> None:
    """Point a skipped scenario item's report at its scenario file (``path``, 1-based ``line``)."""
    longrepr = report.longrepr
    if report.skipped and not hasattr(report, "wasxfail") and isinstance(longrepr, tuple) and len(longrepr) == 3:
        report.longrepr = (str(path), line or 1, longrepr[2])


class TerminalGlue:
    """Registered on every process; acts where the terminal is written (not in xdist workers)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # In a worker the report is about to be serialised (a failure's text travels as a
        # string); the process that writes the terminal, junit and HTML wraps it here.
        if hasattr(self.config, "workerinput") or not (report.failed and report.when == "call"):
            return
        record = report_record(report)
        if record is not None and isinstance(report.longrepr, str):
            report.longrepr = FailureRepr(  # type: ignore[assignment]  # duck-typed: pytest reads toterminal, reprcrash
                report.longrepr, summary_line(record, _line_of(record.get("source", ""))))

    @pytest.hookimpl(wrapper=True, tryfirst=True)  # around the terminal reporter's own summary
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter):
        stats = terminalreporter.stats
        for key in ("failed", "error"):
            for report in stats.get(key, []):
                if hasattr(report, "node"):  # xdist's worker line, printed at the top of each block
                    del report.node
        xfailed = list(stats.get("xfailed", []))
        folded = []
        if "x" in terminalreporter.reportchars and self.config.option.verbose < 2:
            folded = [r for r in xfailed if r.when == "call" and report_record(r) is not None]
            stats["xfailed"] = [r for r in xfailed if r not in folded]
        try:
            return (yield)
        finally:
            if folded:
                stats["xfailed"] = xfailed
                if not _short_summary_written(terminalreporter, folded):
                    terminalreporter.write_sep("=", "short test summary info", cyan=True, bold=True)
                line = known_bad_line(str((report_record(r) or {}).get("source") or r.nodeid) for r in folded)
                terminalreporter.write_line(line, yellow=True)


def _short_summary_written(terminalreporter: pytest.TerminalReporter, folded: list) -> bool:
    """Whether pytest wrote its short-summary header: it does when any report character it was
    asked for had a report (the folded known-bad items taken out)."""
    stats = terminalreporter.stats
    kinds = {"f": "failed", "E": "error", "s": "skipped", "X": "xpassed", "p": "passed"}
    if any(stats.get(kinds[c]) for c in terminalreporter.reportchars if c in kinds):
        return True
    return "x" in terminalreporter.reportchars and len(stats.get("xfailed", [])) > len(folded)
