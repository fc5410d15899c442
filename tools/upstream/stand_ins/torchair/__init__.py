"""IMPORT STAND-IN for ``torchair`` (Ascend's torch graph compiler, shipped with Ascend's NPU stack,
not on PyPI): not the real package; nothing here computes anything.

vllm-ascend 0.18's model runner reaches it at module level
(``vllm_ascend.worker.model_runner_v1`` -> ``vllm_ascend.patch.worker`` ->
``patch_npugraph_ex_triton``: ``import torchair``, ``from torchair.core._concrete_graph import
_is_symlist``, ``from torchair.npu_fx_compiler import _unpack_meta_list``, then ``importlib.reload(sys.modules["torchair.fx_summary"])``, which the real
``import torchair`` has loaded, as this one does). Graph compilation is no
part of the logic compared; every attribute of any ``torchair`` module is a placeholder that RAISES
when called, exactly as in the ``torch_npu`` stand-in beside it (whose machinery this reuses).
"""

from __future__ import annotations

import sys

import torch_npu as _torch_npu

__version__ = "0.0.0+import-stand-in"
IS_IMPORT_STAND_IN = True
StandInError = _torch_npu.StandInError

sys.meta_path.append(_torch_npu._Finder(__name__))
sys.modules[__name__].__class__ = _torch_npu._StandInModule

# The real ``import torchair`` loads these submodules; vllm-ascend 0.18's patch then
# ``importlib.reload``s two of them from sys.modules, so they are loaded here as well.
import importlib as _importlib  # noqa: E402

for _sub in ("core", "core._concrete_graph", "fx_summary", "npu_fx_compiler"):
    _importlib.import_module(f"{__name__}.{_sub}")
