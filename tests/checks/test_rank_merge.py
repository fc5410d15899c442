"""An item's check verdicts from its ranks' (harness.checks.ranks.merge_rank_checks)."""

from __future__ import annotations

from harness.checks.ranks import merge_rank_checks
from harness.checks.result import CheckResult, not_evaluated


def _ok(name: str, summary: str = "fine") -> CheckResult:
    return CheckResult(name, True, summary)


def test_a_check_that_fails_on_one_rank_fails_the_item_and_names_the_rank():
    bad = CheckResult("equality", False, "step 2 differs", 2, {"pairs": 1})
    merged, shown = merge_rank_checks([{"equality": _ok("equality")}, {"equality": bad}])
    assert not merged["equality"].passed and merged["equality"].summary == "rank 1: step 2 differs"
    assert merged["equality"].first_step == 2 and merged["equality"].details["ranks_failing"] == [1]
    assert shown == 1  # the evidence shown is the failing rank's


def test_a_pass_judged_by_every_rank_says_so_and_shows_rank_0():
    merged, shown = merge_rank_checks([{"stale_params": _ok("stale_params")}] * 4)
    assert merged["stale_params"].passed and merged["stale_params"].summary == "fine (all 4 ranks)"
    assert shown == 0


def test_a_pass_only_some_ranks_could_judge_names_them():
    judged, idle = _ok("equality", "12 pairs equal"), not_evaluated("equality", "no reference here")
    merged, _ = merge_rank_checks([{"equality": judged}, {"equality": idle}, {"equality": judged}])
    check = merged["equality"]
    assert check.passed and check.evaluated
    assert check.summary == "12 pairs equal (ranks 0, 2 of 3; the others not evaluated)"


def test_no_rank_judging_a_check_leaves_it_not_evaluated():
    idle = not_evaluated("fia_invariant", "no FIA call was made")
    merged, _ = merge_rank_checks([{"fia_invariant": idle}, {"fia_invariant": idle}])
    assert merged["fia_invariant"].passed and not merged["fia_invariant"].evaluated


def test_a_check_only_one_rank_ran_keeps_that_rank_s_verdict():
    crash = CheckResult("execution", False, "graph path raised RuntimeError at step 1", 1)
    merged, shown = merge_rank_checks([{"equality": _ok("equality")}, {"equality": _ok("equality"), "execution": crash}])
    assert merged["execution"].summary == "rank 1: graph path raised RuntimeError at step 1"
    assert not merged["execution"].passed and shown == 1
