"""The emulated backend's torch.npu-shaped namespace.

Every name the harness calls on ``torch.npu`` exists here with torch_npu's signature, acting on
one :class:`EmulatedDevice`. A few extra names (``stream_usage``, ``memory_report``,
``reset_device``, ``executed_host_arguments``) expose what the harness's checks need to read.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from .. import EMULATED_DEVICE_NAME
from ..errors import TaskUpdateError
from ..protocol import Capabilities, DeviceRules, StreamConfig
from .device import EmulatedDevice
from .graph import NPUGraph as _NPUGraph
from .graph import TaskGroupHandle, TaskUpdateMode, bound_arguments, graph_context, task_group_begin, task_group_end
from . import collectives, rng
from .pool import PoolHandle
from .recorder import OpNode, register_updatable_op
from .streams import ExternalEvent
from .streams import Stream as _Stream

name = "emulated"
device_type = "cpu"
# The same CPU kernels on the same shapes: replay equals eager bit for bit. The ranks of a host
# exchange through shared memory (.collectives), not gloo's loopback TCP.
capabilities = Capabilities(task_updates=True, bitwise_replay=True, stream_pool=True,
                            reports_executed_arguments=True, collective_ops=lambda: collectives.OPS)

_device = EmulatedDevice()
_updates: dict[int, TaskUpdateMode] = {}  # stream id -> update in progress


def reset_device(stream_config: StreamConfig | None = None, rules: DeviceRules | None = None) -> None:
    """Start over with a fresh device (streams, pools, budget): for tests and per scenario.

    ``rules``: the torch_npu release whose graph rules to follow (default: the historical ones)."""
    global _device
    for mode in reversed(list(_updates.values())):  # an update abandoned by an error
        mode.__exit__(None, None, None)
    _updates.clear()
    _device = EmulatedDevice(stream_config, rules)
    rng.REGISTRATION = _device.rules.generator_registration  # type: ignore[assignment]


def stream_usage() -> dict[str, Any]:
    return _device.budget.usage()


def memory_report() -> dict[str, Any]:
    return _device.pools.report()


def device_name() -> str:
    return EMULATED_DEVICE_NAME


# -- graphs -----------------------------------------------------------------------------------
def NPUGraph(*, allow_rng: bool | None = None) -> _NPUGraph:  # noqa: N802 - torch_npu's name
    """``allow_rng`` None: what the device's torch_npu release does (``DeviceRules.rng_in_capture``)."""
    return _NPUGraph(_device, allow_rng=_device.rules.rng_in_capture if allow_rng is None else allow_rng)


def graph(npu_graph: _NPUGraph, pool: PoolHandle | None = None, stream: _Stream | None = None,
          auto_dispatch_capture: bool = False, capture_error_mode: str = "global"):
    return graph_context(_device, npu_graph, pool, stream, auto_dispatch_capture, capture_error_mode)


def graph_pool_handle() -> PoolHandle:
    return _device.pools.new_handle()


def graph_task_group_begin(stream: _Stream) -> None:
    task_group_begin(_device, stream)


def graph_task_group_end(stream: _Stream) -> TaskGroupHandle:
    return task_group_end(_device, stream)


def graph_task_update_begin(stream: _Stream, handle: TaskGroupHandle) -> None:
    if stream.id in _updates:
        raise TaskUpdateError(f"graph_task_update_begin on {stream}: an update is already in progress")
    mode = TaskUpdateMode(handle, stream)
    mode.__enter__()
    _updates[stream.id] = mode


def graph_task_update_end(stream: _Stream) -> None:
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


def get_rng_state(device: Any = "npu"):
    return rng.get_rng_state(_device.capturing)


def set_rng_state(new_state, device: Any = "npu") -> None:
    rng.set_rng_state(_device.capturing, new_state)


# -- streams ----------------------------------------------------------------------------------
def Stream(priority: int = 0) -> _Stream:  # noqa: N802,F811 - torch.npu.Stream() constructs a stream
    del priority
    return _device.new_stream()


def current_stream() -> _Stream:
    return _device.current_stream


@contextlib.contextmanager
def stream(s: _Stream | None) -> Iterator[None]:
    previous = _device.current_stream
    if s is not None:
        _device.current_stream = s
    try:
        yield
    finally:
        _device.current_stream = previous


def synchronize() -> None:
    _device.scheduler.synchronize()


__all__ = [
    "ExternalEvent", "NPUGraph", "Stream", "current_stream", "graph", "graph_pool_handle",
    "graph_task_group_begin", "graph_task_group_end", "graph_task_update_begin",
    "graph_task_update_end", "register_updatable_op", "stream", "synchronize",
    "manual_seed", "initial_seed", "get_rng_state", "set_rng_state",
]


def executed_host_arguments(npu_graph: _NPUGraph, op_name: str, names: tuple[str, ...]) -> list[dict[str, Any]]:
    """The host arguments each ``op_name`` node of the graph holds now, in capture order.

    After a replay these are the values that replay executed with: what the checks compare
    with the live batch to detect stale host parameters.
    """
    found = []
    for node in npu_graph.nodes:
        if isinstance(node, OpNode) and node.func._schema.name == op_name:
            bound = bound_arguments(node.func, node.args, node.kwargs)
            found.append({name: bound.get(name) for name in names})
    return found
