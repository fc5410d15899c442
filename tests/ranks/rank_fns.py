"""Module-level rank functions for tests/ranks: spawned ranks import them by name."""

from __future__ import annotations

import os
from typing import Any
import time

import torch
import torch.distributed as dist


def all_reduce_sum(rank: int, world_size: int, scale: float) -> dict:
    """Every rank contributes ``scale * (rank + 1)``; returns what it sees after the sum."""
    print(f"hello from rank {rank} of {world_size}", flush=True)
    t = torch.full((4,), scale * (rank + 1))
    dist.all_reduce(t)
    return {"rank": rank, "sum": t, "threads": torch.get_num_threads()}


def raise_on_rank1(rank: int, world_size: int) -> None:
    """Rank 1 raises; rank 0 keeps running (it must be ended by the harness)."""
    if rank == 1:
        raise ValueError("rank 1 disagrees")
    time.sleep(600)


def exit_on_rank1(rank: int, world_size: int, code: int) -> None:
    """Rank 1 dies without reporting; rank 0 keeps running."""
    if rank == 1:
        print("rank 1 about to exit", flush=True)
        os._exit(code)
    time.sleep(600)


def skip_collective_on_rank1(rank: int, world_size: int) -> None:
    """Rank 0 enters an all_reduce that rank 1 never joins (rank 1 stays alive, elsewhere)."""
    if rank == 1:
        time.sleep(600)
        return
    print("rank 0 entering all_reduce", flush=True)
    dist.all_reduce(torch.ones(1))


def big_result(rank: int, world_size: int, nbytes: int) -> dict:
    """A result of several MB, plus what the rank saw of its environment."""
    return {
        "payload": bytes(range(256)) * (nbytes // 256),
        "env": os.environ.get("GH_RANKS_TEST"),
        "world": dist.get_world_size(),
    }


def in_process_sum(rank: int, world_size: int, x: int) -> int:
    """Runs in the caller's process; uses a collective only when a group exists."""
    t = torch.tensor([x])
    if dist.is_initialized():
        dist.all_reduce(t)
    return int(t.item()) + rank * 100 + world_size * 1000


def fail_in_process(rank: int, world_size: int) -> None:
    raise KeyError("nope")


def parent_pid(rank: int, world_size: int) -> int:
    """The pid of the process that started this rank (the warm server, for a warm rank)."""
    return os.getppid()


def sleep_forever(rank: int, world_size: int) -> None:
    """Writes its pid into the run's temp dir (where its log is), then never returns."""
    workdir = os.path.dirname(os.readlink("/proc/self/fd/1"))  # fd 1 is <workdir>/rank<r>.log
    with open(os.path.join(workdir, f"rank{rank}.pid.tmp"), "w") as f:
        f.write(str(os.getpid()))
    os.replace(os.path.join(workdir, f"rank{rank}.pid.tmp"), os.path.join(workdir, f"rank{rank}.pid"))
    time.sleep(600)


#: Imports that cost a fresh rank seconds; a scenario rank must reach neither.
HEAVY_MODULES = ("torch._dynamo", "sympy")


def scenario_rank_imports(rank: int, world_size: int, item: Any) -> list[str]:
    """Run one rank of a scenario as the session does; return the heavy modules its job
    imported. (What the rank inherited is the warm server's: a spawned server never imports
    them, tests/ranks checks it; a forked one holds what the harness process had anyway.)"""
    import sys

    from harness.executor import rank_job

    before = {name for name in HEAVY_MODULES if name in sys.modules}
    rank_job(rank, world_size, item)
    return [name for name in HEAVY_MODULES if name in sys.modules and name not in before]


def _compute(seconds: float) -> int:
    """Busy CPU work for ``seconds`` (a rank that is slower, not stuck)."""
    n, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        n += sum(range(1000))
    return n


def collective_after_rank1_finished(rank: int, world_size: int) -> None:
    """Rank 1 returns at once; rank 0 then enters an all_reduce that rank 1 never joins."""
    if rank == 1:
        return
    print("rank 0 entering all_reduce", flush=True)
    dist.all_reduce(torch.ones(1))


def slower_rank0(rank: int, world_size: int, seconds: float, busy: bool) -> int:
    """Rank 1 returns at once; rank 0 computes (``busy``) or sleeps for ``seconds``, then returns
    without a collective: slower, never stuck."""
    if rank == 0:
        if busy:
            _compute(seconds)
        else:
            time.sleep(seconds)
    return rank


def pair_goes_on_after_rank2_finished(rank: int, world_size: int, seconds: float) -> int:
    """Ranks 0 and 1 go on in a group of their own after rank 2 has returned: rank 1 waits in an
    all_reduce while rank 0 computes for ``seconds``, then both meet."""
    pair = dist.new_group([0, 1])  # every rank creates every group
    if rank == 2:
        return rank
    if rank == 0:
        _compute(seconds)
    t = torch.ones(1)
    dist.all_reduce(t, group=pair)
    return int(t.item())


def local_rank_env(rank: int, world_size: int) -> tuple[str | None, int]:
    """What the rank was told of its place on the host, and who started it."""
    return os.environ.get("LOCAL_RANK"), os.getppid()
