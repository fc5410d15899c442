"""The graph wrapper: capture on the first call per batch descriptor, replay on every later one.

Models vLLM Ascend's ``ACLGraphWrapper`` (``vllm_ascend/compilation/acl_graph.py``), itself
vLLM's ``CUDAGraphWrapper`` (``vllm/compilation/cuda_graph.py``) on torch.npu. A wrapper holds
a callable (the whole forward for FULL, one piece between attention layers for PIECEWISE) and
the runtime mode it serves. Per call it reads the forward context (the runtime mode and batch
descriptor the dispatcher chose) and trusts it blindly:

* runtime mode NONE, or not this wrapper's mode: call the callable (eager passthrough). This is
  how warm-up runs, eager batches and nested wrappers work: a FULL wrapper around a forward
  whose pieces are PIECEWISE wrappers passes PIECEWISE batches down to them, and the pieces pass
  FULL captures through to the one graph being captured;
* first call for a descriptor: capture the callable into a new graph of the shared pool
  (allowed only while the :class:`CaptureMonitor` says so) and return its output;
* later calls: replay the graph and return the captured output, without calling the callable.

The wrapper keeps no persistent input buffers: copying inputs into the buffers the graph
captured is the caller's job (the runner's ``static_inputs`` fix). Upstream only verifies it in
debug mode (``VLLM_LOGGING_LEVEL=DEBUG``): the tensor arguments' addresses are recorded at
capture and compared at every replay. Here that is ``debug=True`` (``None`` reads the same
environment variable).

The forward context is scoped state (a ``ContextVar`` set by :func:`set_forward_context`), as
upstream's is: a nested wrapper is called by the callable, not by the runner, so it cannot be
handed the context as an argument. Only the engine's torch.npu-shaped names are called
(``NPUGraph``, ``graph``, ``current_stream``), so the same wrapper runs on every backend.
"""

from __future__ import annotations

import contextlib
import logging
import os
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from torch import Tensor

from harness.engine.errors import StreamBudgetError
from harness.engine.protocol import DeviceGraph, Engine, GraphPool
from harness.graph.capture_errors import capture_error_text
from harness.graph.dispatcher import BatchDescriptor
from harness.graph.modes import CUDAGraphMode
from harness.plain import Kwargs

__all__ = [
    "CaptureDisabledError", "CaptureMonitor", "ForwardContext", "GraphEntry", "GraphWrapper", "InputAddressError",
    "debug_mode_from_env", "get_forward_context", "set_forward_context",
]

logger = logging.getLogger(__name__)


# -- the forward context ------------------------------------------------------------------------
@dataclass
class ForwardContext:
    """What one forward runs under: the dispatcher's decision and what attention reads.

    ``capturing`` is set by the wrapper while it captures (upstream: ``forward_context.capturing``),
    so attention knows to record its task group instead of running with live host lists.
    """

    runtime_mode: CUDAGraphMode = CUDAGraphMode.NONE
    batch_descriptor: BatchDescriptor | None = None
    attn_metadata: Any = None
    capturing: bool = False

    @property
    def graph_key(self) -> BatchDescriptor:
        """The key of the graph this forward captures or replays (a graph mode always has one)."""
        if self.batch_descriptor is None:
            raise RuntimeError(f"a {self.runtime_mode} forward without a batch descriptor")
        return self.batch_descriptor


_FORWARD_CONTEXT: ContextVar[ForwardContext | None] = ContextVar("harness_forward_context", default=None)


@contextlib.contextmanager
def set_forward_context(runtime_mode: CUDAGraphMode, batch_descriptor: BatchDescriptor | None = None,
                        attn_metadata: Any = None) -> Iterator[ForwardContext]:
    """Run the block under a forward context (the previous one is restored on exit)."""
    if not runtime_mode.is_runtime_mode():
        raise ValueError(f"{runtime_mode} is not a runtime mode (NONE, PIECEWISE or FULL)")
    context = ForwardContext(runtime_mode, batch_descriptor, attn_metadata)
    token = _FORWARD_CONTEXT.set(context)
    try:
        yield context
    finally:
        _FORWARD_CONTEXT.reset(token)


def get_forward_context() -> ForwardContext:
    context = _FORWARD_CONTEXT.get()
    if context is None:
        raise RuntimeError("no forward context is set: call the graph wrapper inside set_forward_context(...)")
    return context


# -- errors and the capture monitor -------------------------------------------------------------
class InputAddressError(AssertionError):
    """Debug mode: a replay was handed a tensor at another address than the one captured.

    An ``AssertionError`` as upstream's (an ``assert``), so code that catches that still does.
    """


class CaptureDisabledError(RuntimeError):
    """A capture was attempted outside the capture phase (upstream's monitor)."""


@dataclass
class CaptureMonitor:
    """Whether capturing is legal now (vLLM ``vllm/compilation/monitor.py``).

    The model runner enables it for its capture phase and disables it afterwards, so a batch the
    dispatcher names but nobody captured raises instead of capturing lazily in the middle of
    serving. One monitor is shared by the wrappers of one runner (upstream: a module global).
    """

    enabled: bool = True

    def validate(self) -> None:
        if not self.enabled:
            raise CaptureDisabledError("CUDA graph capturing detected at an inappropriate time. "
                                       "This operation is currently disabled.")


def debug_mode_from_env() -> bool:
    """Upstream's switch for the input-address check: ``VLLM_LOGGING_LEVEL == "DEBUG"``."""
    return os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper() == "DEBUG"


# -- the wrapper --------------------------------------------------------------------------------
@dataclass(eq=False)
class GraphEntry:
    """One captured graph: its key, the graph, the output tensors it writes, its input addresses."""

    batch_descriptor: BatchDescriptor
    graph: DeviceGraph | None = None
    output: Any = None
    input_addresses: list[int] | None = None  # recorded at capture (every mode; compared in debug)


def _weak_refs(engine: Engine, value: Any) -> Any:
    """``value`` with each tensor replaced by a weak reference to its memory (vLLM's ``weak_ref_tensors``)."""
    if isinstance(value, Tensor):
        return engine.weak_ref_tensor(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_weak_refs(engine, v) for v in value)
    return value


def _addresses(args: tuple[object, ...]) -> list[int]:
    return [x.data_ptr() for x in args if isinstance(x, Tensor)]


class GraphWrapper:
    """Adds capture and replay to ``runnable`` for batches of ``runtime_mode`` (FULL or PIECEWISE).

    ``engine`` is a :class:`harness.engine.Engine`; ``pool`` the graph pool shared by every
    wrapper of a runner. ``sync_before_replay`` is vLLM Ascend's current-stream synchronize
    before a FULL replay (PR #4233: the host-parameter update of step i must not race the replay
    of step i-1); it defaults to on for FULL and off for PIECEWISE, as upstream (which also skips
    it for an EAGLE draft model merged into the main graph).

    The wrapper keeps only weak references to a graph's output (``engine.weak_ref_tensor``, vLLM's
    ``weak_ref_tensors``): its memory belongs to the pool, and a later capture may reuse it once
    nothing else holds it. ``weak_ref_output`` also hands the capturing caller a weak reference
    (vLLM's ``CUDAGraphOptions.weak_ref_output``: the last piece of a piecewise model, and a
    whole-model FULL graph), so its memory is free for the next capture at once; a caller must
    then copy what it keeps before another graph of the pool replays.
    """

    def __init__(self, runnable: Callable[..., Any], runtime_mode: CUDAGraphMode, engine: Engine, *,
                 pool: GraphPool | None = None, monitor: CaptureMonitor | None = None, debug: bool | None = None,
                 sync_before_replay: bool | None = None, name: str = "", debug_log_enable: bool = True,
                 capture_error_guidance: str | None = None, weak_ref_output: bool = True) -> None:
        if runtime_mode not in (CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE):
            raise ValueError(f"a graph wrapper serves FULL or PIECEWISE batches, not {runtime_mode}")
        self.runnable = runnable
        self.runtime_mode = runtime_mode
        self.engine = engine
        self.graph_pool = pool
        self.monitor = monitor if monitor is not None else CaptureMonitor()
        self.is_debugging_mode = debug_mode_from_env() if debug is None else debug
        self.sync_before_replay = runtime_mode is CUDAGraphMode.FULL if sync_before_replay is None \
            else sync_before_replay
        self.name = name or getattr(runnable, "__name__", type(runnable).__name__)
        self.debug_log_enable = debug_log_enable
        # the advice vLLM Ascend puts before a stream-resource capture failure (harness.graph.capture_errors)
        self.capture_error_guidance = capture_error_guidance
        self.weak_ref_output = weak_ref_output
        self.entries: dict[BatchDescriptor, GraphEntry] = {}

    def __getattr__(self, key: str) -> Any:
        # Only reached for names the wrapper lacks: those of the runnable (upstream does the same).
        runnable = self.__dict__.get("runnable")
        if runnable is not None and hasattr(runnable, key):
            return getattr(runnable, key)
        raise AttributeError(f"Attribute {key} not found in the runnable of graph wrapper {self.__dict__.get('name')}")

    def unwrap(self) -> Callable[..., Any]:
        return self.runnable

    @property
    def num_captured(self) -> int:
        return sum(1 for entry in self.entries.values() if entry.graph is not None)

    def reset(self) -> None:
        """Give back every graph this wrapper captured (the runner's release at the end of a run)."""
        for entry in self.entries.values():
            if entry.graph is not None:
                entry.graph.reset()
        self.entries.clear()

    def graph_of(self, batch_descriptor: BatchDescriptor) -> DeviceGraph:
        """The captured graph of ``batch_descriptor`` (a ``KeyError`` names the key if none)."""
        entry = self.entries.get(batch_descriptor)
        if entry is None or entry.graph is None:
            raise KeyError(f"{self.name}: no {self.runtime_mode} graph captured for {batch_descriptor}")
        return entry.graph

    def __call__(self, *args: object, **kwargs: object) -> Any:
        context = get_forward_context()
        mode = context.runtime_mode
        if mode is CUDAGraphMode.NONE or mode is not self.runtime_mode:
            return self.runnable(*args, **kwargs)  # warm-up, eager batch, or another wrapper's mode
        key = context.batch_descriptor
        if key is None:
            raise ValueError(f"{self.name}: a {mode} forward needs a batch descriptor")
        entry = self.entries.get(key)
        if entry is None:
            entry = self.entries[key] = GraphEntry(key)
        if entry.graph is None:
            return self._capture(entry, context, args, kwargs)
        if self.is_debugging_mode:
            addresses = _addresses(args)
            if addresses != entry.input_addresses:
                raise InputAddressError(f"Input addresses for aclgraphs are different during replay. "
                                        f"Expected {entry.input_addresses}, got {addresses} "
                                        f"({self.name}, {self.runtime_mode}, {key})")
        if self.sync_before_replay:
            self.engine.current_stream().synchronize()
        entry.graph.replay()
        return entry.output

    def _capture(self, entry: GraphEntry, context: ForwardContext, args: tuple[object, ...],
                 kwargs: dict[str, object]) -> Any:
        if self.debug_log_enable:
            logger.debug("Capturing a graph on (%s, %s)", self.runtime_mode.name, entry.batch_descriptor)
        self.monitor.validate()
        entry.input_addresses = _addresses(args)
        graph = self.engine.NPUGraph()
        context.capturing = True
        try:
            with self.engine.graph(graph, pool=self.graph_pool):
                output = self.runnable(*args, **kwargs)
                if self.weak_ref_output:  # released to the pool before the capture ends
                    output = _weak_refs(self.engine, output)
        except StreamBudgetError as error:
            original = str(error) + (f"\n{error.__cause__}" if error.__cause__ is not None else "")
            text = capture_error_text(original, self.capture_error_guidance)  # type: ignore[arg-type]
            if text is None:
                raise
            raise error.reworded(text) from error
        finally:
            context.capturing = False
        # the entry keeps a weak reference; the caller gets the output itself, so that the pool
        # keeps it while the capture's caller still uses it (upstream: "we need to return the
        # output, rather than the weak ref of the output")
        entry.graph, entry.output = graph, _weak_refs(self.engine, output)
        return output
