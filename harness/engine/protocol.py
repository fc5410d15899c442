"""The engine seam: what the runner may call on a backend, and what a backend declares it can do.

A backend is a module (``harness.engine.emulated.api``, ``.npu``, ``.cuda``) that satisfies
:class:`Engine`. What each backend can do is declared once, here, in :data:`CAPABILITIES`
(no torch needed to read it, so collection can resolve an item without importing a backend),
and read once per item by the capability step (:mod:`harness.graph.capability`,
:mod:`harness.resolve`); nobody else branches on a backend. A backend given a setting it cannot
honour refuses it (:class:`UnsupportedOnBackend`) instead of ignoring it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Protocol, TypedDict, runtime_checkable

if TYPE_CHECKING:  # read by the type checker only: collection reads CAPABILITIES without torch
    from typing_extensions import Self

    import torch

__all__ = [
    "CAPABILITIES", "ArgumentReader", "Capabilities", "CollectiveOps", "DeviceEvent", "DeviceGraph", "DeviceRules",
    "DeviceStream", "Engine", "ExternalDeviceEvent", "GraphPool", "Kernel", "StreamConfig", "StreamUsage", "TaskGroup",
]


@dataclass(frozen=True)
class StreamConfig:
    """How many device streams exist and how many a captured graph consumes.

    ``per_comm_group`` follows the HCCL expansion mode: AIV needs one extra stream per
    communication group, the default (FFTS+/AICPU) mode two (reference section 7).
    """

    pool_size: int = 2048
    per_graph: int = 1
    per_comm_group: int = 2

    def __post_init__(self) -> None:
        # A device has streams and a graph takes at least one (the scenario schema says the same).
        if self.pool_size < 1 or self.per_graph < 1 or self.per_comm_group < 0:
            raise ValueError(f"stream config needs pool_size >= 1, per_graph >= 1 and per_comm_group >= 0, got {self}")


@dataclass(frozen=True)
class DeviceRules:
    """Graph-API rules that differ between torch_npu releases, for the emulator to follow.

    * ``rng_in_capture``: a default ``NPUGraph`` capture accepts random ops (torch_npu commit
      8b8d865aa, v2.11.0 and later); before, random ops fail the capture unless the graph was
      made with ``allow_rng=True``;
    * ``capture_survives_rejected_sync``: a host sync rejected during capture (``.item()``)
      leaves the capture valid, so ``capture_end`` succeeds (commit 882896a6c, master and the
      v2.12.0 branch); before, the rejection invalidates the capture;
    * ``generator_registration``: ``"lazy"`` (commit 42c2f77d7) or ``"explicit"``.

    Defaults are the emulator's historical rules. A native backend runs the installed
    torch_npu, whose own rules apply whatever is asked here.
    """

    rng_in_capture: bool = False
    capture_survives_rejected_sync: bool = False
    generator_registration: str = "lazy"


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do: read by the capability step, which turns it into an item's decisions."""

    device_type: str  # the torch device type its tensors live on ("npu", "cuda")
    physical_device: bool  # a real accelerator: its runtime must not be forked, one device per rank
    task_updates: bool  # graph_task_update_begin/end re-issue a captured op with new host args
    bitwise_replay: bool  # replay equals eager bit for bit (else: compare within tolerance)
    stream_pool: bool  # captures draw on a fixed stream pool the budget applies to (ACL)
    reports_executed_arguments: bool  # executed_host_arguments(graph, op, names) reads what a replay ran
    distributed_backend: str  # torch.distributed's backend for the ranks' process groups


#: Every backend's capabilities, in one place (the backend modules re-export their own).
CAPABILITIES: dict[str, Capabilities] = {
    # The CPU emulator: the same kernels on the same shapes replay bit for bit; it records what
    # each replay ran; its ranks exchange through shared memory (gloo for the rest).
    "emulated": Capabilities(device_type="npu", physical_device=False, task_updates=True, bitwise_replay=True, stream_pool=True,
                             reports_executed_arguments=True, distributed_backend="gloo"),
    # torch_npu on Ascend: ACL graphs with task groups and a fixed stream pool.
    "npu": Capabilities(device_type="npu", physical_device=True, task_updates=True, bitwise_replay=False, stream_pool=True,
                        reports_executed_arguments=False, distributed_backend="hccl"),
    # CUDA graphs: no task groups (lengths live in device buffers), no stream pool.
    "cuda": Capabilities(device_type="cuda", physical_device=True, task_updates=False, bitwise_replay=False, stream_pool=False,
                         reports_executed_arguments=False, distributed_backend="nccl"),
}


#: A backend's own kernel (torch_npu's FIA, a collective op): torch_npu's keyword signature.
Kernel = Callable[..., object]
#: A collective op: each of ``_c10d_functional``'s returns its (output) tensor.
CollectiveKernel = Callable[..., "torch.Tensor"]
#: What an observed op's reader makes of the op's arguments (by schema name): host values by name.
ArgumentReader = Callable[[dict[str, object]], dict[str, object]]


class DeviceStream(Protocol):
    """A device stream as the harness uses one (``torch.npu.Stream``, ``torch.cuda.Stream``, the
    emulator's): a queue of device work the host can wait for or order after another's."""

    def synchronize(self) -> None: ...
    def wait_stream(self, stream: Self, /) -> None: ...  # a stream of the same engine


class DeviceEvent(Protocol):
    """``torch.npu.Event()``: a point in a stream the host can wait for."""

    def record(self) -> None: ...  # at the end of the current stream
    def synchronize(self) -> None: ...


class ExternalDeviceEvent(Protocol):
    """torch_npu's ``ExternalEvent``: recorded by one stream, waited on by another; inside a
    capture each call becomes a node of the graph (how a FULL graph waits for its update)."""

    def record(self, stream: DeviceStream, /) -> None: ...
    def wait(self, stream: DeviceStream, /) -> None: ...
    def reset(self, stream: DeviceStream, /) -> None: ...


class DeviceGraph(Protocol):
    """A captured graph (``torch.npu.NPUGraph``, ``torch.cuda.CUDAGraph``): captured through
    :meth:`Engine.graph`, then replayed until reset."""

    def replay(self) -> None: ...
    def reset(self) -> None: ...


class GraphPool(Protocol):
    """A graph memory pool (``graph_pool_handle()``): opaque, handed back to the engine that made it."""


class TaskGroup(Protocol):
    """A captured task group (``graph_task_group_end``): opaque, handed back to the engine that made it."""


class StreamUsage(TypedDict):
    """Streams held by captured graphs (``None`` where the runtime does not tell)."""

    pool_size: int | None
    in_use: int | None
    graphs: int
    utilisation: float


class CollectiveOps(Protocol):
    """An op family with ``torch.ops._c10d_functional``'s names, which :mod:`harness.model.parallel`
    issues a rank's collectives through."""

    @property
    def all_gather_into_tensor_out(self) -> CollectiveKernel: ...
    @property
    def all_gather_into_tensor(self) -> CollectiveKernel: ...
    @property
    def reduce_scatter_tensor_out(self) -> CollectiveKernel: ...
    @property
    def all_reduce_(self) -> CollectiveKernel: ...
    @property
    def wait_tensor(self) -> CollectiveKernel: ...


@runtime_checkable
class Engine(Protocol):
    """The torch.npu-shaped names the harness calls, plus the read-outs its checks need.

    Every backend module satisfies it (:func:`harness.engine.load` returns each as an ``Engine``,
    which the type checker verifies); a call a backend cannot honour raises
    :class:`~harness.engine.errors.UnsupportedOnBackend`. The streams, events, graphs and handles
    it hands out go back to the same engine only."""

    name: str
    device: torch.device  # this process's (rank's) device, where the run's tensors live
    capabilities: Capabilities

    def NPUGraph(self) -> DeviceGraph: ...  # noqa: N802 - torch.npu's name
    def graph(self, npu_graph: DeviceGraph, /, pool: GraphPool | None = None,
              stream: DeviceStream | None = None) -> ContextManager[object]: ...
    def graph_pool_handle(self) -> GraphPool: ...
    def graph_task_group_begin(self, stream: DeviceStream, /) -> None: ...
    def graph_task_group_end(self, stream: DeviceStream, /) -> TaskGroup: ...
    def graph_task_update_begin(self, stream: DeviceStream, handle: TaskGroup, /) -> None: ...
    def graph_task_update_end(self, stream: DeviceStream, /) -> None: ...
    def ExternalEvent(self) -> ExternalDeviceEvent: ...  # noqa: N802
    def Event(self) -> DeviceEvent: ...  # noqa: N802
    def Stream(self) -> DeviceStream: ...  # noqa: N802
    def current_stream(self) -> DeviceStream: ...
    def stream(self, stream: DeviceStream | None, /) -> ContextManager[object]: ...
    def synchronize(self) -> None: ...
    def reset_device(self, stream_config: StreamConfig | None = None,
                     rules: DeviceRules | None = None) -> None: ...
    def stream_usage(self) -> StreamUsage: ...
    def memory_report(self) -> dict[str, dict[str, object]]: ...  # bytes reserved, by pool
    def device_name(self) -> str: ...
    def device_work(self) -> dict[str, int]: ...  # kernels run (-1: not counted), bytes allocated
    def weak_ref_tensor(self, tensor: torch.Tensor, /) -> torch.Tensor: ...
    # The backend's own kernels and collectives, or None where the harness's reference serves:
    def native_attention(self) -> tuple[Kernel, Kernel, Kernel] | None: ...  # FIA (functional, out, workspace)
    def native_paged_attention(self) -> tuple[Kernel, Kernel] | None: ...  # paged attention + workspace
    def collective_ops(self) -> CollectiveOps | None: ...  # None: torch.ops._c10d_functional
    # Only where ``capabilities.reports_executed_arguments`` (the emulator reads its own graphs);
    # elsewhere they raise UnsupportedOnBackend:
    def executed_host_arguments(self, graph: DeviceGraph, op_name: str, names: tuple[str, ...],
                                replay: int | None = None) -> list[dict[str, Any]]: ...
    def register_updatable_op(self, qualified_name: str, /) -> None: ...
    def register_observed_op(self, qualified_name: str, reader: ArgumentReader, /) -> None: ...
