"""Route :mod:`harness.ops` to an engine's own kernels, or back to the CPU reference.

An NPU engine brings torch_npu's FIA and paged attention (their host checks included); the
emulator and CUDA bring none, and the reference kernels with the harness's contracts serve.
Set per run, before the pipeline makes its first call."""

from __future__ import annotations

from harness.engine.protocol import Engine
from harness.ops.fia import set_native_impl
from harness.ops.paged_attention import set_native_paged_attention

__all__ = ["install_native_ops"]


def install_native_ops(engine: Engine) -> None:
    """Use ``engine``'s native attention kernels where it has them, the reference elsewhere."""
    set_native_impl(*(engine.native_attention() or (None, None, None)))
    set_native_paged_attention(*(engine.native_paged_attention() or (None, None)))
