"""Capture/replay engines behind one torch.npu-shaped API.

``load(name)`` returns a namespace exposing the names the harness calls on ``torch.npu``
(``NPUGraph``, ``graph``, ``graph_pool_handle``, the task-group functions, ``ExternalEvent``,
``Stream``, ``current_stream``, ``stream``, ``synchronize``) plus a few read-outs for the checks
(``stream_usage``, ``memory_report``). Backends:

* ``emulated``: a faithful CPU emulator of ACL graph semantics (:mod:`.emulated`);
* ``npu``: torch_npu on an Ascend device, imported only when selected (:mod:`.npu`);
* ``cuda``: ``torch.cuda.CUDAGraph`` (:mod:`.cuda`), which cannot update host parameters.
* ``auto``: npu if torch_npu imports and sees a device, else cuda if available, else emulated.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

from .errors import (
    CaptureError,
    EngineError,
    GraphHangError,
    StreamBudgetError,
    TaskUpdateError,
    UnsupportedOnBackend,
)
from .protocol import Capabilities, DeviceRules, Engine, StreamConfig

BACKENDS = ("emulated", "npu", "cuda", "auto")
EMULATED_DEVICE_NAME = "emulated NPU on CPU"

RUN_DIR_ENV = "GRAPH_HARNESS_RUN_DIR"
"""Set by whoever starts a run's ranks (:mod:`harness.ranks`) to a directory private to the run
and shared by its ranks: the emulator's shared-memory collectives keep their files there."""


def npu_available() -> bool:
    """True when torch_npu is installed and sees a device (never imports it otherwise)."""
    if importlib.util.find_spec("torch_npu") is None:
        return False
    try:
        import torch
        import torch_npu  # noqa: F401

        return bool(torch.npu.is_available())  # type: ignore[attr-defined]  # torch_npu adds torch.npu
    except Exception:  # a broken CANN install is "no NPU", not a crash of the harness
        return False


def cuda_available() -> bool:
    """True when torch sees a CUDA (or ROCm) device. A CPU-only build of torch is answered from
    its ``torch/version.py`` without importing torch: an xdist controller, which runs no item,
    then never pays the import (seconds) before it starts its workers."""
    if "torch" not in sys.modules and not _torch_build_has_gpu():
        return False
    import torch

    return torch.cuda.is_available()


def _torch_build_has_gpu() -> bool:
    """Whether the installed torch was built with CUDA or HIP (True when that cannot be read)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return True  # no torch to read: let the import say what is wrong
    version_file = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    try:
        text = version_file.read_text()
    except OSError:
        return True
    # generated at build time: `cuda: Optional[str] = None` or `cuda = '12.4'` (hip alike)
    return any(re.search(rf"^{name}\b[^=]*=\s*(?!None\b)\S", text, re.MULTILINE) for name in ("cuda", "hip"))


def device_name(name: str) -> str:
    """The device that backend ``name`` runs on. The emulator's is known without importing torch."""
    resolved = resolve(name)
    if resolved == "emulated":
        return EMULATED_DEVICE_NAME
    return load(resolved).device_name()


def resolve(name: str) -> str:
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    if name != "auto":
        return name
    if npu_available():
        return "npu"
    if cuda_available():
        return "cuda"
    return "emulated"


def load(name: str = "auto") -> Engine:
    """Return the torch.npu-shaped namespace of backend ``name``: a module satisfying :class:`Engine`,
    which the type checker verifies at each ``return`` below. Imported here, on demand: a backend
    imports torch (and the npu one torch_npu)."""
    resolved = resolve(name)
    if resolved == "emulated":
        from .emulated import api

        return api
    if resolved == "npu":
        if not npu_available():
            raise UnsupportedOnBackend("backend 'npu' selected but torch_npu is not installed or sees no device")
        from . import npu

        return npu
    if not cuda_available():
        raise UnsupportedOnBackend("backend 'cuda' selected but torch.cuda is not available")
    from . import cuda

    return cuda


__all__ = [
    "BACKENDS", "Capabilities", "CaptureError", "DeviceRules", "Engine", "StreamConfig", "EngineError", "GraphHangError", "StreamBudgetError",
    "TaskUpdateError", "UnsupportedOnBackend", "cuda_available", "device_name", "load", "npu_available", "resolve",
]
