"""Errors raised by the capture/replay engines, worded as the real runtimes word them.

The harness's checks match on these types and codes, so a failure on the emulator reads the
same as the failure an engineer would meet on hardware.
"""

from __future__ import annotations

#: ACL runtime error code for an exhausted stream pool (torch_npu / HDK).
STREAM_EXHAUSTED_CODE = 207008
STREAM_EXHAUSTED_MESSAGE = "Stream resources are insufficient"

#: Text of the CUDA / ACL error for a host synchronisation inside a capture.
CAPTURE_SYNC_MESSAGE = "operation not permitted when stream is capturing"


class EngineError(RuntimeError):
    """Base of every engine error."""


class CaptureError(EngineError):
    """An operation that cannot be captured was issued while a stream was capturing.

    The capture is abandoned (as with ``capture_error_mode="global"``); a new capture can begin.
    """


class StreamBudgetError(EngineError):
    """A graph needed more device streams than the pool had left (ACL error 207008)."""

    code = STREAM_EXHAUSTED_CODE

    def __init__(self, needed: int, in_use: int, pool_size: int, graph: str) -> None:
        self.needed, self.in_use, self.pool_size, self.graph = needed, in_use, pool_size, graph
        super().__init__(
            f"error code {STREAM_EXHAUSTED_CODE}: {STREAM_EXHAUSTED_MESSAGE} "
            f"(capture of {graph} needs {needed} stream(s); {in_use} of {pool_size} in use)"
        )

    def reworded(self, message: str) -> StreamBudgetError:
        """The same failure under another text: what a wrapper re-raises it as (vLLM Ascend's
        ``ACLGraphWrapper``: its advice, then ``Original error:`` and this text; see
        ``harness.graph.capture_errors``). Same class, same counts, so the check claims it."""
        error = StreamBudgetError(self.needed, self.in_use, self.pool_size, self.graph)
        error.args = (message,)
        return error


class GraphHangError(EngineError):
    """Queued device work can never finish: a replay waits on an event nobody records.

    On hardware this is a hang; the emulator reports it at the synchronisation point instead,
    naming the graph and the operation it is stuck at.
    """


class TaskUpdateError(EngineError):
    """A task-group update did not re-issue the captured operation with the captured tensors."""


class UnsupportedOnBackend(EngineError):
    """The selected backend cannot honour this call (for example task groups on CUDA graphs)."""


def reads_no_graph(backend: str, hook: str) -> UnsupportedOnBackend:
    """The refusal of a graph read-out ``hook`` by a native backend: its graphs are the runtime's
    own, and only the emulator reports what a replay ran. Callers ask
    ``capabilities.reports_executed_arguments`` first, so this is raised only on a misuse."""
    return UnsupportedOnBackend(f"{backend}: {hook}: the backend reads no graph of its own: only the emulator "
                                "reports what a replay ran (capabilities.reports_executed_arguments)")
