"""Capture: record the device work of a forward once, as a tape of nodes.

A ``TorchDispatchMode`` sees every aten (and custom ``torch.library``) op below autograd. During
a capture nothing visible is computed; each op becomes a node, and the tape is what a replay runs:

* tensor arguments are kept by reference, i.e. bound by address: a replay reads their current
  contents and writes in place, and rebinding a Python variable to another tensor changes
  nothing, exactly as on hardware;
* every other argument (ints, floats, lists such as ``actual_seq_lengths``) is deep-copied:
  frozen at its capture-time value;
* functional ops get outputs allocated from the graph's memory pool, filled with poison: they
  hold no valid data until the first replay. Their shapes come from shape inference, memoized
  per op signature: an aten op runs once on the host and its values are thrown away (cheaper
  than aten's Python meta kernels); collectives and ``torch.library`` ops use meta tensors;
* ops that write their arguments (in-place, ``.out``) are not run: capture has no visible side
  effect; replay runs them once each;
* views are made now (they compute nothing) and skipped on replay, since they alias storage
  that the replay fills in place; so are pure allocations (``empty``, ``empty_like``), which
  launch no kernel: their memory keeps whatever the last replay wrote;
* host synchronisations (``.item()``, ``bool(t)``, ``torch.equal``, ``nonzero``, boolean-mask
  indexing, ``.tolist()``, ``.numpy()``) raise :class:`CaptureError` with the runtime's message;
  so do RNG ops unless the capture allows them.
"""

from __future__ import annotations

import copy
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Literal

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from ..errors import CAPTURE_SYNC_MESSAGE, CaptureError
from . import dispatch_mode, rng
from .pool import Block, MemoryPool, nbytes_for
from .streams import ExternalEvent, WaitFor

NodeKind = Literal["functional", "mutating", "view", "allocation"]

_BOOL_INDEX_OPS = {"aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_"}

#: Pure allocations launch no kernel on a device: a replay must leave their memory alone.
_ALLOCATION_OPS = {"aten::empty", "aten::empty_like", "aten::new_empty", "aten::empty_strided",
                   "aten::new_empty_strided", "aten::empty_permuted"}

#: Ops whose host arguments a graph captured with ``auto_dispatch_capture=True`` may update.
#: ``harness.ops`` registers the FIA op here; the engine knows nothing about attention.
UPDATABLE_OPS: set[str] = set()


def register_updatable_op(qualified_name: str) -> None:
    """Mark an op (``"namespace::name"``) as updatable through ``NPUGraph.update``."""
    UPDATABLE_OPS.add(qualified_name)


@dataclass(eq=False)
class OpNode:
    index: int
    func: torch._ops.OpOverload
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    kind: NodeKind
    outputs: list[torch.Tensor] = field(default_factory=list)
    group: int | None = None

    @property
    def name(self) -> str:
        return self.func._schema.name + ("." + self.func._overloadname if self.func._overloadname != "default" else "")

    def replace_argument(self, name: str, value: Any) -> None:
        """Replace one argument by its schema name (host values only: used by updates)."""
        for position, arg in enumerate(self.func._schema.arguments):
            if arg.name == name:
                if position < len(self.args) and not arg.kwarg_only:
                    self.args = self.args[:position] + (value,) + self.args[position + 1 :]
                else:
                    self.kwargs[name] = value
                return
        raise KeyError(f"{self.name} has no argument {name!r}")

    def run(self) -> None:
        if self.kind in ("view", "allocation"):
            return
        result = self.func(*self.args, **self.kwargs)
        if self.kind == "functional":
            for captured, fresh in zip(self.outputs, _tensors(result)):
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


Node = OpNode | EventNode


def _is_write(arg: torch._C.Argument) -> bool:
    return arg.alias_info is not None and arg.alias_info.is_write


#: Host values that cannot change after capture: kept as they are, never copied.
_IMMUTABLE = (int, float, bool, str, complex, type(None), torch.dtype, torch.device, torch.layout,
              torch.memory_format)
#: Exact types kept by reference by :func:`_frozen` (tensors: bound by address; the rest immutable).
_KEPT = frozenset({*_IMMUTABLE, torch.Tensor, torch.nn.Parameter, torch.Size})


#: Element types of a flat host list (``actual_seq_lengths``: up to max_num_seqs ints) that
#: the walks below handle at C speed, without a Python call per element.
_SCALARS = frozenset({int, float, bool})


def _flat_scalars(value: list | tuple) -> bool:
    return set(map(type, value)) <= _SCALARS


def _frozen(value: Any) -> Any:
    """Deep-copy everything but tensors: host values are frozen at capture time."""
    kind = type(value)
    if kind in _KEPT or isinstance(value, torch.Tensor):
        return value
    if kind is tuple or kind is list:
        if _flat_scalars(value):
            return value if kind is tuple else list(value)
        return kind(_frozen(v) for v in value)
    if isinstance(value, (list, tuple)):
        return kind(_frozen(v) for v in value)
    if isinstance(value, dict):
        return {k: _frozen(v) for k, v in value.items()}
    return copy.deepcopy(value)


def _frozen_args(args: tuple) -> tuple:
    """:func:`_frozen` for a positional-argument tuple, which is most often tensors and ints."""
    for value in args:
        if type(value) not in _KEPT:
            return tuple(_frozen(v) for v in args)
    return args


def _tensors(value: Any) -> list[torch.Tensor]:
    """The tensors in an op's arguments or results (a plain walk: pytree is slow per op)."""
    if isinstance(value, torch.Tensor):
        return [value]
    found: list[torch.Tensor] = []
    _collect(value, found)
    return found


def _collect(value: Any, found: list[torch.Tensor]) -> None:
    if isinstance(value, (list, tuple)):
        if _flat_scalars(value):
            return
        for v in value:
            if isinstance(v, torch.Tensor):
                found.append(v)
            elif isinstance(v, (list, tuple, dict)):
                _collect(v, found)
    elif isinstance(value, dict):
        _collect(list(value.values()), found)
    elif isinstance(value, torch.Tensor):
        found.append(value)


def _to_meta(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
    return value


@dataclass(frozen=True)
class _TensorSpec:
    """What shape inference says of one output: enough to allocate it from a pool."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int


def _signature(value: Any) -> Any:
    """A hashable key of everything an op's shape inference can read from its arguments.

    Tensors contribute their metadata (never their values: an op whose output shape depends on
    values is rejected as a host sync before inference). Raises TypeError for unhashable hosts.
    """
    if isinstance(value, torch.Tensor):
        return (value.shape, value.stride(), value.dtype, value.device, value.storage_offset())
    if isinstance(value, (list, tuple)):
        if _flat_scalars(value):  # types too: 1, 1.0 and True are equal keys
            return (type(value), tuple(map(type, value)), tuple(value))
        return (type(value), *map(_signature, value))
    if isinstance(value, dict):
        return tuple((k, _signature(v)) for k, v in value.items())
    if not isinstance(value, _IMMUTABLE):
        raise TypeError(f"no signature for {type(value).__name__}")
    return (type(value), value)


def _spec_of(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        shape, stride = tuple(value.shape), tuple(value.stride())
        return _TensorSpec(shape, stride, value.dtype, nbytes_for(shape, stride, value.dtype))
    if isinstance(value, (list, tuple)):
        return type(value)(_spec_of(v) for v in value)
    return value


#: Shape inference results per (op, argument signature), for the whole process: a 40-layer
#: model issues the same few signatures thousands of times, and inference is pure.
_INFERRED: dict[Any, Any] = {}
_INFERRED_MAX = 100_000


@dataclass(frozen=True)
class _OpInfo:
    """What :meth:`Capture.record` needs to know about an op, read once from its schema."""

    name: str
    host_returns: bool
    data_dependent: bool
    rng: bool
    inplace_view: bool
    writes: bool
    view: bool
    allocation: bool
    run_to_infer: bool  # an aten op without RNG: its CPU kernel is the cheapest shape inference
    guarded: bool  # whether Capture._guard has anything to check (host syncs, RNG)


_OP_INFO: dict[Any, _OpInfo] = {}


def _op_info(func: torch._ops.OpOverload) -> _OpInfo:
    info = _OP_INFO.get(func)
    if info is None:
        schema, tags = func._schema, func.tags
        rng = torch.Tag.nondeterministic_seeded in tags
        host_returns = any(str(r.type) not in ("Tensor", "Tensor[]", "Tensor?") for r in schema.returns)
        data_dependent = torch.Tag.data_dependent_output in tags or torch.Tag.dynamic_output_shape in tags
        info = _OpInfo(
            name=schema.name,
            host_returns=host_returns,
            data_dependent=data_dependent,
            rng=rng,
            inplace_view=torch.Tag.inplace_view in tags,
            writes=any(_is_write(a) for a in schema.arguments),
            view=bool(schema.returns) and all(r.alias_info is not None for r in schema.returns),
            allocation=schema.name in _ALLOCATION_OPS,
            run_to_infer=func.namespace == "aten" and not rng,
            guarded=host_returns or data_dependent or rng or schema.name in _BOOL_INDEX_OPS,
        )
        _OP_INFO[func] = info
    return info


class Capture:
    """The tape being recorded for one graph, plus what it allocated."""

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
        self.allocated: list[torch.Tensor] = []  # tensors made during capture (pool + views)
        self.groups: dict[int, list[int]] = {}
        self._open_group: int | None = None
        self.failed: CaptureError | None = None
        self.owner: Any = None  # weak reference to the graph being captured

    # -- recording ---------------------------------------------------------------------------
    def add_event_node(self, kind: str, event: ExternalEvent) -> None:
        self.nodes.append(EventNode(len(self.nodes), kind, event))  # type: ignore[arg-type]

    def begin_group(self) -> None:
        if self._open_group is not None:
            raise CaptureError("graph_task_group_begin: a task group is already open on this stream")
        self._open_group = len(self.groups)
        self.groups[self._open_group] = []

    def end_group(self) -> int:
        if self._open_group is None:
            raise CaptureError("graph_task_group_end without graph_task_group_begin")
        group, self._open_group = self._open_group, None
        if not self.groups[group]:
            raise CaptureError("graph_task_group_end: the task group recorded no operation")
        return group

    def host_sync(self, what: str) -> None:
        """A host read of device data was attempted during capture."""
        if self.error_mode == "relaxed":
            return
        error = CaptureError(f"{what}: {CAPTURE_SYNC_MESSAGE} (capture of {self.graph_name})")
        if self.sync_invalidates:
            self.failed = self.failed or error
        raise error

    def record(self, func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
        info = _OP_INFO.get(func) or _op_info(func)
        if info.guarded:
            self._guard(func, info, args)
        # Allowed? Which generator must the replay draw from? (see .rng)
        generator = rng.random_op_generator(self, info.name, kwargs) if info.rng else None
        if info.inplace_view:  # metadata-only (t_, squeeze_): apply now, never again
            return func(*args, **kwargs)

        node = OpNode(len(self.nodes), func, _frozen_args(args), _frozen(kwargs) if kwargs else {},
                      "functional")
        if generator is not None:
            node.kwargs["generator"] = generator  # live, not a frozen copy: replays advance it
        if info.writes:
            node.kind = "mutating"
            result = self._aliased_returns(func, args, kwargs)
        elif info.view:
            node.kind = "view"
            result = func(*args, **kwargs)
            self.allocated.extend(_tensors(result))
        else:
            result = self._allocate_outputs(func, args, kwargs)
            node.outputs = _tensors(result)
            if info.allocation:
                node.kind = "allocation"
        self._add(node, info.name)
        return result

    def _guard(self, func: torch._ops.OpOverload, info: _OpInfo, args: tuple) -> None:
        """Host syncs: what a capture must refuse (random ops: :func:`.rng.random_op_generator`)."""
        if info.host_returns:
            self.host_sync(f"{info.name} returns a host value")
        if info.data_dependent:
            self.host_sync(f"{info.name} has a data-dependent result")
        if info.name in _BOOL_INDEX_OPS and _has_bool_index(args):
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

    def _aliased_returns(self, func, args, kwargs) -> Any:
        schema = func._schema
        if not schema.returns:  # e.g. FIA .out, reshape_and_cache: nothing to hand back
            return None
        bound = dict(zip([a.name for a in schema.arguments], args))
        bound.update(kwargs)
        outs = []
        for ret in schema.returns:
            if ret.alias_info is None:
                return self._allocate_outputs(func, args, kwargs)
            source = next(a for a in schema.arguments if a.alias_info and a.alias_info.before_set == ret.alias_info.before_set)
            outs.append(bound[source.name])
        if not outs:
            return None
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _allocate_outputs(self, func, args, kwargs) -> Any:
        return self._allocate(_infer_outputs(func, args, kwargs))

    def _allocate(self, spec: Any) -> Any:
        """Pool tensors in the structure of ``spec`` (non-tensor outputs are kept as they are)."""
        if type(spec) is _TensorSpec:
            tensor, block = self.pool.allocate(spec.shape, spec.stride, spec.dtype, self.graph_name, spec.nbytes)
            self.blocks.append(block)
            self.allocated.append(tensor)
            return tensor
        if isinstance(spec, (list, tuple)):
            return type(spec)(self._allocate(s) for s in spec)
        return spec

    # -- end of capture ----------------------------------------------------------------------
    def release_intermediates(self) -> None:
        """Return blocks that back no tensor the caller still holds to the pool.

        Reference counting decides liveness, as the caching allocator does: a tensor held only
        by the tape is an intermediate; one the caller holds is an output and keeps its block.
        """
        held: list[torch.Tensor] = list(self.allocated)  # every reference the tape holds
        for node in self.nodes:
            if isinstance(node, OpNode):
                _collect(node.args, held)
                if node.kwargs:
                    _collect(node.kwargs, held)
                held.extend(node.outputs)
        internal = Counter(map(id, held))
        del held  # its references would count as the caller's
        live = set()
        for t in self.allocated:
            # getrefcount's own argument and the loop variable account for 2 references.
            if sys.getrefcount(t) - 2 > internal[id(t)]:
                live.add(t.untyped_storage().data_ptr())
        self.pool.release([b for b in self.blocks if b.storage.data_ptr() not in live])


def _has_bool_index(args: tuple) -> bool:
    return any(t.dtype in (torch.bool, torch.uint8) for t in _tensors(args[1:]))


def _infer_outputs(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    """The outputs' shapes, strides and dtypes (as :class:`_TensorSpec` in the result's structure).

    Memoized per signature. On a miss an aten op runs once on its arguments and its values are
    thrown away: a functional op changes nothing it is given, and on CPU its kernel is far
    cheaper than the Python meta kernels (refs, prims) that aten's elementwise ops resolve to
    on the meta device, which would also import torch._dynamo and sympy on first use. Other
    ops (collectives, ``torch.library`` ops) and any op that cannot run on the capture's
    contents (pool memory is poisoned) are inferred on meta tensors.
    """
    try:
        key = (func, _signature(args), _signature(kwargs))
    except TypeError:
        key = None
    spec = _INFERRED.get(key) if key is not None else None
    if spec is None:
        spec = _spec_of(_run_for_shapes(func, args, kwargs))
        if key is not None:
            if len(_INFERRED) >= _INFERRED_MAX:
                _INFERRED.clear()
            _INFERRED[key] = spec
    return spec


def _collective_shape(func: torch._ops.OpOverload, args: tuple) -> Any:
    """Outputs of the functional collectives whose rule is plain, without their meta kernels.

    Those kernels are Python references that import sympy (about 1 s) in every fresh rank.
    """
    name = func._schema.name
    if name == "_c10d_functional::wait_tensor":
        return args[0]  # the waited tensor itself
    if name == "_c10d_functional::all_gather_into_tensor":
        x, group_size = args[0], args[1]
        return torch.empty((group_size * x.shape[0], *x.shape[1:]), dtype=x.dtype, device="meta")
    return None


def _run_for_shapes(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    if func.namespace == "_c10d_functional" and not kwargs:
        shaped = _collective_shape(func, args)
        if shaped is not None:
            return shaped
    if _op_info(func).run_to_infer:
        try:
            return func(*args, **kwargs)
        except Exception:  # noqa: BLE001 - e.g. an index read from poisoned memory; meta next
            pass
    try:
        return func(*tree_map(_to_meta, args), **tree_map(_to_meta, kwargs))
    except (NotImplementedError, RuntimeError):
        return func(*args, **kwargs)  # no meta kernel: the values are discarded


class EmulatorDispatchMode(TorchDispatchMode):
    """Base of the emulator's dispatch modes.

    torch wraps a mode's ``__torch_dispatch__`` in ``torch._dynamo.disable`` unless the mode
    opts out; the wrapper's first call imports torch._dynamo (about 2 s per process). The
    emulator's modes never run under torch.compile, so they opt out.
    """

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False


class CaptureMode(EmulatorDispatchMode):
    """Routes every op issued while capturing into the :class:`Capture`."""

    def __init__(self, capture: Capture) -> None:
        super().__init__()
        self.capture = capture

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self.capture.record(func, args, kwargs or {})


def replay_steps(nodes: list[Node], label: str) -> Iterator[WaitFor]:
    """The device side of a replay: run the tape, stopping at event waits."""
    for node in nodes:
        if isinstance(node, OpNode):
            node.run()
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


def patch_host_reads(capture: Capture) -> Callable[[], None]:
    """``.tolist()`` and ``.numpy()`` bypass the dispatcher; guard them while capturing."""
    originals = {name: getattr(torch.Tensor, name) for name in ("tolist", "numpy")}

    def guarded(name: str):
        original = originals[name]

        def method(self, *args, **kwargs):
            capture.host_sync(f"Tensor.{name}()")
            return original(self, *args, **kwargs)

        return method

    for name in originals:
        setattr(torch.Tensor, name, guarded(name))

    def restore() -> None:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)

    return restore
