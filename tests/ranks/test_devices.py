"""Ranks on devices (harness.ranks.devices), on a CPU: the start method and process-group
backend per engine backend, the rank -> device mapping, the device-count skip (the device count
mocked), and that a device run's ranks are spawned, never forked."""

from __future__ import annotations

import os

import pytest
import torch

from harness.ranks import devices, run_ranks
from harness.ranks.devices import (device_index, group_device_type, group_start_method, process_group_backend,
                                   rank_device, start_method, too_few_devices)
from tests.ranks import rank_fns


@pytest.mark.parametrize(("engine", "method", "group"), [
    ("emulated", "forkserver", "gloo"),
    ("cuda", "spawn", "cpu:gloo,cuda:nccl"),
    ("npu", "spawn", "cpu:gloo,npu:hccl"),
])
def test_a_device_backends_ranks_are_spawned_and_use_its_collective_library(engine: str, method: str,
                                                                           group: str) -> None:
    assert start_method(engine) == method
    assert process_group_backend(engine) == group
    assert group_start_method(group) == method


@pytest.mark.parametrize(("group", "device"), [
    ("gloo", None), ("nccl", "cuda"), ("hccl", "npu"), ("cpu:gloo,cuda:nccl", "cuda"), ("cpu:gloo", None),
    ("cpu:gloo,npu:hccl", "npu"),
])
def test_the_device_a_process_group_backend_serves(group: str, device: str | None) -> None:
    assert group_device_type(group) == device
    assert group_start_method(group) == ("forkserver" if device is None else "spawn")


def test_an_unknown_engine_backend_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown engine backend 'tpu'"):
        process_group_backend("tpu")


def test_each_rank_owns_the_device_of_its_local_rank() -> None:
    assert [device_index(r, 8) for r in range(8)] == list(range(8))
    with pytest.raises(ValueError, match="needs device 2, but 2 device"):
        device_index(2, 2)
    with pytest.raises(ValueError):
        device_index(-1, 2)


@pytest.mark.parametrize(("engine", "world", "count", "reason"), [
    ("cuda", 2, 1, "needs 2 devices, found 1"),
    ("cuda", 16, 8, "needs 16 devices, found 8"),
    ("npu", 4, 0, "needs 4 devices, found 0"),
    ("cuda", 2, 2, None),
    ("npu", 4, 8, None),
    ("emulated", 16, 0, None),  # the emulator's ranks share the host
])
def test_an_item_with_more_ranks_than_devices_is_refused(engine: str, world: int, count: int,
                                                          reason: str | None) -> None:
    assert too_few_devices(engine, world, count) == reason


def test_the_emulator_counts_no_device_and_its_ranks_run_on_the_host() -> None:
    assert devices.device_count("emulated") == 0
    assert rank_device("emulated") == torch.device("cpu") == rank_device("cpu")
    with pytest.raises(ValueError, match="no rank device for 'xpu'"):
        rank_device("xpu")


def test_rank_device_makes_the_local_ranks_device_current(monkeypatch: pytest.MonkeyPatch) -> None:
    chosen: list[int] = []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert rank_device("cuda") == torch.device("cuda", 1) and chosen == [1]
    monkeypatch.delenv("LOCAL_RANK")  # not a rank of a run: a single-rank item, device 0
    assert rank_device("cuda") == torch.device("cuda", 0) and chosen == [1, 0]
    monkeypatch.setenv("LOCAL_RANK", "2")
    with pytest.raises(ValueError, match="needs device 2"):
        rank_device("cuda")


def test_every_rank_is_told_its_local_rank() -> None:
    out = run_ranks(rank_fns.local_rank_env, 2, timeout=60)
    assert out.ok, out.report()
    assert [r[0] for r in out.results] == ["0", "1"]


def test_a_device_runs_ranks_are_spawned_and_take_their_device_before_their_group(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CPU the CUDA group cannot be made, but the run shows what a device run does: its
    ranks are spawned (the warm pool is not asked: it would fail the start here), and each asks
    for device LOCAL_RANK before it creates its process group (and fails here: no device)."""
    from harness.ranks import run as run_module

    def no_warm_workers(*args, **kwargs):
        raise AssertionError("a device run asked the warm pool for workers")

    monkeypatch.setattr(run_module.POOL, "take", no_warm_workers)
    out = run_ranks(rank_fns.local_rank_env, 2, timeout=120, backend=process_group_backend("cuda"))
    assert not out.ok
    assert all(f.kind == "exception" for f in out.failures), out.report()
    assert "local rank 0 needs device 0, but 0 device(s) are visible" in out.failures[0].message
    assert "local rank 1 needs device 1" in out.failures[1].message
    assert "in rank_device" in out.failures[0].traceback and "init_process_group" not in out.failures[0].traceback


def test_the_warm_server_is_not_forked_from_a_process_with_cuda_initialised(monkeypatch: pytest.MonkeyPatch) -> None:
    from multiprocessing import forkserver

    from harness.ranks import server

    forks: list[bool] = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(forkserver._forkserver, "_forkserver_pid", None)
    monkeypatch.setattr(server.os, "fork", lambda: forks.append(True) or os.getpid())
    server.fork_warm_server([])
    assert forks == [] and forkserver._forkserver._forkserver_pid is None  # left to spawn a fresh one


def test_a_multi_rank_item_is_skipped_when_the_devices_are_too_few(monkeypatch: pytest.MonkeyPatch) -> None:
    """Wired where multi-rank items start (harness.executor.execute, through harness.session.run_point), the device count mocked."""
    import harness.executor as executor
    import harness.session as session
    from harness.scenario import load_scenario_text

    calls: list[dict] = []
    monkeypatch.setattr(session, "backend_problem", lambda backend: None)
    monkeypatch.setattr(executor, "device_count", lambda backend: 1)
    monkeypatch.setattr(executor, "run_ranks", lambda *a, **kw: calls.append(kw) or pytest.fail("ran"))
    (point,) = load_scenario_text(_TWO_RANKS)
    result = session.run_point(point, backend="cuda")
    assert result.outcome == session.SKIPPED and result.verdict == "needs 2 devices, found 1"
    assert calls == []
    monkeypatch.setattr(executor, "device_count", lambda backend: 2)
    monkeypatch.setattr(executor, "run_ranks", lambda *a, **kw: calls.append(kw) or _failed(2))
    result = session.run_point(point, backend="cuda")
    assert calls and calls[0]["backend"] == "cpu:gloo,cuda:nccl"  # the item ran, on NCCL


def _failed(world: int):
    from harness.ranks import RankFailure, RanksOutcome

    return RanksOutcome(False, [None] * world, [RankFailure(0, "crash", "stub")], 0.0, logs=[""] * world)


_TWO_RANKS = """
name: two_ranks
model: {kind: random, layers: 1}
graph: {mode: NONE}
features: {dp: {size: 2}}
steps: 2
workload:
  requests:
    - {prompt_len: 3, output_len: 2, repeat: 2}
"""
