"""torch_npu's ``auto_dispatch_capture`` semantics (``_GraphDispatchMode`` in torch_npu/npu/graphs.py).

With ``torch.npu.graph(g, auto_dispatch_capture=True)``, torch_npu's dispatch mode wraps every
op that has an update handler (FIA, ``_npu_paged_attention``, MLA, ...) as vLLM Ascend does by
hand: on the capture stream ``event.wait(stream); event.reset(stream)``, then a task group
around the op. ``NPUGraph.update(cpu_update_input)`` then, for each recorded op in capture
order and on ONE update stream shared by all graphs (the class attribute
``_GraphDispatchMode.update_stream``), begins a task update, re-issues the op with the new host
values, ends the update and records the op's event. Consequences the emulator reproduces:

* every replay waits, at each dispatched op, for an update: a replay with no ``update()`` before
  it never finishes (the emulator reports the hang at the next synchronisation);
* a single dict in ``cpu_update_input`` is applied to every recorded op;
* the update runs on the shared update stream, not on the caller's current stream.

Host tensors for host-list arguments (``context_lens`` as the CPU tensor vLLM Ascend passes)
are read into lists, since the emulator keeps host lists, not tensors, in its tape.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

import torch

from .streams import ExternalEvent, Stream

if TYPE_CHECKING:  # the device and the recorder import this module's callers
    from .device import EmulatedDevice
    from .recorder import Capture

_events: "weakref.WeakKeyDictionary[Capture, dict[int, ExternalEvent]]" = weakref.WeakKeyDictionary()
_update_streams: "weakref.WeakKeyDictionary[EmulatedDevice, Stream]" = weakref.WeakKeyDictionary()


def guard_with_event(capture: Capture, group: int) -> None:
    """Before a dispatched op: the event wait and reset torch_npu's dispatch mode captures."""
    event = ExternalEvent()
    capture.add_event_node("wait", event)
    capture.add_event_node("reset", event)
    _events.setdefault(capture, {})[group] = event


def update_stream(device: EmulatedDevice) -> Stream:
    """The one update stream of the process (here: of the emulated device), made on first use."""
    stream = _update_streams.get(device)
    if stream is None:
        stream = _update_streams[device] = device.new_stream("dispatch-update")
    return stream


def broadcast(cpu_update_input: Sequence[Mapping[str, object]], num_ops: int) -> list[Mapping[str, object]]:
    """torch_npu applies a lone dict to every recorded op."""
    if len(cpu_update_input) == 1 and num_ops > 1:
        return [dict(cpu_update_input[0]) for _ in range(num_ops)]
    return list(cpu_update_input)


def host_value(func: torch._ops.OpOverload, name: str, value: object) -> object:
    """A host (CPU) integer tensor given for an ``int[]``/``SymInt[]`` argument becomes its list."""
    if not isinstance(value, torch.Tensor) or value.device.type != "cpu" or value.dtype.is_floating_point:
        return value
    for arg in func._schema.arguments:
        if arg.name == name and str(arg.type).replace("Optional[", "").startswith(("List[int]", "List[SymInt]")):
            return [int(v) for v in value.tolist()]
    return value


def launch_update(device: EmulatedDevice, capture: Capture, apply: Callable[[], None]) -> None:
    """Apply the new host values on the update stream, then release every dispatched op's event."""
    stream = update_stream(device)
    stream.launch_host_fn("auto-dispatch update", apply)
    for group in sorted(_events.get(capture, {})):
        _events[capture][group].record(stream)
