"""The engine seam: what the runner may call on a backend, and what a backend declares it can do.

A backend is a module (``harness.engine.emulated.api``, ``.npu``, ``.cuda``) that satisfies
:class:`Engine`; the harness reads :class:`Capabilities` instead of probing for names, and a
backend given a setting it cannot honour refuses it (:class:`UnsupportedOnBackend`) instead of
ignoring it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Protocol, runtime_checkable

__all__ = ["Capabilities", "DeviceRules", "Engine", "StreamConfig"]


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
    """What a backend can do; the runner and the checks branch on these, never on names."""

    task_updates: bool  # graph_task_update_begin/end re-issue a captured op with new host args
    bitwise_replay: bool  # replay equals eager bit for bit (else: compare within tolerance)
    stream_pool: bool  # captures draw on a fixed stream pool the budget applies to (ACL)
    reports_executed_arguments: bool  # executed_host_arguments(graph, op, names) reads a graph
    native_attention: Callable[[], tuple[Any, Any, Any]] | None = None  # the device's own FIA
    native_paged_attention: Callable[[], tuple[Any, Any]] | None = None  # its paged attention + workspace
    # The op family a rank's collectives go through (the names of ``_c10d_functional``'s ops);
    # None: ``torch.ops._c10d_functional`` on the process group's own backend.
    collective_ops: Callable[[], Any] | None = None


@runtime_checkable
class Engine(Protocol):
    """The torch.npu-shaped names the harness calls, plus the read-outs its checks need."""

    name: str
    device_type: str
    capabilities: Capabilities

    def NPUGraph(self, *args: Any, **kwargs: Any) -> Any: ...  # noqa: N802 - torch.npu's name
    def graph(self, npu_graph: Any, pool: Any = None, stream: Any = None) -> ContextManager[Any]: ...
    def graph_pool_handle(self) -> Any: ...
    def graph_task_group_begin(self, stream: Any) -> None: ...
    def graph_task_group_end(self, stream: Any) -> Any: ...
    def graph_task_update_begin(self, stream: Any, handle: Any) -> None: ...
    def graph_task_update_end(self, stream: Any) -> None: ...
    def ExternalEvent(self) -> Any: ...  # noqa: N802
    def Stream(self) -> Any: ...  # noqa: N802
    def current_stream(self) -> Any: ...
    def stream(self, s: Any) -> ContextManager[Any]: ...
    def synchronize(self) -> None: ...
    def reset_device(self, stream_config: StreamConfig | None = None,
                     rules: DeviceRules | None = None) -> None: ...
    def stream_usage(self) -> dict[str, Any]: ...
    def memory_report(self) -> dict[str, Any]: ...
    def device_name(self) -> str: ...
