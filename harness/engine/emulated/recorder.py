"""Capture: record the device work of a forward once, as a tape of nodes.

A ``TorchDispatchMode`` sees every aten (and custom ``torch.library``) op below autograd, on
host and device tensors alike. A capture records only work issued to the device, as a real graph
does; what happens to each op:

* host work (no device tensor in, none out) runs at once, on the host, and is not captured: a
  replay will not repeat it. A capture that recorded no device work at all is refused at its end
  (:class:`CaptureError`, naming the host operations that ran instead): the forward's model or
  inputs were in host memory, and every replay would hand back what the capture left;
* a host tensor mixed with device tensors raises as eagerly (:mod:`.tensors`);
* device tensor arguments are kept by reference (their host data, see :mod:`.tensors`), i.e.
  bound by address: a replay reads their current contents and writes in place, and rebinding a
  Python variable to another tensor changes nothing, exactly as on hardware;
* every other argument (ints, floats, lists such as ``actual_seq_lengths``) is deep-copied:
  frozen at its capture-time value;
* functional ops get outputs allocated from the graph's memory pool, filled with poison: they
  hold no valid data until the first replay. Their shapes come from shape inference
  (:mod:`.opinfo`, memoized per op signature);
* ops that write their arguments (in-place, ``.out``) are not run: capture has no visible side
  effect; replay runs them once each;
* views are made now (they compute nothing) and skipped on replay, since they alias storage
  that the replay fills in place; so are pure allocations (``empty``, ``empty_like``), which
  launch no kernel: their memory keeps whatever the last replay wrote;
* host reads of device memory (``.item()``, ``bool(t)``, ``torch.equal``, ``nonzero``,
  boolean-mask indexing, ``.tolist()``, ``.cpu()``) and blocking copies from host memory raise
  :class:`CaptureError` with the runtime's message; so do RNG ops unless the capture allows them.
  A ``non_blocking`` copy from host memory is captured: every replay reads the host buffer anew.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator, Literal

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..errors import CAPTURE_SYNC_MESSAGE, CaptureError
from . import dispatch_mode, rng, tensors
from .opinfo import BOOL_INDEX_OPS, OP_INFO, OpArgs, OpInfo, OpKwargs, TensorSpec, frozen, frozen_args, has_bool_index, infer_outputs, \
    op_info, tensors_in
from .pool import Block, MemoryPool
from .streams import ExternalEvent, WaitFor

if TYPE_CHECKING:  # the graph imports this module (and typing.Self is Python 3.11's)
    from typing_extensions import Self

    from ..protocol import ArgumentReader
    from .graph import NPUGraph

NodeKind = Literal["functional", "mutating", "view", "allocation"]

#: Host operations a capture notes by name for its "no device work" error (the rest are counted).
_HOST_OPS_NAMED = 3

#: Ops whose host arguments a graph captured with ``auto_dispatch_capture=True`` may update.
#: ``harness.ops`` registers the FIA op here; the engine knows nothing about attention.
UPDATABLE_OPS: set[str] = set()


def register_updatable_op(qualified_name: str) -> None:
    """Mark an op (``"namespace::name"``) as updatable through ``NPUGraph.update``."""
    UPDATABLE_OPS.add(qualified_name)


#: Ops whose kernel reads values a check wants to know (lengths in device buffers): op name ->
#: a reader of the op's arguments (by schema name, device data) run as the replay runs the op.
OBSERVED_OPS: dict[str, ArgumentReader] = {}


def register_observed_op(qualified_name: str, reader: ArgumentReader) -> None:
    """Have every replay report what ``reader`` reads off the op's arguments when it runs."""
    OBSERVED_OPS[qualified_name] = reader


@dataclass(eq=False)
class OpNode:
    index: int
    func: torch._ops.OpOverload
    args: OpArgs
    kwargs: OpKwargs
    kind: NodeKind
    outputs: list[torch.Tensor] = field(default_factory=list)
    group: int | None = None

    @property
    def name(self) -> str:
        return self.func._schema.name + ("." + self.func._overloadname if self.func._overloadname != "default" else "")

    def replace_argument(self, name: str, value: object) -> None:
        """Replace one argument by its schema name (host values only: used by updates)."""
        for position, arg in enumerate(self.func._schema.arguments):
            if arg.name == name:
                if position < len(self.args) and not arg.kwarg_only:
                    self.args = self.args[:position] + (value,) + self.args[position + 1 :]
                else:
                    self.kwargs[name] = value
                return
        raise KeyError(f"{self.name} has no argument {name!r}")

    def bound(self) -> dict[str, object]:
        """The op's arguments by schema name, as the tape holds them now."""
        bound = dict(zip([a.name for a in self.func._schema.arguments], self.args))
        bound.update(self.kwargs)
        return bound

    def host_arguments(self) -> dict[str, object]:
        """The op's schema name and its non-tensor arguments by name, as the tape holds them now."""
        return {"op": self.func._schema.name,
                **{k: v for k, v in self.bound().items() if not isinstance(v, torch.Tensor)}}

    def run(self) -> None:
        if self.kind in ("view", "allocation"):
            return
        result = self.func(*self.args, **self.kwargs)
        if self.kind == "functional":
            for captured, fresh in zip(self.outputs, tensors_in(result)):
                if self.func.namespace == "_c10d_functional":
                    # An asynchronous collective: its result is valid only once waited on, and
                    # the tape's own wait_tensor waits on the captured buffer, not this one.
                    fresh = torch.ops._c10d_functional.wait_tensor(fresh)
                captured.copy_(fresh)


@dataclass(eq=False)
class EventNode:
    index: int
    kind: Literal["wait", "record", "reset"]
    event: ExternalEvent


Node = OpNode | EventNode | rng.RngNode


class Capture:
    """The tape being recorded for one graph, plus what it allocated and what ran on the host."""

    def __init__(self, graph_name: str, pool: MemoryPool, *, auto_dispatch: bool, allow_rng: bool,
                 error_mode: str, sync_invalidates: bool = True) -> None:
        self.graph_name = graph_name
        self.pool = pool
        self.auto_dispatch = auto_dispatch
        self.allow_rng = allow_rng
        self.error_mode = error_mode
        # torch_npu before 882896a6c: a rejected host sync invalidates the capture (capture_end
        # raises); since, the rejection is raised and the capture goes on
        self.sync_invalidates = sync_invalidates
        self.nodes: list[Node] = []
        self.blocks: list[Block] = []
        self.groups: dict[int, list[int]] = {}
        self._open_group: int | None = None
        self.failed: CaptureError | None = None
        self.owner: weakref.ref[NPUGraph] | None = None  # the graph being captured
        self.kernels = 0  # device operations recorded (views and allocations launch none)
        self.host_ops = 0  # operations that ran on the host instead
        self.host_ops_named: list[str] = []
        self._blocks_by_id: dict[int, Block] = {}  # a pool tensor just allocated -> its block

    # -- recording ---------------------------------------------------------------------------
    def add_event_node(self, kind: str, event: ExternalEvent) -> None:
        self.nodes.append(EventNode(len(self.nodes), kind, event))  # type: ignore[arg-type]

    def begin_group(self) -> None:
        if self._open_group is not None:
            raise CaptureError("graph_task_group_begin: a task group is already open on this stream")
        self._open_group = len(self.groups)
        self.groups[self._open_group] = []
        self._group_host_ops: list[str] = []

    def end_group(self) -> int:
        if self._open_group is None:
            raise CaptureError("graph_task_group_end without graph_task_group_begin")
        group, self._open_group = self._open_group, None
        if not self.groups[group]:
            ran = (f"; {', '.join(self._group_host_ops)} ran on the host instead: its tensors are in host memory"
                   if self._group_host_ops else "")
            raise CaptureError(f"graph_task_group_end: the task group recorded no operation{ran}")
        return group

    def host_sync(self, what: str) -> None:
        """A host read of device data was attempted during capture."""
        if self.error_mode == "relaxed":
            return
        error = CaptureError(f"{what}: {CAPTURE_SYNC_MESSAGE} (capture of {self.graph_name})")
        if self.sync_invalidates:
            self.failed = self.failed or error
        raise error

    def record(self, func: torch._ops.OpOverload, args: OpArgs, kwargs: OpKwargs) -> object:
        info = OP_INFO.get(func) or op_info(func)
        call = tensors.unwrap_call(func, args, kwargs)
        if not call.on_device and not call.to_device:
            return self._on_host(func, info, args, kwargs)
        if info.guarded:
            self._guard(info, call.data_args)
        if call.to_host:
            self.host_sync(f"{info.name} copies device memory to the host")
        if call.host is not None and info.name == "aten::copy_" and not tensors.non_blocking(args, kwargs):
            self.host_sync(f"{info.name}: a blocking copy from host memory")
        # Allowed? Which generator must the replay draw from? (see .rng)
        generator = rng.random_op_generator(self, info.name, kwargs) if info.rng else None
        if info.inplace_view:  # metadata-only (t_, squeeze_): apply now, never again
            return tensors.apply_inplace_view(func, args, call)

        node = OpNode(len(self.nodes), func, frozen_args(tuple(call.data_args)),
                      frozen(call.data_kwargs) if call.data_kwargs else {}, "functional")
        if generator is not None:
            node.kwargs["generator"] = generator  # live, not a frozen copy: replays advance it
        if info.writes:
            node.kind = "mutating"
            result = self._aliased_returns(func, args, kwargs, call)
        elif info.view:
            node.kind = "view"
            base = next((a for a in args if tensors.is_device_tensor(a)), None)
            block = base._block if base is not None else None
            result = _map_tensors(func(*call.data_args, **call.data_kwargs), lambda t: tensors.wrap(t, block))
        else:
            outputs = self._allocate(infer_outputs(func, tuple(call.data_args), call.data_kwargs))
            node.outputs = tensors_in(outputs)
            if info.allocation:
                node.kind = "allocation"
            result = _map_tensors(outputs, lambda t: tensors.wrap(t, self._blocks_by_id.pop(id(t))))
        if node.kind in ("functional", "mutating"):
            self.kernels += 1
        self._add(node, info.name)
        return result

    def _on_host(self, func: torch._ops.OpOverload, info: OpInfo, args: OpArgs, kwargs: OpKwargs) -> object:
        """Host work during a capture: it runs now and is not in the graph (as on a device)."""
        self.host_ops += 1
        if not info.view and not info.allocation:
            shapes = [list(t.shape) for t in tensors_in(args)[:2]]
            described = f"{info.name}" + (f" on host tensors of shape {shapes}" if shapes else "")
            if len(self.host_ops_named) < _HOST_OPS_NAMED:
                self.host_ops_named.append(described)
            if self._open_group is not None and len(self._group_host_ops) < _HOST_OPS_NAMED:
                self._group_host_ops.append(described)
        return func(*args, **kwargs)

    def no_device_work(self) -> CaptureError | None:
        """The error for a capture that recorded no device operation, else None."""
        if self.kernels:
            return None
        ran = (f"; {self.host_ops} operation(s) ran on the host instead (first: {', '.join(self.host_ops_named)})"
               if self.host_ops else "")
        return CaptureError(
            f"captured graph {self.graph_name} has no device work{ran}: its model or inputs are in host memory, "
            "so every replay would launch nothing and hand back what the capture left")

    def _guard(self, info: OpInfo, data_args: list[object]) -> None:
        """Host syncs: what a capture must refuse (random ops: :func:`.rng.random_op_generator`)."""
        if info.host_returns:
            self.host_sync(f"{info.name} returns a host value")
        if info.data_dependent:
            self.host_sync(f"{info.name} has a data-dependent result")
        if info.name in BOOL_INDEX_OPS and has_bool_index(tuple(data_args)):
            self.host_sync(f"boolean-mask indexing ({info.name})")

    def _add(self, node: OpNode, name: str) -> None:
        if self._open_group is not None:
            node.group = self._open_group
        elif self.auto_dispatch and name in UPDATABLE_OPS:
            node.group = len(self.groups)
            self.groups[node.group] = []
            dispatch_mode.guard_with_event(self, node.group)  # torch_npu waits per dispatched op
            node.index = len(self.nodes)
        if node.group is not None:
            self.groups[node.group].append(node.index)
        self.nodes.append(node)

    def _aliased_returns(self, func: torch._ops.OpOverload, args: OpArgs, kwargs: OpKwargs,
                         call: tensors.Call) -> object:
        """What an in-place or ``out=`` op returns: the caller's own tensors (never run here)."""
        schema = func._schema
        if not schema.returns:  # e.g. FIA .out, reshape_and_cache: nothing to hand back
            return None
        bound = dict(zip([a.name for a in schema.arguments], args))
        bound.update(kwargs)
        outs = []
        for ret in schema.returns:
            if ret.alias_info is None:
                outputs = self._allocate(infer_outputs(func, tuple(call.data_args), call.data_kwargs))
                return _map_tensors(outputs, lambda t: tensors.wrap(t, self._blocks_by_id.pop(id(t))))
            source = next(a for a in schema.arguments if a.alias_info and a.alias_info.before_set == ret.alias_info.before_set)
            outs.append(bound[source.name])
        if not outs:
            return None
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _allocate(self, spec: object) -> object:
        """Pool memory in the structure of ``spec`` (non-tensor outputs are kept as they are)."""
        if type(spec) is TensorSpec:
            data, block = self.pool.allocate(spec.shape, spec.stride, spec.dtype, self.graph_name, spec.nbytes)
            self.blocks.append(block)
            self._blocks_by_id[id(data)] = block
            return data
        if isinstance(spec, (list, tuple)):
            return type(spec)(self._allocate(s) for s in spec)
        return spec

    def release_unheld(self) -> None:
        """At the end of the capture: blocks allocated but never handed out are free at once."""
        self.pool.release(self.blocks)
        self._blocks_by_id.clear()


def _map_tensors(value: object, fn: Callable[[torch.Tensor], torch.Tensor]) -> object:
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_map_tensors(v, fn) for v in value)
    return value


class EmulatorDispatchMode(TorchDispatchMode):
    """Base of the emulator's dispatch modes.

    torch wraps a mode's ``__torch_dispatch__`` in ``torch._dynamo.disable`` unless the mode
    opts out; the wrapper's first call imports torch._dynamo (about 2 s per process). The
    emulator's modes never run under torch.compile, so they opt out.
    """

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torch's TorchDispatchMode is unannotated

    def __enter__(self) -> Self:
        super().__enter__()  # type: ignore[no-untyped-call]  # (as above)
        return self

    def __exit__(self, *exc_info: object) -> None:
        super().__exit__(*exc_info)  # type: ignore[no-untyped-call]  # (as above)

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False


class CaptureMode(EmulatorDispatchMode):
    """Routes every op issued while capturing into the :class:`Capture`."""

    def __init__(self, capture: Capture) -> None:
        super().__init__()
        self.capture = capture

    def __torch_dispatch__(self, func: torch._ops.OpOverload, types: object, args: OpArgs = (),
                           kwargs: OpKwargs | None = None) -> object:
        return self.capture.record(func, args, kwargs or {})


def replay_steps(nodes: list[Node], label: str, executed: list[dict[str, object]] | None = None) -> Iterator[WaitFor]:
    """The device side of a replay: run the tape, stopping at event waits.

    ``executed`` receives, for each op of a task group or of an updatable kind (FIA), the op's
    name and host arguments as it ran them: what a host-parameter check must compare, since an
    update may change them later."""
    for node in nodes:
        if isinstance(node, OpNode):
            node.run()
            if executed is not None:
                name = node.func._schema.name
                if node.group is not None or name in UPDATABLE_OPS:
                    executed.append(node.host_arguments())
                elif name in OBSERVED_OPS:
                    executed.append({"op": name, **OBSERVED_OPS[name](node.bound())})
        elif node.kind == "rng":  # save/restore a generator state (.rng)
            node.run()
        elif node.kind == "wait":
            if not node.event.is_recorded:
                yield WaitFor(node.event, f"node #{node.index} ({_next_op(nodes, node.index)})")
        elif node.kind == "reset":
            node.event.is_recorded = False
        else:
            node.event.is_recorded = True


def _next_op(nodes: list[Node], index: int) -> str:
    for node in nodes[index + 1 :]:
        if isinstance(node, OpNode) and node.kind != "view":
            return f"before {node.name}"
    return "at the end of the graph"
