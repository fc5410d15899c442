"""The rules across a scenario's sections, one named step each.

:meth:`harness.scenario.schema.Scenario._consistent` runs them in this order and raises their
issues together. They read the scenario through :class:`Sections`, the sections it holds: the
root model calls them, so they cannot import it. A feature's own rules are the feature's
(``Feature.mirrors``, ``Feature.scenario_issues``): the steps here name no feature.
"""

from __future__ import annotations

from typing import Any, Protocol

from .fields import Loc
from .expect import Expect
from .sections import Features, Fixes, GraphSpec, ModelSpec, StepEntry, Workload
from harness.features import registry

__all__ = ["Sections", "scenario_issues"]


class Sections(Protocol):
    """What the rules read of a scenario (:class:`harness.scenario.schema.Scenario`)."""

    model: ModelSpec
    graph: GraphSpec
    workload: Workload
    features: Features  # generated from the feature registry
    fixes: Fixes
    steps: int
    expect: Expect


def scenario_issues(scenario: Sections) -> list[tuple[Loc, str]]:
    """Every cross-section problem of ``scenario``, located from its root (mirrors applied)."""
    return [*_mirror_issues(scenario), *_capture_size_issues(scenario), *_feature_issues(scenario),
            *_request_issues(scenario), *_explicit_step_issues(scenario), *_dispatch_step_issues(scenario)]


def _dispatch_step_issues(scenario: Sections) -> list[tuple[Loc, str]]:
    """A dispatch row about a step past ``steps``: the run never reaches it, so the row could
    only ever fail (steps count from 0)."""
    return [(("expect", "dispatch", i, "step"),
             f"step {row.step} never runs: steps is {scenario.steps} (steps 0..{scenario.steps - 1})")
            for i, row in enumerate(scenario.expect.dispatch or ()) if row.step >= scenario.steps]


def _mirror_issues(scenario: Sections) -> list[tuple[Loc, str]]:
    """A field that mirrors a feature's setting follows it, or it follows the field: either may
    be given; given both, they must agree (the setting is canonical)."""
    issues: list[tuple[Loc, str]] = []
    for name, cls in registry().items():
        section = getattr(scenario.features, name, None)
        for path, setting in cls.mirrors.items():
            *parents, leaf = path.split(".")
            holder: Any = scenario  # walked by getattr down the mirror's dotted path: a section's model
            for part in parents:
                holder = getattr(holder, part)
            if section is None or holder is None:
                continue
            mirror_given = leaf in holder.model_fields_set
            setting_given = setting in section.model_fields_set
            mirror, value = getattr(holder, leaf), getattr(section, setting)
            if mirror_given and setting_given and mirror != value:
                issues.append((tuple(path.split(".")),
                               f"{leaf} {mirror} differs from features.{name}.{setting} {value}"))
            elif mirror_given and not setting_given:
                setattr(section, setting, mirror)
            elif setting_given and not mirror_given:
                setattr(holder, leaf, value)
    return issues


def _capture_size_issues(scenario: Sections) -> list[tuple[Loc, str]]:
    """Explicit capture sizes and a max capture size must agree, as vLLM refuses both otherwise;
    sizes above max_num_batched_tokens are dropped first (the filters of the features are
    applied by the preflight, which sees them)."""
    sizes, top = scenario.graph.capture_sizes, scenario.graph.max_capture_size
    if not sizes or top is None:
        return []
    kept = [s for s in sizes if s <= scenario.workload.max_num_batched_tokens]
    if kept and kept[-1] != top:
        return [(("graph", "max_capture_size"),
                 f"customized max_cudagraph_capture_size(={top}) should be consistent with the "
                 f"max value of cudagraph_capture_sizes(={kept[-1]}): give one of the two")]
    return []


def _feature_issues(scenario: Sections) -> list[tuple[Loc, str]]:
    """Every enabled feature's own cross-field rules (``Feature.scenario_issues``)."""
    issues: list[tuple[Loc, str]] = []
    fixes = dict(scenario.fixes)
    for name, cls in registry().items():
        section = getattr(scenario.features, name, None)
        if section is None:
            continue
        feature = cls(section, fixes)
        if feature.enabled():
            issues.extend(feature.scenario_issues(scenario))
    return issues


def _request_issues(scenario: Sections) -> list[tuple[Loc, str]]:
    """Each request arrives before the last step, and its prompt and length fit the budget and
    the model."""
    issues: list[tuple[Loc, str]] = []
    budget, max_len = scenario.workload.max_num_batched_tokens, scenario.model.max_model_len
    for i, r in enumerate(scenario.workload.requests or []):
        if r.arrival_step >= scenario.steps:
            issues.append((("workload", "requests", i, "arrival_step"),
                           f"the request arrives at step {r.arrival_step}, after the last step "
                           f"(steps is {scenario.steps}): it would never run"))
        if r.prompt_len > budget:
            issues.append((("workload", "requests", i, "prompt_len"),
                           f"prompt_len {r.prompt_len} is above workload.max_num_batched_tokens {budget}: the "
                           "harness prefills a prompt in one step (no chunked prefill; vLLM without it "
                           "refuses such a request too), so it would never be scheduled"))
        if r.prompt_len + r.output_len > max_len:
            issues.append((("workload", "requests", i),
                           f"prompt_len {r.prompt_len} + output_len {r.output_len} = "
                           f"{r.prompt_len + r.output_len} exceeds model.max_model_len {max_len}"))
    return issues


def _explicit_step_issues(scenario: Sections) -> list[tuple[Loc, str]]:
    """Explicit steps fit the run's steps, each request's tokens fit the model, and the live
    requests' KV blocks fit the cache."""
    steps = scenario.workload.steps
    if not steps:
        return []
    issues: list[tuple[Loc, str]] = []
    max_len = scenario.model.max_model_len
    if len(steps) > scenario.steps:
        issues.append((("workload", "steps"),
                       f"{len(steps)} explicit steps, but steps is {scenario.steps}: the "
                       "later ones would never run"))
    totals: dict[str, int] = {}
    for step in steps:
        for e in step:
            totals[str(e.req)] = totals.get(str(e.req), 0) + e.new_tokens
    for req, total in totals.items():
        if total > max_len:
            issues.append((("workload", "steps"),
                           f"request {req!r} reaches {total} tokens, above model.max_model_len {max_len}"))
    issues.extend(_explicit_blocks_issue(steps, totals, scenario.model))
    return issues


def _explicit_blocks_issue(steps: list[list[StepEntry]], totals: dict[str, int], model: ModelSpec) -> list[tuple[Loc, str]]:
    """The first explicit step whose live requests (from their first step to their last, each
    holding blocks for all its tokens) need more KV blocks than the cache has."""
    blocks = {req: -(-total // model.block_size) for req, total in totals.items()}
    last = {str(e.req): i for i, step in enumerate(steps) for e in step}
    free = model.num_blocks - 1  # block 0 is reserved
    held: set[str] = set()
    in_use = 0
    for i, step in enumerate(steps):
        arrived = {str(e.req) for e in step} - held
        held |= arrived
        in_use += sum(blocks[req] for req in arrived)
        if in_use > free:
            return [(("workload", "steps", i),
                     f"at step {i} the {len(held)} requests holding KV (from their first step to their last) "
                     f"need {in_use} blocks of {model.block_size} slots, the cache has {free} (model.num_blocks "
                     f"{model.num_blocks}, block 0 reserved): raise model.num_blocks")]
        ended = {str(e.req) for e in step if last[str(e.req)] == i}
        held -= ended
        in_use -= sum(blocks[req] for req in ended)
    return []
