"""The NPU backend: torch_npu's graph API on an Ascend device.

Importing this module imports torch_npu, so :func:`harness.engine.load` imports it only when
the ``npu`` backend is selected (never install torch-npu where CANN is absent: it breaks
``import torch``). The names are torch_npu's own; this module adds the read-outs the checks
need and turns the runtime's stream-exhaustion error into :class:`StreamBudgetError`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch_npu  # noqa: F401  (registers torch.npu)

from .errors import STREAM_EXHAUSTED_CODE, StreamBudgetError, UnsupportedOnBackend, reads_no_graph
from .protocol import CAPABILITIES, ArgumentReader, DeviceGraph, DeviceRules, Kernel, StreamConfig, StreamUsage


def native_attention() -> tuple[Kernel, Kernel, Kernel]:
    """torch_npu's FIA (functional, out, workspace): the device op, host check included."""
    op = torch_npu.npu_fused_infer_attention_score
    return (op, lambda query, key, value, *, out, **kwargs: op.out(query, key, value, **kwargs, out=out),
            torch_npu._npu_fused_infer_attention_score_get_max_workspace)


def native_paged_attention() -> tuple[Kernel, Kernel]:
    """torch_npu's ATB decode attention (``context_lens`` read on the host) and its workspace query."""
    return torch_npu._npu_paged_attention, torch_npu._npu_paged_attention_get_workspace


name = "npu"
capabilities = CAPABILITIES[name]
device = torch.device("npu", 0)  # this rank's NPU once reset_device() has looked


def collective_ops() -> None:
    """None: HCCL through ``_c10d_functional``."""


def device_work() -> dict[str, int]:
    """Device memory allocated since the last reset (the runtime counts no kernels for us)."""
    return {"kernels": -1, "bytes_allocated": int(torch.npu.max_memory_allocated(device))}


def weak_ref_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor itself: a strong reference (torch_npu offers no weak tensor reference here)."""
    return tensor

_graphs_alive: set[int] = set()
_stream_pool_size = 2048


class NPUGraph(torch.npu.NPUGraph):
    def capture_end(self) -> None:
        try:
            super().capture_end()
        except RuntimeError as error:
            if str(STREAM_EXHAUSTED_CODE) in str(error) or "alloc sq cq fail" in str(error):
                raise StreamBudgetError(1, len(_graphs_alive), _stream_pool_size, repr(self)) from error
            raise
        _graphs_alive.add(id(self))

    def reset(self) -> None:
        _graphs_alive.discard(id(self))
        super().reset()


graph = torch.npu.graph
graph_pool_handle = torch.npu.graph_pool_handle
graph_task_group_begin = torch.npu.graph_task_group_begin
graph_task_group_end = torch.npu.graph_task_group_end
graph_task_update_begin = torch.npu.graph_task_update_begin
graph_task_update_end = torch.npu.graph_task_update_end
ExternalEvent = torch.npu.ExternalEvent
Stream = torch.npu.Stream
Event = torch.npu.Event
current_stream = torch.npu.current_stream
stream = torch.npu.stream
synchronize = torch.npu.synchronize
manual_seed = torch.npu.manual_seed
get_rng_state = torch.npu.get_rng_state
set_rng_state = torch.npu.set_rng_state


def stream_usage() -> StreamUsage:
    """Graphs held; the runtime does not expose its stream count, so 207008 is the authority."""
    return {"pool_size": _stream_pool_size, "in_use": None, "graphs": len(_graphs_alive), "utilisation": 0.0}


def memory_report() -> dict[str, dict[str, object]]:
    return {"device": {"bytes_reserved": torch.npu.memory_reserved()}}


def device_name() -> str:
    return str(torch.npu.get_device_name())


def reset_device(stream_config: StreamConfig | None = None, rules: DeviceRules | None = None) -> None:
    """Synchronize; take the pool size the budget is reported against. How many streams a graph
    and a communication group take is the runtime's, so a config that says otherwise is refused.
    ``rules`` (a stack's torch_npu rules) are the emulator's to follow: here the installed
    runtime's own rules apply, and the device check compares the two."""
    global _stream_pool_size, device
    device = torch.device("npu", torch.npu.current_device())  # a rank's, made current by harness.ranks
    torch.npu.synchronize()
    torch.npu.reset_peak_memory_stats(device)
    config = stream_config or StreamConfig()
    if (config.per_graph, config.per_comm_group) not in ((1, 1), (1, 2)):
        raise UnsupportedOnBackend(f"npu: streams per graph / per comm group are set by the runtime, not "
                                   f"{config.per_graph} / {config.per_comm_group}")
    _stream_pool_size = config.pool_size


def executed_host_arguments(graph: DeviceGraph, op_name: str, names: tuple[str, ...],
                            replay: int | None = None) -> list[dict[str, Any]]:
    raise reads_no_graph(name, "executed_host_arguments")


def register_updatable_op(qualified_name: str) -> None:
    raise reads_no_graph(name, "register_updatable_op")


def register_observed_op(qualified_name: str, reader: ArgumentReader) -> None:
    raise reads_no_graph(name, "register_observed_op")
