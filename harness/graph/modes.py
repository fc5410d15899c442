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

__all__ = ["CUDAGraphMode", "parse_mode"]


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
