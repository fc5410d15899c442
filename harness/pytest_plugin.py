"""pytest glue: YAML scenario files become items; results become reports.

Kept thin on purpose (the domain lives in :mod:`harness.session`): this module maps files to
items, command-line options to run settings, item results to pytest outcomes (known-bad
scenarios that fail as expected are ``xfailed``), and records to the JSON results file, the
junitxml properties and the pytest-html extras.
"""

from __future__ import annotations

import errno
import fnmatch
import gc
import os
import time
from pathlib import Path
from typing import Any

import pytest

from harness.collection import Resolution, collect_points, parse_modes
from harness import pytest_groups, pytest_matrix
from harness.plain import JsonObject
from harness.pytest_terminal import TerminalGlue, scenario_skip_location
from harness.engine import BACKENDS
from harness.engine import resolve as resolve_backend
from harness.report.record import report_record
from harness.report.results import EVIDENCE_CHOICES, attach_record, item_record, metrics, write_results
from harness.scenario import GRAPH_MODES, ScenarioError, ScenarioPoint, locate
from harness.stacks import DEFAULT_STACK, stack_names

SCENARIO_FILES_INI = "scenario_files"
#: The YAML files collected when pytest walks a directory: those under a folder named scenarios.
DEFAULT_SCENARIO_FILES = ["scenarios/*.yaml", "scenarios/*.yml"]
_results_key = pytest.StashKey[list]()
_report_errors_key = pytest.StashKey[list]()
_title_key = pytest.StashKey[str]()
DEFAULT_RESULTS_JSON = os.path.join("reports", "graph-harness-results.json")


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    pytest_groups.register(pluginmanager, lambda item: isinstance(item, ScenarioItem))
    group = parser.getgroup("graph-harness", "graph-mode scenarios")
    group.addoption("--mode", default=None,
                    help=f"graph mode(s) to run, comma separated ({', '.join(GRAPH_MODES)}); intersects "
                         "with a scenario's own mode axis, expands scenarios that name no mode")
    group.addoption("--backend", default="auto", choices=BACKENDS,
                    help="capture/replay engine: auto (npu, else cuda, else the CPU emulator)")
    group.addoption("--fia-contract", default=None, choices=("strict", "relaxed"),
                    help="override every scenario's FIA host contract")
    group.addoption("--results-json", default=None, metavar="PATH",
                    help=f"JSON results file (default {DEFAULT_RESULTS_JSON} when scenarios run)")
    group.addoption("--report-evidence", default="failures", choices=EVIDENCE_CHOICES,
                    help="per-step dispatch, texts and evidence tables in the JSON and HTML reports: for "
                         "failing and known-bad items (failures, the default; passing items keep verdict, "
                         "check summaries and metrics) or for every item (all)")
    group.addoption("--stack", default=None, choices=stack_names(),
                    help=f"the release every scenario that names no `stack:` models (default {DEFAULT_STACK}, "
                         "the newest); a scenario's own stack is kept: its expect was written for it")
    pytest_matrix.add_options(group)
    group.addoption("--replay-results", default=None, metavar="PATH",
                    help="run no scenario: rebuild the reports (--html, --junitxml) of the results file at PATH "
                         "(what graph-harness merge does for the groups of a split run)")
    parser.addini(SCENARIO_FILES_INI, type="args", default=DEFAULT_SCENARIO_FILES,
                  help="glob patterns of the YAML files collected as scenarios when a directory is "
                       "walked (a file named on the command line always is); a pattern with a '/' "
                       "matches the path below the rootdir, '*' matching '/' too; default: "
                       + " ".join(DEFAULT_SCENARIO_FILES))


def selected_modes(config: pytest.Config) -> list[str] | None:
    try:
        return parse_modes(config.getoption("--mode"))
    except ValueError as error:
        raise pytest.UsageError(f"--mode={config.getoption('--mode')}: {error}") from None


def pytest_configure(config: pytest.Config) -> None:
    for mode in GRAPH_MODES:
        config.addinivalue_line("markers", f"{mode.lower()}: scenario items running in graph mode {mode}")
    from harness.features import registry

    for name, cls in registry().items():  # every feature's marker, plugins' included
        if cls.marker:
            config.addinivalue_line("markers", f"{name}: scenario items using {cls.marker}")
    config.addinivalue_line("markers", "known_bad: scenarios built to fail the named checks")
    pytest_matrix.register_markers(config)
    selected_modes(config)  # a bad --mode is a usage error before collection
    # One bad scenario file is a collection error for that file only; the rest still runs.
    config.option.continue_on_collection_errors = True
    replaying = bool(config.getoption("--replay-results"))
    if replaying:
        from harness.report import replay

        replay.configure(config)
    runs_items = _runs_items(config) and not replaying
    if runs_items:
        import torch

        # One intra-op thread, with or without -n: the harness's ops are tiny, and on a loaded
        # machine every multi-threaded op waits milliseconds for its threads (profiled: a 15 us
        # bmm took 5 to 10 ms with 2 threads). Replay and eager share the process, so equality
        # is unaffected.
        torch.set_num_threads(1)
    config.stash[_results_key] = []
    config.pluginmanager.register(ResultsCollector(config), "graph-harness-results")
    config.pluginmanager.register(TerminalGlue(config), "graph-harness-terminal")
    config.stash[_title_key] = title = "" if hasattr(config, "workerinput") else _title(config)
    if config.pluginmanager.hasplugin("html") and not hasattr(config, "workerinput"):  # where the page is written
        from harness.report.html_hooks import COLLAPSED, HtmlReport

        # Only failed rows start open, unless the run set pytest-html's render_collapsed itself.
        collapsed = COLLAPSED if config.getini("render_collapsed") == "passed" else ""
        config.pluginmanager.register(HtmlReport(config.stash[_results_key], preload_charts=not runs_items,
                                                 title=title, collapsed=collapsed), "graph-harness-html")
    if not replaying:  # a replay's table describes the run it replays (harness.report.replay)
        _describe_environment(config)


def _title(config: pytest.Config) -> str:
    """The report page's title: what ran, in which modes, and which group of a split."""
    from harness.report.suite import report_title

    if config.getoption("--replay-results"):
        from harness.report import replay

        return replay.title(config)
    title = report_title([str(arg) for arg in config.args], selected_modes(config), str(config.invocation_params.dir))
    if pytest_groups.split_active(config):
        title += f" (group {config.option.group} of {config.option.splits})"
    return title


def _runs_items(config: pytest.Config) -> bool:
    """False in an xdist controller: it only hands items to its workers, and so never needs
    torch (importing it there would hold back the start of every worker by seconds)."""
    return hasattr(config, "workerinput") or getattr(config.option, "dist", "no") == "no"


def _describe_environment(config: pytest.Config) -> None:
    """torch, harness version and backend in pytest-html's Environment table (torch not imported)."""
    try:
        from pytest_metadata.plugin import metadata_key
    except ImportError:
        return
    import harness
    from harness.engine import resolve
    from harness.report.run_info import torch_version

    table = config.stash.get(metadata_key, None)
    if table is not None:
        table.update({"graph-harness": harness.__version__, "torch": torch_version(),
                      "backend": resolve(config.getoption("--backend"))})


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """An xdist worker is about to exit, and the controller waits for it: freeze the heap so
    that the interpreter's own collections at exit skip it (measured: a process that imported
    torch takes 0.5 to 1 s to finalize, 0.15 s frozen). Only in a worker: its session ends
    with the process, where a pytester run's ends inside a longer-lived one."""
    if hasattr(config, "workerinput"):
        gc.freeze()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if hasattr(config, "workerinput"):  # every xdist worker orders alike, as xdist requires
        pytest_matrix.slow_first(items)


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    # A YAML file named on the command line is a scenario wherever it lives; one found under a
    # directory is a scenario when it matches the `scenario_files` patterns.
    if file_path.suffix not in (".yaml", ".yml"):
        return None
    if parent.session.isinitpath(file_path) or matches_scenario_files(
            file_path, parent.config.getini(SCENARIO_FILES_INI), parent.config.rootpath):
        return ScenarioFile.from_parent(parent, path=file_path)
    return None


def matches_scenario_files(path: Path, patterns: list[str], root: Path) -> bool:
    """Whether ``path`` matches one of the ``scenario_files`` patterns, as pytest matches
    ``python_files``: a pattern with a ``/`` against the path (relative to the root, or
    anywhere below a directory: ``scenarios/*.yaml`` matches ``a/scenarios/b/c.yaml``, since
    ``*`` also matches ``/``), a pattern without one against the file name."""
    try:
        relative = path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        relative = path.as_posix()
    for pattern in patterns:
        if "/" not in pattern:
            if fnmatch.fnmatchcase(path.name, pattern):
                return True
        elif fnmatch.fnmatchcase(relative, pattern) or fnmatch.fnmatchcase(relative, f"*/{pattern}"):
            return True
    return False


class ScenarioFile(pytest.File):
    """One YAML file: one item per matrix point (and per ``--mode`` if the file names none)."""

    def collect(self):
        modes = selected_modes(self.config)
        stack = self.config.getoption("--stack")
        chosen = pytest_matrix.combinations(self.config, self.path, modes, stack)
        backend = resolve_backend(self.config.getoption("--backend"))
        for suffix, point, resolution in collect_points(self.path, modes, combinations=chosen, stack=stack,
                                                         backend=backend,
                                                         fia_contract=self.config.getoption("--fia-contract")):
            name = f"{point.name}[{suffix}]" if suffix else point.name
            yield ScenarioItem.from_parent(self, name=name, point=point, resolution=resolution,
                                           **_node_id(self, point.name, suffix))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException]):  # type: ignore[override]
        if isinstance(excinfo.value, ScenarioError):
            return str(excinfo.value)  # file:line: field: message, nothing else
        return super().repr_failure(excinfo)


def _node_id(parent: pytest.Collector, name: str, params: str) -> JsonObject:
    """The id pytest itself would give a parametrized item (pytest >= 9.2 keeps node ids
    structured as name + params; an item named "x[id]" without them never matches the ids that
    --lf / --ff read back from the cache). Older pytest builds the string id from the name."""
    parent_id = getattr(parent, "id", None)
    if parent_id is None or not hasattr(parent_id, "with_params"):
        return {}
    return {"nodeid": parent_id.child(name).with_params(params or None)}


class ScenarioFailed(Exception):
    """The item's verdict was a failure; the message is the explanation."""


class ScenarioItem(pytest.Item):
    def __init__(self, *, point: ScenarioPoint, resolution: Resolution,
                 **kwargs: Any) -> None:  # pytest's from_parent keywords, for Item
        super().__init__(**kwargs)
        self.point = point
        self.resolution = resolution  # made at collection (the preflight): the run executes it
        scenario = point.scenario
        self.add_marker(scenario.graph.mode.lower())
        for feature in resolution.features:  # the enabled features, resolved (a skipped point's too)
            if feature.marker:
                self.add_marker(feature.name)
        if scenario.expect.outcome == "fail":
            self.add_marker("known_bad")
        pytest_matrix.mark_item(self, scenario)
        self.record: JsonObject | None = None

    def runtest(self) -> None:
        from harness.session import FAILED, SKIPPED, XFAILED, run_point

        backend = self.config.getoption("--backend")
        started = time.time()
        result = run_point(self.point, backend=backend, fia_contract=self.config.getoption("--fia-contract"),
                           stack=self.config.getoption("--stack"), resolution=self.resolution)
        self.record = item_record(result, nodeid=self.nodeid, started=started, root=self.config.rootpath,
                                  evidence=self.config.getoption("--report-evidence"))
        self.user_properties.extend(metrics(self.record))  # junit: the small metrics only
        if result.outcome == XFAILED:
            pytest.xfail(result.verdict)
        if result.outcome == SKIPPED:
            pytest.skip(result.verdict)
        if result.outcome == FAILED:
            raise ScenarioFailed(result.verdict)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException]):  # type: ignore[override]
        # A verdict (failed, or known-bad and failed as expected) is explained by the record;
        # pytest's traceback of the harness frames that raised it would explain nothing.
        where = f"{os.path.relpath(self.path, self.config.invocation_params.dir)}:{self.point.source.line or 1}"
        if isinstance(excinfo.value, pytest.fail.Exception) and str(excinfo.value).startswith("Timeout"):
            # pytest-timeout's alarm (timeout_s): it printed the stack it interrupted. pytest's own
            # traceback of that stack is noise, and crashes (an INTERNALERROR that ends the session)
            # when the alarm lands on an instruction without a line number (Python 3.11).
            return f"{where}: {excinfo.value} (the item's time limit: timeout_s)"
        if isinstance(excinfo.value, (ScenarioFailed, pytest.xfail.Exception)) and self.record:
            from harness.report.terminal import failure_text

            text = failure_text(self.record, where=where, path=str(self.path), locate=locate)
            if self.record.get("traceback"):
                text += "\n" + self.record["traceback"]
            return text
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, self.point.source.line - 1 if self.point.source.line else None, f"scenario {self.name}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    outcome = yield
    report = outcome.get_result()
    if call.when != "call" or not isinstance(item, ScenarioItem):
        return
    scenario_skip_location(report, item.path, item.point.source.line)
    if item.record is not None:
        attach_record(report, item.record)  # travels to the xdist controller with the report


class ResultsCollector:
    """Gathers every item's record (from any xdist worker) and writes the JSON results file."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.records: list[JsonObject] = config.stash[_results_key]
        self.run: JsonObject = {}

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        if not hasattr(self.config, "workerinput"):
            from harness.report.suite import add_suite_properties, run_info

            self.run = run_info(self.config, self.config.stash.get(_title_key, ""))
            add_suite_properties(self.config, self.run)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":
            return
        record = report_record(report)
        if record is not None:
            self.records.append(record)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if hasattr(self.config, "workerinput"):
            return  # the controller writes the results of all workers
        path = self.config.getoption("--results-json")
        if path is None and (not self.records or self.config.getoption("--replay-results")):
            return  # a replay writes a results file only where it is told to
        path = Path(path) if path else self.config.rootpath / DEFAULT_RESULTS_JSON
        from harness.report.suite import finish_run

        run = finish_run(self.run)
        split = pytest_groups.split_info(self.config)
        if split is not None:
            run["split"] = split
        try:
            if path.is_dir():
                raise IsADirectoryError(errno.EISDIR, "it is a directory")
            write_results(path, self.records, run)
        except OSError as error:  # the other reports (HTML, junit) must still be written
            reason = error.strerror or type(error).__name__
            self.config.stash.setdefault(_report_errors_key, []).append(
                f"graph-harness: cannot write the JSON results to {path}: {reason}")
            if session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        for line in self.config.stash.get(_report_errors_key, []):
            terminalreporter.write_line(line, red=True, bold=True)


def _report_paths(config: pytest.Config) -> list[tuple[str, str | None]]:
    """Where this run writes its HTML and JSON reports (as given, relative to the invocation)."""
    json_path = config.getoption("--results-json") or DEFAULT_RESULTS_JSON
    return [("HTML", getattr(config.option, "htmlpath", None)), ("JSON", json_path)]


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    if config.stash.get(_results_key, None):
        from harness.report.terminal import reports_line

        terminalreporter.write_sep("-", f"graph-harness {reports_line(_report_paths(config))}")


def pytest_report_header(config: pytest.Config) -> str:
    from harness.engine import resolve

    return (f"graph-harness: backend {resolve(config.getoption('--backend'))}, modes {selected_modes(config) or 'as declared'}, "
            f"stack {config.getoption('--stack') or DEFAULT_STACK}")
