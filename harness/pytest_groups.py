"""pytest glue for a suite split over runners: pytest-split's ``--splits N --group i``.

pytest-split picks the group's items; this module only makes its choice reproducible and
checkable afterwards:

* the harness splits with pytest-split's ``least_duration`` unless the run names an algorithm:
  it balances groups best, and it does not depend on the order items arrive in (its default,
  ``duration_based_chunks``, cuts the collection order into runs, and that order differs with
  and without pytest-xdist, so "group 2" would not be the same items in both);
* the run record says which group of which split ran (:func:`split_info`): the items collected
  before the split, the group's own, the algorithm and a digest of the durations file. That is
  what ``graph-harness merge`` checks the groups against, so a missing group, an item run twice
  or groups of different collections are named, not silently merged.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.plain import JsonObject

__all__ = ["DEFAULT_ALGORITHM", "RECORDER_NAME", "SplitRecorder", "register", "split_active", "split_info"]

#: pytest-split's algorithm when a run names none (see the module's docstring).
DEFAULT_ALGORITHM = "least_duration"
_ALGORITHM_OPTION = "--splitting-algorithm"
#: The key of the split a pytest-xdist worker saw, in its ``workeroutput`` for the controller.
WORKER_OUTPUT_KEY = "graph_harness_split"
RECORDER_NAME = "graph-harness-split"


def split_active(config: pytest.Config) -> bool:
    """Whether this run is one group of a pytest-split split (pytest-split installed, and
    both of its options given)."""
    return bool(getattr(config.option, "splits", None) and getattr(config.option, "group", None))


def _names_algorithm(config: pytest.Config) -> bool:
    args = [*config.invocation_params.args, *os.environ.get("PYTEST_ADDOPTS", "").split()]
    try:
        args += list(config.getini("addopts"))
    except (ValueError, KeyError):
        pass
    return any(str(arg).startswith(_ALGORITHM_OPTION) for arg in args)


def register(pluginmanager: pytest.PytestPluginManager, is_scenario: Callable[[pytest.Item], bool]) -> None:
    """At ``pytest_addoption``, before any plugin's ``pytest_configure``: the recorder goes in
    before pytest-split's own plugin (which its ``pytest_configure`` registers), so that of the
    two ``trylast`` collection hooks pluggy calls the recorder's first (a ``trylast`` impl
    registered earlier runs earlier): it sees the items after every other selection (``-m``,
    ``-k``, ``--lf``) and before the split."""
    pluginmanager.register(SplitRecorder(is_scenario), RECORDER_NAME)


class SplitRecorder:
    """The scenario items before and after the split (in an xdist worker, sent to the
    controller in ``workeroutput``; the controller keeps the first worker's: every worker
    collects and splits alike, as pytest-xdist requires)."""

    def __init__(self, is_scenario: Callable[[pytest.Item], bool]) -> None:
        self.is_scenario = is_scenario
        self.active = False
        self.collected: list[str] | None = None
        self.selected: list[str] | None = None

    def pytest_configure(self, config: pytest.Config) -> None:
        self.config = config
        self.active = split_active(config)
        if self.active and not _names_algorithm(config):
            config.option.splitting_algorithm = DEFAULT_ALGORITHM

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        if self.active:
            self.collected = [item.nodeid for item in items if self.is_scenario(item)]

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if not self.active:
            return
        self.selected = [item.nodeid for item in session.items if self.is_scenario(item)]
        workeroutput = getattr(self.config, "workeroutput", None)
        if workeroutput is not None:
            workeroutput[WORKER_OUTPUT_KEY] = {"collected": self.collected, "selected": self.selected}

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: object, error: object) -> None:
        seen = (getattr(node, "workeroutput", None) or {}).get(WORKER_OUTPUT_KEY)
        if self.active and seen and self.selected is None:
            self.collected, self.selected = seen["collected"], seen["selected"]


def _durations(config: pytest.Config) -> JsonObject:
    path = Path(str(getattr(config.option, "durations_path", "") or ".test_durations"))
    try:
        data = path.read_bytes()
    except OSError:
        return {"path": str(path), "found": False}
    try:
        shown = path.resolve().relative_to(Path(config.rootpath).resolve()).as_posix()
    except ValueError:
        shown = str(path)
    return {"path": shown, "found": True, "sha256": hashlib.sha256(data).hexdigest()}


def split_info(config: pytest.Config) -> JsonObject | None:
    """The run record's ``split``: which group of which split this run was, or None."""
    recorder = config.pluginmanager.get_plugin(RECORDER_NAME)
    if not isinstance(recorder, SplitRecorder) or not recorder.active:
        return None
    return {
        "splits": config.option.splits,
        "group": config.option.group,
        "algorithm": config.option.splitting_algorithm,
        "durations": _durations(config),
        "collected": recorder.collected or [],
        "selected": recorder.selected or [],
    }
