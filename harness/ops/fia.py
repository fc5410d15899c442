"""The FIA wrappers: the "host tiling" step, where validation and observation happen.

Call these, not ``torch.ops.harness.*`` directly. A wrapper runs on every path: in eager mode,
during a graph capture (where a recorder runs only the op's fake kernel), and during a
task-group update (where the engine intercepts the op call). So the wrapper is the one place
that can (1) apply the host contract (:mod:`harness.ops.contract`), exactly as CANN's host
tiling does before the kernel launch, and (2) record a :class:`~harness.ops.observe.FiaCall`
for the harness's FIA-invariant check -- also for calls that raise.

Each wrapper then makes exactly ONE op call, so a dispatch-mode recorder sees one node whose
list arguments it can later replace. The wrappers read only shapes and host lists, never
tensor data, so they are legal inside a capture.

Backend dispatch: by default the op is the CPU reference in :mod:`harness.ops.library`. The
NPU engine installs torch_npu's real op with :func:`set_native_impl`; this package never
imports torch_npu. (The device-metadata variant has no native counterpart on Ascend.)

The wrappers' keyword arguments are torch_npu's, defined once in
:class:`harness.ops.signature.FiaKeywords` (the ops' schemas are rendered from the same
definition); each wrapper's ``__signature__`` lists them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Union

import torch
from torch import Tensor

from harness.ops import library as _library  # noqa: F401  (registers the ops)
from harness.ops.contract import (
    FiaArgumentError,
    FiaContract,
    FiaContractError,
    bnsd_length_violation,
    check_fia_lengths,
    resolve_contract,
    shape_violation,
)
from harness.ops.observe import FiaCall, FiaCallKind, current_tags, record_fia_call
from harness.ops.signature import FiaKeywords, wrapper_signature
from harness.plain import Kwargs

if TYPE_CHECKING:  # the type only: harness.ops imports no backend
    from typing_extensions import Unpack

    from harness.engine.protocol import Engine

#: torch_npu's kernels, by what they return: the functional FIA's (attention_out, softmax_lse),
#: nothing for ``.out`` (it writes its ``out=``), and a workspace tensor.
NativeFia = Callable[..., tuple[Tensor, Tensor]]
NativeFiaOut = Callable[..., object]
NativeWorkspace = Callable[..., Tensor]
NativeFn = Union[NativeFia, NativeFiaOut, NativeWorkspace]


@dataclass(frozen=True)
class _NativeImpl:
    functional: NativeFia | None = None
    out: NativeFiaOut | None = None
    workspace: NativeWorkspace | None = None


# A process-wide backend choice (like torch's own backend registry), not per-test state:
# the engine selects a backend once. Tests that set it must restore it.
_native = _NativeImpl()


def set_native_impl(
    fn_functional: NativeFia | None,
    fn_out: NativeFiaOut | None,
    fn_workspace: NativeWorkspace | None = None,
) -> None:
    """Route the wrappers to a native op (e.g. torch_npu's); ``None`` restores the reference.

    ``fn_functional(query, key, value, **kwargs)`` and ``fn_out(query, key, value, **kwargs,
    workspace=..., out=[attention_out, softmax_lse])`` receive torch_npu's keyword names;
    ``fn_workspace(query, key, value, **kwargs)`` is torch_npu's
    ``_npu_fused_infer_attention_score_get_max_workspace``.
    """
    global _native
    _native = _NativeImpl(fn_functional, fn_out, fn_workspace)


def get_native_impl() -> tuple[NativeFia | None, NativeFiaOut | None, NativeWorkspace | None]:
    """The installed ``(fn_functional, fn_out, fn_workspace)``; all ``None`` for the reference."""
    return _native.functional, _native.out, _native.workspace


def register_updatable_ops(engine: Engine) -> None:
    """Tell an engine that reads its own graphs (``capabilities.reports_executed_arguments``: the
    emulator) which ops' host lists a graph update may replace
    (:data:`~harness.ops.library.UPDATABLE_OP_NAMES`), and what the device-metadata attention
    reads when it runs (its lengths buffers), so that a replay can report both. A native graph
    records the ops itself: nothing to tell. This keeps harness.ops free of engine imports."""
    if not engine.capabilities.reports_executed_arguments:
        return
    for name in _library.UPDATABLE_OP_NAMES:
        engine.register_updatable_op(name)
    engine.register_observed_op(_library.DEVICE_METADATA_OP_NAME, _device_lengths_read)


def _device_lengths_read(arguments: Kwargs) -> Kwargs:
    """What ``fia_device_metadata`` read as it ran: its buffers as host lists (cumulative query
    ends, per-request KV lengths), one entry per request slot of ``max_num_reqs``."""
    slots = int(arguments["max_num_reqs"])
    starts = arguments["query_start_loc"][: slots + 1].tolist()
    return {"actual_seq_lengths": starts[1:], "actual_seq_lengths_kv": arguments["seq_lens_kv"][:slots].tolist()}


def observe_device_lengths(T: int, actual_seq_lengths: Sequence[int], actual_seq_lengths_kv: Sequence[int],
                           block_table_shape: tuple[int, ...], block_size: int) -> None:
    """Record the FIA invariant of the device-metadata attention: the lengths its buffers hold
    (what the kernel will read) against the query's ``T``, under the active contract, as one
    :class:`FiaCall` of kind ``device_metadata`` with those lists. Nothing raises: a device
    kernel has no host tiling to refuse the call; the check reads the record."""
    name = resolve_contract(None)
    q, kv = list(actual_seq_lengths), list(actual_seq_lengths_kv)

    def problem(contract: FiaContract) -> str | None:
        try:
            check_fia_lengths(T, q, kv, block_table_shape, block_size, contract)
        except (FiaArgumentError, FiaContractError) as error:
            return f"{type(error).__name__}: {error}"
        return None

    strict, relaxed = problem("strict"), problem("relaxed")
    error = strict if name == "strict" else relaxed if name == "relaxed" else None
    record_fia_call(FiaCall("device_metadata", T, tuple(q), tuple(kv), len(q), name, strict is None,
                            strict is None or relaxed is None, error, tags=current_tags()))


# --------------------------------------------------------------------------- validation


def _as_tuple(values: list[int] | None) -> tuple[int, ...]:
    """A :func:`_host_list` result as a tuple (its elements are plain ints already)."""
    return () if values is None else tuple(values)


def _host_list(name: str, values: Sequence[int] | None) -> list[int] | None:
    """A plain ``list[int]`` copy of a host list; a tensor is refused (reading it would sync)."""
    if values is None:
        return None
    if isinstance(values, Tensor):
        raise FiaArgumentError(name, "must be a host list of ints, not a tensor (reading it is a host sync)")
    # a host list of up to max_num_seqs plain ints is the common case: checked at C speed
    return list(values) if set(map(type, values)) <= {int} else [int(v) for v in values]


def _validate(
    contract: FiaContract,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    actual_seq_lengths: Sequence[int] | None,
    actual_seq_lengths_kv: Sequence[int] | None,
    kw: FiaKeywords,
) -> None:
    """Everything the host tiling checks, under ``contract``, of a call with ``kw`` whose host
    lists are given as plain lists. Raises on the first problem."""
    problem = shape_violation(
        query.shape, key.shape, value.shape, block_size=kw.block_size, num_heads=kw.num_heads,
        num_key_value_heads=kw.num_key_value_heads, input_layout=kw.input_layout, sparse_mode=kw.sparse_mode,
    )
    if problem is not None:
        raise FiaArgumentError(*problem)
    block_table = kw.block_table
    if kw.input_layout == "BNSD":  # dense: per-batch lengths, no block table, no last-element rule
        if block_table is not None:
            raise FiaArgumentError("block_table", "the harness models BNSD dense (non-paged) only; pass None")
        problem = bnsd_length_violation(query.shape, key.shape, actual_seq_lengths, actual_seq_lengths_kv)
        if problem is not None:
            raise FiaArgumentError(*problem)
        return
    for name, given in (
        ("actual_seq_lengths", actual_seq_lengths),
        ("actual_seq_lengths_kv", actual_seq_lengths_kv),
        ("block_table", block_table),
    ):
        if given is None:
            raise FiaArgumentError(name, "is required for TND paged attention")
    assert actual_seq_lengths is not None and actual_seq_lengths_kv is not None
    assert block_table is not None
    check_fia_lengths(
        query.shape[0], actual_seq_lengths, actual_seq_lengths_kv, block_table.shape, kw.block_size, contract
    )


def _accepts(contract: FiaContract, *args: Unpack[tuple[Tensor, Tensor, Tensor, Sequence[int] | None,
                                                          Sequence[int] | None, FiaKeywords]]) -> bool:
    try:
        _validate(contract, *args)
    except (FiaArgumentError, FiaContractError):
        return False
    return True


class _Observed:
    """Context manager that records one :class:`FiaCall` on exit, with the error if any."""

    def __init__(self, kind: FiaCallKind, T: int, q: tuple[int, ...], kv: tuple[int, ...],
                 num_reqs: int, contract: str, strict_ok: bool, relaxed_ok: bool,
                 layout: str = "TND", accepted: bool = False) -> None:
        self._fields = dict(kind=kind, T=T, actual_seq_lengths=q, actual_seq_lengths_kv=kv,
                            num_reqs=num_reqs, contract=contract, strict_ok=strict_ok,
                            relaxed_ok=relaxed_ok, layout=layout)
        self.accepted = accepted  # True: the active contract is known to accept the call

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: object) -> Literal[False]:
        error = None if exc is None else f"{type(exc).__name__}: {exc}"
        record_fia_call(FiaCall(**self._fields, error=error, tags=current_tags()))  # type: ignore[arg-type]
        return False


def _host_tiling(
    kind: FiaCallKind,
    contract: FiaContract | None,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    kw: FiaKeywords,
) -> tuple[_Observed, FiaContract, list[int] | None, list[int] | None]:
    """Resolve the contract, evaluate strict/relaxed, and return the observer for the call.

    Validation under the active contract runs inside the returned context, so its error is
    recorded too. The lists are returned as plain ``list[int]`` copies for the op call.
    """
    name = resolve_contract(contract)
    T = int(query.shape[0])
    try:
        q = _host_list("actual_seq_lengths", kw.actual_seq_lengths)
        kv = _host_list("actual_seq_lengths_kv", kw.actual_seq_lengths_kv)
    except FiaArgumentError:
        with _Observed(kind, T, (), (), 0, name, strict_ok=False, relaxed_ok=False):
            raise
    args = (query, key, value, q, kv, kw)
    strict_ok = _accepts("strict", *args)
    relaxed_ok = strict_ok or _accepts("relaxed", *args)  # relaxed only loosens strict's rule
    observed = _Observed(
        kind, T, _as_tuple(q), _as_tuple(kv), T if kw.input_layout == "BNSD" else len(q or ()), name,
        strict_ok=strict_ok, relaxed_ok=relaxed_ok, layout=str(kw.input_layout),
        # whether the active contract accepts the call, when already known ("off" only loosens
        # relaxed's): the wrapper then skips validating a third time
        accepted=strict_ok if name == "strict" else relaxed_ok,
    )
    return observed, name, q, kv


# --------------------------------------------------------------------------- wrappers


def npu_fused_infer_attention_score(
    query: Tensor, key: Tensor, value: Tensor, *, contract: FiaContract | None = None, **keywords: object,
) -> tuple[Tensor, Tensor]:
    """Functional FIA: returns ``(attention_out [T, N, Dv], softmax_lse)``.

    TND takes a paged KV cache, 4-D or vLLM Ascend's flat 3-D view; ``input_layout="BNSD"``
    takes dense ``[B, N_kv, S_kv, D]`` key/value with per-batch lengths and no ``block_table``,
    and returns ``[B, N, S, Dv]`` (lse ``[B, N, S, 1]``).

    ``softmax_lse`` is float32 ``[T, N, 1]`` with ``softmax_lse_flag``, else zeros ``[1]``.
    ``contract=None`` uses the current default (:func:`harness.ops.contract.fia_contract`).
    """
    kw = FiaKeywords.of("npu_fused_infer_attention_score", keywords)
    observed, name, q, kv = _host_tiling("functional", contract, query, key, value, kw)
    with observed:
        if not observed.accepted:  # raises the host tiling's error, inside the observation
            _validate(name, query, key, value, q, kv, kw)
        kwargs = kw.as_kwargs(actual_seq_lengths=q, actual_seq_lengths_kv=kv)
        if _native.functional is not None:
            return _native.functional(query, key, value, **kwargs)
        attended: tuple[Tensor, Tensor] = torch.ops.harness.npu_fused_infer_attention_score(query, key, value, **kwargs)
        return attended


def npu_fused_infer_attention_score_out(
    query: Tensor, key: Tensor, value: Tensor, *, workspace: Tensor, out: Sequence[Tensor],
    contract: FiaContract | None = None, **keywords: object,
) -> None:
    """FIA writing into ``out = (attention_out, softmax_lse)`` (torch_npu's ``.out`` form).

    The tensors keep their addresses; ``workspace`` comes from :func:`get_max_workspace`.
    With ``softmax_lse_flag=False`` the given ``softmax_lse`` (any float32 shape) is zeroed.
    """
    kw = FiaKeywords.of("npu_fused_infer_attention_score_out", keywords)
    observed, name, q, kv = _host_tiling("out", contract, query, key, value, kw)
    with observed:
        if len(out) != 2:
            raise FiaArgumentError("out", f"must be (attention_out, softmax_lse), got {len(out)} tensors")
        if not observed.accepted:  # raises the host tiling's error, inside the observation
            _validate(name, query, key, value, q, kv, kw)
        kwargs = kw.as_kwargs(actual_seq_lengths=q, actual_seq_lengths_kv=kv)
        if _native.out is not None:
            _native.out(query, key, value, **kwargs, workspace=workspace, out=list(out))
            return
        torch.ops.harness.npu_fused_infer_attention_score.out(
            query, key, value, **kwargs,
            workspace=workspace, attention_out=out[0], softmax_lse=out[1],
        )


_CONTRACT = inspect.Parameter("contract", inspect.Parameter.KEYWORD_ONLY, default=None,
                              annotation="FiaContract | None")
npu_fused_infer_attention_score.__signature__ = wrapper_signature(_CONTRACT)  # type: ignore[attr-defined]
npu_fused_infer_attention_score_out.__signature__ = wrapper_signature(  # type: ignore[attr-defined]
    inspect.Parameter("workspace", inspect.Parameter.KEYWORD_ONLY, annotation=Tensor),
    inspect.Parameter("out", inspect.Parameter.KEYWORD_ONLY, annotation="Sequence[Tensor]"),
    _CONTRACT,
)


def get_max_workspace(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    **kwargs: object,
) -> Tensor:
    """A workspace for the ``.out`` form (torch_npu's ``_..._get_max_workspace``).

    Takes the same keyword arguments as :func:`npu_fused_infer_attention_score` (``contract``
    is ignored). The reference size is deterministic: ``workspace_nbytes(T, N)`` uint8 bytes.
    """
    kwargs.pop("contract", None)
    if _native.workspace is not None:
        return _native.workspace(query, key, value, **kwargs)
    nbytes = _library.workspace_nbytes(query.shape[0], query.shape[1])
    return torch.empty(nbytes, dtype=torch.uint8, device=query.device)


def fia_device_metadata(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    query_start_loc: Tensor,
    seq_lens_kv: Tensor,
    block_table: Tensor,
    *,
    block_size: int,
    num_heads: int,
    num_key_value_heads: int,
    scale: float,
    max_num_reqs: int,
    sparse_mode: int = 3,
) -> tuple[Tensor, Tensor]:
    """GPU-FlashAttention-style attention: bounds in device tensors, read at run time.

    ``query_start_loc`` (int32, >= max_num_reqs + 1 entries, cumulative starts from 0) and
    ``seq_lens_kv`` (int32, >= max_num_reqs) are NOT read here (that would be a host sync);
    only their shapes and the host upper bound ``max_num_reqs`` are checked. Unused request
    slots must have zero-length queries (repeat the last start). Returns
    ``(attention_out [T, N, Dv], softmax_lse [T, N, 1] float32)``.
    """
    T = int(query.shape[0])
    name = resolve_contract(None)

    def host_checks() -> None:
        problem = shape_violation(
            query.shape, key.shape, value.shape, block_size=block_size, num_heads=num_heads,
            num_key_value_heads=num_key_value_heads, sparse_mode=sparse_mode,
        )
        if problem is not None:
            raise FiaArgumentError(*problem)
        if max_num_reqs <= 0:
            raise FiaArgumentError("max_num_reqs", f"must be positive, got {max_num_reqs}")
        for arg, tensor, need in (
            ("query_start_loc", query_start_loc, max_num_reqs + 1),
            ("seq_lens_kv", seq_lens_kv, max_num_reqs),
            ("block_table", block_table, max_num_reqs),
        ):
            if tensor.dtype != torch.int32:
                raise FiaArgumentError(arg, f"must be int32, got {tensor.dtype}")
            if tensor.dim() < 1 or tensor.shape[0] < need:
                raise FiaArgumentError(
                    arg, f"needs at least {need} rows for max_num_reqs={max_num_reqs}, "
                    f"got shape {list(tensor.shape)}"
                )
        if block_table.dim() != 2:
            raise FiaArgumentError("block_table", f"must be 2-D, got shape {list(block_table.shape)}")

    try:
        host_checks()
        ok = True
    except FiaArgumentError:
        ok = False
    observed = _Observed("device_metadata", T, (), (), max_num_reqs, name, ok, ok)
    with observed:
        host_checks()
        attended: tuple[Tensor, Tensor] = torch.ops.harness.fia_device_metadata(
            query, key, value, query_start_loc, seq_lens_kv, block_table,
            block_size=block_size, num_heads=num_heads, num_key_value_heads=num_key_value_heads,
            scale=scale, max_num_reqs=max_num_reqs, sparse_mode=sparse_mode,
        )
        return attended
