"""Streams, events and the scheduler that runs queued device work.

A device runs its work asynchronously: the host issues it to a stream and goes on, and the work
runs later, in stream order, ordered across streams only by events. The bugs this harness hunts
live in that gap (a host-parameter update on an update stream racing the replay it is meant for,
a static buffer rewritten before the replay that reads it has run), so the emulated device keeps
it: a stream is a FIFO queue of work items, and a graph replay is queued until the host waits
for it: ``synchronize()``, ``Stream.synchronize()``, ``Event.synchronize()``, a host read of
device memory or a blocking copy (:mod:`.tensors`). Until then the host sees nothing of it. A
work item is a generator that yields a :class:`WaitFor` whenever it reaches an event wait.

The order the emulator picks is the one a busy device takes, which is where races show:

* **The device is behind the host on compute.** A replay runs only when the host waits for it,
  and a host wait runs no more than it needs: the stream waited for, item by item, and, where
  that stream stops at an event wait, the other streams one item at a time, round robin, until
  the event is recorded. Work queued after what the host waits for stays queued (under async
  scheduling the host launches step i+1 while step i still runs).
* **Work with no waits on an idle stream runs at once**: an eager operation, a task-group update
  (host values patched into a captured op), an event record. Nothing on that stream comes before
  it, and nothing on another stream is ordered against it without an event; it is cheap, and a
  device does it as soon as it is issued, ahead of a replay queued on another stream (so an
  update issued for step i+1 lands before step i's replay has run, if nothing made the host wait).

Work that can never be unblocked is reported as a hang that names the graph and the operation
it is stuck at, instead of running with stale values.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol

from torch.utils._python_dispatch import _disable_current_modes

from ..errors import GraphHangError
from ..protocol import DeviceStream

_event_ids = itertools.count()
_stream_ids = itertools.count()


class CaptureSink(Protocol):
    """What a capturing stream forwards event operations to (the capture in progress)."""

    def add_event_node(self, kind: str, event: "ExternalEvent") -> None: ...


@dataclass
class WaitFor:
    """Yielded by a work item that cannot go on until ``event`` has been recorded."""

    event: "ExternalEvent"
    where: str


@dataclass
class WorkItem:
    label: str
    steps: Iterator[WaitFor]
    waiting: WaitFor | None = None


class Scheduler:
    """Runs queued work on every stream as far as events allow."""

    def __init__(self) -> None:
        self._streams: list[Stream] = []
        self._running = False

    @property
    def busy(self) -> bool:
        """Queued work is running now (work issued from it waits its turn)."""
        return self._running

    def register(self, stream: "Stream") -> None:
        self._streams.append(stream)

    def enqueue(self, stream: "Stream", label: str, steps: Iterator[WaitFor]) -> None:
        """Queue work on ``stream``; it runs when the host next waits (see the module docstring)."""
        stream.queue.append(WorkItem(label, steps))

    def run(self) -> None:
        """Advance all streams until every queue is empty or blocked on an unrecorded event."""
        if self._running:  # work enqueued by work (an update issued from a replay) waits its turn
            return
        self._running = True
        # Device work runs outside any dispatch mode the host has active (a capture elsewhere,
        # a task-group update): those modes see host calls, never device execution.
        try:
            with _disable_current_modes():
                progress = True
                while progress:
                    progress = False
                    for stream in self._streams:
                        while self._step(stream):
                            progress = True
        finally:
            self._running = False

    @staticmethod
    def _step(stream: "Stream") -> bool:
        """Run the head item of ``stream`` to its next wait (or its end); False if it cannot move."""
        if not stream.queue:
            return False
        item = stream.queue[0]
        if item.waiting is not None:
            if not item.waiting.event.is_recorded:
                return False
            item.waiting = None
        try:
            item.waiting = next(item.steps)
        except StopIteration:
            stream.queue.popleft()
        return True

    def pending(self) -> list[tuple["Stream", WorkItem]]:
        return [(s, item) for s in self._streams for item in s.queue]

    def drain(self, stream: "Stream") -> None:
        """The host waits for ``stream``: run its queued work, in order, until its queue is empty,
        and of the other streams only what records the events it waits on (the module docstring)."""
        self._wait_until(lambda: not stream.queue, stream)

    def wait_for(self, event: "Event") -> None:
        """The host waits until ``event`` is recorded (``Event.synchronize()``)."""
        self._wait_until(lambda: event.is_recorded, None)

    def _wait_until(self, done: Callable[[], bool], stream: "Stream | None") -> None:
        if done() or self._running:
            return
        self._running = True
        try:
            with _disable_current_modes():
                while not done():
                    if stream is not None and self._step(stream):
                        continue
                    # stuck at a wait (or waiting on no stream): one item of every other stream
                    if not any([self._step(other) for other in self._streams if other is not stream]):
                        break
        finally:
            self._running = False
        if not done():
            self._hang(self.pending())

    def synchronize(self) -> None:
        """Drain all queues; raise :class:`GraphHangError` for work that can never finish."""
        self.run()
        stuck = self.pending()
        if stuck:
            self._hang(stuck)

    def _hang(self, stuck: list[tuple["Stream", WorkItem]]) -> None:
        lines = []
        for stream, item in stuck:
            if item.waiting is not None:
                lines.append(
                    f"{item.label} on {stream} waits at {item.waiting.where} for "
                    f"{item.waiting.event}, which no queued work records"
                )
            else:
                lines.append(f"{item.label} on {stream} is queued behind blocked work")
        for stream in self._streams:  # the device would need a reset; the emulator starts clean
            stream.queue.clear()
        raise GraphHangError("device work can never finish (a hang on hardware):\n  " + "\n  ".join(lines))


class Stream:
    """A device stream: a queue of work, possibly capturing into a graph."""

    def __init__(self, scheduler: Scheduler, name: str | None = None) -> None:
        self.id = next(_stream_ids)
        self.name = name or f"stream{self.id}"
        self.queue: deque[WorkItem] = deque()
        self.capture: CaptureSink | None = None
        self._scheduler = scheduler
        scheduler.register(self)

    def __repr__(self) -> str:
        return f"<Stream {self.name}>"

    @property
    def is_capturing(self) -> bool:
        return self.capture is not None

    def launch(self, label: str, steps: Iterator[WaitFor]) -> None:
        self._scheduler.enqueue(self, label, steps)

    def launch_host_fn(self, label: str, fn: Callable[[], object]) -> None:  # (what fn returns is dropped)
        """Issue a piece of work with no waits (an update, an event record, a queued operation):
        at once on an idle stream, else queued behind the stream's work."""
        if not self.queue and not self._scheduler.busy:
            fn()
            return

        def steps() -> Iterator[WaitFor]:
            fn()
            return
            yield  # makes this a generator

        self.launch(label, steps())

    def synchronize(self) -> None:
        """The host waits for this stream's work (and what it waits on), not the device's."""
        self._scheduler.drain(self)

    def query(self) -> bool:
        self._scheduler.run()
        return not self.queue

    def wait_stream(self, other: "Stream") -> None:
        """Make future work on this stream wait for the work queued on ``other`` so far."""
        marker = ExternalEvent()
        marker.record(other)
        marker.wait(self)


def own(stream: DeviceStream) -> Stream:
    """``stream`` as a stream of this device (the engine seam hands streams out as
    :class:`~harness.engine.protocol.DeviceStream`): another engine's is refused by name."""
    if isinstance(stream, Stream):
        return stream
    raise TypeError(f"{stream!r} is not a stream of the emulated device")


@dataclass(eq=False)
class ExternalEvent:
    """torch_npu's ``ExternalEvent``: recorded by one stream, waited on by another.

    Inside a capture, ``wait``/``reset``/``record`` become nodes of the graph, so a replay stops
    at the wait until the host records the event on some stream.
    """

    id: int = field(default_factory=lambda: next(_event_ids))
    is_recorded: bool = False

    def __repr__(self) -> str:
        return f"ExternalEvent#{self.id}"

    def record(self, stream: DeviceStream) -> None:
        stream = own(stream)
        if stream.capture is not None:
            stream.capture.add_event_node("record", self)
        else:
            stream.launch_host_fn(f"record {self}", self._set)

    def wait(self, stream: DeviceStream) -> None:
        stream = own(stream)
        if stream.capture is not None:
            stream.capture.add_event_node("wait", self)
        elif stream.queue or not self.is_recorded:  # (an idle stream passes a recorded event at once)
            stream.launch(f"wait {self}", self.wait_steps(f"a wait on {stream}"))

    def reset(self, stream: DeviceStream) -> None:
        stream = own(stream)
        if stream.capture is not None:
            stream.capture.add_event_node("reset", self)
        else:
            stream.launch_host_fn(f"reset {self}", self._clear)

    def wait_steps(self, where: str) -> Iterator[WaitFor]:
        if not self.is_recorded:
            yield WaitFor(self, where)

    def _set(self) -> None:
        self.is_recorded = True

    def _clear(self) -> None:
        self.is_recorded = False


class Event:
    """``torch.npu.Event`` / ``torch.cuda.Event``: a point in a stream the host can wait for.

    ``record`` marks the current end of a stream; ``synchronize`` makes the host wait until the
    device has reached it, and runs no more than that (async scheduling reads step i this way
    while step i+1 is still queued)."""

    def __init__(self, scheduler: Scheduler, current: Callable[[], Stream]) -> None:
        self._scheduler, self._current = scheduler, current
        self.is_recorded = True  # an event never recorded is complete, as torch's

    def record(self, stream: Stream | None = None) -> None:
        stream = stream or self._current()
        if stream.capture is not None:
            raise RuntimeError("Event.record inside a graph capture: use ExternalEvent (a node of the graph)")
        self.is_recorded = False
        stream.launch_host_fn(f"record {self!r}", self._set)

    def synchronize(self) -> None:
        self._scheduler.wait_for(self)

    def query(self) -> bool:
        return self.is_recorded

    def wait(self, stream: Stream | None = None) -> None:
        stream = stream or self._current()
        if stream.queue or not self.is_recorded:  # (an idle stream passes a recorded event at once)
            stream.launch(f"wait {self!r}", self._wait_steps(f"a wait on {stream}"))

    def _wait_steps(self, where: str) -> Iterator[WaitFor]:
        if not self.is_recorded:
            yield WaitFor(self, where)  # type: ignore[arg-type]

    def _set(self) -> None:
        self.is_recorded = True
