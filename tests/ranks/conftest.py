"""Shared by the tests of harness.ranks: the temp dirs a run made, and what a clean run leaves."""

from __future__ import annotations

import os
import tempfile

import pytest

from harness import ranks


@pytest.fixture
def workdirs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the temp dirs run_ranks creates, to check they are removed."""
    made: list[str] = []
    real = tempfile.mkdtemp

    def mkdtemp(*a, **kw):
        path = real(*a, **kw)
        if os.path.basename(path).startswith("graph-harness-ranks-"):  # not multiprocessing's own
            made.append(path)
        return path

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    return made


def gone(pid: int) -> bool:
    """True when no process (not even a zombie) has this pid."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def assert_clean(outcome: ranks.RanksOutcome, workdirs: list[str], warm: bool = True) -> None:
    """No temp dir is left; the ranks of a failed (or spawned) run are gone; those of a clean
    warm run wait, idle, in the pool, and are gone once it is closed."""
    assert workdirs and not any(os.path.exists(d) for d in workdirs), workdirs
    assert outcome.pids
    if outcome.ok and warm:
        assert set(outcome.pids) <= set(ranks.pool_pids()), (outcome.pids, ranks.pool_pids())
        ranks.close_pool()
        assert not ranks.pool_pids()
    assert all(gone(pid) for pid in outcome.pids), outcome.pids
