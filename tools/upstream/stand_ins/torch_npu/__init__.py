"""IMPORT STAND-IN for ``torch_npu``: not Ascend's package, and nothing here computes anything.

It exists only so that vLLM Ascend's pure-Python modules (its platform's config hooks, its model
runner's bookkeeping) import on a machine without CANN, inside the optional upstream venvs that
``tools/upstream/setup.py`` makes (a .pth puts ``tools/upstream/stand_ins`` on their sys.path). The
real ``torch-npu`` wheel is never installed there: without CANN it breaks ``import torch``.

What it provides, and nothing else:

* any attribute of ``torch_npu`` or of a submodule (``torch_npu.npu_fused_infer_attention_score``,
  ``torch_npu.float4_e2m1fn_x2``, ``torch_npu.npu.Stream`` ...) is a :class:`Missing` placeholder:
  it can be referenced, hashed, compared (equal only to itself), subscripted, joined with ``|`` (as
  in annotations), subclassed (the class raises when instantiated) and have further attributes
  taken at import time; a value assigned to one of its attributes (a config flag such as
  ``torch_npu.npu.config.allow_internal_format = True``) is kept and read back as such; CALLING
  one RAISES :class:`StandInError`: it never fakes a value;
* any submodule (``torch_npu.npu``, ``torch_npu._C._distributed_c10d``, ``torch_npu.profiler``,
  ``torch_npu.op_plugin.atb._atb_ops`` ...) imports as a module of such placeholders;
* as the real package does, PyTorch's PrivateUse1 backend is renamed "npu" (``torch.device("npu")``
  parses; no kernel or allocator exists for it) and ``torch_npu.npu`` is registered as
  ``torch.npu``, so that ``torch.npu.<name>`` references in annotations and defaults resolve; calling any of them raises,
  with two exceptions for OTHER libraries only (``npu.py``): ``is_available()`` and
  ``device_count()`` answer ``False`` / ``0`` (the truth: there is no NPU) when called from outside
  ``vllm_ascend`` -- transformers and vLLM probe for an NPU whenever ``torch_npu`` is importable --
  and raise when vllm_ascend's own code calls them.

``torchair`` (Ascend's torch graph compiler, part of the same NPU stack, not on PyPI; vllm-ascend
0.18's worker patches import it at module level) is the same kind of stand-in, beside this one.

So a probe that reaches a device operation (a stream, an op, a memory query) fails loudly with the
name of what it wanted, instead of comparing upstream's logic against an invented answer.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any, NoReturn

__version__ = "0.0.0+import-stand-in"
IS_IMPORT_STAND_IN = True


class StandInError(NotImplementedError):
    """Raised by every call into the stand-in: the upstream code wanted a real NPU operation."""


# Values that upstream code assigned to attributes of placeholders (their full names as keys).
ASSIGNED: dict[str, Any] = {}


class Missing:
    """A named placeholder for a torch_npu attribute: referencable at import, raises when called."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_name", name)

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        full = f"{self._name}.{attr}"
        return ASSIGNED[full] if full in ASSIGNED else Missing(full)

    def __setattr__(self, attr: str, value: Any) -> None:
        # ``torch_npu.npu.config.allow_internal_format = False`` at import: kept (ASSIGNED), so that
        # a later read gives back what upstream's code set; nothing acts on it.
        ASSIGNED[f"{self._name}.{attr}"] = value

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise StandInError(f"{self._name}() called: torch_npu is an import stand-in "
                           "(tools/upstream/stand_ins), no NPU operation runs here")

    def __bool__(self) -> bool:
        raise StandInError(f"bool({self._name}): torch_npu is an import stand-in")

    def __iter__(self) -> NoReturn:
        raise StandInError(f"iter({self._name}): torch_npu is an import stand-in")

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        # ``class X(torch_npu.something):`` at import: a base class that raises when instantiated.
        return (_missing_base(self._name),)

    def __or__(self, other: Any) -> "Missing":
        # ``stream: torch.npu.Stream | None = None`` in a class body (an annotation, evaluated at import)
        return Missing(f"{self._name} | {other!r}")

    def __ror__(self, other: Any) -> "Missing":
        return Missing(f"{other!r} | {self._name}")

    def __getitem__(self, item: Any) -> "Missing":
        # ``torch.npu.SomeGeneric[int]`` in an annotation
        return Missing(f"{self._name}[{item!r}]")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Missing) and other._name == self._name

    def __hash__(self) -> int:
        return hash(("torch_npu-stand-in", self._name))

    def __repr__(self) -> str:
        return f"<torch_npu stand-in {self._name}>"


def _missing_base(name: str) -> type:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> NoReturn:
        raise StandInError(f"{name}(...) instantiated: torch_npu is an import stand-in")

    return type(name.rsplit(".", 1)[-1], (), {"__init__": __init__, "__module__": "torch_npu"})


class _StandInModule(types.ModuleType):
    def __getattr__(self, attr: str) -> Missing:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return Missing(f"{self.__name__}.{attr}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Every ``<package>.<sub>`` that has no file here is a :class:`_StandInModule`."""

    def __init__(self, package: str) -> None:
        self.package = package

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.startswith(self.package + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        mod = _StandInModule(spec.name, f"{self.package} import stand-in ({spec.name})")
        mod.__path__ = []
        return mod

    def exec_module(self, module: types.ModuleType) -> None:  # noqa: D102
        module.__dict__["IS_IMPORT_STAND_IN"] = True


sys.meta_path.append(_Finder(__name__))
sys.modules[__name__].__class__ = _StandInModule

# The real package registers torch.npu; the same stand-in module here, so ``torch.npu.X`` is a
# placeholder (calling it raises). Only set where torch has none of its own.
import torch as _torch  # noqa: E402

# importlib, not ``from . import npu``: that would find the package's own placeholder attribute.
import importlib as _importlib  # noqa: E402

npu = _importlib.import_module(__name__ + ".npu")

# As the real package's import does: name PyTorch's PrivateUse1 backend "npu" (so that
# ``torch.device("npu")``, a descriptor, parses: vLLM's DeviceConfig makes one) and register the
# device module. No kernel and no allocator is registered: any tensor on "npu" fails in torch itself.
if _torch._C._get_privateuse1_backend_name() == "privateuseone":
    _torch.utils.rename_privateuse1_backend("npu")
if not hasattr(_torch, "npu"):
    _torch._register_device_module("npu", npu)
