"""A scenario point resolved: every decision of an item made once, in one typed object.

A point's scenario says what a user asked for; an engine decides what actually runs: the stack
whose rules apply, the features and their fix switches, the graph mode after the attention
backend's support and the engine's capabilities had their say (:mod:`harness.graph.capability`),
the capture sizes every feature's constraints leave, the stream budget's cut, the world size.
:func:`resolve_item` makes each of those decisions once and returns a frozen
:class:`ResolvedItem`; collection (preflight), the session, the ranks, the pipeline's spec and
the checks read it and never derive any of it again. A point the real engine refuses to start
(:class:`~harness.graph.capture_sizes.EngineRefusal`), that this backend cannot run
(:class:`~harness.graph.capability.AttentionPathUnavailable`) or that the harness does not
model raises :class:`PointSkipped` with the reason; a file the harness cannot run as written
raises :class:`ItemProblem` with the field to change.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

from harness import features as registry
from harness.engine.protocol import CAPABILITIES, Capabilities, DeviceRules, StreamConfig
from harness.features import Feature, FeatureSettings, ItemFeatures, active_features
from harness.graph.capability import ATTENTION_BACKENDS, AttentionPathUnavailable, Resolution, resolve
from harness.graph.capture_sizes import EngineRefusal, Platform, SizeResolution, resolve_sizes, spec_decode_rounding
from harness.graph.modes import CompilationModeName, CUDAGraphMode, ModeResolution, parse_mode, resolve_mode
from harness.graph.stream_budget import BudgetDecision, stream_budget
from harness.model.config import ModelConfig
from harness.plain import JsonObject, PlainData
from harness.scenario import Scenario
from harness.scenario.sections import GraphSpec
from harness.scenario.bounds import MAX_WORLD_SIZE
from harness.stacks import StackProfile, profile

__all__ = ["ItemProblem", "PointSkipped", "ResolvedItem", "refused_at_start_up", "resolve_item", "scenario_features"]


class PointSkipped(Exception):
    """A point that cannot run (not a bad file): the real engine refuses to start with it, the
    harness does not model it, or this backend lacks what it needs. The item is skipped with
    its ``reason``; ``features`` are the point's enabled features where the resolution got that
    far (its pytest markers)."""

    def __init__(self, reason: str, features: Sequence[Feature] = ()) -> None:
        super().__init__(reason, tuple(features))

    @property
    def reason(self) -> str:
        return str(self.args[0])

    @property
    def features(self) -> tuple[Feature, ...]:
        return tuple(self.args[1])


class ItemProblem(ValueError):
    """A scenario the harness cannot run as written (a bad file): ``ItemProblem(field, message)``,
    the field to change and why.

    Raised where the schema cannot see the problem (the feature registry, the model's rules,
    the capture sizes a feature leaves); collection turns it into an error naming the file,
    the line of ``field`` and the message."""

    @property
    def field(self) -> str:
        return str(self.args[0])

    @property
    def message(self) -> str:
        return str(self.args[1])

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class ResolvedItem:
    """One scenario point with every decision made (see the module docstring).

    ``capabilities`` are the backend's (:data:`harness.engine.protocol.CAPABILITIES`); the
    emulator's when the item was resolved without one (collection)."""

    scenario: Scenario  # the overrides of the run applied (--fia-contract, --stack)
    backend: str
    capabilities: Capabilities
    stack: StackProfile
    features: tuple[Feature, ...]
    world_size: int
    uniform_decode_query_len: int  # q = 1 + the draft tokens a request verifies per step
    graph: Resolution  # the effective graph mode and attention path
    sizes: SizeResolution  # capture sizes before the stream budget, with the engine's notes
    budget: BudgetDecision  # the stream-budget policy's cut
    model: ModelConfig
    streams: StreamConfig  # the device's stream pool, and what a graph and a comm group take of it
    device_rules: DeviceRules  # the stack's torch_npu rules, as the engine's options
    # The scenario's dispatch table as plain rows for the dispatch-table check, the rows of
    # another stack left out (``for_stack``). Data, not the scenario's rows: a row pins the
    # fields its file named, which a scenario that travelled to a rank no longer knows.
    dispatch_rows: tuple[JsonObject, ...] = ()

    @property
    def mode(self) -> CUDAGraphMode:
        return self.graph.mode

    @property
    def capture_sizes(self) -> tuple[int, ...]:
        return tuple(self.budget.sizes_kept)

    @property
    def budget_report(self) -> JsonObject:
        return asdict(self.budget)

    @property
    def notes(self) -> list[str]:
        """What the engine would have logged on the way here (a report shows them)."""
        return [f"stack {self.stack.name}: {self.stack.summary}", *self.graph.warnings, *self.sizes.notes]


#: A point the real engine refuses to start is skipped with these words (``stack``: its profile).
REFUSED = "the real engine refuses to start (stack {stack}): {why}"


def scenario_features(scenario: Scenario) -> list[Feature]:
    """The scenario's enabled features, each with its typed settings and fix switches."""
    return active_features(_feature_settings(scenario), scenario.fixes.model_dump())


def _feature_settings(scenario: Scenario) -> dict[str, FeatureSettings | None]:
    """Each feature's typed settings section, by its name under ``features:``."""
    return {name: getattr(scenario.features, name) for name in scenario.features.model_dump()}


def _start_up(stack: str | None, mode: str, *, compilation_mode: CompilationModeName,
              platform: Platform) -> tuple[StackProfile, ModeResolution]:
    """The stack's profile and the graph mode its platform lets start (compilation mode,
    FULL_AND_PIECEWISE on older releases), before any attention backend has its say."""
    profile_ = profile(stack)
    return profile_, resolve_mode(parse_mode(mode), compilation_mode=compilation_mode, platform=platform,
                                  full_and_piecewise=profile_.full_and_piecewise,
                                  npu_unsupported_compilation=profile_.npu_unsupported_compilation)


def resolve_item(scenario: Scenario, backend: str = "emulated", *, fia_contract: str | None = None,
                 stack: str | None = None, dispatch_lines: Sequence[int | None] = ()) -> ResolvedItem:
    """Resolve ``scenario`` for ``backend`` (a resolved name: emulated, cuda or npu).

    ``fia_contract`` overrides the scenario's contract (``--fia-contract``); ``stack`` is the
    profile of a scenario that names none (``--stack``); ``dispatch_lines`` are the file lines
    of its ``expect.dispatch`` rows (:attr:`ScenarioPoint.dispatch_lines`), for the check's
    words. Raises :class:`ItemProblem` for what the harness cannot run as written (checked
    first, so a bad file is reported even where the point would be skipped) and
    :class:`PointSkipped` for a point that cannot run.

    Each decision calls the module that owns it, once, in the engine's order: the features, the
    stack, the platform's start-up rules, the attention backend's support, the capture sizes,
    the stream budget."""
    if fia_contract is not None:
        scenario = scenario.model_copy(update={"fia_contract": fia_contract})
    settings = _feature_settings(scenario)
    g = scenario.graph
    # the platform's start-up rules first, then the attention backend's support (vLLM's model
    # runner resolves after the platform)
    stack_profile, startup = _start_up(scenario.stack or stack, g.mode, compilation_mode=g.compilation_mode,
                                       platform=g.platform)
    if scenario.stack is None and stack is not None:  # the report names the profile it ran
        scenario = scenario.model_copy(update={"stack": stack_profile.name})
    m, engine = scenario.model, scenario.engine
    try:
        model = ModelConfig(kind=m.kind, num_layers=m.layers, hidden_size=m.hidden_size, num_heads=m.num_heads,
                            num_kv_heads=m.num_kv_heads, head_dim=m.head_dim, vocab_size=m.vocab_size,
                            dtype=m.dtype, seed=m.seed, block_size=m.block_size, num_blocks=m.num_blocks,
                            max_model_len=m.max_model_len)
    except ValueError as error:
        named = next((f for f in type(m).model_fields if f in str(error)), None)
        raise ItemProblem(f"model.{named}" if named else "model", str(error)) from None
    try:
        needs: ItemFeatures = registry.item_features(settings, scenario.fixes.model_dump(),
                                                     scenario.model_dump(mode="json"), model)
    except ValueError as error:
        raise ItemProblem("features", str(error)) from None
    if needs.model_problem is not None:
        raise ItemProblem(*needs.model_problem)
    skip, q = needs.unsupported, needs.uniform_decode_query_len
    capabilities = CAPABILITIES[backend]
    try:
        graph = resolve(startup.mode, ATTENTION_BACKENDS[g.attention_backend], uniform_decode_query_len=q,
                        task_updates=capabilities.task_updates, metadata=g.attention_metadata,
                        splitting_ops_contain_attention=g.compilation_mode == "VLLM_COMPILE")
    except EngineRefusal as refusal:
        raise PointSkipped(skip or REFUSED.format(stack=stack_profile.name, why=refusal), needs.features) from None
    except AttentionPathUnavailable as unavailable:
        raise PointSkipped(skip or f"unsupported on {backend}: {unavailable}", needs.features) from None
    graph = replace(graph, requested=startup.requested, warnings=startup.notes + graph.warnings)
    try:
        sizes = resolve_sizes(max_num_seqs=g.max_num_seqs, platform=g.platform, num_speculative_tokens=q - 1,
                              graphs=graph.graphs, capture_sizes=g.capture_sizes, max_capture_size=g.max_capture_size,
                              max_num_batched_tokens=scenario.workload.max_num_batched_tokens,
                              constraints=needs.size_constraints, decode_full=graph.decode_full,
                              spec_sp_multiple=stack_profile.spec_sp_multiple,
                              capture_max_num_batched_tokens=stack_profile.capture_max_num_batched_tokens,
                              capture_max_num_seqs=stack_profile.capture_max_num_seqs,
                              mixed_graphs=graph.mixed_graphs, max_model_len=model.max_model_len)
    except EngineRefusal as refusal:
        raise PointSkipped(skip or REFUSED.format(stack=stack_profile.name, why=refusal), needs.features) from None
    except ValueError as error:
        field = "graph.max_capture_size" if "max_cudagraph_capture_size" in str(error) else "graph.capture_sizes"
        raise ItemProblem(field, str(error)) from None
    if not skip and g.async_scheduling and q > 1:
        skip = ("graph.async_scheduling with speculative decoding: the harness does not model it (the drafter's "
                "inputs would come from unread accepted tokens)")
    if skip:
        raise PointSkipped(skip, needs.features)
    policy = engine.budget_policy or stack_profile.budget_policy
    # what vLLM Ascend's legacy formula reads from a deployment (features add theirs)
    legacy = dict(num_layers=m.layers, mode=graph.mode, hccl_mode=engine.hccl_mode,
                  release=stack_profile.legacy_budget, **needs.budget_inputs) if policy == "legacy" else {}
    try:
        budget = stream_budget(policy, sizes.sizes, **legacy)
    except EngineRefusal as refusal:  # v0.18.0's update_aclgraph_sizes crashes when it keeps one size
        raise PointSkipped(REFUSED.format(stack=stack_profile.name, why=refusal), needs.features) from None
    if needs.world_size > MAX_WORLD_SIZE:
        raise ItemProblem("features", f"the features need {needs.world_size} ranks (one process each), above the "
                                      f"maximum world size of {MAX_WORLD_SIZE}")
    streams = StreamConfig(engine.stream_pool, engine.streams_per_graph, 1 if engine.hccl_mode == "AIV" else 2)
    rules = DeviceRules(rng_in_capture=stack_profile.rng_in_capture,
                        capture_survives_rejected_sync=stack_profile.capture_survives_rejected_sync,
                        generator_registration=stack_profile.generator_registration)
    rows = tuple({**row.pinned(), "step": row.step, "rank": row.rank, "for_mode": row.for_mode, "index": i,
                  "line": dispatch_lines[i] if i < len(dispatch_lines) else None}
                 for i, row in enumerate(scenario.expect.dispatch or ()) if row.for_stack in (None, stack_profile.name))
    return ResolvedItem(scenario, backend, capabilities, stack_profile, needs.features, needs.world_size, q, graph,
                        sizes, budget, model, streams, rules, rows)


def refused_at_start_up(point: PlainData, features: Sequence[Feature]) -> str | None:
    """Why the real engine would refuse to start ``point``, given as plain data, else None.

    The cross product's selection judges thousands of points, some partial, before any is
    validated, so this reads the raw values (absent ones as the schema's defaults). It asks the
    same rules as :func:`resolve_item`, in the same order: the stack, its start-up mode rules,
    then spec decode's rounding of the capture sizes with the features' constraints (vLLM's
    ``adjust_cudagraph_sizes_for_spec_decode``: speculation with SP where ``max(q, tp)`` is no
    common multiple). Without an attention backend's downgrade: the cross product names none."""
    graph = point.get("graph") or {}
    default = {name: info.default for name, info in GraphSpec.model_fields.items()}
    stack, startup = _start_up(point.get("stack"), str(graph.get("mode", default["mode"])),
                               compilation_mode=graph.get("compilation_mode", default["compilation_mode"]),
                               platform=graph.get("platform", default["platform"]))
    try:
        spec_decode_rounding(registry.size_constraints(features),
                             decode_full=startup.mode.decode_mode() is CUDAGraphMode.FULL,
                             spec_sp_multiple=stack.spec_sp_multiple)
    except EngineRefusal as refusal:
        return REFUSED.format(stack=stack.name, why=refusal)
    return None
