"""The CUDA backend: ``torch.cuda.CUDAGraph`` behind the torch.npu-shaped names.

CUDA graphs capture, replay and share pools like ACL graphs, but they have no task groups:
a captured kernel's host arguments cannot be replaced. Those calls raise
:class:`UnsupportedOnBackend` saying so; on GPUs the answer is to keep per-request lengths in
device tensors (``harness.ops.fia_device_metadata``), as FlashAttention does with cu_seqlens.
"""

from __future__ import annotations

import warnings
from typing import Any, ContextManager, Mapping, Sequence, TypeVar, cast

import torch

from .errors import CaptureError, UnsupportedOnBackend, reads_no_graph
from .protocol import (CAPABILITIES, ArgumentReader, DeviceGraph, DeviceRules, DeviceStream, GraphPool, StreamConfig, StreamUsage,
                       TaskGroup)

name = "cuda"
capabilities = CAPABILITIES[name]
device = torch.device("cuda", 0)  # this rank's GPU once reset_device() has looked

_NO_TASK_GROUPS = (
    "task-group update is an ACL graph feature that CUDA graphs lack; keep per-request lengths in "
    "device tensors instead (harness.ops.fia_device_metadata)"
)
_graphs_alive: set[int] = set()
_T = TypeVar("_T")


def _mine(value: object, kind: type[_T], what: str) -> _T:
    """``value`` as this backend's own ``kind``: the engine seam hands graphs and streams out under
    protocol types, and one from another engine is refused by name."""
    if isinstance(value, kind):
        return value
    raise TypeError(f"{value!r} is not {what} of the cuda backend")


class NPUGraph(torch.cuda.CUDAGraph):
    """A CUDA graph with torch_npu's extra method names."""

    def capture_end(self) -> None:
        # CUDA warns about an empty graph and captures it; for a serving engine's forward that is
        # always a bug (the model was left in host memory): refused, as the emulator refuses it.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            super().capture_end()
        empty = [w for w in caught if "Graph is empty" in str(w.message)]
        for w in caught:
            if w not in empty:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        if empty:
            raise CaptureError(f"captured graph has no device work ({empty[0].message}): its model or inputs are "
                               "in host memory, so every replay would launch nothing")
        _graphs_alive.add(id(self))

    def reset(self) -> None:
        _graphs_alive.discard(id(self))
        super().reset()

    def update(self, cpu_update_input: Sequence[Mapping[str, object]]) -> None:
        raise UnsupportedOnBackend(f"NPUGraph.update: {_NO_TASK_GROUPS}")


def graph(npu_graph: DeviceGraph, pool: GraphPool | None = None, stream: DeviceStream | None = None,
          auto_dispatch_capture: bool = False, capture_error_mode: str = "global") -> ContextManager[object]:
    if auto_dispatch_capture:
        raise UnsupportedOnBackend(f"graph(auto_dispatch_capture=True): {_NO_TASK_GROUPS}")
    # a pool is what graph_pool_handle() made: torch's (int, int) NewType, not checkable at run time
    handle = None if pool is None else cast("torch.cuda._POOL_HANDLE", _mine(pool, tuple, "a graph pool"))
    return torch.cuda.graph(_mine(npu_graph, torch.cuda.CUDAGraph, "a graph"), pool=handle,
                            stream=None if stream is None else _mine(stream, torch.cuda.Stream, "a stream"),
                            capture_error_mode=capture_error_mode)


def graph_pool_handle() -> GraphPool:
    return torch.cuda.graph_pool_handle()


def graph_task_group_begin(stream: DeviceStream) -> None:
    raise UnsupportedOnBackend(f"graph_task_group_begin: {_NO_TASK_GROUPS}")


def graph_task_group_end(stream: DeviceStream) -> TaskGroup:
    raise UnsupportedOnBackend(f"graph_task_group_end: {_NO_TASK_GROUPS}")


def graph_task_update_begin(stream: DeviceStream, handle: TaskGroup) -> None:
    raise UnsupportedOnBackend(f"graph_task_update_begin: {_NO_TASK_GROUPS}")


def graph_task_update_end(stream: DeviceStream) -> None:
    raise UnsupportedOnBackend(f"graph_task_update_end: {_NO_TASK_GROUPS}")


class ExternalEvent:
    """torch_npu's ExternalEvent on CUDA: an external CUDA event (capturable wait/record)."""

    def __init__(self) -> None:
        self._event = torch.cuda.Event(external=True)

    def record(self, stream: DeviceStream) -> None:
        self._event.record(_mine(stream, torch.cuda.Stream, "a stream"))

    def wait(self, stream: DeviceStream) -> None:
        _mine(stream, torch.cuda.Stream, "a stream").wait_event(self._event)

    def reset(self, stream: DeviceStream) -> None:
        """CUDA events need no reset: the next record supersedes the last."""


Stream = torch.cuda.Stream
Event = torch.cuda.Event
current_stream = torch.cuda.current_stream
synchronize = torch.cuda.synchronize
manual_seed = torch.cuda.manual_seed
get_rng_state = torch.cuda.get_rng_state
set_rng_state = torch.cuda.set_rng_state


def stream(stream: DeviceStream | None) -> ContextManager[object]:
    return torch.cuda.stream(None if stream is None else _mine(stream, torch.cuda.Stream, "a stream"))


def stream_usage() -> StreamUsage:
    """CUDA has no fixed stream pool for graphs; report the graphs held for the record."""
    return {"pool_size": None, "in_use": None, "graphs": len(_graphs_alive), "utilisation": 0.0}


def memory_report() -> dict[str, dict[str, object]]:
    return {"device": {"bytes_reserved": torch.cuda.memory_reserved()}}


def device_name() -> str:
    return torch.cuda.get_device_name()


def device_work() -> dict[str, int]:
    """Peak device memory since the last reset (graph launches are counted by the runner)."""
    return {"kernels": -1, "bytes_allocated": int(torch.cuda.max_memory_allocated(device))}


def native_attention() -> None:
    """None: the harness's reference FIA (device tensors, host lists) runs on the GPU."""


def native_paged_attention() -> None:
    """None: the harness's reference paged attention runs on the GPU."""


def collective_ops() -> None:
    """None: NCCL through ``_c10d_functional`` (capturable)."""


def weak_ref_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor on the same GPU memory that does not keep it allocated (vLLM's
    ``weak_ref_tensors``): a non-owning storage over the same address."""
    if not isinstance(tensor, torch.Tensor):
        return tensor
    storage = torch._C._construct_storage_from_data_pointer(
        tensor.untyped_storage().data_ptr(), tensor.device, tensor.untyped_storage().nbytes())
    return torch.empty(0, dtype=tensor.dtype, device=tensor.device).set_(
        storage, tensor.storage_offset(), tensor.size(), tensor.stride())


def reset_device(stream_config: StreamConfig | None = None, rules: DeviceRules | None = None) -> None:
    """Take this process's current GPU (a rank's, which harness.ranks made current before its
    process group), synchronize, and start counting its memory afresh.
    CUDA has no fixed graph stream pool: a stream budget other than the default cannot be
    honoured, so it is refused (the item is skipped with the reason).
    ``rules`` (a stack's torch_npu rules) are the emulator's to follow: here the installed
    runtime's own rules apply, and the device check compares the two."""
    if stream_config is not None and stream_config.pool_size != StreamConfig().pool_size:
        raise UnsupportedOnBackend(f"cuda: no graph stream pool to limit to {stream_config.pool_size} streams")
    global device
    device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats(device)


def executed_host_arguments(graph: DeviceGraph, op_name: str, names: tuple[str, ...],
                            replay: int | None = None) -> list[dict[str, Any]]:
    raise reads_no_graph(name, "executed_host_arguments")


def register_updatable_op(qualified_name: str) -> None:
    raise reads_no_graph(name, "register_updatable_op")


def register_observed_op(qualified_name: str, reader: ArgumentReader) -> None:
    raise reads_no_graph(name, "register_observed_op")
