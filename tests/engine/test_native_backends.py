"""Backend selection and the native backends (CUDA graphs, torch_npu), as far as this machine allows.

On a CPU-only machine: ``auto`` resolves to the emulator, selecting ``npu`` fails cleanly without
importing torch_npu, and the CUDA backend module imports (it touches ``torch.cuda`` only at call
time) and refuses task groups with a message pointing at the device-metadata FIA. Tests that need
a GPU or an Ascend device skip with the reason. ``benchmarks/device_check.py`` is the longer
check for a lent GPU machine.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import torch

import harness.engine as engine_mod
from harness.engine import UnsupportedOnBackend, load, resolve

HAS_CUDA = torch.cuda.is_available()
HAS_TORCH_NPU = importlib.util.find_spec("torch_npu") is not None
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device (torch.cuda.is_available() is False)")
needs_npu = pytest.mark.skipif(not HAS_TORCH_NPU, reason="needs torch_npu and an Ascend device (torch_npu not installed)")
cpu_only = pytest.mark.skipif(HAS_CUDA or HAS_TORCH_NPU, reason="checks the CPU-only fallback; a device is present")

TASK_GROUP_CALLS = ("graph_task_group_begin", "graph_task_group_end", "graph_task_update_begin", "graph_task_update_end")


def _cuda_module():
    if not hasattr(torch, "cuda") or not hasattr(torch.cuda, "CUDAGraph"):
        pytest.skip("this torch build has no torch.cuda.CUDAGraph attribute")
    import harness.engine.cuda as cuda_backend

    return cuda_backend


# -- selection ----------------------------------------------------------------------------------
@cpu_only
def test_auto_resolves_to_the_emulator_on_cpu():
    assert resolve("auto") == "emulated"
    assert load("auto").name == "emulated"


def test_unknown_backend_is_a_value_error():
    with pytest.raises(ValueError, match="unknown backend 'tpu'"):
        resolve("tpu")


@cpu_only
def test_selecting_npu_without_torch_npu_fails_cleanly_without_importing_it():
    with pytest.raises(UnsupportedOnBackend, match="backend 'npu' selected but torch_npu"):
        load("npu")
    assert "torch_npu" not in sys.modules
    assert "harness.engine.npu" not in sys.modules  # the backend module (which imports torch_npu) too


@cpu_only
def test_selecting_npu_in_a_fresh_process_imports_no_torch_npu():
    """The same in a clean interpreter, so no earlier test can have hidden an import."""
    code = (
        "import sys\n"
        "from harness.engine import load, UnsupportedOnBackend, resolve\n"
        "assert resolve('auto') == 'emulated'\n"
        "try:\n    load('npu')\nexcept UnsupportedOnBackend:\n    pass\n"
        "else:\n    raise SystemExit('load(npu) did not raise')\n"
        "assert 'torch_npu' not in sys.modules, 'torch_npu was imported'\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


@cpu_only
def test_auto_on_a_cpu_build_of_torch_resolves_without_importing_torch():
    """An xdist controller resolves the backend for its report header: on a CPU build of
    torch that takes reading ``torch/version.py``, never the import (seconds)."""
    if engine_mod._torch_build_has_gpu():
        pytest.skip("this torch build has CUDA or HIP: resolving it needs torch.cuda")
    code = (
        "import sys\n"
        "from harness.engine import device_name, resolve\n"
        "from harness.report.run_info import environment\n"
        "assert resolve('auto') == 'emulated' and device_name('auto') == 'emulated NPU on CPU'\n"
        "env = environment('auto')\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "print(env['torch'])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == str(torch.__version__), done.stderr


@pytest.mark.parametrize(("text", "has_gpu"), [
    ("cuda: Optional[str] = None\nhip: Optional[str] = None\n", False),
    ("cuda: Optional[str] = '12.8'\nhip: Optional[str] = None\n", True),
    ("cuda = '12.4'\nhip = None\n", True),
    ("cuda = None\nhip = '6.2.41133'\n", True),
    ("cudnn = '9'\ncuda = None\n", False),
])
def test_a_torch_build_says_whether_it_has_a_gpu_in_its_version_file(tmp_path, monkeypatch, text, has_gpu):
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "version.py").write_text(text)
    spec = importlib.util.spec_from_file_location("torch", tmp_path / "torch" / "__init__.py",
                                                  submodule_search_locations=[str(tmp_path / "torch")])
    monkeypatch.setattr(engine_mod.importlib.util, "find_spec", lambda name: spec)
    assert engine_mod._torch_build_has_gpu() is has_gpu


def test_an_unreadable_torch_build_is_asked_through_torch_itself(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("torch", tmp_path / "torch" / "__init__.py",
                                                  submodule_search_locations=[str(tmp_path / "torch")])
    monkeypatch.setattr(engine_mod.importlib.util, "find_spec", lambda name: spec)
    assert engine_mod._torch_build_has_gpu() is True  # no version.py: import torch and ask it


@pytest.mark.skipif(HAS_CUDA, reason="a CUDA device is present")
def test_selecting_cuda_without_a_gpu_fails_cleanly():
    with pytest.raises(UnsupportedOnBackend, match="torch.cuda is not available"):
        load("cuda")


# -- the CUDA backend module, importable on CPU torch --------------------------------------------
def test_cuda_module_imports_on_this_torch_and_declares_no_task_update():
    cuda_backend = _cuda_module()
    assert cuda_backend.name == "cuda" and cuda_backend.capabilities.task_updates is False
    assert cuda_backend.capabilities.bitwise_replay is False


@pytest.mark.parametrize("call", TASK_GROUP_CALLS)
def test_cuda_task_group_calls_point_at_the_device_metadata_variant(call):
    cuda_backend = _cuda_module()
    args = (None, None) if call == "graph_task_update_begin" else (None,)
    with pytest.raises(UnsupportedOnBackend, match=r"CUDA graphs lack.*harness\.ops\.fia_device_metadata"):
        getattr(cuda_backend, call)(*args)


def test_cuda_auto_dispatch_capture_and_update_are_refused():
    cuda_backend = _cuda_module()
    with pytest.raises(UnsupportedOnBackend, match="auto_dispatch_capture.*fia_device_metadata"):
        cuda_backend.graph(None, auto_dispatch_capture=True)
    with pytest.raises(UnsupportedOnBackend, match=r"NPUGraph\.update.*fia_device_metadata"):
        cuda_backend.NPUGraph.update(None, cpu_update_input=[{"actual_seq_lengths": [1]}])  # no CUDA object needed


# -- on a GPU -------------------------------------------------------------------------------------
@needs_cuda
def test_cuda_capture_replay_through_the_npu_shaped_names():
    cuda = load("cuda")
    x = torch.ones(4, device="cuda")
    side = cuda.Stream()
    side.wait_stream(cuda.current_stream())
    with cuda.stream(side):
        (x * 2).sum()
    cuda.current_stream().wait_stream(side)
    g = cuda.NPUGraph()
    with cuda.graph(g, pool=cuda.graph_pool_handle()):
        out = x * 2 + 1
    x.copy_(torch.full((4,), 5.0, device="cuda"))
    g.replay()
    cuda.synchronize()
    assert torch.equal(out.cpu(), torch.full((4,), 11.0))
    with pytest.raises(UnsupportedOnBackend, match="fia_device_metadata"):
        cuda.graph_task_group_begin(cuda.current_stream())
    g.reset()


@needs_cuda
def test_auto_prefers_a_device_backend_when_cuda_is_present():
    assert resolve("auto") in ("cuda", "npu")


# -- on an Ascend device --------------------------------------------------------------------------
@needs_npu
def test_npu_backend_loads_when_torch_npu_sees_a_device():
    if not engine_mod.npu_available():
        pytest.skip("torch_npu is installed but sees no NPU device")
    npu = load("npu")
    assert npu.name == "npu" and npu.capabilities.task_updates
    assert resolve("auto") == "npu"


# -- the device's own kernels, installed through the engine's capabilities ------------------------
def _paged_attention_call(**over):
    from harness.ops import npu_paged_attention, paged_attention_get_workspace

    g = torch.Generator().manual_seed(0)
    args = dict(query=torch.randn(2, 4, 8, generator=g), key_cache=torch.randn(4, 4, 2, 8, generator=g),
                value_cache=torch.randn(4, 4, 2, 8, generator=g), num_kv_heads=2, num_heads=4,
                scale_value=0.35, block_table=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32))
    out = torch.full_like(args["query"], float("nan"))
    workspace = paged_attention_get_workspace(**args, context_lens=[5, 3], out=out)
    npu_paged_attention(**args, context_lens=torch.tensor([5, 3], dtype=torch.int32), out=out, workspace=workspace)
    return out


def test_the_session_installs_the_engines_paged_attention_and_restores_the_reference():
    """``engine.native_paged_attention()`` routes ``_npu_paged_attention`` to the device op with
    torch_npu's keyword names (as vLLM Ascend calls it); an engine without it gets the reference."""
    from types import SimpleNamespace

    from harness.ops.native import install_native_ops

    calls: list[tuple[str, dict]] = []

    def native_op(**kwargs):
        calls.append(("op", kwargs))
        kwargs["out"].fill_(7.0)

    def native_workspace(**kwargs):
        calls.append(("workspace", kwargs))
        return torch.empty(3, dtype=torch.uint8)

    emulated = load("emulated")
    device = SimpleNamespace(native_attention=emulated.native_attention,
                             native_paged_attention=lambda: (native_op, native_workspace),
                             collective_ops=emulated.collective_ops)
    reference = _paged_attention_call()
    try:
        install_native_ops(device)
        out = _paged_attention_call()
        assert torch.equal(out, torch.full_like(out, 7.0))
        assert [kind for kind, _ in calls] == ["workspace", "op"]
        op_kwargs = calls[1][1]
        assert set(op_kwargs) == {"query", "key_cache", "value_cache", "num_kv_heads", "num_heads", "scale_value",
                                  "block_table", "context_lens", "out", "workspace"}
        assert op_kwargs["context_lens"].tolist() == [5, 3] and op_kwargs["workspace"].numel() == 3
    finally:
        install_native_ops(emulated)
    assert torch.equal(_paged_attention_call(), reference)  # back on the CPU reference


@needs_npu
def test_npu_backend_declares_torch_npus_own_attention_kernels():
    if not engine_mod.npu_available():
        pytest.skip("torch_npu is installed but sees no NPU device")
    import torch_npu

    npu = load("npu")
    assert npu.native_attention()[0] is torch_npu.npu_fused_infer_attention_score
    assert npu.native_paged_attention() == (torch_npu._npu_paged_attention,
                                            torch_npu._npu_paged_attention_get_workspace)
