"""``NPUGraph``, the ``graph`` context manager and task-group updates, on the emulated device."""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass
from typing import Iterator, Mapping, Sequence

import torch

from ..errors import CaptureError, EngineError, TaskUpdateError
from .device import COMM_NAMESPACES, EmulatedDevice
from . import dispatch_mode, rng
from .pool import PoolHandle
from . import tensors
from .opinfo import OpArgs, OpKwargs, frozen
from .recorder import Capture, CaptureMode, EmulatorDispatchMode, Node, OpNode, replay_steps
from .streams import Stream

_CAPTURE_ERROR_MODES = ("global", "thread_local", "relaxed")
_EXECUTED_KEPT = 8  # replays whose executed host arguments are kept


@dataclass(frozen=True, eq=False)
class TaskGroupHandle:
    """Returned by ``graph_task_group_end``: names the captured ops a later update may re-issue."""

    graph: "weakref.ref[NPUGraph]"
    group: int

    def nodes(self) -> list[OpNode]:
        graph = self.graph()
        if graph is None or graph._capture is None:
            raise TaskUpdateError("task group handle refers to a graph that was reset or freed")
        capture = graph._capture
        return [capture.nodes[i] for i in capture.groups[self.group]]  # type: ignore[misc]


def bound_arguments(func: torch._ops.OpOverload, args: OpArgs, kwargs: OpKwargs) -> dict[str, object]:
    names = [a.name for a in func._schema.arguments]
    bound = dict(zip(names, args))
    bound.update(kwargs)
    return bound


class NPUGraph:
    """A capturable, replayable graph with torch_npu's method names and signatures."""

    def __init__(self, device: EmulatedDevice, *, allow_rng: bool = False) -> None:
        self._device = device
        self._capture: Capture | None = None  # set while capturing and once captured
        self._captured = False
        self._pool: PoolHandle | None = None
        self._mode: CaptureMode | None = None
        self._stream: Stream | None = None
        self.replays = 0  # replays launched
        # What each replay's task-group ops ran with, by replay number (the latest few):
        # read once the replay has run, it is what the device executed, whatever came after.
        self.executed: dict[int, list[dict[str, object]]] = {}
        self.allow_rng = allow_rng
        device.graph_count += 1
        self.name = f"graph#{device.graph_count}"

    def __repr__(self) -> str:
        return f"<NPUGraph {self.name} {'captured' if self._captured else 'empty'}>"

    # -- capture -----------------------------------------------------------------------------
    def capture_begin(self, pool: PoolHandle | None = None, capture_error_mode: str = "global", *,
                      auto_dispatch_capture: bool = False) -> None:
        if capture_error_mode not in _CAPTURE_ERROR_MODES:
            raise ValueError(f"capture_error_mode must be one of {_CAPTURE_ERROR_MODES}, got {capture_error_mode!r}")
        if self._captured or self._capture is not None:
            raise EngineError(f"{self.name} was already captured; call reset() before capturing again")
        device = self._device
        if device.capturing is not None:
            raise CaptureError(f"capture_begin: {device.capturing.graph_name} is still capturing")
        stream = device.current_stream
        if stream is device.default_stream:
            raise CaptureError("cannot capture on the default stream; capture inside `graph(...)` or a side stream")
        if pool is None:
            pool = self._pool or device.pools.new_handle()
        self._pool = pool
        capture = Capture(self.name, device.pools.get(pool), auto_dispatch=auto_dispatch_capture,
                          allow_rng=self.allow_rng, error_mode=capture_error_mode,
                          sync_invalidates=not device.rules.capture_survives_rejected_sync)
        capture.owner = weakref.ref(self)
        self._capture, self._stream = capture, stream
        stream.capture = capture
        device.capturing = capture
        self._mode = CaptureMode(capture)
        self._mode.__enter__()

    def capture_end(self) -> None:
        capture = self._capture
        if capture is None or self._mode is None:
            raise EngineError(f"capture_end on {self.name} without capture_begin")
        self._finish_recording()
        failure = capture.failed
        if failure is None and capture._open_group is not None:
            failure = CaptureError(f"capture of {self.name} ended with a task group still open")
        if failure is not None:
            self._discard()
            raise CaptureError(f"capture of {self.name} was invalidated by an earlier error: {failure}")
        empty = capture.no_device_work()
        if empty is not None:
            self._discard()
            raise empty
        comm_groups = _communication_groups(capture)
        try:
            self._device.budget.acquire(self.name, self._device.budget.needed_for(len(comm_groups)))
        except Exception:
            self._discard()
            raise
        capture.release_unheld()
        self._captured = True

    def _finish_recording(self) -> None:
        assert self._mode is not None and self._stream is not None
        self._mode.__exit__(None, None, None)
        self._mode = None
        self._stream.capture = None
        self._device.capturing = None

    def _abort(self) -> None:
        """Tear down a capture that raised; the graph can be captured again."""
        if self._mode is not None:
            self._finish_recording()
        self._discard()

    def _discard(self) -> None:
        capture = self._capture
        if capture is not None:
            capture.pool.forget_graph(self.name, capture.blocks)
        self._capture = None
        self._captured = False

    # -- replay, reset, pool -------------------------------------------------------------------
    def replay(self) -> None:
        if not self._captured or self._capture is None:
            raise EngineError(f"replay of {self.name}, which holds no captured graph")
        stream = self._device.current_stream
        self.replays += 1
        self._device.replayed_kernels += self._capture.kernels
        log = self.executed.setdefault(self.replays, [])
        self.executed.pop(self.replays - _EXECUTED_KEPT, None)
        stream.launch(f"replay of {self.name}", replay_steps(self._capture.nodes, self.name, log))

    def reset(self) -> None:
        if self._mode is not None:
            self._abort()
            return
        self._device.budget.release(self.name)
        self._discard()

    def pool(self) -> PoolHandle:
        if self._pool is None:
            self._pool = self._device.pools.new_handle()
        return self._pool

    @property
    def nodes(self) -> list[Node]:
        """The recorded tape (for reports and tests)."""
        return list(self._capture.nodes) if self._capture else []

    @property
    def streams_held(self) -> int:
        return self._device.budget.held.get(self.name, 0)

    @property
    def bytes_held(self) -> int:
        if self._capture is None:
            return 0
        return self._capture.pool.graph_bytes.get(self.name, 0)

    def register_generator_state(self, generator: torch.Generator) -> None:
        rng.register_generator_state(self, generator)

    def update(self, cpu_update_input: Sequence[Mapping[str, object]]) -> None:
        """Replace host arguments of the ops recorded by ``auto_dispatch_capture``, in order."""
        capture = self._capture
        if not self._captured or capture is None:
            raise TaskUpdateError(f"update of {self.name}, which holds no captured graph")
        if not capture.auto_dispatch:
            raise TaskUpdateError(f"update() needs a graph captured with auto_dispatch_capture=True ({self.name})")
        groups = [capture.groups[g] for g in sorted(capture.groups)]
        cpu_update_input = dispatch_mode.broadcast(cpu_update_input, len(groups))
        if len(cpu_update_input) != len(groups):
            raise TaskUpdateError(
                f"update of {self.name}: {len(cpu_update_input)} input dict(s) for {len(groups)} updatable op(s)"
            )
        changes = []
        for position, (indices, values) in enumerate(zip(groups, cpu_update_input)):
            for index in indices:
                node = capture.nodes[index]
                assert isinstance(node, OpNode)  # a task group holds the ops captured in it
                for name, value in values.items():
                    value = dispatch_mode.host_value(node.func, name, value)
                    if isinstance(value, torch.Tensor):
                        raise TaskUpdateError(f"update of {self.name}: {name!r} is a tensor; only host values update")
                    if name not in bound_arguments(node.func, node.args, node.kwargs) and name not in {
                        a.name for a in node.func._schema.arguments
                    }:
                        raise TaskUpdateError(f"update of {self.name}: op #{position} ({node.name}) has no argument {name!r}")
                    changes.append((node, name, frozen(value)))

        def apply() -> None:
            for node, name, value in changes:
                node.replace_argument(name, value)

        dispatch_mode.launch_update(self._device, capture, apply)


def _communication_groups(capture: Capture) -> set[str]:
    groups = set()
    for node in capture.nodes:
        if isinstance(node, OpNode) and node.func.namespace in COMM_NAMESPACES:
            bound = bound_arguments(node.func, node.args, node.kwargs)
            if "group_name" in bound:  # wait_tensor names no group: it is not a collective
                groups.add(str(bound["group_name"]))
    return groups


# -- task groups ------------------------------------------------------------------------------
def task_group_begin(device: EmulatedDevice, stream: Stream) -> None:
    if not isinstance(stream.capture, Capture):
        raise CaptureError("graph_task_group_begin outside a capture")
    stream.capture.begin_group()


def task_group_end(device: EmulatedDevice, stream: Stream) -> TaskGroupHandle:
    capture = stream.capture
    if not isinstance(capture, Capture):
        raise CaptureError("graph_task_group_end outside a capture")
    group = capture.end_group()
    assert capture.owner is not None  # set by the graph's capture_begin
    return TaskGroupHandle(capture.owner, group)


class TaskUpdateMode(EmulatorDispatchMode):
    """Intercepts the ops re-issued between ``graph_task_update_begin`` and ``_end``.

    Each must be the captured op of the task group, with the captured tensors (same address,
    shape, stride and dtype); its host arguments replace the frozen ones. Nothing executes.
    """

    def __init__(self, handle: TaskGroupHandle, stream: Stream) -> None:
        super().__init__()
        self.handle, self.stream = handle, stream
        self.expected = handle.nodes()
        self.changes: list[tuple[OpNode, OpArgs, OpKwargs]] = []

    def __torch_dispatch__(self, func: torch._ops.OpOverload, types: object, args: OpArgs = (),
                           kwargs: OpKwargs | None = None) -> object:
        kwargs = kwargs or {}
        if len(self.changes) >= len(self.expected):
            raise TaskUpdateError(
                f"task update re-issued {func._schema.name} but the task group holds only "
                f"{len(self.expected)} op(s)"
            )
        node = self.expected[len(self.changes)]
        if func is not node.func:
            raise TaskUpdateError(f"task update re-issued {func} where the task group captured {node.func}")
        call = tensors.unwrap_call(func, args, kwargs)
        args, kwargs = tuple(call.data_args), call.data_kwargs  # the tape holds device data
        captured = bound_arguments(node.func, node.args, node.kwargs)
        given = bound_arguments(func, args, kwargs)
        for name, old in captured.items():
            new = given.get(name)
            if isinstance(old, torch.Tensor) and not _same_tensor(old, new):
                raise TaskUpdateError(
                    f"task update of {node.name}: argument {name!r} is a different tensor than the one "
                    f"captured ({_describe(new)} vs {_describe(old)}); updates may change host values only"
                )
        self.changes.append((node, frozen(args), frozen(kwargs)))
        if node.kind == "functional":
            outputs = [tensors.wrap(t) for t in node.outputs]
            return outputs[0] if len(outputs) == 1 else tuple(outputs)
        return None

    def apply(self) -> None:
        for node, args, kwargs in self.changes:
            node.args, node.kwargs = args, kwargs


def _same_tensor(a: torch.Tensor, b: object) -> bool:
    return (
        isinstance(b, torch.Tensor)
        and a.data_ptr() == b.data_ptr()
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.dtype == b.dtype
    )


def _describe(t: object) -> str:
    if not isinstance(t, torch.Tensor):
        return repr(type(t).__name__)
    return f"{tuple(t.shape)} {t.dtype} @0x{t.data_ptr():x}"


@contextlib.contextmanager
def graph_context(device: EmulatedDevice, npu_graph: NPUGraph, pool: PoolHandle | None = None,
                  stream: Stream | None = None, auto_dispatch_capture: bool = False,
                  capture_error_mode: str = "global") -> Iterator[NPUGraph]:
    """``torch.npu.graph``: capture on a side stream; a failed capture leaves nothing behind."""
    capture_stream = stream or device.capture_stream
    previous = device.current_stream
    device.current_stream = capture_stream
    try:
        npu_graph.capture_begin(pool=pool, capture_error_mode=capture_error_mode,
                                auto_dispatch_capture=auto_dispatch_capture)
        try:
            yield npu_graph
        except BaseException:
            npu_graph._abort()
            raise
        npu_graph.capture_end()
    finally:
        device.current_stream = previous
