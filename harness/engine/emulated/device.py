"""The emulated device: its streams, scheduler, graph pools and stream budget.

One :class:`EmulatedDevice` stands for one NPU. The torch.npu-shaped functions in
:mod:`.api` act on the current device, as ``torch.npu.*`` act on the current NPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import StreamBudgetError
from ..protocol import DeviceRules, StreamConfig, StreamUsage
from .pool import PoolRegistry
from .streams import Scheduler, Stream

if TYPE_CHECKING:  # the recorder imports the device's modules
    from .recorder import Capture

#: Namespaces whose ops are collectives: each communication group a graph uses needs streams.
#: ``harness_comm``: the emulator's own shared-memory collectives (.collectives).
COMM_NAMESPACES = ("_c10d_functional", "c10d", "_c10d_functional_autograd", "harness_comm")


@dataclass
class StreamBudget:
    config: StreamConfig = field(default_factory=StreamConfig)
    held: dict[str, int] = field(default_factory=dict)  # graph name -> streams

    def __post_init__(self) -> None:
        self._in_use = sum(self.held.values())  # kept as a count: thousands of graphs per run

    @property
    def in_use(self) -> int:
        return self._in_use

    def needed_for(self, comm_groups: int) -> int:
        return self.config.per_graph + self.config.per_comm_group * comm_groups

    def acquire(self, graph: str, needed: int) -> None:
        if self.in_use + needed > self.config.pool_size:
            raise StreamBudgetError(needed, self.in_use, self.config.pool_size, graph)
        self._in_use += needed - self.held.get(graph, 0)
        self.held[graph] = needed

    def release(self, graph: str) -> None:
        self._in_use -= self.held.pop(graph, 0)

    def usage(self) -> StreamUsage:
        return {
            "pool_size": self.config.pool_size,
            "in_use": self.in_use,
            "graphs": len(self.held),
            "utilisation": self.in_use / self.config.pool_size,
        }


class EmulatedDevice:
    def __init__(self, stream_config: StreamConfig | None = None, rules: DeviceRules | None = None) -> None:
        self.rules = rules or DeviceRules()  # the torch_npu release's graph rules
        self.scheduler = Scheduler()
        self.default_stream = Stream(self.scheduler, "default")
        self.capture_stream = Stream(self.scheduler, "capture")
        self.current_stream = self.default_stream
        self.pools = PoolRegistry()
        self.budget = StreamBudget(stream_config or StreamConfig())
        self.capturing: Capture | None = None  # the capture in progress, if any
        self.graph_count = 0
        # What ran on the device (for an item's record: "it ran on the host" must never pass)
        self.kernels = 0  # device operations run eagerly
        self.replayed_kernels = 0  # device operations of the graphs replayed
        self.bytes_allocated = 0  # device memory allocated outside graph pools, in bytes

    def new_stream(self, name: str | None = None) -> Stream:
        return Stream(self.scheduler, name)
