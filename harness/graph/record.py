"""What a pipeline run leaves behind for the checks and the report.

Plain data: every check is a pure function of a :class:`RunRecord`, so a check can be tested
on a hand-made record and a report can be written from a record of a run that crashed.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable

from harness.plain import JsonObject

if TYPE_CHECKING:  # types only: a record is read (checks, reports) where torch may never load
    from torch import Tensor

    from harness.ops.observe import FiaCall

PATHS = ("reference", "padded", "graph")
"""The three executions of every step: eager unpadded (the reference), eager with the graph
path's padding (separates padding effects from graph effects), and the graph path itself."""


class ErrorCategory(str, enum.Enum):
    """What kind of failure stopped a path, decided where it was caught (by ``isinstance``).

    A check claims the categories it explains (the FIA invariant claims ``fia_contract``, the
    stream budget ``stream_budget``); anything else is an unexplained crash.
    """

    FIA_CONTRACT = "fia_contract"  # the FIA host check rejected a call (CANN 561002 and kin)
    STREAM_BUDGET = "stream_budget"  # capture ran out of streams (ACL 207008)
    CRASH = "crash"  # anything else: a harness or pipeline bug, a rank that died
    RANK = "rank"  # a rank raised, crashed or hung before it could report


def categorize(error: BaseException) -> ErrorCategory:
    """The category of ``error``: by class (and its bases), never by name."""
    from harness.engine.errors import StreamBudgetError
    from harness.ops.contract import FiaArgumentError, FiaContractError

    if isinstance(error, (FiaContractError, FiaArgumentError)):
        return ErrorCategory.FIA_CONTRACT
    if isinstance(error, StreamBudgetError):
        return ErrorCategory.STREAM_BUDGET
    return ErrorCategory.CRASH


def fia_calls_by_phase(calls: Iterable[FiaCall], path: str = "graph") -> dict[str, int]:
    """How many FIA calls one path made in each phase (its ``phase`` tag): for the graph path,
    what the engine under test issues in ``warmup``, ``capture``, ``step`` (eager),
    ``between-pieces`` (PIECEWISE), ``update`` (task groups after a FULL replay),
    ``device-buffers``, and the draft model's ``draft`` (live), ``draft-capture`` and
    ``draft-update``. Calls without a path tag (none in a pipeline run) count for no path."""
    counts: dict[str, int] = {}
    for call in calls:
        tags = call.tags
        if tags.get("path") == path:
            phase = str(tags.get("phase", "-"))
            counts[phase] = counts.get(phase, 0) + 1
    return dict(sorted(counts.items()))


@dataclass
class PathError:
    """An execution path stopped: where, and why."""

    path: str
    step: int | None
    phase: str  # "capture", "step", "update", "rank <r>"
    kind: str  # exception class name (for people; classification is ``category``)
    message: str
    bucket: int | None = None
    category: ErrorCategory = ErrorCategory.CRASH

    @classmethod
    def of(cls, path: str, step: int | None, phase: str, error: BaseException, *,
           bucket: int | None = None) -> PathError:
        return cls(path, step, phase, type(error).__name__, str(error), bucket, categorize(error))


@dataclass
class StepRecord:
    step: int
    requests: list[tuple[str, int, int]]  # (req_id, num_computed_tokens, num_new_tokens)
    num_tokens: int
    uniform_decode: bool
    runtime_mode: str
    num_tokens_padded: int
    num_reqs: int
    num_reqs_padded: int
    padding_source: str
    dispatch_reason: str
    ledger: dict[str, int] = field(default_factory=dict)  # what each feature added to T
    descriptor: JsonObject | None = None  # the key of the graph replayed (None: eager)
    metadata: JsonObject = field(default_factory=dict)  # the graph path's host lists
    reference_metadata: JsonObject = field(default_factory=dict)  # the unpadded host lists
    sampled: dict[str, list[int]] = field(default_factory=dict)  # path -> token per request
    # path -> per request, the greedy tokens the step's rows gave up to the first rejected draft
    # (spec decode: the accepted drafts and the bonus token; otherwise the sampled token)
    generated: dict[str, list[list[int]]] = field(default_factory=dict)
    proposed: dict[str, dict[str, list[int]]] = field(default_factory=dict)  # path -> req -> draft tokens verified
    logits: dict[str, Tensor] = field(default_factory=dict)  # path -> real-row logits (not serialised)
    executed: list[JsonObject] | None = None  # per layer: host lists the graph executed
    host_lists_unverifiable: bool = False  # a FULL replay on a backend that cannot report them
    # the graph path's draft (speculative decoding): its dispatch, and for a draft graph the host
    # lists of each round and what each task group executed (harness.graph.draft_runner)
    draft: JsonObject | None = None
    seconds: dict[str, float] = field(default_factory=dict)  # path -> wall time to its logits on the host


@dataclass
class RunRecord:
    mode: str
    backend: str
    capture_sizes: list[int]
    graphs_captured: int = 0  # the draft model's included (one graph pool, one stream budget)
    draft_graphs_captured: int = 0  # of them, the draft model's (harness.graph.draft_runner)
    capture_seconds: float = 0.0
    steps: list[StepRecord] = field(default_factory=list)
    fia_calls: list[FiaCall] = field(default_factory=list)
    texts: dict[str, dict[str, list[int]]] = field(default_factory=dict)  # path -> req -> tokens
    unfinished: dict[str, list[str]] = field(default_factory=dict)  # path -> requests the step limit cut short
    errors: list[PathError] = field(default_factory=list)
    stream_usage: JsonObject = field(default_factory=dict)
    memory: JsonObject = field(default_factory=dict)
    # What ran on the device: kernels launched (-1 where the runtime does not count them) and
    # bytes of device memory allocated. A run on a device that used none ran on the host.
    device_work: dict[str, int] = field(default_factory=dict)
    budget: JsonObject = field(default_factory=dict)  # the capture-size policy's decision
    notes: list[str] = field(default_factory=list)
    speculation: dict[str, dict[str, int]] = field(default_factory=dict)  # path -> proposed/accepted
    reference_here: bool = True  # False: a peer with the same requests ran the reference (runs_reference)

    def error_of(self, path: str) -> PathError | None:
        return next((e for e in self.errors if e.path == path), None)
