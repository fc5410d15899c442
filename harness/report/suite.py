"""The run's own record (command line, times, commit, environment) and junit's suite properties.

Kept out of the pytest plugin so that the plugin stays a list of hook calls: the controller
(or a run without xdist) starts the run record at session start, adds the suite-level junit
properties then (junit writes its file at session end), and finishes the record when it
writes the results file.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from harness.plain import JsonObject
from harness.report.results import SCHEMA_VERSION, iso_time
from harness.report.run_info import environment, git_commit, suite_properties

if TYPE_CHECKING:
    import pytest


#: The harness's options that decide what an item is and how it is judged: groups of one split
#: (``graph-harness merge``) must agree on every one.
RUN_OPTIONS = ("--backend", "--stack", "--mode", "--matrix", "--fia-contract", "--report-evidence")


def report_title(args: list[str], modes: list[str] | None = None, cwd: str | None = None) -> str:
    """The page's title says what ran: ``graph-harness: tests, scenarios`` for the whole test
    suite, ``graph-harness: scenarios (FULL)`` for the scenario library in one mode (``args``:
    what pytest collected from, relative to ``cwd`` where they lie below it)."""
    cwd = cwd or os.getcwd()
    names = []
    for arg in args:
        path, sep, rest = str(arg).partition("::")
        relative = os.path.relpath(path, cwd) if os.path.isabs(path) else path
        if relative.startswith(".."):
            relative = path
        names.append((os.path.basename(os.path.abspath(path)) if relative == "." else relative) + sep + rest)
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return f"graph-harness: {shown or 'run'}" + (f" ({', '.join(modes)})" if modes else "")


def run_info(config: pytest.Config, title: str = "") -> JsonObject:
    """The run record at its start, for a pytest ``config``; ``title`` is the report page's."""
    root = Path(config.rootpath)
    started = time.time()
    return {
        "schema": SCHEMA_VERSION,
        "command": [Path(sys.argv[0]).name, *map(str, config.invocation_params.args)],
        "cwd": _relative(Path(config.invocation_params.dir), root),
        "root": root.name,
        "title": title,
        "started": iso_time(started),
        "_started": started,
        **git_commit(root),
        "options": _options(config),
        "environment": _environment(config.getoption("--backend")),
    }


def _options(config: pytest.Config) -> JsonObject:
    from harness.stacks import DEFAULT_STACK

    options: JsonObject = {name.lstrip("-").replace("-", "_"): config.getoption(name) for name in RUN_OPTIONS}
    options["stack"] = options["stack"] or DEFAULT_STACK  # no --stack models the default one
    return options


def _environment(backend: str) -> JsonObject:
    try:
        return environment(backend)
    except Exception as error:  # noqa: BLE001 - a bad backend fails the items, not the run record
        return {"backend": backend, "error": f"{type(error).__name__}: {error}"}


def _relative(path: Path, root: Path) -> str:
    try:
        return path.resolve().relative_to(root.resolve()).as_posix() or "."
    except ValueError:
        return str(path)


def finish_run(run: JsonObject) -> JsonObject:
    finished = time.time()
    done = {key: value for key, value in run.items() if not key.startswith("_")}
    done["finished"] = iso_time(finished)
    if "_started" in run:
        done["duration"] = round(finished - run["_started"], 3)
    return done


def add_suite_properties(config: pytest.Config, run: JsonObject) -> None:
    """Commit, device, backend and versions as junit ``<testsuite>`` properties, when junit is on.

    pytest's ``record_testsuite_property`` fixture does exactly this for Python tests; YAML
    items have no fixtures, so the same LogXML object is reached through the stash key the
    fixture itself uses."""
    try:
        from _pytest.junitxml import xml_key
    except ImportError:  # a pytest without it: the per-item properties still carry the backend
        return
    xml = config.stash.get(xml_key, None)
    if xml is None:
        return
    for name, value in suite_properties(run):
        xml.add_global_property(name, value)
