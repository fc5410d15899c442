"""Observation of FIA calls for the harness's "FIA invariant" check.

Every wrapper call (including calls that raise) produces one :class:`FiaCall`. Records go to
every list opened by an active :func:`observe_fia_calls` (they nest), and carry the tags set by
the enclosing :func:`fia_call_tags` blocks, e.g. ``phase="capture", step=3, layer=1``.

Both the observers and the tags live in context variables, never in module globals, so two
tests (or two threads) cannot see each other's records.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

from harness.plain import JsonObject, PlainData

FiaCallKind = Literal["functional", "out", "device_metadata"]

_OBSERVERS: contextvars.ContextVar[tuple[list[FiaCall], ...]] = contextvars.ContextVar(
    "harness_fia_observers", default=()
)
_TAGS: contextvars.ContextVar[PlainData] = contextvars.ContextVar("harness_fia_tags", default={})


@dataclass(frozen=True)
class FiaCall:
    """What the host tiling saw in one call, and what each contract would have said.

    For ``kind == "device_metadata"`` the lengths live in device tensors that the host does not
    read, so both length tuples are empty, ``num_reqs`` is the host upper bound
    ``max_num_reqs``, and ``strict_ok``/``relaxed_ok`` only reflect the host-side checks.
    """

    kind: FiaCallKind
    T: int
    actual_seq_lengths: tuple[int, ...]
    actual_seq_lengths_kv: tuple[int, ...]
    num_reqs: int
    contract: str
    strict_ok: bool
    relaxed_ok: bool
    error: str | None
    tags: JsonObject = field(default_factory=dict, hash=False)
    #: ``"TND"`` (cumulative query lengths, T = query rows) or ``"BNSD"`` (per-batch lengths,
    #: T = the batch B); the last-element rule exists only for TND.
    layout: str = "TND"


@contextlib.contextmanager
def observe_fia_calls() -> Iterator[list[FiaCall]]:
    """Collect the :class:`FiaCall` records of calls made inside the block into a list."""
    sink: list[FiaCall] = []
    token = _OBSERVERS.set(_OBSERVERS.get() + (sink,))
    try:
        yield sink
    finally:
        _OBSERVERS.reset(token)


@contextlib.contextmanager
def fia_call_tags(**tags: object) -> Iterator[JsonObject]:
    """Merge ``tags`` into the tags of records made inside the block (inner values win)."""
    merged = {**_TAGS.get(), **tags}
    token = _TAGS.set(merged)
    try:
        yield dict(merged)
    finally:
        _TAGS.reset(token)


def current_tags() -> JsonObject:
    """A copy of the tags that a record made now would carry."""
    return dict(_TAGS.get())


def record_fia_call(call: FiaCall) -> None:
    """Hand ``call`` to every active observer (no-op when nobody observes)."""
    for sink in _OBSERVERS.get():
        sink.append(call)
