"""What the emulator knows of one operation: its schema's flags, its outputs' shapes, and its
host arguments frozen as a launch freezes them.

Read once per operation and memoized, because the recorder (:mod:`.recorder`) and the device
memory (:mod:`.tensors`) ask on every operation: a 40-layer model issues the same few
signatures thousands of times.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Iterable

import torch
from torch.utils._pytree import tree_map

from .pool import nbytes_for

#: An op's positional and keyword arguments as the dispatcher hands them over: any schema's values.
OpArgs = tuple[object, ...]
OpKwargs = dict[str, object]
#: The same where the code reads a value as the type the op's schema gives it (``copy_``'s
#: tensors, ``generator=``): the dispatcher has checked it, and the hot path does not again.
SchemaArgs = tuple[Any, ...]
SchemaKwargs = dict[str, Any]

BOOL_INDEX_OPS = {"aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_"}

#: Pure allocations launch no kernel on a device: a replay must leave their memory alone.
_ALLOCATION_OPS = {"aten::empty", "aten::empty_like", "aten::new_empty", "aten::empty_strided",
                   "aten::new_empty_strided", "aten::empty_permuted"}


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


def _flat_scalars(value: Iterable[object]) -> bool:
    return set(map(type, value)) <= _SCALARS


def frozen(value: Any) -> Any:
    """Deep-copy everything but tensors: host values are frozen at capture time."""
    kind = type(value)
    if kind in _KEPT or isinstance(value, torch.Tensor):
        return value
    if kind is tuple or kind is list:
        if _flat_scalars(value):
            return value if kind is tuple else list(value)
        return kind(frozen(v) for v in value)
    if isinstance(value, (list, tuple)):
        return kind(frozen(v) for v in value)
    if isinstance(value, dict):
        return {k: frozen(v) for k, v in value.items()}
    return copy.deepcopy(value)


def frozen_args(args: OpArgs) -> OpArgs:
    """:func:`_frozen` for a positional-argument tuple, which is most often tensors and ints."""
    for value in args:
        if type(value) not in _KEPT:
            return tuple(frozen(v) for v in args)
    return args


def tensors_in(value: object) -> list[torch.Tensor]:
    """The tensors in an op's arguments or results (a plain walk: pytree is slow per op)."""
    if isinstance(value, torch.Tensor):
        return [value]
    found: list[torch.Tensor] = []
    _collect(value, found)
    return found


def _collect(value: object, found: list[torch.Tensor]) -> None:
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


def _to_meta(value: object) -> object:
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
    return value


@dataclass(frozen=True)
class TensorSpec:
    """What shape inference says of one output: enough to allocate it from a pool."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int


def _signature(value: object) -> tuple[object, ...]:
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


def _spec_of(value: object) -> object:
    if isinstance(value, torch.Tensor):
        shape, stride = tuple(value.shape), tuple(value.stride())
        return TensorSpec(shape, stride, value.dtype, nbytes_for(shape, stride, value.dtype))
    if isinstance(value, (list, tuple)):
        return type(value)(_spec_of(v) for v in value)
    return value


#: Shape inference results per (op, argument signature), for the whole process: a 40-layer
#: model issues the same few signatures thousands of times, and inference is pure.
_InferKey = tuple[torch._ops.OpOverload, tuple[object, ...], tuple[object, ...]]
_INFERRED: dict[_InferKey, object] = {}
_INFERRED_MAX = 100_000


@dataclass(frozen=True)
class OpInfo:
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


OP_INFO: dict[torch._ops.OpOverload, OpInfo] = {}


def op_info(func: torch._ops.OpOverload) -> OpInfo:
    info = OP_INFO.get(func)
    if info is None:
        schema, tags = func._schema, func.tags
        rng = torch.Tag.nondeterministic_seeded in tags
        host_returns = any(str(r.type) not in ("Tensor", "Tensor[]", "Tensor?", "List[Tensor]") for r in schema.returns)
        data_dependent = torch.Tag.data_dependent_output in tags or torch.Tag.dynamic_output_shape in tags
        info = OpInfo(
            name=schema.name,
            host_returns=host_returns,
            data_dependent=data_dependent,
            rng=rng,
            inplace_view=torch.Tag.inplace_view in tags,
            writes=any(_is_write(a) for a in schema.arguments),
            view=bool(schema.returns) and all(r.alias_info is not None for r in schema.returns),
            allocation=schema.name in _ALLOCATION_OPS,
            run_to_infer=func.namespace == "aten" and not rng,
            guarded=host_returns or data_dependent or rng or schema.name in BOOL_INDEX_OPS,
        )
        OP_INFO[func] = info
    return info


def infer_outputs(func: torch._ops.OpOverload, args: OpArgs, kwargs: OpKwargs) -> object:
    """The outputs' shapes, strides and dtypes (as :class:`TensorSpec` in the result's structure).

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


def _collective_shape(func: torch._ops.OpOverload, args: SchemaArgs) -> object:
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


def _run_for_shapes(func: torch._ops.OpOverload, args: OpArgs, kwargs: OpKwargs) -> object:
    if func.namespace == "_c10d_functional" and not kwargs:
        shaped = _collective_shape(func, args)
        if shaped is not None:
            return shaped
    if op_info(func).run_to_infer:
        try:
            return func(*args, **kwargs)
        except Exception:  # noqa: BLE001 - e.g. an index read from poisoned memory; meta next
            pass
    try:
        return func(*tree_map(_to_meta, args), **tree_map(_to_meta, kwargs))
    except (NotImplementedError, RuntimeError):
        return func(*args, **kwargs)  # no meta kernel: the values are discarded



def has_bool_index(args: OpArgs) -> bool:
    return any(t.dtype in (torch.bool, torch.uint8) for t in tensors_in(args[1:]))


