"""What a triager reads first, derived from one item record: pure functions, no HTML.

The record (:mod:`harness.report.results`) holds every check's raw verdict; this module turns
it into the facts the report and the terminal line lead with: the graph mode and feature
combination of the item, each check's state (a check that compared nothing is *not
evaluated*, not passed; mismatches that start at or after another check's failure are
*explained by* that check), the first failing check with the step and bucket where it failed,
and the fix switches the scenario turned off. Every function tolerates a partial record (a
crashed item has no run, a skipped one no checks).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["CheckState", "FirstFailure", "check_states", "feature_label", "first_failure",
           "fixes_off", "item_mode", "CHECK_ORDER", "PASS", "FAIL", "NOT_EVALUATED", "EXPLAINED"]

#: Root-cause order of the checks, the order :func:`harness.checks.run_checks` reports them in.
CHECK_ORDER = ("fia_invariant", "stale_params", "stream_budget", "equality", "dispatch", "execution")

PASS, FAIL, NOT_EVALUATED, EXPLAINED = "pass", "fail", "not-evaluated", "explained"


def _dict(value: object) -> Mapping:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list:
    return list(value) if isinstance(value, (list, tuple)) else []


@dataclass(frozen=True)
class CheckState:
    """One row of the checks table."""

    name: str
    state: str  # PASS, FAIL, NOT_EVALUATED or EXPLAINED
    label: str  # what the badge says: "PASS", "FAIL", "not evaluated", "explained by stale_params"
    summary: str
    first_step: int | None = None


@dataclass(frozen=True)
class FirstFailure:
    """The check to read first, and where it failed."""

    check: str
    summary: str
    step: int | None
    bucket: object  # as the evidence recorded it: shown, never computed with


def item_mode(record: Mapping) -> str:
    """The graph mode the item ran in (the scenario's, when the run left no record)."""
    mode = _dict(record.get("run")).get("mode") or _dict(_dict(record.get("scenario")).get("graph")).get("mode")
    return str(mode) if mode else "\u2014"


def feature_label(scenario: object) -> str:
    """The item's feature combination (``sp2+mtp1``), or ``base``: each feature names itself
    (:meth:`harness.features.Feature.label`), in registry order."""
    from harness.features import feature_label as combination

    return combination(_dict(_dict(scenario).get("features")))


def fixes_off(scenario: object) -> list[str]:
    """The fix switches the scenario turned off (``fixes.host_param_update``), in file order."""
    return [f"fixes.{name}" for name, on in _dict(_dict(scenario).get("fixes")).items() if on is False]


def _graph_never_ran(run: Mapping) -> bool:
    """Whether the graph path stopped at capture: nothing was replayed to compare."""
    return any(_dict(e).get("path") == "graph" and _dict(e).get("phase") == "capture"
               for e in _list(run.get("errors")))


def _step_count(record: Mapping) -> int:
    """Steps the item ran: its per-step data, or its metrics when it kept only a summary."""
    run = _dict(record.get("run"))
    if "steps" in run:
        return len(_list(run.get("steps")))
    steps = _dict(record.get("metrics")).get("steps")
    return steps if isinstance(steps, int) else 0


def _not_evaluated(name: str, check: Mapping, record: Mapping) -> bool:
    """Whether the check looked at nothing, so that its pass would be vacuous.

    The check says so itself (``evaluated``, since results written by this version); the
    guesses below are for records written before it did."""
    if isinstance(check.get("evaluated"), bool):
        return not check["evaluated"]
    run = _dict(record.get("run"))
    details = _dict(check.get("details"))
    if name in ("equality", "stale_params") and _graph_never_ran(run):
        return True
    if name == "fia_invariant":
        return details.get("calls") == 0
    if name == "equality":
        return details.get("compared") == 0
    if name == "stale_params":
        return _step_count(record) == 0
    if name == "stream_budget":
        captured = run.get("graphs_captured", details.get("graphs_captured"))
        return captured == 0
    return False


def _explaining_check(checks: Mapping, name: str) -> str | None:
    """The failed check whose first failure comes first: what explains ``name``'s mismatches."""
    failed = [(n, _dict(c)) for n, c in checks.items() if n != name and not _dict(c).get("passed", True)]
    stepped = [(c.get("first_step"), CHECK_ORDER.index(n) if n in CHECK_ORDER else 99, n)
               for n, c in failed if isinstance(c.get("first_step"), int)]
    if stepped:
        return min(stepped)[2]
    return failed[0][0] if failed else None


def _ordered(checks: Mapping) -> list[str]:
    return [n for n in CHECK_ORDER if n in checks] + [n for n in checks if n not in CHECK_ORDER]


def check_states(record: Mapping) -> list[CheckState]:
    """Every check of the item with its state, in root-cause order."""
    checks = _dict(record.get("checks"))
    states = []
    for name in _ordered(checks):
        check = _dict(checks[name])
        summary = str(check.get("summary") or "")
        step = check.get("first_step") if isinstance(check.get("first_step"), int) else None
        if not check.get("passed", False):
            states.append(CheckState(name, FAIL, "FAIL", summary, step))
        elif _dict(check.get("details")).get("mismatches") or _dict(check.get("details")).get("mismatches_total"):
            cause = _explaining_check(checks, name)
            label = f"explained by {cause}" if cause else "explained by an earlier failure"
            states.append(CheckState(name, EXPLAINED, label, summary, step))
        elif _not_evaluated(name, check, record):
            states.append(CheckState(name, NOT_EVALUATED, "not evaluated", summary, step))
        else:
            states.append(CheckState(name, PASS, "PASS", summary, step))
    return states


def _bucket_of(name: str, check: Mapping, run: Mapping, step: int | None) -> object:
    details = _dict(check.get("details"))
    evidence = {"fia_invariant": "violations", "stale_params": "stale", "equality": "mismatches"}.get(name)
    for entry in _list(details.get(evidence)) if evidence else []:
        bucket = _dict(entry).get("bucket")
        if bucket not in (None, "-"):
            return bucket
    for error in _list(details.get("errors")) + _list(run.get("errors")):
        error = _dict(error)
        if error.get("bucket") is not None and (step is None or error.get("step") == step):
            return error.get("bucket")
    for entry in _list(run.get("steps")):
        entry = _dict(entry)
        if step is not None and entry.get("step") == step:
            return entry.get("num_tokens_padded")
    return None


def first_failure(record: Mapping) -> FirstFailure | None:
    """The failed check to read first: the earliest failure, capture-time ones before step 0.

    Ties keep root-cause order (FIA, stale parameters, stream budget, equality, execution),
    the order in which the checks explain each other.
    """
    checks = _dict(record.get("checks"))
    run = _dict(record.get("run"))
    failed = [s for s in check_states(record) if s.state == FAIL]
    if not failed:
        return None
    order = _ordered(checks)
    first = min(failed, key=lambda s: (-1 if s.first_step is None else s.first_step, order.index(s.name)))
    bucket = _bucket_of(first.name, _dict(checks.get(first.name)), run, first.first_step)
    return FirstFailure(first.name, first.summary, first.first_step, bucket)
