"""The CUDA backend: ``torch.cuda.CUDAGraph`` behind the torch.npu-shaped names.

CUDA graphs capture, replay and share pools like ACL graphs, but they have no task groups:
a captured kernel's host arguments cannot be replaced. Those calls raise
:class:`UnsupportedOnBackend` saying so; on GPUs the answer is to keep per-request lengths in
device tensors (``harness.ops.fia_device_metadata``), as FlashAttention does with cu_seqlens.
"""

from __future__ import annotations

from typing import Any

import torch

from .errors import UnsupportedOnBackend
from .protocol import Capabilities, DeviceRules, StreamConfig

name = "cuda"
device_type = "cuda"
# Kernels may pick other algorithms per shape: compare within tolerance. No task groups.
capabilities = Capabilities(task_updates=False, bitwise_replay=False, stream_pool=False,
                            reports_executed_arguments=False)

_NO_TASK_GROUPS = (
    "task-group update is an ACL graph feature that CUDA graphs lack; keep per-request lengths in "
    "device tensors instead (harness.ops.fia_device_metadata)"
)
_graphs_alive: set[int] = set()


class NPUGraph(torch.cuda.CUDAGraph):
    """A CUDA graph with torch_npu's extra method names."""

    def capture_end(self) -> None:
        super().capture_end()
        _graphs_alive.add(id(self))

    def reset(self) -> None:
        _graphs_alive.discard(id(self))
        super().reset()

    def update(self, cpu_update_input: list[dict[str, Any]]) -> None:
        raise UnsupportedOnBackend(f"NPUGraph.update: {_NO_TASK_GROUPS}")


def graph(npu_graph: NPUGraph, pool=None, stream=None, auto_dispatch_capture: bool = False,
          capture_error_mode: str = "global"):
    if auto_dispatch_capture:
        raise UnsupportedOnBackend(f"graph(auto_dispatch_capture=True): {_NO_TASK_GROUPS}")
    return torch.cuda.graph(npu_graph, pool=pool, stream=stream, capture_error_mode=capture_error_mode)


def graph_pool_handle():
    return torch.cuda.graph_pool_handle()


def graph_task_group_begin(stream) -> None:
    raise UnsupportedOnBackend(f"graph_task_group_begin: {_NO_TASK_GROUPS}")


def graph_task_group_end(stream):
    raise UnsupportedOnBackend(f"graph_task_group_end: {_NO_TASK_GROUPS}")


def graph_task_update_begin(stream, handle) -> None:
    raise UnsupportedOnBackend(f"graph_task_update_begin: {_NO_TASK_GROUPS}")


def graph_task_update_end(stream) -> None:
    raise UnsupportedOnBackend(f"graph_task_update_end: {_NO_TASK_GROUPS}")


class ExternalEvent:
    """torch_npu's ExternalEvent on CUDA: an external CUDA event (capturable wait/record)."""

    def __init__(self) -> None:
        self._event = torch.cuda.Event(external=True)

    def record(self, stream) -> None:
        self._event.record(stream)

    def wait(self, stream) -> None:
        stream.wait_event(self._event)

    def reset(self, stream) -> None:
        """CUDA events need no reset: the next record supersedes the last."""


Stream = torch.cuda.Stream
current_stream = torch.cuda.current_stream
stream = torch.cuda.stream
synchronize = torch.cuda.synchronize
manual_seed = torch.cuda.manual_seed
get_rng_state = torch.cuda.get_rng_state
set_rng_state = torch.cuda.set_rng_state


def stream_usage() -> dict[str, Any]:
    """CUDA has no fixed stream pool for graphs; report the graphs held for the record."""
    return {"pool_size": None, "in_use": None, "graphs": len(_graphs_alive), "utilisation": 0.0}


def memory_report() -> dict[str, Any]:
    return {"device": {"bytes_reserved": torch.cuda.memory_reserved()}}


def device_name() -> str:
    return torch.cuda.get_device_name()


def reset_device(stream_config: StreamConfig | None = None, rules: DeviceRules | None = None) -> None:
    """Synchronize. CUDA has no fixed graph stream pool: a stream budget other than the default
    cannot be honoured, so it is refused (the item is skipped with the reason).
    ``rules`` (a stack's torch_npu rules) are the emulator's to follow: here the installed
    runtime's own rules apply, and the device check compares the two."""
    torch.cuda.synchronize()
    if stream_config is not None and stream_config.pool_size != StreamConfig().pool_size:
        raise UnsupportedOnBackend(f"cuda: no graph stream pool to limit to {stream_config.pool_size} streams")
