"""The emulator's shared-memory collectives (harness.engine.emulated.collectives), on real ranks.

Each op against its ``_c10d_functional`` namesake on gloo, in float32 and bfloat16; a message
above the slot size; members that disagree on a collective (a hang on a device, an error here);
a member that dies in one; a decoder forward captured and replayed through them.
"""

from __future__ import annotations

import os

import pytest
import torch

from harness import ranks
from harness.engine.emulated import collectives
from harness.ranks import run_ranks
from tests.engine import collective_fns


@pytest.fixture(scope="module", params=[2, 4], ids=["2 ranks", "4 ranks"])
def every_op(request) -> tuple[int, list[dict]]:
    world = request.param
    outcome = run_ranks(collective_fns.every_op, world, args=("float32",), timeout=120)
    assert outcome.ok, outcome.report()
    return world, outcome.results


def _expected(world: int, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    values = collective_fns._values
    stacked = torch.stack([values(r, (5,), torch.float64) for r in range(world)])
    scatter = torch.stack([values(r, (2 * world, 4), torch.float64) for r in range(world)]).sum(0)
    return {
        "all_gather": torch.cat([values(r, (3, 4), torch.float64) for r in range(world)]).to(dtype),
        "all_reduce_sum": stacked.sum(0).to(dtype), "all_reduce_max": stacked.amax(0).to(dtype),
        "all_reduce_min": stacked.amin(0).to(dtype), "all_reduce_avg": (stacked.sum(0) / world).to(dtype),
        "reduce_scatter": [scatter[2 * r:2 * r + 2].to(dtype) for r in range(world)],
    }


def test_each_op_gives_the_exact_result_on_every_rank(every_op) -> None:
    world, results = every_op
    expected = _expected(world)
    for rank, result in enumerate(results):
        shm = result["shm"]
        assert torch.equal(shm["all_gather"], expected["all_gather"])
        assert torch.equal(shm["all_gather_functional"], expected["all_gather"])
        assert torch.equal(shm["reduce_scatter"], expected["reduce_scatter"][rank])
        for op in ("sum", "max", "min", "avg"):
            assert torch.equal(shm[f"all_reduce_{op}"], expected[f"all_reduce_{op}"]), op


def test_the_shared_memory_path_was_taken_and_agrees_with_gloo(every_op) -> None:
    world, results = every_op
    for result in results:
        assert result["available"] and result["groups"], "the ops fell back to the process group"
        assert any(name.startswith("comm-") for name in result["files"]) and not [
            name for name in result["files"] if name.endswith(".partial")]
        for key, value in result["c10d"].items():
            assert torch.equal(result["shm"][key], value), key  # exact values: any summation order


def test_bfloat16_results_are_the_same_on_every_rank() -> None:
    outcome = run_ranks(collective_fns.every_op, 2, args=("bfloat16",), timeout=120)
    assert outcome.ok, outcome.report()
    first, second = (r["shm"] for r in outcome.results)
    for key in ("all_gather", "all_reduce_sum", "all_reduce_max", "all_reduce_avg"):
        assert first[key].dtype == torch.bfloat16 and torch.equal(first[key], second[key]), key
    assert torch.equal(first["all_gather"], _expected(2, torch.bfloat16)["all_gather"])


def test_a_message_above_the_slot_size_goes_through_the_process_group() -> None:
    outcome = run_ranks(collective_fns.large_message, 2, timeout=120)
    assert outcome.ok, outcome.report()
    for result in outcome.results:
        assert result["large"] == result["large_last"] == 3.0 and result["small"] == 3.0
        assert result["shm_groups"], "the small message went through shared memory"


def test_members_that_disagree_fail_at_once_and_say_how() -> None:
    outcome = run_ranks(collective_fns.mismatched, 2, timeout=60, grace=5)
    assert not outcome.ok
    failure = outcome.root_cause
    assert failure is not None and failure.kind == "exception", outcome.report()
    assert "CollectiveError" in failure.message and "all_gather of 16 bytes" in failure.message
    assert "all_gather of 32 bytes" in failure.message


def test_members_that_disagree_on_the_dtype_fail_too() -> None:
    outcome = run_ranks(collective_fns.mismatched_dtype, 2, timeout=60, grace=5)
    failure = outcome.root_cause
    assert failure is not None and failure.kind == "exception", outcome.report()
    assert "all_reduce of 16 bytes of torch.float32" in failure.message
    assert "all_reduce of 16 bytes of torch.int32" in failure.message


def test_a_member_that_dies_in_a_collective_fails_its_peer_at_once() -> None:
    outcome = run_ranks(collective_fns.dies_in_a_collective, 2, timeout=60, grace=30)
    assert not outcome.ok
    by_rank = {f.rank: f for f in outcome.failures}
    assert by_rank[1].kind == "crash" and by_rank[1].exitcode == 3
    assert by_rank[0].kind == "exception", outcome.report()
    assert "member 1" in by_rank[0].message and "exited" in by_rank[0].message
    waited = float(by_rank[0].message.split("after ", 1)[1].split(" s", 1)[0])
    assert waited < 10, by_rank[0].message  # noticed by the wait's liveness check, not a timeout


def test_an_sp_forward_captured_through_shared_memory_replays_bit_for_bit() -> None:
    outcome = run_ranks(collective_fns.sp_capture_and_replay, 2, timeout=120)
    assert outcome.ok, outcome.report()
    for result in outcome.results:
        shm, c10d = result["shm"], result["c10d"]
        assert shm["family"] and c10d["family"]
        assert torch.equal(shm["replay"], shm["eager"]) and torch.equal(c10d["replay"], c10d["eager"])
        assert "harness_comm" in shm["namespaces"] and "_c10d_functional" not in shm["namespaces"]
        assert shm["streams"] == c10d["streams"] == 3  # one graph, one communication group
        torch.testing.assert_close(shm["eager"], c10d["eager"])  # the same model, up to summation order
    assert torch.equal(outcome.results[0]["shm"]["eager"], outcome.results[1]["shm"]["eager"])


def test_outside_a_run_of_ranks_the_ops_use_the_process_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(collectives.RUN_DIR_ENV, raising=False)
    assert not collectives.available()
    assert collectives._group("no-such-group", 16) is None  # never resolved: nothing to attach


@pytest.mark.parametrize(("tmpdir", "free", "expected"), [
    ("", 8 << 30, ranks.SHM_DIR), ("/somewhere", 8 << 30, None), ("", 64 << 20, None)])
def test_a_run_dir_is_in_memory_unless_tmpdir_says_otherwise_or_it_is_small(
        monkeypatch: pytest.MonkeyPatch, tmpdir: str, free: int, expected: str | None) -> None:
    monkeypatch.setenv("TMPDIR", tmpdir)

    class Stats:
        f_bavail, f_frsize = free // 4096, 4096

    monkeypatch.setattr(os, "statvfs", lambda path: Stats())
    monkeypatch.setattr(os, "access", lambda path, mode: True)
    assert ranks.run_dir_root() == expected


def test_every_rank_of_a_run_is_told_its_run_dir() -> None:
    outcome = run_ranks(collective_fns.run_dir, 2, timeout=60)
    assert outcome.ok, outcome.report()
    assert outcome.results[0] == outcome.results[1] and os.path.basename(outcome.results[0]).startswith(
        "graph-harness-ranks-")
    assert not os.path.exists(outcome.results[0])  # removed with the run
