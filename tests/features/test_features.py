"""The feature interface and registry, without ranks (multi-rank runs are the scenarios')."""

from __future__ import annotations

import sys
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
)
from harness.graph.scheduler import RequestPlan
from harness.graph.shape import RankContext, StepShape
from harness.session import dp_share


def test_builtin_registry_names_every_feature_once():
    assert [cls.name for cls in BUILTIN] == ["sp", "dp", "mtp", "cp"]
    assert set(registry()) >= {"sp", "dp", "mtp", "cp"}


def test_only_enabled_features_are_active_and_fix_switches_are_read():
    active = active_features({"sp": {"tp": 2}, "dp": {"size": 1}, "mtp": {"k": 0}, "cp": {"size": 2}},
                             {"sp_padding": False})
    assert [type(f) for f in active] == [SequenceParallel, ContextParallel]
    assert active[0].fix_on is False and active[1].fix_on is True
    with pytest.raises(ValueError, match="unknown feature 'ep'"):
        active_features({"ep": {"size": 2}}, {})


def test_sequence_parallel_rounds_tokens_and_filters_sizes():
    sp = SequenceParallel({"tp": 2}, {})
    assert [sp.pad_tokens(n) for n in (1, 2, 5, 8)] == [2, 2, 6, 8]
    assert sp.capture_sizes([1, 2, 4, 6, 7, 8], 8) == [2, 4, 6, 8]
    assert sp.ranks() == 2
    with pytest.raises(ValueError, match="tp=4"):
        SequenceParallel({"tp": 4}, {}).capture_sizes([1, 2, 3], 3)


def test_speculative_decoding_rounds_sizes_to_multiples_of_q():
    mtp = SpeculativeDecoding({"k": 2}, {})
    assert mtp.extra_query_tokens() == 2
    assert mtp.capture_sizes([1, 2, 4, 8, 16], 16) == [3, 6, 9]  # 16 -> 18 is above the max
    assert mtp.unsupported({"workload": {"steps": [[{"req": "a", "new_tokens": 1}]]}})


def test_data_parallel_without_a_group_is_the_identity():
    dp = DataParallel({"size": 2}, {})
    shape = StepShape(8, "FULL", True)
    assert dp.agree(shape, RankContext()) == shape


def test_dp_share_gives_every_rank_its_batch():
    plans = [RequestPlan(f"r{i}", 3, 3) for i in range(5)]
    ctx = [RankContext(dp=2, dp_rank=r) for r in (0, 1)]
    assert [p.req_id for p in dp_share(plans, ctx[0], "equal")] == ["r0", "r2", "r4"]
    assert [p.req_id for p in dp_share(plans, ctx[1], "equal")] == ["r1", "r3"]
    assert [p.req_id for p in dp_share(plans, ctx[0], "unequal")] == ["r0", "r1", "r2", "r3"]
    assert [p.req_id for p in dp_share(plans, ctx[1], "unequal")] == ["r4"]


def test_cp_is_not_modelled_together_with_sp():
    cp = ContextParallel({"size": 2}, {})
    assert "not modelled" in cp.unsupported({"features": {"sp": {"tp": 2}}})
    assert cp.unsupported({"features": {"sp": {"tp": 1}}}) is None


def test_a_feature_can_come_from_an_entry_point(tmp_path, monkeypatch):
    """A plugin outside this repository: a module plus an entry point, nothing else."""
    (tmp_path / "ep_feature.py").write_text(textwrap.dedent('''
        from harness.features import Feature

        class ExpertParallel(Feature):
            name = "ep"
            fix = None
            ledger = "ep"

            def enabled(self):
                return self.settings.get("size", 1) > 1

            def pad_tokens(self, num_tokens):
                return num_tokens + 1
    '''))
    dist = tmp_path / "ep_feature-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ep-feature\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nep = ep_feature:ExpertParallel\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "ep" in registry()
    (feature,) = active_features({"ep": {"size": 2}}, {})
    assert isinstance(feature, Feature) and feature.pad_tokens(4) == 5
    sys.modules.pop("ep_feature", None)
