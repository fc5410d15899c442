"""The feature interface and registry; a feature from another package, end to end."""

from __future__ import annotations

import textwrap

import pytest

from harness.features import (
    BUILTIN,
    ENTRY_POINT_GROUP,
    ContextParallel,
    DataParallel,
    Feature,
    SequenceParallel,
    SpeculativeDecoding,
    active_features,
    registry,
    size_constraints,
    world_size,
)
from harness.collection import collect_points
from harness.features.layout import axis_sizes, coordinates, runs_reference
from harness.graph.capture_sizes import EngineRefusal, compose_constraints
from harness.graph.scheduler import RequestPlan
from harness.graph.shape import RankAxis, RankContext, StepShape


def test_builtin_registry_names_every_feature_once_in_layout_order():
    assert [cls.name for cls in BUILTIN] == ["dp", "sp", "mtp", "cp"]
    assert set(registry()) >= {"sp", "dp", "mtp", "cp"}
    assert all(cls.marker and cls.fixes for cls in BUILTIN)


def test_only_enabled_features_are_active_and_fix_switches_are_read():
    active = active_features({"sp": {"tp": 2}, "dp": {"size": 1}, "mtp": {"k": 0}, "cp": {"size": 2}},
                             {"sp_padding": False})
    assert [type(f) for f in active] == [SequenceParallel, ContextParallel]
    assert active[0].fix_on is False and active[1].fix_on is True
    with pytest.raises(ValueError, match="unknown feature 'ep'"):
        active_features({"ep": {"size": 2}}, {})


def test_sequence_parallel_declares_its_axis_constraints_and_budget_inputs():
    sp = SequenceParallel({"tp": 2}, {})
    assert (sp.axis, sp.world_size(), sp.token_multiple()) == ("tp", 2, 2)
    assert compose_constraints([1, 2, 4, 6, 7, 8], sp.size_constraints()) == [2, 4, 6, 8]
    assert sp.budget_inputs() == {"tp": 2}
    with pytest.raises(ValueError, match="tp=4"):
        compose_constraints([1, 2, 3], SequenceParallel({"tp": 4}, {}).size_constraints())


def test_speculative_decoding_rounds_sizes_to_multiples_of_q():
    mtp = SpeculativeDecoding({"k": 2}, {})
    assert mtp.extra_query_tokens() == 2 and mtp.axis is None
    assert compose_constraints([1, 2, 4, 8, 16], mtp.size_constraints()) == [3, 6, 9]  # 18 is above the max
    assert mtp.unsupported({"workload": {"steps": [[{"req": "a", "new_tokens": 1}]]}})


def test_sp_with_mtp_composes_to_the_lcm_only_in_the_harness_alternative():
    features = active_features({"sp": {"tp": 2}, "mtp": {"k": 2}}, {})
    assert compose_constraints([1, 2, 4, 8], size_constraints(features), spec_sp_multiple="lcm") == [6]
    with pytest.raises(EngineRefusal, match="both a multiple of 3 .* and 2 .*tensor_parallel_size"):
        compose_constraints([1, 2, 4, 8], size_constraints(features))  # upstream: max(3, 2) = 3


def test_data_parallel_without_a_group_is_the_identity():
    dp = DataParallel({"size": 2}, {})
    shape = StepShape(8, True)
    assert dp.agree(shape, RankContext()) == shape


def test_dp_shares_the_requests_among_its_ranks():
    plans = [RequestPlan(f"r{i}", 3, 3) for i in range(5)]
    ctx = [RankContext(axes={"dp": RankAxis(2, r)}) for r in (0, 1)]
    equal, unequal = DataParallel({"size": 2}, {}), DataParallel({"size": 2, "batches": "unequal"}, {})
    assert [p.req_id for p in equal.share_requests(plans, ctx[0])] == ["r0", "r2", "r4"]
    assert [p.req_id for p in equal.share_requests(plans, ctx[1])] == ["r1", "r3"]
    assert [p.req_id for p in unequal.share_requests(plans, ctx[0])] == ["r0", "r1", "r2", "r3"]
    assert [p.req_id for p in unequal.share_requests(plans, ctx[1])] == ["r4"]


def test_rank_layout_follows_the_registry_outermost_first():
    features = active_features({"dp": {"size": 2}, "sp": {"tp": 2}, "cp": {"size": 2}}, {})
    sizes = axis_sizes(features)
    assert sizes == [("dp", 2), ("tp", 2), ("cp", 2)] and world_size(features) == 8
    # rank = (dp_rank * tp + tp_rank) * cp + cp_rank
    assert coordinates(sizes, 5) == {"dp": 1, "tp": 0, "cp": 1}


def test_the_reference_runs_once_per_group_of_ranks_with_the_same_requests():
    """DP ranks get requests of their own, each runs the reference; TP and CP ranks share their
    requests, and only the first of them runs it."""
    features = active_features({"dp": {"size": 2}, "sp": {"tp": 2}, "cp": {"size": 2}}, {})
    sizes = axis_sizes(features)
    running = [r for r in range(8)
               if runs_reference(features, RankContext(r, 8, {a: RankAxis(n, coordinates(sizes, r)[a]) for a, n in sizes}))]
    assert running == [0, 4]  # (dp 0, tp 0, cp 0) and (dp 1, tp 0, cp 0)
    assert [f.splits_requests() for f in features] == [True, False, False]
    assert runs_reference([], RankContext())  # a single rank runs everything


def test_cp_is_not_modelled_beside_a_feature_that_shards_the_model():
    from harness.features import active_features, unsupported_reason

    def reason(features):
        return unsupported_reason(active_features(features, {}), {})

    assert "not modelled" in reason({"cp": {"size": 2}, "sp": {"tp": 2}})
    assert "(sp)" in reason({"cp": {"size": 2}, "sp": {"tp": 2}})
    assert reason({"cp": {"size": 2}, "sp": {"tp": 1}}) is None  # SP off: no shard
    assert reason({"cp": {"size": 2}, "dp": {"size": 2}}) is None  # DP keeps the whole model


def test_each_feature_names_itself_in_reports_and_colours_its_ledger_column():
    from harness.features import feature_label, ledger_colours

    assert feature_label({"sp": {"tp": 2}, "dp": {"size": 2}, "mtp": {"k": 1}, "cp": {"size": 1}}) == "dp2+sp2+mtp1"
    assert feature_label({"sp": {"tp": 1}, "mtp": {"k": 0}}) == feature_label({}) == "base"
    assert set(ledger_colours()) >= {"sp", "dp", "spec", "cp"}  # MTP's drafts are the ledger's "spec"


def test_a_feature_says_whether_non_full_batches_pad_their_requests():
    """vLLM Ascend pads the requests of a non-FULL batch with SP, and never with CP (DCP)."""
    from harness.graph.modes import CUDAGraphMode
    from harness.graph.plan import PlannerConfig, StepPlanner

    def pads(settings):
        config = PlannerConfig(CUDAGraphMode.PIECEWISE, (2, 4), 4, 1, 16, 8)
        return StepPlanner(config, active_features(settings, {})).pads_without_full

    assert pads({"sp": {"tp": 2}}) and not pads({"sp": {"tp": 2}, "cp": {"size": 2}}) and not pads({"dp": {"size": 2}})


def test_sp_refuses_a_model_its_ranks_cannot_split_at_the_field_to_change():
    from harness.model.config import ModelConfig

    sp = SequenceParallel({"tp": 4}, {})
    field, message = sp.model_problem(ModelConfig(num_heads=6, num_kv_heads=2, hidden_size=64, head_dim=16))
    assert field == "model.num_heads" and message.endswith("with features.sp.tp=4")
    assert sp.model_problem(ModelConfig(num_heads=4, num_kv_heads=4, hidden_size=64, head_dim=16)) is None


# -- a feature from another package ---------------------------------------------------------------

PLUGIN = '''
from pathlib import Path

from pydantic import Field

from harness.features import FeatureSettings, FixSwitch, RankAxisFeature, SizeConstraint


class EPSettings(FeatureSettings):
    size: int = Field(1, ge=1, description="expert-parallel ranks")


class ExpertParallel(RankAxisFeature):
    """Expert parallel: tokens are dispatched to experts all-to-all, so T is a multiple of ep;
    each rank holds its share of the experts (here: of the MLP columns and the heads), and the
    ranks' partial sums are all-reduced."""

    name = "ep"
    Settings = EPSettings
    fixes = {"ep_padding": FixSwitch("the metadata covers the tokens EP adds", "FIA: last element < T")}
    marker = "expert parallel (size > 1)"
    axis = "ep"
    ledger = "ep"
    ledger_colour = "#54a24b"

    @classmethod
    def label(cls, settings):
        size = settings.get("size", 1)
        return f"ep{size}" if isinstance(size, int) and size > 1 else None

    def size_constraints(self):
        return [SizeConstraint(self.size, "keep", f"expert parallel with ep={self.size}")]

    def token_multiple(self):
        return self.size

    def model_problem(self, config):
        if config.num_kv_heads % self.size:
            return "model.num_kv_heads", f"{config.num_kv_heads} KV heads cannot be split over ep={self.size} ranks"
        return None

    def rank_model(self, model, ctx):
        from harness.model import DecoderLM
        from harness.model.parallel import ParallelContext

        axis = ctx.axis("ep")
        shard = DecoderLM(model.config, ParallelContext(axis.size, axis.rank, axis.group)).place(model.device)
        # what the test reads back: the model this rank ran
        Path(__file__).with_name(f"ep_shard_rank{ctx.rank}.txt").write_text(
            f"{shard.local_num_heads}/{model.local_num_heads} heads")
        return shard

    def before_forward(self, shape, ctx, step):
        axis = ctx.axis("ep")  # the harness gave this rank its coordinates and its group
        if axis.size != 2 or axis.group is None or not 0 <= axis.rank < 2:
            raise RuntimeError(f"no ep process group on rank {ctx.rank}: {axis}")
'''


@pytest.fixture(scope="session")
def ep_package(tmp_path_factory):
    """The plugin's directory, one per session: warm rank workers keep the module they imported
    (and its ``__file__``) from one run to the next."""
    root = tmp_path_factory.mktemp("ep_package")
    (root / "ep_feature.py").write_text(textwrap.dedent(PLUGIN))
    dist = root / "ep_feature-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ep-feature\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nep = ep_feature:ExpertParallel\n")
    return root


@pytest.fixture
def expert_parallel(ep_package, monkeypatch):
    """Install ``ep`` from a temporary entry point (a package outside this repository). The
    module stays imported after the test (the registry's scan for this ``sys.path`` holds its
    classes); without the entry point on ``sys.path`` no scan finds it."""
    monkeypatch.syspath_prepend(str(ep_package))
    return registry()["ep"]


def _ep_point(tmp_path, fix_on: bool, mode: str = "NONE"):
    from harness.scenario import load_scenario_file

    path = tmp_path / "ep.yaml"
    path.write_text(textwrap.dedent(f"""
        name: ep_{'fixed' if fix_on else 'no_padding'}
        model: {{kind: random, layers: 1}}
        graph: {{mode: {mode}, capture_sizes: [1, 2, 3, 4]}}
        features: {{ep: {{size: 2}}}}
        fixes: {{ep_padding: {'true' if fix_on else 'false'}}}
        steps: 3
        workload:
          requests:
            - {{prompt_len: 5, output_len: 3}}
        expect: {'pass' if fix_on else '{fail: [fia_invariant]}'}
    """))
    (point,) = load_scenario_file(path)
    return point


def test_an_outside_feature_declares_everything_and_needs_no_harness_change(expert_parallel, tmp_path):
    from harness.resolve import resolve_item
    from harness.scenario import Scenario, ScenarioError, load_scenario_text

    assert issubclass(expert_parallel, Feature) and expert_parallel.marker
    point = _ep_point(tmp_path, fix_on=False)
    scenario = point.scenario
    assert scenario.fixes.model_dump()["ep_padding"] is False  # its own fix switch
    item = resolve_item(scenario)
    assert [f.name for f in item.features] == ["ep"] and item.world_size == 2
    assert list(item.capture_sizes) == []  # mode NONE: no sizes (vLLM: [], max 0)
    piecewise = scenario.model_copy(update={"graph": scenario.graph.model_copy(update={"mode": "PIECEWISE"})})
    assert list(resolve_item(piecewise).capture_sizes) == [2, 4]  # its capture-size constraint
    with pytest.raises(Exception, match="size"):  # its settings are typed: a string is refused
        Scenario.model_validate({"workload": {"requests": [{"prompt_len": 2, "output_len": 2}]},
                                 "features": {"ep": {"size": "two"}}})
    with pytest.raises(ScenarioError, match="ep_pading"):
        load_scenario_text("workload: {requests: [{prompt_len: 2, output_len: 2}]}\nfixes: {ep_pading: false}\n",
                           path="typo.yaml")
    # a model it cannot split is a bad file, at the field to change (collection's preflight)
    bad = tmp_path / "ep_bad_model.yaml"
    bad.write_text((tmp_path / "ep.yaml").read_text().replace(
        "model: {kind: random, layers: 1}", "model: {kind: random, layers: 1, num_heads: 3, num_kv_heads: 3}"))
    with pytest.raises(ScenarioError, match=r"ep_bad_model.yaml:3: model.num_kv_heads: 3 KV heads cannot be split"):
        collect_points(bad)


def test_an_outside_features_known_bad_scenario_fails_exactly_its_check(expert_parallel, ep_package, tmp_path):
    """Two real ranks along the plugin's axis; fix off: exactly fia_invariant; fix on: passes.
    Each rank runs the plugin's shard of the model, checked against the unsplit reference."""
    from harness.session import PASSED, XFAILED, run_point

    bad = run_point(_ep_point(tmp_path, fix_on=False), backend="emulated")
    assert bad.outcome == XFAILED, bad.verdict
    assert bad.failed_checks == ["fia_invariant"]
    good = run_point(_ep_point(tmp_path, fix_on=True), backend="emulated")
    assert good.outcome == PASSED, good.verdict
    assert _shards(ep_package) == ["2/4 heads", "2/4 heads"]  # the model each rank ran: half the heads


def _shards(ep_package) -> list[str]:
    """What the plugin's ``rank_model`` wrote on each rank (and clears it for the next run)."""
    out = []
    for rank in (0, 1):
        marker = ep_package / f"ep_shard_rank{rank}.txt"
        out.append(marker.read_text() if marker.exists() else "")
        marker.unlink(missing_ok=True)
    return out


def test_an_outside_feature_shards_the_model_in_captured_graphs_and_names_itself_in_reports(expert_parallel,
                                                                                          ep_package, tmp_path):
    """FULL graphs captured and replayed on each rank's shard (its all-reduces inside them), equal
    to the unsplit reference; the report labels the item by the plugin's label and draws its
    padding-ledger column in the plugin's colour."""
    from harness.report.html import render_item
    from harness.report.results import item_record
    from harness.report.view import feature_label
    from harness.session import PASSED, run_point

    result = run_point(_ep_point(tmp_path, fix_on=True, mode="FULL"), backend="emulated")
    assert result.outcome == PASSED, result.verdict
    assert result.checks["equality"].evaluated and result.record.graphs_captured
    assert _shards(ep_package) == ["2/4 heads", "2/4 heads"]
    assert feature_label(result.scenario) == "ep2"
    eager = run_point(_ep_point(tmp_path, fix_on=True), backend="emulated")  # EP pads eager steps itself
    html = render_item(item_record(eager, {"torch": "x"}, evidence="all"), draw_charts=True)
    assert "features <b>ep2</b>" in html
    assert any("ep" in step.ledger for step in eager.record.steps) and "#54a24b" in html
