"""Run one scenario point end to end: resolve it, execute it on its ranks, judge the outcome.

:func:`run_point` is what every pytest item, ``graph-harness narrow`` trial and notebook
calls; it never raises for a scenario's own failure (that is the result). Each stage has its
module: :mod:`harness.resolve` makes every decision of the item once, :mod:`harness.executor`
runs it on its ranks, :mod:`harness.verdict` holds the checks against ``expect``. pytest-free.
"""

from __future__ import annotations

import platform
import time
import traceback
from dataclasses import dataclass, field

import torch

import harness
from harness.checks import CheckResult
from harness.engine import UnsupportedOnBackend, load, resolve
from harness.executor import execute
from harness.graph.record import RunRecord
from harness.plain import JsonObject
from harness.resolve import ItemProblem, PointSkipped, ResolvedItem, resolve_item
from harness.scenario import Scenario, ScenarioPoint
from harness.verdict import FAILED, PASSED, SKIPPED, XFAILED, judge

__all__ = ["FAILED", "PASSED", "SKIPPED", "XFAILED", "ItemResult", "backend_problem", "environment", "preflight",
           "run_point"]


@dataclass
class ItemResult:
    name: str
    id: str
    source: str
    scenario: JsonObject
    backend: str
    outcome: str
    verdict: str  # one line: why this outcome
    checks: dict[str, CheckResult] = field(default_factory=dict)
    record: RunRecord | None = None
    duration: float = 0.0
    traceback: str | None = None

    @property
    def failed_checks(self) -> list[str]:
        return [name for name, result in self.checks.items() if not result.passed]


def environment(backend: str) -> dict[str, str]:
    try:
        engine = load(backend)
        name, device = engine.name, engine.device_name()
    except UnsupportedOnBackend as error:  # every item then fails with this reason
        name, device = backend, f"unavailable: {error}"
    return {
        "harness": harness.__version__,
        "torch": str(torch.__version__),
        "python": platform.python_version(),
        "backend": name,
        "device": device,
    }


def backend_problem(backend: str) -> str | None:
    """Why ``backend`` cannot run here (torch_npu absent, no CUDA device), else None."""
    try:
        load(backend)
    except UnsupportedOnBackend as error:
        return str(error)
    return None


def run_point(point: ScenarioPoint, *, backend: str = "auto", fia_contract: str | None = None,
              stack: str | None = None, resolution: ResolvedItem | PointSkipped | None = None) -> ItemResult:
    """Run ``point``; never raises for a scenario's own failure (that is the result).

    ``stack`` is the version profile of a scenario that names none (``--stack``). ``resolution``
    is the point's resolution made when it was collected, for this backend and ``fia_contract``
    (:class:`harness.collection.CollectedItem`): the run executes it and decides nothing again.
    Without one the point is resolved here (a notebook, ``graph-harness narrow``)."""
    resolved = resolve(backend)
    scenario = point.scenario
    result = ItemResult(point.name, point.id, f"{point.source.path}:{point.source.line}",
                        scenario.model_dump(mode="json"), resolved, SKIPPED, "")
    if scenario.expect.outcome == "skip":
        result.verdict = f"unsupported by design: {scenario.expect.skip}"
        return result
    started = time.perf_counter()
    problem = backend_problem(resolved)
    if problem:  # one line per item, no traceback: the option is wrong for this machine
        result.outcome, result.verdict = FAILED, f"backend unavailable: {problem}"
        return result
    try:
        item = resolution if resolution is not None else resolve_item(
            scenario, resolved, fia_contract=fia_contract, stack=stack, dispatch_lines=point.dispatch_lines)
        if isinstance(item, PointSkipped):  # resolved at collection: the same skip as resolving here
            raise item
        if item.backend != resolved:
            raise ValueError(f"the point was resolved for backend {item.backend!r}, the run is on {resolved!r}")
        result.scenario = item.scenario.model_dump(mode="json")
        result.checks, result.record = execute(item)
        result.outcome, result.verdict = judge(scenario.expect, result.checks, result.record)
    except PointSkipped as skipped:
        result.verdict = skipped.reason
    except ItemProblem as refused:  # collection refuses it; a direct caller gets this
        result.outcome, result.verdict = FAILED, f"{refused.field}: {refused.message}"
    except UnsupportedOnBackend as error:  # a setting this backend refuses: not a finding
        result.outcome, result.verdict = SKIPPED, f"unsupported on {resolved}: {error}"
    except Exception as error:  # noqa: BLE001 - a crash is this item's result, never the suite's
        result.outcome = FAILED
        result.verdict = f"harness error: {type(error).__name__}: {error}"
        result.traceback = traceback.format_exc()
    finally:
        result.duration = time.perf_counter() - started
    return result


def preflight(scenario: Scenario) -> tuple[str, str] | None:
    """What the schema cannot see, as ``(field, message)``: the resolution of the point (a point
    that resolves, or is skipped, has no problem)."""
    try:
        resolve_item(scenario)
    except ItemProblem as problem:
        return problem.field, problem.message
    except PointSkipped:
        return None
    return None


