"""Graph modes: which routine (no graph, piecewise graphs, one full graph) runs a batch.

Mirrors vLLM's ``CUDAGraphMode`` (``vllm/config/compilation.py``). Three modes are
*runtime* modes, the answer of a dispatch for one batch: ``NONE``, ``PIECEWISE``, ``FULL``.
Two more are *configured* modes that pair a routine for uniform-decode batches (element 0)
with one for mixed/prefill batches (element 1):

* ``FULL_DECODE_ONLY = (FULL, NONE)``: full graphs for uniform decode, eager otherwise;
* ``FULL_AND_PIECEWISE = (FULL, PIECEWISE)``: full graphs for uniform decode, piecewise
  graphs otherwise (upstream default since vLLM PR #25444).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal

__all__ = ["COMPILATION_MODES", "CUDAGraphMode", "ModeResolution", "parse_mode", "resolve_mode"]

#: vLLM's ``CompilationMode`` (an ``IntEnum``: a log line prints its value), by name.
COMPILATION_MODES = {"NONE": 0, "STOCK_TORCH_COMPILE": 1, "DYNAMO_TRACE_ONCE": 2, "VLLM_COMPILE": 3}
CompilationModeName = Literal["NONE", "STOCK_TORCH_COMPILE", "DYNAMO_TRACE_ONCE", "VLLM_COMPILE"]


class CUDAGraphMode(enum.Enum):
    """A configured or runtime graph mode.

    Values follow vLLM: ints for the single-routine modes, ``(decode, mixed)`` tuples of
    those ints for the dual modes. Inside the class body ``FULL`` etc. are still the raw
    values, which is what makes the tuple definitions work.
    """

    NONE = 0
    PIECEWISE = 1
    FULL = 2
    FULL_DECODE_ONLY = (FULL, NONE)
    FULL_AND_PIECEWISE = (FULL, PIECEWISE)

    def separate_routine(self) -> bool:
        """True for the dual modes: uniform decode and mixed batches route differently."""
        return isinstance(self.value, tuple)

    def decode_mode(self) -> CUDAGraphMode:
        """The runtime routine for uniform-decode batches."""
        return CUDAGraphMode(self.value[0]) if self.separate_routine() else self

    def mixed_mode(self) -> CUDAGraphMode:
        """The runtime routine for mixed / prefill batches."""
        return CUDAGraphMode(self.value[1]) if self.separate_routine() else self

    def has_mode(self, mode: CUDAGraphMode) -> bool:
        """True when ``mode`` (a runtime mode) is one of this mode's routines."""
        return mode in (self.decode_mode(), self.mixed_mode())

    def has_full_cudagraphs(self) -> bool:
        """True when some batches replay one full graph (attention included)."""
        return self.has_mode(CUDAGraphMode.FULL)

    def has_piecewise_cudagraphs(self) -> bool:
        """True when some batches replay piecewise graphs (attention eager)."""
        return self.has_mode(CUDAGraphMode.PIECEWISE)

    def is_runtime_mode(self) -> bool:
        """True for the modes a single batch can actually run in."""
        return self in (CUDAGraphMode.NONE, CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL)

    def __str__(self) -> str:
        return self.name


def parse_mode(name: str | CUDAGraphMode) -> CUDAGraphMode:
    """The mode called ``name``, case-insensitive (``"full_decode_only"`` works).

    A ``CUDAGraphMode`` passes through. Raises ``ValueError`` listing the valid names,
    because a typo in a scenario file should say what was meant rather than fall back
    to a default.
    """
    if isinstance(name, CUDAGraphMode):
        return name
    key = str(name).strip().upper()
    try:
        return CUDAGraphMode[key]
    except KeyError:
        valid = ", ".join(m.name for m in CUDAGraphMode)
        raise ValueError(f"unknown graph mode {name!r}; valid modes: {valid}") from None


@dataclass(frozen=True)
class ModeResolution:
    """The graph mode a run has after the engine's start-up rules, and what it logged on the way.

    ``requested`` is the scenario's mode, ``mode`` the one the engine runs; ``notes`` the log
    lines of each change, worded as upstream's (a report shows them)."""

    requested: CUDAGraphMode
    mode: CUDAGraphMode
    notes: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return self.mode is not self.requested


def resolve_mode(requested: CUDAGraphMode, *, compilation_mode: CompilationModeName = "VLLM_COMPILE",
                 platform: Literal["npu", "gpu"] = "npu", full_and_piecewise: bool = True,
                 npu_unsupported_compilation: Literal["graphs_off_v0.18", "graphs_off", "compile_off"] = "graphs_off",
                 ) -> ModeResolution:
    """The mode the engine runs for ``requested``, in the order upstream applies its rules.

    1. vLLM ``VllmConfig.__post_init__`` (v0.15 to v0.23 alike): a mode with piecewise graphs
       (PIECEWISE, FULL_AND_PIECEWISE) needs ``VLLM_COMPILE`` (the compilation that splits the
       model at attention); any other compilation mode turns it into NONE.
    2. vLLM Ascend ``check_and_update_config`` (``platform="npu"``): a compilation mode other than
       NONE and VLLM_COMPILE is unsupported: ``"graphs_off"`` (v0.23.0; ``"graphs_off_v0.18"``: the
       same rule with the older log line) sets the graph mode to NONE; ``"compile_off"`` (main since PR #13692) sets the compilation mode to NONE and
       keeps the FULL modes.
    3. ``full_and_piecewise=False`` (vLLM Ascend before PR #9572): FULL_AND_PIECEWISE becomes
       PIECEWISE, with no log line (the platform's "TODO: Full graph is fully supported later").

    The attention backend's support has the last word, after these (vLLM's model runner
    resolves after the platform's ``check_and_update_config``): :func:`harness.resolve.resolve_item`
    applies :func:`harness.graph.capability.resolve` to the mode returned here.
    """
    mode, notes = requested, []
    number = COMPILATION_MODES[compilation_mode]
    if mode.has_piecewise_cudagraphs() and compilation_mode != "VLLM_COMPILE":
        notes.append(f"Cudagraph mode {mode} is not compatible with compilation mode {number}.Overriding to NONE. "
                     f"(vLLM VllmConfig: piecewise graphs need compilation_mode VLLM_COMPILE, not {compilation_mode})")
        mode = CUDAGraphMode.NONE
    if platform == "npu" and compilation_mode not in ("NONE", "VLLM_COMPILE"):
        if npu_unsupported_compilation != "compile_off":
            if mode is not CUDAGraphMode.NONE:
                line = (f"NPU does not support {number} compilation mode. Setting CUDAGraphMode to NONE"
                        if npu_unsupported_compilation == "graphs_off_v0.18" else
                        f"NPU does not support compilation mode. mode={number}, action: setting CUDAGraphMode to NONE.")
                notes.append(f"{line} (vLLM Ascend platform.py: {mode} -> NONE)")
                mode = CUDAGraphMode.NONE
        else:
            notes.append(f"NPU does not support compilation mode. mode={number}, action: setting CUDAGraphMode to "
                         f"NONE. (vLLM Ascend main, PR #13692: the compilation mode becomes NONE; {mode} is kept)")
    if mode is CUDAGraphMode.FULL_AND_PIECEWISE and not full_and_piecewise:
        notes.append("FULL_AND_PIECEWISE -> PIECEWISE: this vLLM Ascend release turns FULL_AND_PIECEWISE into "
                     "PIECEWISE in check_and_update_config, with no log line (platform.py: 'TODO: Full graph is "
                     "fully supported later'; removed by PR #9572): no FULL decode graph is captured and uniform "
                     "decode batches replay PIECEWISE graphs")
        mode = CUDAGraphMode.PIECEWISE
    return ModeResolution(requested, mode, tuple(notes))
