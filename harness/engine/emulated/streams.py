"""Streams, external events and the scheduler that runs queued device work.

A device runs its work asynchronously: the host issues it to a stream and goes on, and the work
runs later, in stream order, ordered across streams only by events. The bugs this harness hunts
live in that gap (a host-parameter update on an update stream racing the replay it is meant for,
a static buffer rewritten before the replay that reads it has run), so the emulated device keeps
it: a stream is a FIFO queue of work items, and queued work runs only when the host waits for
it: ``synchronize()``, ``Stream.synchronize()``, a host read of device memory or a blocking copy
(:mod:`.tensors`). Until then the host sees nothing of it. A work item is a generator that yields
a :class:`WaitFor` whenever it reaches an event wait; at a wait point the scheduler advances
every stream as far as events allow, each stream in turn as far as it goes (so a stream with no
waits, such as an update stream, runs ahead of a replay that waits on it, which is one of the
orders a device may take). Work that can never be unblocked is reported at the wait point as a
hang that names the graph and the operation it is stuck at, instead of running with stale values.

An eager operation issued while its stream has no queued work runs at once: nothing on that
stream can come before it, and no other stream's work is ordered against it without an event,
so running it now is an order the device may take too (and the cheap one).
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol

from torch.utils._python_dispatch import _disable_current_modes

from ..errors import GraphHangError

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
                        progress |= self._advance(stream)
        finally:
            self._running = False

    @staticmethod
    def _advance(stream: "Stream") -> bool:
        moved = False
        while stream.queue:
            item = stream.queue[0]
            if item.waiting is not None:
                if not item.waiting.event.is_recorded:
                    return moved
                item.waiting = None
            try:
                item.waiting = next(item.steps)
            except StopIteration:
                stream.queue.popleft()
            moved = True
        return moved

    def pending(self) -> list[tuple["Stream", WorkItem]]:
        return [(s, item) for s in self._streams for item in s.queue]

    def drain(self, stream: "Stream") -> None:
        """The host waits for ``stream``: run queued work until that stream's queue is empty
        (other streams run as far as they can on the way); a hang if it can never empty."""
        if not stream.queue:
            return
        self.run()
        if stream.queue:
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

    def launch_host_fn(self, label: str, fn: Callable[[], None]) -> None:
        """Queue a piece of work with no waits (an update, an event record)."""

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

    def record(self, stream: Stream) -> None:
        if stream.capture is not None:
            stream.capture.add_event_node("record", self)
        else:
            stream.launch_host_fn(f"record {self}", self._set)

    def wait(self, stream: Stream) -> None:
        if stream.capture is not None:
            stream.capture.add_event_node("wait", self)
        else:
            stream.launch(f"wait {self}", self.wait_steps(f"a wait on {stream}"))

    def reset(self, stream: Stream) -> None:
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
