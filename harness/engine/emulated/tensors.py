"""The emulated NPU's memory: tensors on a device that is not the host.

A real NPU or GPU keeps its tensors in memory the host cannot touch directly, and that is what
makes three classes of bugs visible there: a model left in host memory (a graph captured around
it holds no kernel, and every replay hands back what the capture left), an operation that mixes
a host tensor with a device tensor (it raises), and host work issued during a capture (it runs
once, on the host, and is not in the graph). An emulator whose "device" is the host sees none of
them. So the emulated NPU has a device of its own:

* torch's ``PrivateUse1`` backend, named ``npu`` as torch_npu names it (a Python backend:
  :func:`torch.utils.backend_registration._setup_privateuseone_for_python_backend`), so
  ``torch.zeros(n, device="npu")``, ``tensor.to("npu")`` and ``module.to("npu")`` work as on
  an Ascend machine, and ``tensor.device`` says ``npu:0``;
* a tensor on it is a :class:`DeviceTensor`: a wrapper whose data is a host tensor that only
  device work touches. Every operation on one goes through :func:`_dispatch`, which enforces the
  device's rules: all tensor arguments on one device (host scalars and index tensors excepted,
  as on CUDA), a host read of device memory (``.item()``, ``.tolist()``, ``.cpu()``, a
  device-to-host copy) waits for the stream, as does a blocking host-to-device copy, and an
  operation issued to a stream with queued work is queued behind it (:mod:`.streams`);
* ``.numpy()`` refuses, as on CUDA: device memory must be copied to the host first.

Device work during a capture is recorded by :mod:`.recorder` instead (a capture's dispatch mode
sees every operation before this wrapper does); host work there runs at once and is not
captured, as on a device.

The cost is one Python dispatch per device operation (about 7 µs on the CPUs this project runs
on), measured in ``benchmarks/README.md``. A process that has loaded torch_npu already owns the
``npu`` device: the emulator then refuses to start (:func:`install`).

Over 500 lines on purpose: the placement rules, the short dispatch path and the general one
read the same per-operation rule table and must change together; each op's rule is a few lines.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, NoReturn, SupportsIndex, TypeGuard, cast

import torch
from torch import Tensor
from torch.utils._mode_utils import no_dispatch
from torch.utils._python_dispatch import _disable_current_modes

from ..errors import UnsupportedOnBackend
if TYPE_CHECKING:  # the device imports this module's users
    from .device import EmulatedDevice
    from .pool import Block
    from .streams import Stream
from .opinfo import OpArgs, OpKwargs, SchemaArgs, SchemaKwargs, TensorSpec, frozen_args, infer_outputs, op_info

DEVICE_TYPE = "npu"
DEVICE = torch.device(DEVICE_TYPE, 0) if torch._C._get_privateuse1_backend_name() == DEVICE_TYPE else None

#: Operations that legitimately take host and device tensors together (CUDA's rules): copies
#: between the two memories, and advanced indexing with host index tensors.
_MIXED_OK = frozenset({
    "aten::copy_", "aten::_to_copy", "aten::_copy_from", "aten::_copy_from_and_resize", "aten::to",
    "aten::index", "aten::index_put_", "aten::index_put", "aten::_index_put_impl_",
})


class DeviceMismatchError(RuntimeError):
    """A host tensor and a device tensor met in one operation (a ``RuntimeError`` as torch's)."""


@dataclass(frozen=True)
class _OpRule:
    """How the device treats one operation, read once from its schema."""

    name: str
    mixed_ok: bool
    host_read: bool  # returns a host value or a data-dependent shape: waits for the stream
    view: bool
    writes: bool
    inplace_view: bool
    plain: bool  # none of the above matters: the short path of _dispatch may run it
    aliases: tuple[int | str, ...]  # per return: the argument (position or keyword) it aliases, or -1
    arg_names: tuple[str, ...]


_RULES: dict[torch._ops.OpOverload, _OpRule] = {}
_LIFT_FRESH = torch.ops.aten.lift_fresh.default


def _rule(func: torch._ops.OpOverload) -> _OpRule:
    rule = _RULES.get(func)
    if rule is None:
        info, schema = op_info(func), func._schema
        aliases: list[int | str] = []
        for ret in schema.returns:
            source: int | str = -1
            if ret.alias_info is not None:
                for position, arg in enumerate(schema.arguments):
                    if arg.alias_info is not None and arg.alias_info.before_set == ret.alias_info.before_set:
                        source = arg.name if arg.kwarg_only else position
                        break
            aliases.append(source)
        mixed_ok, host_read = info.name in _MIXED_OK, info.host_returns or info.data_dependent
        rule = _RULES[func] = _OpRule(
            name=info.name, mixed_ok=mixed_ok, host_read=host_read, view=info.view and not info.writes,
            writes=info.writes, inplace_view=info.inplace_view,
            plain=not (mixed_ok or host_read or info.inplace_view or info.rng), aliases=tuple(aliases),
            arg_names=tuple(a.name for a in schema.arguments))
    return rule


# -- the device tensor --------------------------------------------------------------------------
_make_wrapper = torch.Tensor._make_wrapper_subclass


class DeviceTensor(torch.Tensor):
    """A tensor in the emulated NPU's memory (``device='npu:0'``).

    ``_data`` is the host tensor that holds its contents (device work runs on it); ``_block``
    the graph-pool block it lives in, if it was allocated by a capture (a live tensor keeps its
    block from being recycled: :mod:`.pool`).
    """

    _data: Tensor
    _block: Block | None = None  # set only for graph-pool memory (most tensors have none)

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]  # torch's stub types the impl as a plain function, not the classmethod protocol it serves

    @classmethod
    def __torch_dispatch__(cls, func: torch._ops.OpOverload, types: object, args: OpArgs = (),  # type: ignore[override]  # torch's base is a plain function stub
                           kwargs: OpKwargs | None = None) -> object:
        return _dispatch(func, args, kwargs)

    def data_ptr(self) -> int:
        return self._data.data_ptr()

    def untyped_storage(self) -> torch.UntypedStorage:
        return self._data.untyped_storage()

    def tolist(self) -> Any:
        capture = _Hooks.device.capturing if _Hooks.device is not None else None
        if capture is not None:
            capture.host_sync("Tensor.tolist()")  # a host read of device memory
        _wait_for_current_stream()
        return self._data.tolist()

    def numpy(self, *, force: bool = False) -> NoReturn:
        raise TypeError(f"can't convert {self.device} device type tensor to numpy. "
                        "Use Tensor.cpu() to copy the tensor to host memory first.")

    def __repr__(self, *, tensor_contents: object = None) -> str:  # type: ignore[override]
        _wait_for_current_stream()
        text = repr(self._data)
        return text[:-1] + f", device='{self.device}')" if text.endswith(")") else text

    def __reduce_ex__(self, protocol: SupportsIndex) -> tuple[Callable[[Tensor], Tensor], tuple[Tensor]]:
        _wait_for_current_stream()
        with _disable_current_modes():
            return (_rebuild, (self._data.clone(),))


def _rebuild(data: Tensor) -> Tensor:
    return wrap(data)


def wrap(data: Tensor, block: Block | None = None) -> DeviceTensor:
    """``data`` (a host tensor) as device memory; ``block``: the graph-pool block it lives in."""
    assert DEVICE is not None, "install() registers the device first"
    tensor = _make_wrapper(DeviceTensor, data.size(), strides=data.stride(), storage_offset=data.storage_offset(),
                           dtype=data.dtype, device=DEVICE, requires_grad=data.requires_grad)
    tensor._data = data
    if block is not None:
        tensor._block = block
        block.hold(tensor)
    return tensor


def weak_ref(tensor: Tensor) -> Tensor:
    """A tensor on the same memory that does not keep it allocated (vLLM's ``weak_ref_tensors``):
    once every other holder is gone, a later capture into the pool may reuse the block."""
    if type(tensor) is not DeviceTensor:
        return tensor
    return wrap(tensor._data)


def host_data(tensor: Tensor) -> Tensor:
    """The host tensor that holds a device tensor's contents (itself for a host tensor).

    For the emulator's own machinery (a replay runs on these); reading it skips the stream
    order, so callers that are not the device wait first."""
    return tensor._data if type(tensor) is DeviceTensor else tensor


def is_device_tensor(value: object) -> TypeGuard[DeviceTensor]:
    return type(value) is DeviceTensor


# -- the device's state that the dispatch needs (set by the api module) -------------------------
class _Hooks:
    """What dispatch asks of the current emulated device: its stream state and counters.

    The api module installs the live device here (:func:`attach`); until then operations run at
    once, with nothing counted."""

    device: EmulatedDevice | None = None


def attach(device: EmulatedDevice) -> None:
    _Hooks.device = device


def _wait_for_current_stream() -> None:
    device = _Hooks.device
    if device is not None:
        device.scheduler.drain(device.current_stream)


# -- dispatch -----------------------------------------------------------------------------------
@dataclass
class Call:
    """One operation's arguments as the device sees them (also read by the recorder)."""

    data_args: list[object]
    data_kwargs: dict[str, object]
    on_device: bool  # a device tensor is among the arguments
    host: Tensor | None  # the first host tensor of more than one element among them
    to_device: bool | None  # ``device=`` names the device (True), the host (False), or nothing
    to_host: bool  # a copy of device memory to the host (a host read)


def _unwrap(values: Any, seen: list[Any]) -> object:
    """``values`` with device tensors replaced by their data. ``seen[0]`` becomes True at a device
    tensor, ``seen[1]`` is the first host tensor of more than one element (a list or tuple
    argument, such as ``cat``'s, is walked)."""
    kind = type(values)
    if kind is DeviceTensor:
        seen[0] = True
        return values._data
    if isinstance(values, Tensor):
        if seen[1] is None and values.dim() and values.device.type == "cpu":
            seen[1] = values
        return values
    if kind is list or kind is tuple:
        return kind(_unwrap(v, seen) for v in values)
    return values


def unwrap_call(func: torch._ops.OpOverload, args: OpArgs, kwargs: OpKwargs | None) -> Call:
    """Unwrap ``func``'s arguments; raise :class:`DeviceMismatchError` for a forbidden host/device mix."""
    rule = _RULES.get(func) or _rule(func)
    seen: list[Any] = [False, None]
    data_args = [_unwrap(a, seen) for a in args]
    data_kwargs: SchemaKwargs = {k: _unwrap(v, seen) for k, v in kwargs.items()} if kwargs else {}  # device=: a Device
    to_device = None
    if "device" in data_kwargs and data_kwargs["device"] is not None:
        to_device = torch.device(data_kwargs["device"]).type == DEVICE_TYPE
        data_kwargs["device"] = torch.device("cpu")
    on_device, host = seen
    if host is not None and on_device and not rule.mixed_ok:
        raise _mismatch(rule, args, kwargs or {}, host)
    to_host = on_device and (to_device is False or (rule.name == "aten::copy_" and type(args[0]) is not DeviceTensor))
    return Call(data_args, data_kwargs, on_device, host, to_device, to_host)


def non_blocking(args: OpArgs, kwargs: OpKwargs | None) -> bool:
    """``copy_``'s ``non_blocking`` flag."""
    if len(args) > 2:
        return bool(args[2])
    return bool(kwargs and kwargs.get("non_blocking"))


def apply_inplace_view(func: torch._ops.OpOverload, args: OpArgs, call: Call) -> object:
    """A metadata-only in-place op (``t_``, ``squeeze_``) on a device tensor: applied to its data
    and to the wrapper's own sizes and strides (which are the wrapper's, not its data's)."""
    func(*call.data_args, **call.data_kwargs)
    with no_dispatch():
        func(*args, **{k: v for k, v in call.data_kwargs.items()})
    return args[0]


def _mismatch(rule: _OpRule, args: OpArgs, kwargs: OpKwargs, host: Tensor) -> DeviceMismatchError:
    where = next((rule.arg_names[i] for i, a in enumerate(args) if _holds(a, host) and i < len(rule.arg_names)),
                 next((k for k, v in kwargs.items() if _holds(v, host)), "?"))
    return DeviceMismatchError(
        f"Expected all tensors to be on the same device, but found at least two devices, {DEVICE} and cpu! "
        f"({rule.name}: argument '{where}' is a host tensor of shape {list(host.shape)})")


def _holds(value: object, tensor: Tensor) -> bool:
    if value is tensor:
        return True
    return isinstance(value, (list, tuple)) and any(v is tensor for v in value)


def _dispatch(func: torch._ops.OpOverload, args: OpArgs, kwargs: OpKwargs | None) -> object:
    """Every operation on a device tensor outside a capture: the device's rules, then the work.

    The common case (positional device tensors and host scalars, an empty stream, no copy and no
    host read) takes a short path: this runs for every operation of every eager forward."""
    rule = _RULES.get(func) or _rule(func)
    if not rule.plain or (kwargs and "device" in kwargs):
        return _dispatch_call(func, rule, args, kwargs)
    if func is _LIFT_FRESH:  # torch.tensor(..., device=...) hands back what it made: nothing to run
        return args[0]
    device = _Hooks.device
    try:
        data = [_plain(a) for a in args]
        data_kwargs = {k: _plain(v) for k, v in kwargs.items()} if kwargs else _NO_KWARGS
        plain = device is None or not device.current_stream.queue
    except _NotPlain:
        plain = False
    if not plain:  # (outside the except clause: an error raised there must not chain to _NotPlain)
        return _dispatch_call(func, rule, args, kwargs)
    if device is not None and not rule.view:
        device.kernels += 1
    result = func(*data, **data_kwargs)
    if type(result) is not Tensor:
        return _wrap_result(result, rule, args, kwargs, device)
    if rule.view:  # a view keeps its base's graph-pool block alive
        return wrap(result, args[0]._block if type(args[0]) is DeviceTensor else None)
    if rule.writes and rule.aliases and type(rule.aliases[0]) is int and rule.aliases[0] >= 0:
        return args[rule.aliases[0]]  # in place: the caller's own tensor
    if device is not None:
        device.bytes_allocated += result.untyped_storage().nbytes()
    return wrap(result)


_NO_KWARGS: OpKwargs = {}


class _NotPlain(Exception):
    """An argument the short path does not handle: a host tensor, a list of tensors."""


def _plain(value: Any) -> object:
    """One argument for the short path: a device tensor's data, a host scalar or list of ints."""
    kind = type(value)
    if kind is DeviceTensor:
        return value._data
    if kind is list or kind is tuple:
        if value and type(value[0]) is not int:
            raise _NotPlain
        return value
    if isinstance(value, Tensor):
        raise _NotPlain
    return value


def _dispatch_call(func: torch._ops.OpOverload, rule: _OpRule, args: OpArgs, kwargs: OpKwargs | None) -> object:
    """The general path: keywords, host tensors, copies, host reads, a stream with queued work."""
    call = unwrap_call(func, args, kwargs)
    if rule.inplace_view:
        return apply_inplace_view(func, args, call)
    host_read = rule.host_read or call.to_host
    device = _Hooks.device
    if device is not None:
        stream = device.current_stream
        if call.to_host and stream.queue and _non_blocking_read(func, rule, args, kwargs):
            return _queued_to_host(func, rule, args, kwargs or {}, call, stream, device)
        if host_read or (call.host is not None and rule.name == "aten::copy_" and not non_blocking(args, kwargs)):
            device.scheduler.drain(stream)  # the host waits for the stream (a sync point)
        elif stream.queue:
            return _queued(func, rule, args, kwargs or {}, call.data_args, call.data_kwargs, stream, device)
        if not rule.view:
            device.kernels += 1
    result = func(*call.data_args, **call.data_kwargs)
    if host_read or call.to_device is False:
        return result
    return _wrap_result(result, rule, args, kwargs, device)


def _wrap_result(result: object, rule: _OpRule, args: OpArgs, kwargs: OpKwargs | None,
                 device: EmulatedDevice | None) -> object:
    if type(result) is Tensor:
        return _wrap_one(result, 0, rule, args, kwargs, device)
    if isinstance(result, (tuple, list)):
        return type(result)(_wrap_one(r, i, rule, args, kwargs, device) if type(r) is Tensor else r
                            for i, r in enumerate(result))
    return result


def _wrap_one(result: Tensor, index: int, rule: _OpRule, args: OpArgs, kwargs: OpKwargs | None, device: EmulatedDevice | None) -> Tensor:
    if rule.writes:
        source = rule.aliases[index] if index < len(rule.aliases) else -1
        if source != -1:
            original = (kwargs or {}).get(source) if isinstance(source, str) else \
                args[source] if source < len(args) else None
            if original is not None:
                return cast(Tensor, original)  # in place / out=: the caller's own tensor
    if rule.view:  # a view keeps its base's graph-pool block alive
        base = next((a for a in args if type(a) is DeviceTensor), None)
        return wrap(result, base._block if base is not None else None)
    if device is not None:
        device.bytes_allocated += result.untyped_storage().nbytes()
    return wrap(result)


def _queued(func: torch._ops.OpOverload, rule: _OpRule, args: OpArgs, kwargs: OpKwargs, data_args: list[object],
            data_kwargs: OpKwargs, stream: Stream, device: EmulatedDevice) -> object:
    """An operation issued to a stream with queued work: it runs when the stream reaches it.

    Its outputs exist at once (a device allocates before it launches); what it reads is read
    when it runs, and the host values it was given are those of the moment it was issued."""
    if rule.view:  # metadata only: nothing to run
        return _wrap_result(func(*data_args, **data_kwargs), rule, args, kwargs, None)
    launch_args, launch_kwargs = frozen_args(tuple(data_args)), dict(data_kwargs)
    if rule.writes:
        stream.launch_host_fn(f"{rule.name} (queued)", lambda: func(*launch_args, **launch_kwargs))
        device.kernels += 1
        return _aliased(rule, args, kwargs)
    outputs = _allocate(infer_outputs(func, launch_args, launch_kwargs))

    def run() -> None:
        fresh = func(*launch_args, **launch_kwargs)
        for out, value in zip(_flat(outputs), _flat(fresh)):
            out.copy_(value)

    stream.launch_host_fn(f"{rule.name} (queued)", run)
    device.kernels += 1
    return _wrap_result(outputs, rule, args, kwargs, device)


def _non_blocking_read(func: torch._ops.OpOverload, rule: _OpRule, args: OpArgs, kwargs: OpKwargs | None) -> bool:
    """A copy to the host that does not make the host wait (``.to("cpu", non_blocking=True)``,
    ``host.copy_(device, non_blocking=True)``)."""
    if rule.name == "aten::copy_":
        return non_blocking(args, kwargs)
    return func is torch.ops.aten._to_copy.default and bool(kwargs and kwargs.get("non_blocking"))


def _queued_to_host(func: torch._ops.OpOverload, rule: _OpRule, args: SchemaArgs, kwargs: OpKwargs, call: Call,
                    stream: Stream, device: EmulatedDevice) -> Tensor:
    """A copy to host memory issued behind queued work: the host tensor exists at once and is
    filled when the stream reaches the copy (read it before then and it holds what was there)."""
    launch_args: SchemaArgs = frozen_args(tuple(call.data_args))  # copy_(Tensor self, Tensor src, ...)
    launch_kwargs = dict(call.data_kwargs)
    if rule.name == "aten::copy_":
        out: Tensor = args[0]
        stream.launch_host_fn("aten::copy_ to host (queued)", lambda: out.copy_(launch_args[1]))
    else:
        out = _allocate(infer_outputs(func, launch_args, launch_kwargs))
        stream.launch_host_fn("aten::_to_copy to host (queued)",
                              lambda: out.copy_(func(*launch_args, **launch_kwargs)))
    device.kernels += 1
    return out


def _aliased(rule: _OpRule, args: OpArgs, kwargs: OpKwargs) -> object:
    """The caller's tensors that an in-place or ``out=`` operation returns."""
    picked = [kwargs.get(s) if isinstance(s, str) else args[s] for s in rule.aliases if s != -1]
    if not picked:
        return None
    return picked[0] if len(picked) == 1 else tuple(picked)


def _allocate(spec: object) -> Any:  # a tensor per TensorSpec: what the op's schema returns
    if type(spec) is TensorSpec:
        return torch.empty_strided(spec.shape, spec.stride, dtype=spec.dtype)
    if isinstance(spec, (list, tuple)):
        return type(spec)(_allocate(s) for s in spec)
    return spec


def _flat(value: object) -> list[Tensor]:
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _flat(v)]
    return []


# -- the PrivateUse1 kernels: what reaches the device without a device tensor argument ----------
def _empty(size: list[int], dtype: torch.dtype | None = None, layout: object = None, device: object = None,
           pin_memory: object = None, memory_format: torch.memory_format | None = None) -> DeviceTensor:
    data = torch.empty(size, dtype=dtype, memory_format=memory_format)
    return _fresh(data)


def _empty_strided(size: list[int], stride: list[int], dtype: torch.dtype | None = None, layout: object = None,
                   device: object = None, pin_memory: object = None) -> DeviceTensor:
    return _fresh(torch.empty_strided(size, stride, dtype=dtype))


def _fresh(data: Tensor) -> DeviceTensor:
    device = _Hooks.device
    if device is not None:
        device.bytes_allocated += data.untyped_storage().nbytes()
    return wrap(data)


def _copy_from(self: Tensor, dst: Tensor, non_blocking: bool = False) -> Tensor:
    """A copy into device memory that torch routes to the backend (``tensor.to("npu")``)."""
    if not non_blocking:
        _wait_for_current_stream()
    host_data(dst).copy_(host_data(self))
    return dst


def _copy_from_and_resize(self: Tensor, dst: Tensor) -> Tensor:
    host_data(dst).resize_(self.shape).copy_(host_data(self))
    return dst


class _BackendModule:
    """``torch.npu`` as torch's device-generic code asks it (one device, always ready)."""

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def is_initialized() -> bool:
        return True

    @staticmethod
    def current_device() -> int:
        return 0

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def _is_in_bad_fork() -> bool:
        return False

    # The emulated device draws from torch's CPU generator (see :mod:`.rng`), which
    # torch.manual_seed (the caller of this one) seeds already.
    @staticmethod
    def manual_seed_all(seed: int) -> None:
        pass

    @staticmethod
    def get_rng_state(device: object = None) -> Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: Tensor, device: object = None) -> None:
        torch.set_rng_state(state)

    @staticmethod
    def get_amp_supported_dtype() -> list[torch.dtype]:
        return [torch.float16, torch.bfloat16]


_libraries: list[torch.library.Library] = []


def install() -> torch.device:
    """Register the ``npu`` device with torch (once per process) and return it.

    Raises :class:`UnsupportedOnBackend` where torch_npu (or anything else) already owns
    ``PrivateUse1``: that process has a real NPU backend, and the emulator cannot share the name."""
    global DEVICE
    if DEVICE is not None and _libraries:
        return DEVICE
    owner = torch._C._get_privateuse1_backend_name()
    if owner != "privateuseone":
        raise UnsupportedOnBackend(f"the emulated NPU needs torch's PrivateUse1 device, which {owner!r} already "
                                   "owns in this process (torch_npu is loaded): run the emulator in a process "
                                   "without torch_npu")
    # torch imports its DTensor package (and sympy) on the first dispatch to any tensor subclass:
    # about 0.6 s, paid here, at start-up, where the warm rank server inherits it, rather than
    # in the first operation of a rank's job.
    importlib.import_module("torch.distributed.tensor")
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    _setup_privateuseone_for_python_backend(DEVICE_TYPE, backend_module=_BackendModule())
    lib = torch.library.Library("aten", "IMPL")  # noqa: TOR901 - kept alive in _libraries
    lib.impl("empty.memory_format", _empty, "PrivateUse1")
    lib.impl("empty_strided", _empty_strided, "PrivateUse1")
    lib.impl("_copy_from", _copy_from, "PrivateUse1")
    lib.impl("_copy_from_and_resize", _copy_from_and_resize, "PrivateUse1")
    _libraries.append(lib)
    DEVICE = torch.device(DEVICE_TYPE, 0)
    return DEVICE


__all__ = ["DEVICE_TYPE", "Call", "DeviceMismatchError", "DeviceTensor", "apply_inplace_view", "attach",
           "host_data", "install", "is_device_tensor", "non_blocking", "unwrap_call", "weak_ref", "wrap"]
