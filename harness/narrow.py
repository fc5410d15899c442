"""Narrow a failing item to the smallest scenario that still fails the same check.

When a new parallel feature lands and a combination fails, the question is which feature
changed T. ``graph-harness narrow FILE.yaml::ITEM`` answers it by greedy delta debugging over
the scenario: it tries one reduction at a time (drop a feature, lower its size, reset a
setting, shrink the workload, drop a capture size, fewer layers) and keeps each reduction
after which the item still fails the same check. What remains is a small reproducer, written
as YAML under ``reports/``, and each feature's verdict says what it contributes:
``fails with sp2+mtp2+dp2; fails without dp; fails without mtp; passes without sp``.

Every trial is :func:`harness.session.run_point`, the function the pytest items call, so it
runs through the same engine, the same rank layout and the same checks as the item. The
target check is the item's first failing check in root-cause order; the scenario's ``expect``
is dropped for the trials (a known-bad scenario narrows like any failing one).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Protocol, Sequence

import yaml

from harness.plain import JsonObject
from harness.scenario import GRAPH_MODES, ScenarioError, ScenarioPoint, Scenario, load_scenario_file

#: The trial budget by default: multi-rank trials cost seconds each.
MAX_TRIALS = 40


class NarrowError(ValueError):
    """The target cannot be narrowed (not found, does not fail, ...): one line for the user."""


@dataclass
class Trial:
    """One reduction tried: what changed, and whether the target check still failed."""

    what: str
    fails: bool
    failed_checks: list[str]
    verdict: str
    duration: float
    kept: bool = False


@dataclass
class Narrowed:
    target: str  # FILE::ITEM as given
    check: str  # the check that had to keep failing
    original: JsonObject  # the scenario as run (expanded point)
    minimal: JsonObject
    trials: list[Trial] = field(default_factory=list)
    features: list[str] = field(default_factory=list)  # verdict per feature, in order
    budget_spent: bool = False  # the trial budget ran out before every reduction was tried
    output: Path | None = None

    @property
    def verdict(self) -> str:
        return "; ".join(self.features)


# -- finding the item ----------------------------------------------------------------------------
def split_target(target: str) -> tuple[Path, str]:
    """``FILE.yaml::NAME[ID]`` (a node id or a results key) -> (file, item)."""
    path, sep, item = target.partition("::")
    if not sep or not item:
        raise NarrowError(f"{target}: expected FILE.yaml::ITEM, e.g. scenarios/x.yaml::x[FULL-sp2]")
    return Path(path), item


def _tokens(text: str) -> set[str]:
    return {t for t in re.split(r"[^A-Za-z0-9_.]+", text) if t}


def find_point(path: Path, item: str) -> ScenarioPoint:
    """The matrix point an item name denotes, with or without the mode suffix ``--mode`` adds.

    Ids are matched as sets of their dash-joined parts, so ``x[sp2-FULL]`` (a file with no
    mode axis, run with ``--mode=FULL``) and ``x[sp2]`` (run in the file's default mode) both
    find the ``sp2`` point, the first in the mode named."""
    name, _, rest = item.partition("[")
    wanted = _tokens(rest.rstrip("]"))
    modes = wanted & set(GRAPH_MODES)
    try:
        points = load_scenario_file(path)
    except ScenarioError as error:
        raise NarrowError(str(error)) from None
    candidates = [p for p in points if p.name == name]
    if not candidates:
        known = sorted({p.name for p in points})
        raise NarrowError(f"{path}: no scenario named {name!r} (the file has {', '.join(known)})")
    for point in candidates:
        parts = _tokens(point.id)
        if parts == wanted:
            return point
        mode = point.scenario.graph.mode
        if parts | {mode} == wanted and mode in modes:
            return point
    # A file that names no mode, asked for one: the point in that mode, as --mode would run it.
    if len(modes) == 1 and not _names_a_mode(path):
        (mode,) = modes
        for point in load_scenario_file(path, overrides={"graph.mode": mode}):
            if point.name == name and _tokens(point.id) | {mode} == wanted:
                return point
    ids = ", ".join(p.display_name for p in candidates[:12])
    raise NarrowError(f"{path}: no item {item!r}; the file has {ids}")


def _names_a_mode(path: Path) -> bool:
    """Whether the file fixes its mode (``graph.mode`` or a ``graph.mode`` matrix axis)."""
    data = yaml.safe_load(path.read_text())  # it loaded above: this cannot fail
    graph, matrix = data.get("graph") or {}, data.get("matrix") or {}
    return "mode" in graph or "graph.mode" in matrix


# -- running a trial -----------------------------------------------------------------------------
class TrialResult(Protocol):
    """What a trial's run tells the search (:class:`harness.session.ItemResult` is one)."""

    @property
    def failed_checks(self) -> Iterable[str]: ...

    @property
    def verdict(self) -> str: ...

    @property
    def duration(self) -> float: ...


Runner = Callable[[ScenarioPoint], TrialResult]


def _as_point(data: JsonObject, like: ScenarioPoint) -> ScenarioPoint | None:
    """A validated point from a candidate, or None when the reduction made it invalid."""
    try:
        scenario = Scenario.model_validate(data)
    except ValueError:
        return None
    from harness.session import preflight

    if preflight(scenario):
        return None  # e.g. capture sizes a feature leaves empty: not a trial, a dead end
    return ScenarioPoint(like.id, scenario, like.axes, like.source)


def default_runner(backend: str = "auto", fia_contract: str | None = None) -> Runner:
    from harness.session import run_point

    return lambda point: run_point(point, backend=backend, fia_contract=fia_contract)


# -- reductions ----------------------------------------------------------------------------------
Reduction = tuple[str, JsonObject]  # (what it does, the scenario after it)


def _copy(data: JsonObject) -> JsonObject:
    return yaml.safe_load(yaml.safe_dump(data))  # plain data: a deep copy that cannot alias


def _defaults() -> JsonObject:
    """The scenario defaults (a feature's defaults are the feature switched off)."""
    return Scenario.model_validate({"workload": {"requests": [{"prompt_len": 1, "output_len": 1}]}}).model_dump(mode="json")


def active_feature_names(data: JsonObject) -> list[str]:
    from harness.resolve import scenario_features

    return [feature.name for feature in scenario_features(Scenario.model_validate(data))]


def _magnitude_key(section: JsonObject, default: JsonObject) -> str | None:
    """The integer setting that sizes a feature (tp, size, k): the first one off its default."""
    for key, value in section.items():
        if isinstance(value, int) and not isinstance(value, bool) and value != default.get(key):
            return key
    return None


def _drop_mirrors(data: JsonObject) -> None:
    """Leave out every field that mirrors a feature's setting (``Feature.mirrors``), so that a
    lowered setting is not contradicted by its mirror's old value."""
    from harness.features import registry

    for cls in registry().values():
        for path in cls.mirrors:
            *parents, leaf = path.split(".")
            section: object = data
            for part in parents:
                section = section.get(part) if isinstance(section, dict) else None
            if isinstance(section, dict):
                section.pop(leaf, None)


def feature_label(name: str, data: JsonObject) -> str:
    section = data["features"].get(name) or {}
    key = _magnitude_key(section, _defaults()["features"].get(name, {}))
    return f"{name}{section[key]}" if key else name


def _feature_defaults(name: str) -> JsonObject:
    return _defaults()["features"].get(name, {})


def drop_feature(data: JsonObject, name: str) -> JsonObject:
    return _with(data, ("features", name), dict(_feature_defaults(name)))


def lower_candidates(data: JsonObject, name: str) -> list[tuple[int, JsonObject]]:
    """Smaller sizes of a feature that keep it on, smallest (the biggest reduction) first."""
    section, default = data["features"][name], _feature_defaults(name)
    key = _magnitude_key(section, default)
    if key is None:
        return []
    floor = default.get(key, 0) + 1
    return [(value, _with(data, ("features", name, key), value)) for value in range(floor, section[key])]


def reset_candidates(data: JsonObject, name: str) -> list[tuple[str, JsonObject]]:
    """A feature's other settings (e.g. dp batches: unequal) back to their defaults, one by one."""
    section, default = data["features"][name], _feature_defaults(name)
    key = _magnitude_key(section, default)
    return [(f"{setting}={default.get(setting)}", _with(data, ("features", name, setting), default.get(setting)))
            for setting, value in section.items() if setting != key and value != default.get(setting)]


def workload_reductions(data: JsonObject) -> Iterator[Reduction]:
    """Fewer requests and steps, shorter prompts and outputs, fewer capture sizes, fewer layers."""
    workload = data["workload"]
    requests = workload.get("requests")
    if requests:
        if len(requests) > 1:
            for keep in (requests[: len(requests) // 2], requests[len(requests) // 2 :]):
                yield f"keep requests {_names(keep, requests)}", _with(data, ("workload", "requests"), keep)
            for i in range(len(requests)):
                rest = requests[:i] + requests[i + 1 :]
                yield f"drop request {i}", _with(data, ("workload", "requests"), rest)
        for i, request in enumerate(requests):
            for fld, floor in (("repeat", 1), ("arrival_step", 0), ("output_len", 1), ("prompt_len", 1)):
                value = request.get(fld)
                if isinstance(value, int) and value > floor:
                    smaller = floor if fld in ("repeat", "arrival_step") else max(floor, value // 2)
                    changed = [dict(r) for r in requests]
                    changed[i][fld] = smaller
                    yield f"request {i} {fld} {value} -> {smaller}", _with(data, ("workload", "requests"), changed)
    steps = workload.get("steps")
    if steps and len(steps) > 1:
        yield f"explicit steps {len(steps)} -> {len(steps) // 2}", _with(data, ("workload", "steps"), steps[: len(steps) // 2])
    if data.get("steps", 1) > 1:
        yield f"steps {data['steps']} -> {data['steps'] // 2}", _with(data, ("steps",), data["steps"] // 2)
    sizes = data["graph"].get("capture_sizes")
    if sizes and len(sizes) > 1:
        for size in sorted(sizes, reverse=True):
            yield f"drop capture size {size}", _with(data, ("graph", "capture_sizes"), [s for s in sizes if s != size])
    layers = data["model"].get("layers", 1)
    if layers > 1:
        yield f"layers {layers} -> 1", _with(data, ("model", "layers"), 1)


def _names(subset: Sequence[object], whole: Sequence[object]) -> str:
    return ",".join(str(whole.index(r)) for r in subset)


def _with(data: JsonObject, path: tuple[str, ...], value: object) -> JsonObject:
    changed = _copy(data)
    target = changed
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = _copy({"v": value})["v"]
    return changed


# -- the search ----------------------------------------------------------------------------------
class _Search:
    def __init__(self, runner: Runner, like: ScenarioPoint, check: str, max_trials: int,
                 on_trial: Callable[[Trial], None] | None = None) -> None:
        self.runner, self.like, self.check, self.max_trials = runner, like, check, max_trials
        self.on_trial = on_trial or (lambda trial: None)
        self.trials: list[Trial] = []
        self.seen: dict[str, bool | None] = {}  # a candidate reached twice is not run twice

    @property
    def spent(self) -> bool:
        return len(self.trials) >= self.max_trials

    def fails(self, what: str, data: JsonObject) -> bool | None:
        """Whether the target check still fails; None when the candidate is not runnable."""
        seen = json.dumps(data, sort_keys=True)
        if seen in self.seen:
            return None
        point = _as_point(data, self.like)
        if point is None or self.spent:
            self.seen[seen] = None
            return None
        result = self.runner(point)
        failed = list(result.failed_checks)
        trial = Trial(what, self.check in failed, failed, result.verdict, round(result.duration, 3),
                      kept=self.check in failed)
        self.trials.append(trial)
        self.seen[seen] = trial.fails
        self.on_trial(trial)
        return trial.fails


def narrow(point: ScenarioPoint, *, runner: Runner, target: str = "", check: str | None = None,
           max_trials: int = MAX_TRIALS, progress: Callable[[str], None] | None = None) -> Narrowed:
    """Delta-debug ``point`` down to a minimal scenario that still fails ``check``.

    ``progress`` gets each trial's line (:func:`trial_line`) as the trial ends, so a caller that
    shows progress has shown the trial list once already (see ``render_report(trials=...)``)."""
    say = (lambda trial: progress(trial_line(trial))) if progress else None
    data = point.scenario.model_dump(mode="json")
    data["expect"] = {}  # trials are judged by their checks, not by the scenario's expectation
    _drop_mirrors(data)  # a feature's mirrors follow its settings as they are narrowed
    search = _Search(runner, point, check or "", max_trials + 1, on_trial=say)  # +1: the original run
    first = runner(_as_point(data, point) or point)
    failed = list(first.failed_checks)
    if check is None:
        if not failed:
            raise NarrowError(f"{target or point.display_name}: the item does not fail ({first.verdict}); nothing to narrow")
        check = failed[0]
    elif check not in failed:
        raise NarrowError(f"{target or point.display_name}: {check} does not fail "
                          f"(failed: {', '.join(failed) or 'none'}; {first.verdict})")
    search.check = check
    search.trials.append(Trial("the item as run", True, failed, first.verdict, round(first.duration, 3), kept=True))
    search.on_trial(search.trials[-1])
    result = Narrowed(target or point.display_name, check, _copy(data), data)
    names = active_feature_names(data)
    result.features.append(f"fails with {'+'.join(feature_label(n, data) for n in names) or 'no feature'}")
    current = data
    # Features first, the rank-costly ones first: dropping dp or cp early halves every later trial.
    order = sorted(names, key=lambda n: -_rank_weight(n, current))

    def attempt(label: str, candidate: JsonObject) -> bool | None:
        fails = search.fails(label, candidate)
        if fails is not None:
            result.features.append(f"{'fails' if fails else 'passes'} {label}")
        return fails

    for name in order:
        candidate = drop_feature(current, name)
        if attempt(f"without {name}", candidate):
            current = candidate  # not needed for the failure
            continue
        for value, candidate in lower_candidates(current, name):
            if attempt(f"with {name}{value}", candidate):
                current = candidate
                break
        for setting, candidate in reset_candidates(current, name):
            if attempt(f"with {name} {setting}", candidate):
                current = candidate
    # Then the workload, repeated until nothing more can go (each pass shrinks by halves).
    # A reduction after which the failure went away is not tried again in a later pass.
    changed, rejected = True, set()
    while changed and not search.spent:
        changed = False
        for what, candidate in workload_reductions(current):
            if what in rejected:
                continue
            fails = search.fails(what, candidate)
            if fails is False:
                rejected.add(what)
            if fails:
                current = candidate
                changed = True
                break
    remaining = active_feature_names(current)
    result.features.append(f"minimal: {'+'.join(feature_label(n, current) for n in remaining) or 'no feature'}"
                           f" fails {check}")
    result.minimal = current
    result.trials = search.trials
    result.budget_spent = search.spent
    return result


def _rank_weight(name: str, data: JsonObject) -> int:
    """How many ranks a feature multiplies the world by (1 for features that add no ranks)."""
    from harness.resolve import scenario_features

    for feature in scenario_features(Scenario.model_validate(data)):
        if feature.name == name:
            return feature.world_size()
    return 1


# -- writing the reproducer ----------------------------------------------------------------------
def minimal_yaml(narrowed: Narrowed) -> str:
    """The minimal scenario as a file a triager can run: only what differs from the defaults."""
    data = Scenario.model_validate(narrowed.minimal).model_dump(mode="json", exclude_defaults=True)
    data.pop("expect", None)
    data["name"] = f"{narrowed.minimal.get('name') or 'scenario'}_narrowed"
    kept = [t for t in narrowed.trials if t.kept][1:]
    header = [f"# graph-harness narrow {narrowed.target}",
              f"# the smallest scenario found that still fails {narrowed.check}",
              *(f"# {line}" for line in narrowed.features),
              f"# {len(narrowed.trials)} trial(s); reductions kept: {', '.join(t.what for t in kept) or 'none'}"]
    if narrowed.budget_spent:
        header.append("# the trial budget ran out: a smaller scenario may exist (--max-trials)")
    return "\n".join(header) + "\n" + yaml.safe_dump(data, sort_keys=False, default_flow_style=None)


def write_minimal(narrowed: Narrowed, out_dir: Path) -> Path:
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", narrowed.target.split("::")[-1]).strip("_")
    path = out_dir / f"narrowed-{name}.yaml"
    out_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(minimal_yaml(narrowed))
    load_scenario_file(path)  # what we wrote must load: a reproducer that does not is useless
    narrowed.output = path
    return path


def trial_line(trial: Trial) -> str:
    """One trial as the report lists it: what changed, whether the check still failed."""
    return (f"{trial.what}: {'FAILS' if trial.fails else 'passes'} ({', '.join(trial.failed_checks) or 'no check failed'})"
            f"{' [kept]' if trial.kept else ''} {trial.duration:.1f} s")


def render_report(narrowed: Narrowed, *, trials: bool = True) -> str:
    """The final report; ``trials=False`` when the trial list was shown as it ran (progress)."""
    lines = [f"narrow {narrowed.target}: target check {narrowed.check}"]
    if trials:
        lines.extend(f"  {trial_line(t)}" for t in narrowed.trials)
    else:
        lines.append(f"  {len(narrowed.trials)} trial(s), listed above")
    lines.append(narrowed.verdict)
    if narrowed.budget_spent:
        lines.append("(trial budget spent: raise --max-trials for a smaller scenario)")
    if narrowed.output:
        lines.append(f"minimal scenario: {narrowed.output}")
    return "\n".join(lines) + "\n"
