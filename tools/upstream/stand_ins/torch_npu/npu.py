"""IMPORT STAND-IN for ``torch_npu.npu`` (also set as ``torch.npu``): see the package docstring.

Every attribute is a placeholder that raises when called, except the two device probes below,
which answer "no NPU" to callers outside ``vllm_ascend`` (transformers' ``is_torch_npu_available``,
vLLM's platform detection) and raise for vllm_ascend's own code, whose logic is what is compared.
"""

from __future__ import annotations

import sys
from typing import Any

from . import Missing, StandInError, _StandInModule


def _caller_is_vllm_ascend() -> bool:
    name = sys._getframe(2).f_globals.get("__name__", "")
    return name == "vllm_ascend" or name.startswith("vllm_ascend.")


def is_available(*args: Any, **kwargs: Any) -> bool:
    """False (there is no NPU) for other libraries; raises for vllm_ascend's own code."""
    if _caller_is_vllm_ascend():
        raise StandInError("torch.npu.is_available() called from vllm_ascend: torch_npu is an import stand-in")
    return False


def device_count(*args: Any, **kwargs: Any) -> int:
    """0 (there is no NPU) for other libraries; raises for vllm_ascend's own code."""
    if _caller_is_vllm_ascend():
        raise StandInError("torch.npu.device_count() called from vllm_ascend: torch_npu is an import stand-in")
    return 0


__all__ = ["Missing", "StandInError", "device_count", "is_available"]
sys.modules[__name__].__class__ = _StandInModule
