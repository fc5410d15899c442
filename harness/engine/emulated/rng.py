"""torch_npu's RNG rules for graphs, on the emulated device.

What torch_npu does (``torch_npu/csrc/aten/NPUGeneratorImpl.cpp``, ``core/npu/NPUGraph.cpp``;
tests ``test/npu/test_aclgraph_rng_state.py``): a generator is a philox ``(seed, offset)``. A
random op captured into a graph does not bake its offset in: it reads the seed and a base
offset from device tensors and adds its offset *within* the graph. At capture end the graph
keeps the generator's whole-graph increment; every replay first writes the generator's current
``(seed, offset)`` into those tensors and advances the generator by the increment. So:

1. a capture consumes nothing: the generator is where it was before the capture;
2. each replay draws fresh numbers, the ones eager code would draw from the generator's state
   at that moment, and leaves the generator where that eager code would;
3. inside a capture, ``get_rng_state`` returns the offset *within the graph* and
   ``set_rng_state`` rewinds to it, so "save, draw, restore, draw" draws the same numbers twice
   on every replay;
4. ``manual_seed``/``set_rng_state`` with a different seed during a capture raise
   "NPUGeneratorImpl::set_current_seed can be called during stream capture only if new seed is
   the same as the original seed."; the same seed is a no-op;
5. generators other than the default: since torch_npu commit 42c2f77d7 ("RNG lazy generator
   registration", first in v26.2.0-beta.1-pytorch2.13.0) a generator is registered with the
   capturing graph on its first random op and ``NPUGraph.register_generator_state`` is a
   deprecated no-op; before it, an unregistered generator's random op raised "RNG op during
   graph capture but generator is not registered with the capturing graph. Call
   graph.register_generator_state() before capture_begin()." Set :data:`REGISTRATION` to
   ``"explicit"`` to model the older rule.

How the emulator gets the same observable behaviour: its device generator IS torch's CPU
generator (random ops on the emulated device are CPU ops). A replay runs the captured random
ops in capture order, drawing from the generator's live state, which gives rules 1 and 2 exactly
(the "offset" advances by what the graph consumes, as the increment does). Rule 3 is a pair of
tape nodes: ``get_rng_state`` inside a capture records a *mark* that, at replay, saves the live
state, and ``set_rng_state`` of that state records a *restore* of it. States are torch's CPU
generator states (5056 bytes), not torch_npu's 16-byte ``(seed, offset)``; the first 8 bytes
are the seed in both.

Random ops in a capture at all: the graph's ``allow_rng`` (a default NPUGraph capture accepts
them from torch_npu v2.11.0-26.1.0; see the version table in docs/conformance.md).
"""

from __future__ import annotations

import warnings
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Literal

import torch
from torch.utils._python_dispatch import _disable_current_modes

from ..errors import CaptureError
from .opinfo import SchemaKwargs

if TYPE_CHECKING:  # the capture and the graph import this module
    from .graph import NPUGraph
    from .recorder import Capture

#: ``"lazy"`` (torch_npu master): generators register themselves on first use in a capture.
#: ``"explicit"`` (before 42c2f77d7): a non-default generator must be registered first.
REGISTRATION: Literal["lazy", "explicit"] = "lazy"

SEED_MISMATCH_MESSAGE = (
    "NPUGeneratorImpl::set_current_seed can be called during stream capture only if new seed is "
    "the same as the original seed."
)
UNREGISTERED_MESSAGE = (
    "RNG op during graph capture but generator is not registered with the capturing graph. "
    "Call graph.register_generator_state() before capture_begin()."
)
DEPRECATED_MESSAGE = (
    "NPUGraph.register_generator_state() is deprecated, and will be removed in a future torch_npu "
    "release. It is now a no-op and can be safely removed from your code. Generator states are "
    "automatically registered when RNG ops first execute during graph capture."
)

_HOST_TOLIST = torch.Tensor.tolist  # taken before any capture wraps it (state tensors are host memory)


@dataclass(eq=False)
class RngNode:
    """A tape node that acts on a generator at replay (save or restore a state); runs no kernel."""

    index: int
    kind: Literal["rng"]
    label: str
    action: Callable[[], None]

    def run(self) -> None:
        self.action()


@dataclass
class _CaptureRng:
    """RNG bookkeeping of one capture: the states handed out by ``get_rng_state`` inside it."""

    marks: dict[int, int] = field(default_factory=dict)  # id(state tensor) -> slot
    handed_out: list[torch.Tensor] = field(default_factory=list)  # keeps the ids valid
    slots: list[torch.Tensor | None] = field(default_factory=list)  # filled at replay


_captures: "weakref.WeakKeyDictionary[Capture, _CaptureRng]" = weakref.WeakKeyDictionary()
_registered: "weakref.WeakKeyDictionary[NPUGraph, list[torch.Generator]]" = weakref.WeakKeyDictionary()


def _state_seed(state: torch.Tensor) -> int:
    with _disable_current_modes():
        return int.from_bytes(bytes(_HOST_TOLIST(state.flatten()[:8])), "little")


def _add_node(capture: Capture, label: str, action: Callable[[], None]) -> None:
    capture.nodes.append(RngNode(len(capture.nodes), "rng", label, action))


# -- the torch.npu RNG functions --------------------------------------------------------------
def manual_seed(capture: Capture | None, seed: int) -> None:
    """``torch.npu.manual_seed``: reseed (offset 0); inside a capture only the same seed, a no-op."""
    if capture is not None:
        if int(seed) != torch.initial_seed():
            raise RuntimeError(SEED_MISMATCH_MESSAGE)
        return
    torch.manual_seed(int(seed))


def initial_seed() -> int:
    return torch.initial_seed()


def get_rng_state(capture: Capture | None) -> torch.Tensor:
    """``torch.npu.get_rng_state``; inside a capture, a state that names the current point of the graph."""
    with _disable_current_modes():
        state = torch.get_rng_state()
    if capture is None:
        return state
    book = _captures.setdefault(capture, _CaptureRng())
    slot = len(book.slots)
    book.slots.append(None)
    book.marks[id(state)] = slot
    book.handed_out.append(state)

    def save() -> None:
        book.slots[slot] = torch.get_rng_state()

    _add_node(capture, f"rng: save state #{slot}", save)
    return state


def set_rng_state(capture: Capture | None, state: torch.Tensor) -> None:
    """``torch.npu.set_rng_state``; inside a capture, rewind the graph to a state it handed out."""
    if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8:
        raise TypeError(f"set_rng_state expects a uint8 state tensor, got {type(state).__name__}")
    if capture is None:
        torch.set_rng_state(state)
        return
    if _state_seed(state) != torch.initial_seed():
        raise RuntimeError(SEED_MISMATCH_MESSAGE)
    book = _captures.setdefault(capture, _CaptureRng())
    slot = book.marks.get(id(state))
    if slot is None:
        # A state from outside this capture (same seed): restore it as given at every replay.
        with _disable_current_modes():
            fixed = state.clone()
        _add_node(capture, "rng: set a state from outside the graph", lambda: torch.set_rng_state(fixed))
        return

    def restore() -> None:
        saved = book.slots[slot]
        assert saved is not None, "a restore runs after its save in tape order"
        torch.set_rng_state(saved)

    _add_node(capture, f"rng: restore state #{slot}", restore)


# -- generators in a capture --------------------------------------------------------------------
def register_generator_state(graph: NPUGraph, generator: torch.Generator) -> None:
    """``NPUGraph.register_generator_state``: a deprecated no-op under lazy registration."""
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"register_generator_state expects a torch.Generator, got {type(generator).__name__}")
    if REGISTRATION == "lazy":
        warnings.warn(DEPRECATED_MESSAGE, DeprecationWarning, stacklevel=3)
    _registered.setdefault(graph, []).append(generator)


def random_op_generator(capture: Capture, schema_name: str, kwargs: SchemaKwargs) -> torch.Generator | None:
    """Vet a random op being captured; return the live generator the replay must draw from.

    Raises :class:`CaptureError` (and invalidates the capture) when random ops are not allowed
    in this capture, or when an unregistered generator is used under explicit registration.
    ``None`` means the default generator.
    """
    if not capture.allow_rng:
        _fail(capture, f"{schema_name} draws random numbers inside the capture of {capture.graph_name}; a real "
                       "graph must register the generator state (pass allow_rng=True to capture it)")
    generator: torch.Generator | None = kwargs.get("generator")
    if generator is None:
        return None
    owner = capture.owner() if capture.owner is not None else None
    registered = _registered.get(owner, []) if owner is not None else []  # (None cannot key a weak dict)
    if REGISTRATION == "explicit" and not any(_same_generator(g, generator) for g in registered):
        _fail(capture, f"{schema_name}: {UNREGISTERED_MESSAGE}")
    return generator  # bound by reference, like a tensor: the replay advances it


def _same_generator(a: torch.Generator, b: torch.Generator) -> bool:
    """Whether two Python wrappers share one generator (dispatch hands ops a fresh wrapper).

    Wrappers have no stable identity, so advance ``a`` once and see whether ``b`` moved;
    ``a``'s state is restored, so nothing is consumed.
    """
    if a is b:
        return True
    if a.device != b.device:
        return False
    with _disable_current_modes():
        saved = a.get_state()
        if not torch.equal(saved, b.get_state()):
            return False
        torch.empty(1).uniform_(generator=a)
        moved = not torch.equal(b.get_state(), saved)
        a.set_state(saved)
    return moved


def _fail(capture: Capture, message: str) -> None:
    error = CaptureError(message)
    capture.failed = capture.failed or error
    raise error
