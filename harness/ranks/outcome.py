"""What a multi-rank run hands back: every way a rank can go wrong, as data."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, Literal, TypeVar

__all__ = ["FailureKind", "RankFailure", "RanksOutcome"]

FailureKind = Literal["exception", "crash", "timeout", "hang"]

_R = TypeVar("_R")  # what the run's fn returns


@dataclass(frozen=True)
class RankFailure:
    """Why one rank did not return a result.

    ``kind`` is ``"exception"`` (``fn`` or the rank's setup raised; ``traceback`` holds the
    formatted traceback), ``"crash"`` (the process exited without reporting: segfault,
    ``os._exit``, killed; ``message`` holds the exit code), ``"timeout"`` (still running at the
    deadline, or ended after another rank failed) or ``"hang"`` (waiting in a collective that a
    finished peer will never join; ``traceback`` holds its stacks, :mod:`harness.ranks.stranded`).
    """

    rank: int
    kind: FailureKind
    message: str
    traceback: str | None = None
    log: str = ""
    exitcode: int | None = None
    at: float = float("inf")
    """Wall-clock time of the failure (its result file's mtime, or when a crash was seen)."""


@dataclass
class RanksOutcome(Generic[_R]):
    """What a multi-rank run produced: per-rank results (``None`` where a rank failed)."""

    ok: bool
    results: list[_R | None]
    failures: list[RankFailure]
    duration: float
    logs: list[str] = field(default_factory=list)
    pids: list[int | None] = field(default_factory=list)  # None: a rank whose process never started
    startup: float = 0.0
    """Seconds from the first start until every rank was ready (not counted in ``timeout``)."""

    @property
    def root_cause(self) -> RankFailure | None:
        """The failure that came first: the others are often its victims (a peer's collective
        reset, a timeout after the grace)."""
        return min(self.failures, key=lambda f: (f.at, f.rank)) if self.failures else None

    def report(self) -> str:
        """Human-readable account of the failures, with each failed rank's log tail."""
        if self.ok:
            return f"all {len(self.results)} ranks ok in {self.duration:.1f}s"
        parts = [f"{len(self.failures)} of {len(self.results)} ranks failed ({self.duration:.1f}s)"]
        for f in self.failures:
            parts.append(f"--- rank {f.rank}: {f.kind}: {f.message}")
            if f.traceback:
                parts.append(f.traceback.rstrip())
            if f.log.strip():
                parts.append(f"--- rank {f.rank} log (tail):\n{f.log.rstrip()}")
        return "\n".join(parts)
