"""The emulated backend's torch.npu-shaped namespace.

Every name the harness calls on ``torch.npu`` exists here with torch_npu's signature, acting on
one :class:`EmulatedDevice`. A few extra names (``stream_usage``, ``memory_report``,
``reset_device``, ``executed_host_arguments``) expose what the harness's checks need to read.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Iterator, TypeVar

import torch

from .. import EMULATED_DEVICE_NAME
from ..errors import TaskUpdateError
from ..protocol import (CAPABILITIES, CollectiveOps, DeviceGraph, DeviceRules, DeviceStream, GraphPool, StreamConfig,
                        StreamUsage, TaskGroup)
from . import tensors
from .device import EmulatedDevice
from .graph import NPUGraph as _NPUGraph
from .graph import TaskGroupHandle, TaskUpdateMode, graph_context, task_group_begin, task_group_end
from . import collectives, rng
from .pool import PoolHandle
from .recorder import register_observed_op, register_updatable_op
from .streams import Event as _Event
from .streams import ExternalEvent
from .streams import Stream as _Stream
from .streams import own

name = "emulated"
device = tensors.install()  # torch.device("npu", 0): the emulated NPU's own memory (.tensors)
device_type = device.type
capabilities = CAPABILITIES[name]

_device = EmulatedDevice()
tensors.attach(_device)
_updates: dict[int, TaskUpdateMode] = {}  # stream id -> update in progress
_T = TypeVar("_T")


def _mine(value: object, kind: type[_T], what: str) -> _T:
    """``value`` as this device's own ``kind``: the engine seam hands graphs and handles out
    under protocol types, and one from another engine is refused by name."""
    if isinstance(value, kind):
        return value
    raise TypeError(f"{value!r} is not {what} of the emulated device")


def reset_device(stream_config: StreamConfig | None = None, rules: DeviceRules | None = None) -> None:
    """Start over with a fresh device (streams, pools, budget): for tests and per scenario.

    ``rules``: the torch_npu release whose graph rules to follow (default: the historical ones)."""
    global _device
    for mode in reversed(list(_updates.values())):  # an update abandoned by an error
        mode.__exit__(None, None, None)
    _updates.clear()
    _device = EmulatedDevice(stream_config, rules)
    tensors.attach(_device)
    rng.REGISTRATION = _device.rules.generator_registration  # type: ignore[assignment]


def stream_usage() -> StreamUsage:
    return _device.budget.usage()


def memory_report() -> dict[str, dict[str, object]]:
    return _device.pools.report()


def device_work() -> dict[str, int]:
    """What ran on the device since the last reset: kernels launched (eager device operations
    and replayed graph operations) and bytes of device memory allocated (graph pools included)."""
    pools = sum(p.bytes_reserved for p in _device.pools.pools.values())
    return {"kernels": _device.kernels + _device.replayed_kernels, "bytes_allocated": _device.bytes_allocated + pools}


def native_attention() -> None:
    """None: the harness's reference FIA is this device's attention."""


def native_paged_attention() -> None:
    """None: the harness's reference paged attention is this device's."""


def collective_ops() -> CollectiveOps:
    """The ranks of a host exchange through shared memory (.collectives), not gloo's loopback TCP."""
    return collectives.OPS


def weak_ref_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor on the same device memory that does not keep it allocated (vLLM's
    ``weak_ref_tensors``): a graph pool may hand the block to a later capture once every other
    holder is gone."""
    return tensors.weak_ref(tensor)


def device_name() -> str:
    return EMULATED_DEVICE_NAME


# -- graphs -----------------------------------------------------------------------------------
def NPUGraph(*, allow_rng: bool | None = None) -> _NPUGraph:  # noqa: N802 - torch_npu's name
    """``allow_rng`` None: what the device's torch_npu release does (``DeviceRules.rng_in_capture``)."""
    return _NPUGraph(_device, allow_rng=_device.rules.rng_in_capture if allow_rng is None else allow_rng)


def graph(npu_graph: DeviceGraph, pool: GraphPool | None = None, stream: DeviceStream | None = None,
          auto_dispatch_capture: bool = False, capture_error_mode: str = "global") -> ContextManager[_NPUGraph]:
    return graph_context(_device, _mine(npu_graph, _NPUGraph, "a graph"),
                         None if pool is None else _mine(pool, PoolHandle, "a graph pool"),
                         None if stream is None else own(stream), auto_dispatch_capture, capture_error_mode)


def graph_pool_handle() -> PoolHandle:
    return _device.pools.new_handle()


def graph_task_group_begin(stream: DeviceStream) -> None:
    task_group_begin(_device, own(stream))


def graph_task_group_end(stream: DeviceStream) -> TaskGroupHandle:
    return task_group_end(_device, own(stream))


def graph_task_update_begin(stream: DeviceStream, handle: TaskGroup) -> None:
    stream = own(stream)
    if stream.id in _updates:
        raise TaskUpdateError(f"graph_task_update_begin on {stream}: an update is already in progress")
    mode = TaskUpdateMode(_mine(handle, TaskGroupHandle, "a task group"), stream)
    mode.__enter__()
    _updates[stream.id] = mode


def graph_task_update_end(stream: DeviceStream) -> None:
    stream = own(stream)
    mode = _updates.pop(stream.id, None)
    if mode is None:
        raise TaskUpdateError(f"graph_task_update_end on {stream} without graph_task_update_begin")
    mode.__exit__(None, None, None)
    if not mode.changes:
        raise TaskUpdateError("graph_task_update_end: no operation was re-issued for the task group")
    stream.launch_host_fn("task update", mode.apply)


# -- random numbers (torch_npu's graph-safe RNG rules: see .rng) ------------------------------
def manual_seed(seed: int) -> None:
    rng.manual_seed(_device.capturing, seed)


def initial_seed() -> int:
    return rng.initial_seed()


def get_rng_state(device: str | torch.device = "npu") -> torch.Tensor:
    return rng.get_rng_state(_device.capturing)


def set_rng_state(new_state: torch.Tensor, device: str | torch.device = "npu") -> None:
    rng.set_rng_state(_device.capturing, new_state)


# -- streams ----------------------------------------------------------------------------------
def Stream(priority: int = 0) -> _Stream:  # noqa: N802,F811 - torch.npu.Stream() constructs a stream
    del priority
    return _device.new_stream()


def Event(enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> _Event:  # noqa: N802
    """``torch.npu.Event()``: a point in a stream the host can wait for."""
    del enable_timing, blocking, interprocess
    return _Event(_device.scheduler, lambda: _device.current_stream)


def current_stream() -> _Stream:
    return _device.current_stream


@contextlib.contextmanager
def stream(s: DeviceStream | None) -> Iterator[None]:
    previous = _device.current_stream
    if s is not None:
        _device.current_stream = own(s)
    try:
        yield
    finally:
        _device.current_stream = previous


def synchronize() -> None:
    _device.scheduler.synchronize()


__all__ = [
    "Event", "ExternalEvent", "NPUGraph", "Stream", "current_stream", "device", "device_work", "graph", "graph_pool_handle",
    "graph_task_group_begin", "graph_task_group_end", "graph_task_update_begin",
    "graph_task_update_end", "register_observed_op", "register_updatable_op", "stream", "synchronize",
    "manual_seed", "initial_seed", "get_rng_state", "set_rng_state", "weak_ref_tensor",
    # the rest of the Engine protocol (harness.engine.protocol) and the emulator's own read-outs:
    "name", "capabilities", "reset_device", "stream_usage", "memory_report", "device_name", "native_attention",
    "native_paged_attention", "collective_ops", "executed_host_arguments",
]


def executed_host_arguments(npu_graph: DeviceGraph, op_name: str, names: tuple[str, ...],
                            replay: int | None = None) -> list[dict[str, Any]]:
    """The host arguments each ``op_name`` task-group op ran with in replay number ``replay``
    (default: the graph's latest), in capture order; empty if that replay has not run yet.

    What the checks compare with the live batch to detect stale host parameters: an update
    issued after the replay ran cannot change it."""
    npu_graph = _mine(npu_graph, _NPUGraph, "a graph")
    ran = npu_graph.executed.get(npu_graph.replays if replay is None else replay, [])
    return [{name: entry.get(name) for name in names} for entry in ran if entry["op"] == op_name]
