"""pytest glue: the reports of a results file, rebuilt without running a scenario.

``pytest --replay-results=PATH --html=PAGE`` (what ``graph-harness merge --html`` runs) turns
every record of a results file back into a pytest item whose report is the one the real run
made: the same node id, outcome (a known-bad item ``xfailed``, a skipped one skipped with its
reason), duration, failure text and record. pytest-html, junitxml and the harness's own page
hooks then write their reports from those reports exactly as they do during a run, so a merged
nightly's page has the grid, charts, filters and fragments of an unsplit one: it is the same
code that draws it, not a copy of it.

Registered by :mod:`harness.pytest_plugin` when ``--replay-results`` is given; nothing else
is collected then.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from harness.plain import JsonObject
from harness.report.diff import ResultsFileError, load_results
from harness.report.results import attach_record

__all__ = ["configure", "rebuild_reports", "title"]

_data_key = pytest.StashKey[JsonObject]()


def rebuild_reports(results: Path, *, html: str | None = None, junitxml: str | None = None) -> int:
    """Write the HTML page and/or junit file of ``results`` through pytest: 0 when written.

    A process of its own (pytest's plugins keep state per process), with the project's
    ``addopts`` cleared and no conftest read: a replay has nothing to distribute or select, and
    the conftests around the results file are not the run's. Its exit status 1 only
    says the run had failed items, which the reports show."""
    command = [sys.executable, "-m", "pytest", f"--replay-results={results}", "-p", "harness.pytest_plugin",
               "-p", "no:cacheprovider", "-o", "addopts=", "--noconftest", "-q", "--no-header"]
    if html:
        command += [f"--html={html}", "--self-contained-html"]
    if junitxml:
        command += [f"--junitxml={junitxml}"]
    done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
    if done.returncode in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED, pytest.ExitCode.NO_TESTS_COLLECTED):
        return 0
    sys.stderr.write(done.stderr)
    return int(done.returncode) or 1


def configure(config: pytest.Config) -> None:
    """Read the results file (a bad one is a usage error, said in one line) and collect it alone."""
    path = Path(config.getoption("--replay-results"))
    try:
        data = load_results(path)
    except ResultsFileError as error:
        raise pytest.UsageError(f"--replay-results: {error}") from None
    config.stash[_data_key] = data
    config.args = [str(path)]  # collect the results file, never the testpaths
    config.pluginmanager.register(_Replay(path.resolve(), data), "graph-harness-replay")
    _describe(config, data.get("run") or {})


def title(config: pytest.Config) -> str:
    """The page title the results file's run had (a merged run says how many groups)."""
    run = config.stash[_data_key].get("run") or {}
    return str(run.get("title") or f"graph-harness: {Path(config.getoption('--replay-results')).name}")


def _describe(config: pytest.Config, run: JsonObject) -> None:
    """Where the results came from, in pytest-html's Environment table (the replay's own
    machine is of no interest)."""
    try:
        from pytest_metadata.plugin import metadata_key
    except ImportError:
        return
    table = config.stash.get(metadata_key, None)
    if table is None:
        return
    table.clear()
    environment = run.get("environment") or {}
    table.update({key: str(value) for key, value in environment.items()})
    if run.get("commit"):
        table["commit"] = f"{run['commit']}{' (dirty)' if run.get('dirty') else ''}"
    if run.get("command"):
        table["command"] = " ".join(map(str, run["command"]))
    for group in run.get("groups") or []:
        table[f"group {group.get('group', '?')}"] = (f"{group.get('items')} items, {group.get('duration')} s, "
                                                     f"from {group.get('path')}")


class _Replay:
    def __init__(self, path: Path, data: JsonObject) -> None:
        self.path = path
        self.data = data

    @pytest.hookimpl(trylast=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        # pytest-html's "N tests took T" times the session that writes the page; a replay's would
        # say seconds. Its start moved back by the run's own duration says the run's (wall, from
        # the first group's start to the last one's end).
        duration = (self.data.get("run") or {}).get("duration")
        page = next((p for p in session.config.pluginmanager.get_plugins() if hasattr(p, "_suite_start_time")), None)
        if isinstance(duration, (int, float)) and page is not None:
            page._suite_start_time = time.time() - float(duration)

    def pytest_collect_file(self, file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
        if file_path.resolve() == self.path:
            return _ResultsFile.from_parent(parent, path=file_path, records=self.data.get("items") or [])
        return None

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
        outcome = yield
        report = outcome.get_result()
        if isinstance(item, _ReplayedItem):
            report.duration = float(item.record.get("duration") or 0.0) if call.when == "call" else 0.0
            if call.when == "call":
                attach_record(report, item.record)


class _ResultsFile(pytest.File):
    def __init__(self, *, records: list[JsonObject], **kwargs: Any) -> None:  # pytest's from_parent keywords
        super().__init__(**kwargs)
        self.records = records

    def collect(self):  # type: ignore[no-untyped-def]
        for record in self.records:
            nodeid = str(record.get("nodeid") or record.get("key") or "")
            name = nodeid.rpartition("::")[2] or str(record.get("name") or "item")
            yield _ReplayedItem.from_parent(self, name=name, nodeid=nodeid, record=record)


class _Replayed(Exception):
    """The item failed in the run that wrote the record."""


class _ReplayedItem(pytest.Item):
    def __init__(self, *, record: JsonObject, **kwargs: Any) -> None:  # pytest's from_parent keywords
        super().__init__(**kwargs)
        self.record = record
        mode = record.get("mode")
        if isinstance(mode, str) and mode:
            self.add_marker(mode.lower())

    def runtest(self) -> None:
        outcome = self.record.get("outcome")
        verdict = str(self.record.get("verdict") or "")
        if outcome == "xfailed":
            pytest.xfail(verdict)
        if outcome == "skipped":
            pytest.skip(verdict)
        if outcome not in ("passed", "xfailed", "skipped"):
            raise _Replayed(verdict)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException]):  # type: ignore[override]
        from harness.report.terminal import failure_text

        text = failure_text(self.record, where=str(self.record.get("source") or self.nodeid))
        if self.record.get("traceback"):
            text += "\n" + str(self.record["traceback"])
        return text

    def reportinfo(self):  # type: ignore[no-untyped-def]
        source = str(self.record.get("source") or "")
        path, _, line = source.rpartition(":")
        return (path or source), (int(line) - 1 if line.isdigit() and int(line) > 0 else None), \
            f"scenario {self.name}"
