"""Upstream's answers for scenario points, computed by upstream's own code: runs INSIDE an upstream
venv (``make upstream``), never in the harness's.

    .venv-upstream/v0.23.0/bin/python harness/upstream/worker.py < points.jsonl > answers.jsonl

Standard library plus the venv's vLLM and vLLM Ascend, nothing of the harness (its venv's
pydantic, torch build and plugins are not this one's). vLLM Ascend's ``NPUPlatform`` is made
vLLM's current platform before any config exists, as its platform plugin does on Ascend, so
``EngineArgs.create_engine_config`` runs every platform hook of that release on the settings of
the point. Per point (one JSON object a line: ``id``, ``mode``, ``max_num_seqs``,
``max_num_batched_tokens``, ``capture_sizes``, ``max_capture_size``, ``k``), one answer a line:

* ``config_sizes``, ``config_mode``: ``compilation_config``'s capture sizes and mode after
  the platform's hooks (start-up);
* ``sizes``, ``mode``, ``keys``: the same after vLLM Ascend's model runner resolved them for
  its attention backend (``NPUModelRunner._check_and_update_cudagraph_mode``, bound to a
  minimal stand-in ``self``), and ``CudagraphDispatcher``'s keys it initialised, per mode, as
  ``[num_tokens, num_reqs, uniform]``;
* ``refused``: the one-line error when the engine would not start on those settings;
  ``adapter_error`` when this adapter failed (then no other field).

Speculative decoding (``k`` > 0) is vLLM's ``ngram`` proposer: it needs no draft model, and
what the capture sizes and keys read of it (``num_speculative_tokens``) is the same as MTP's.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys
import tempfile
from typing import Any

MAX_MODEL_LEN = 4096


def _tiny_llama(directory: str) -> str:
    import transformers

    transformers.LlamaConfig(
        architectures=["LlamaForCausalLM"], hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=256, max_position_embeddings=MAX_MODEL_LEN,
        torch_dtype="bfloat16").save_pretrained(directory)
    return directory


def _npu_platform() -> None:
    import vllm.platforms as platforms
    from vllm_ascend.platform import NPUPlatform

    platforms._current_platform = NPUPlatform()


def _name(value: Any) -> Any:
    return getattr(value, "name", value)


def _import_runner() -> Any:
    """vLLM Ascend's model runner class. Its module imports a vision model of vLLM's whose
    processor imports torchvision, which does not load against this torch: the probe's scoped
    import stand-in (tools/upstream/scoped_stand_ins) is put on the path for this import only."""
    import importlib.util

    scoped = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "tools", "upstream",
                          "scoped_stand_ins")
    import transformers.utils

    added = importlib.util.find_spec("torchvision") is None
    # transformers asks once whether torchvision is there and keeps the answer: asked before the
    # stand-in is on the path, it says no, and transformers takes none of its image paths
    transformers.utils.is_torchvision_available()
    if added:
        sys.path.insert(0, os.path.normpath(scoped))
    try:
        from vllm_ascend.worker.model_runner_v1 import NPUModelRunner
    finally:
        if added:
            sys.path.remove(os.path.normpath(scoped))
    return NPUModelRunner


class _RunnerSelf:
    """The fields ``NPUModelRunner._check_and_update_cudagraph_mode`` reads, and nothing else: the
    real method is bound to this, never re-typed (``use_aclgraph`` False skips only the graph
    params' allocation, which decides nothing compared here)."""

    def __init__(self, vllm_config: Any, q: int) -> None:
        from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher

        self.vllm_config = vllm_config
        self.compilation_config = vllm_config.compilation_config
        self.parallel_config = vllm_config.parallel_config
        self.speculative_config = vllm_config.speculative_config
        self.uniform_decode_query_len = q
        self.max_num_reqs = vllm_config.scheduler_config.max_num_seqs
        self.kv_cache_config = None
        self.drafter = None
        self.use_aclgraph = False
        self.cudagraph_dispatcher = CudagraphDispatcher(vllm_config)


def _runtime(runner_cls: Any, vllm_config: Any, q: int) -> tuple[str, dict[str, list[list[Any]]]]:
    """The model runner's own resolution of mode, sizes and keys for one attention group of
    vLLM Ascend's attention backend (what a decoder-only model has)."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec
    from vllm_ascend.attention.attention_v1 import AscendAttentionBackend

    stand_in = _RunnerSelf(vllm_config, q)
    spec = FullAttentionSpec(block_size=128, num_kv_heads=2, head_size=16, dtype=torch.bfloat16)
    group = KVCacheGroupSpec(layer_names=["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"],
                             kv_cache_spec=spec)
    runner_cls._check_and_update_cudagraph_mode(stand_in, [{AscendAttentionBackend}], [group])
    dispatcher = stand_in.cudagraph_dispatcher
    keys = {_name(m): sorted([d.num_tokens, d.num_reqs, bool(d.uniform)] for d in descs)
            for m, descs in dispatcher.cudagraph_keys.items() if descs}
    return _name(vllm_config.compilation_config.cudagraph_mode), keys


def _one_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {' '.join(str(error).split())}"[:500]


def _failure(error: BaseException) -> str:
    """``refused``: upstream's own validation said no (a ``ValueError``, pydantic's included);
    ``adapter_error``: anything else, a fault of this adapter, never an answer."""
    return "refused" if isinstance(error, ValueError) else "adapter_error"


_RUNNER: list[Any] = []


def _runner_class() -> Any:
    """Imported once, after the first engine config: vLLM Ascend's modules import each other in a
    circle that only the order of a real start (platform, config, then the runner) resolves."""
    if not _RUNNER:
        _RUNNER.append(_import_runner())
    return _RUNNER[0]


def answer(point: dict[str, Any], model_dir: str) -> dict[str, Any]:
    from vllm.engine.arg_utils import EngineArgs

    compilation: dict[str, Any] = {"cudagraph_mode": point["mode"]}
    if point.get("capture_sizes") is not None:
        compilation["cudagraph_capture_sizes"] = point["capture_sizes"]
    if point.get("max_capture_size") is not None:
        compilation["max_cudagraph_capture_size"] = point["max_capture_size"]
    kwargs: dict[str, Any] = dict(model=model_dir, skip_tokenizer_init=True, max_model_len=MAX_MODEL_LEN,
                                  max_num_seqs=point["max_num_seqs"],
                                  max_num_batched_tokens=point["max_num_batched_tokens"],
                                  compilation_config=compilation)
    k = int(point.get("k") or 0)
    if k:
        kwargs["speculative_config"] = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 3}
    out: dict[str, Any] = {"id": point["id"]}
    try:
        config = EngineArgs(**kwargs).create_engine_config()
    except Exception as error:  # noqa: BLE001 - a refusal is an answer
        out[_failure(error)] = _one_line(error)
        return out
    cc = config.compilation_config
    out["config_sizes"] = list(cc.cudagraph_capture_sizes or [])
    out["config_mode"] = _name(cc.cudagraph_mode)
    try:
        from vllm.config import set_current_vllm_config

        with set_current_vllm_config(config):  # as the runner is made in a worker
            out["mode"], out["keys"] = _runtime(_runner_class(), config, 1 + k)
    except Exception as error:  # noqa: BLE001 - the runner refusing at start-up is an answer too
        out[_failure(error)] = _one_line(error)
        return out
    out["sizes"] = list(cc.cudagraph_capture_sizes or [])
    return out


def main() -> int:
    logging.disable(logging.WARNING)  # vLLM logs every config at INFO: the answers are on stdout
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    real_stdout = sys.stdout
    with contextlib.redirect_stdout(io.StringIO()):  # upstream prints; only answers go out
        _npu_platform()
        with tempfile.TemporaryDirectory() as directory:
            model_dir = _tiny_llama(os.path.join(directory, "tiny-llama"))
            for line in sys.stdin:
                if not line.strip():
                    continue
                result = answer(json.loads(line), model_dir)
                real_stdout.write(json.dumps(result) + "\n")
                real_stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
