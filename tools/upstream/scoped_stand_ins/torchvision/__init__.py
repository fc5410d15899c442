"""IMPORT STAND-IN for ``torchvision``: not the real package; nothing here computes anything.

Why: PyPI's torchvision wheels do not load against torch 2.13 (and, installed, break transformers'
imports), yet one import chain of vLLM Ascend's model runner reaches it at module level:

    vllm_ascend.worker.model_runner_v1
    -> vllm_ascend.patch.worker (patch_qwen3_5)
    -> vllm.model_executor.models.qwen3_5 -> vllm.model_executor.models.qwen3_vl
    -> transformers.models.qwen2_vl.image_processing_qwen2_vl
    -> ``from torchvision.transforms.v2 import functional as tvF``

Image preprocessing is no part of the logic compared (capture sizes, dispatch keys, scheduler
limits), so this stand-in only lets that import succeed: every attribute of any ``torchvision``
module is a function that RAISES when called.

SCOPED: it is NOT on the upstream venvs' sys.path (their .pth names ``tools/upstream/stand_ins``
only). ``tools/upstream/probe.py`` prepends ``tools/upstream/scoped_stand_ins`` just before it imports
the model runner, after transformers has decided (and cached) that torchvision is absent: on
sys.path from the start, it would make transformers take its torchvision code paths (transformers
5's ``image_utils`` reads ``InterpolationMode`` members at import and fails).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any, Callable, NoReturn

__version__ = "0.0.0+import-stand-in"
IS_IMPORT_STAND_IN = True


class StandInError(NotImplementedError):
    """Raised by every call into the torchvision stand-in."""


def _missing(name: str) -> Callable[..., NoReturn]:
    def missing(*args: Any, **kwargs: Any) -> NoReturn:
        raise StandInError(f"{name}() called: torchvision is an import stand-in (tools/upstream/stand_ins)")

    missing.__name__ = name.rsplit(".", 1)[-1]
    missing.__qualname__ = name
    return missing


class _StandInModule(types.ModuleType):
    def __getattr__(self, attr: str) -> Callable[..., NoReturn]:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return _missing(f"{self.__name__}.{attr}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Every ``torchvision.<sub>`` (``transforms.v2.functional``, ``ops`` ...) is a stand-in module."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        mod = _StandInModule(spec.name, f"torchvision import stand-in ({spec.name})")
        mod.__path__ = []
        return mod

    def exec_module(self, module: types.ModuleType) -> None:  # noqa: D102
        module.__dict__["IS_IMPORT_STAND_IN"] = True


sys.meta_path.append(_Finder())
sys.modules[__name__].__class__ = _StandInModule
