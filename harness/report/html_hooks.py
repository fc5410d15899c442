"""pytest-html glue: the added table columns, the page summary, and each item's fragment.

Registered by :mod:`harness.pytest_plugin` only when pytest-html is installed. The fragment of
an item is rendered from its record by the process that writes the page, as the item's report
arrives (an xdist controller, which otherwise only waits for its workers, and which imports
matplotlib for the page's charts anyway: a worker that drew a known-bad item's charts paid that
import too, a third of a second each); pytest-html's own per-item data gets none of
it, only the fragment's key on the row's Mode cell, and the page carries every fragment once,
in one compressed store that the page's script opens when a row is opened
(:func:`harness.report.html.render_fragments`). That keeps pytest-html's table, which it
rebuilds on every sort, filter and click, small. A passed item's log ("No log output
captured", or what a passing test printed) and a skipped scenario item's (its reason, which
the fragment says) are left out of pytest-html's data.
"""

from __future__ import annotations

import html as html_escape
import threading
from typing import Protocol

import pytest

from harness.plain import JsonObject
from harness.report.html import (COLLAPSED, TABLE_COLUMNS, item_key, render_fragments, render_item, render_page,
                                 row_values)
from harness.report.record import report_record
from harness.report.suite import report_title

__all__ = ["HtmlReport", "FRAGMENT_KEY", "attach_fragment", "report_title"]

#: The test-report attribute that holds an item's rendered fragment, once rendered.
FRAGMENT_KEY = "graph_harness_html"


def attach_fragment(report: pytest.TestReport, record: JsonObject) -> None:
    """Render the item's fragment onto its report (read back by the row and page hooks)."""
    key = item_key(report.nodeid)
    try:
        fragment = render_item(record, salt=key)
    except Exception as error:  # noqa: BLE001 - a rendering bug must not lose the result
        fragment = f"<pre>graph-harness could not render this item: {html_escape.escape(repr(error))}</pre>"
    setattr(report, FRAGMENT_KEY, fragment)


class _Page(Protocol):
    """pytest-html's page data (``ReportData``, untyped): the title is what the hook sets."""

    title: str


def _sort_key(text: str) -> str:
    """A hidden prefix that makes pytest-html's string sort order numbers by value."""
    return f'<span hidden>{int(text):08d}</span>' if text.isdigit() else ""


class HtmlReport:
    """pytest-html hooks; collects the fragments on the process that writes the report."""

    def __init__(self, records: list[JsonObject], *, preload_charts: bool = False,
                 title: str = "graph-harness", collapsed: str = COLLAPSED) -> None:
        self.title = title
        self.collapsed = collapsed  # rows pytest-html starts collapsed (see render_page)
        self.records = records  # the results collector's list: every item's record, any worker
        self.fragments: dict[str, str] = {}
        self.media = False  # whether any test attached an image or a video (pytest-html extras)
        self.preload_charts = preload_charts

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        # An xdist controller waits while its workers run the items, then draws the summary
        # charts: matplotlib's import (about a second) is done in that wait, not after it.
        if self.preload_charts:
            from harness.report import charts

            threading.Thread(target=charts.preload, name="graph-harness-charts", daemon=True).start()

    @pytest.hookimpl(tryfirst=True)  # before pytest-html's, which builds the row from the report
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        record = report_record(report) if report.when == "call" else None
        if record is not None:
            attach_fragment(report, record)
            self.fragments[item_key(report.nodeid)] = getattr(report, FRAGMENT_KEY)
        extras = getattr(report, "extras", None) or []
        self.media = self.media or any(isinstance(e, dict) and e.get("format_type") in ("image", "video")
                                       for e in extras)

    @pytest.hookimpl(optionalhook=True)
    def pytest_html_report_title(self, report: _Page) -> None:
        report.title = self.title

    @pytest.hookimpl(optionalhook=True)
    def pytest_html_results_table_header(self, cells: list[str]) -> None:
        added = [f'<th class="sortable" data-column-type="{column}">{title}</th>' for column, title in TABLE_COLUMNS]
        cells[2:2] = added  # after Result and Test, before Duration and Links

    @pytest.hookimpl(optionalhook=True)
    def pytest_html_results_table_row(self, report: pytest.TestReport, cells: list[str]) -> None:
        call = getattr(report, "when", None) == "call"
        values = row_values(report_record(report) if call else None)
        # The key of the item's fragment, read by the page's script when the row is opened.
        has_fragment = call and isinstance(getattr(report, FRAGMENT_KEY, None), str)
        key = f' data-gh="{item_key(report.nodeid)}"' if has_fragment else ""
        added = []
        for column, _ in TABLE_COLUMNS:
            text = html_escape.escape(values[column])
            prefix = _sort_key(values[column]) if column in ("step", "bucket") else ""
            attribute = key if column == "mode" else ""
            added.append(f'<td class="col-{column}"{attribute}>{prefix}{text}</td>')
        cells[2:2] = added

    @pytest.hookimpl(optionalhook=True)
    def pytest_html_results_table_html(self, report: pytest.TestReport, data: list[str]) -> None:
        # A passed item's log says nothing (usually "No log output captured"); a skipped
        # scenario item's is its skip reason, which its fragment's verdict says already. Then
        # the row's details are the fragment alone (pytest-html drops an empty log).
        if getattr(report, "when", None) != "call" or hasattr(report, "wasxfail"):
            return
        if report.passed or (report.skipped and isinstance(getattr(report, FRAGMENT_KEY, None), str)):
            data.clear()

    @pytest.hookimpl(optionalhook=True)
    def pytest_html_results_summary(self, prefix: list[str], summary: list[str], postfix: list[str],
                                    session: pytest.Session) -> None:
        # A rendering bug must not cost the report that pytest-html is about to write.
        try:
            if self.records or self.fragments:
                prefix.append(render_page(self.records, media=self.media, collapsed=self.collapsed))
        except Exception as error:  # noqa: BLE001
            prefix.append(f"<p>graph-harness could not render the summary: {html_escape.escape(repr(error))}</p>")
        if self.fragments:
            postfix.append(render_fragments(self.fragments))
