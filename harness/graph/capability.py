"""The capability step: the graph mode and attention path an item really runs, decided once.

A serving engine does not run the graph mode it is asked for: vLLM resolves it once, at
start-up, from the weakest graph support of the model's attention backends
(``AttentionCGSupport``; ``GPUModelRunner._check_and_update_cudagraph_mode`` calling
``CompilationConfig.resolve_cudagraph_mode_and_sizes``, which vLLM Ascend's ``NPUModelRunner``
calls as well), and the same requested mode becomes FULL_AND_PIECEWISE with one backend and
FULL with another. The harness adds the engine's side of the same question: an engine with
task-group updates (ACL graphs) keeps FIA's lengths in host lists, captures each layer's FIA in
a task group and updates it after every replay; an engine without them (CUDA graphs) keeps the
lengths in device buffers that are refreshed before every replay, as FlashAttention's
``cu_seqlens`` are. Both answers come from :func:`resolve` here, and from nowhere else: the
pipeline, the runner and the checks read the :class:`Resolution`, never a backend's name.

Plain data in, a decision out (vLLM's dispatcher is the model): no torch, no backend.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from harness.graph.capture_sizes import EngineRefusal
from harness.graph.modes import CUDAGraphMode

__all__ = ["ATTENTION_BACKENDS", "AttentionBackendInfo", "AttentionCGSupport", "AttentionPath",
           "AttentionPathUnavailable", "GraphModeRefused", "Resolution", "resolve"]


class AttentionCGSupport(enum.IntEnum):
    """How far an attention backend's metadata builder supports full graphs (vLLM's enum)."""

    NEVER = 0  # no full graph at all
    UNIFORM_SINGLE_TOKEN_DECODE = 1  # full graphs of one-token decode batches only
    UNIFORM_BATCH = 2  # full graphs of uniform batches (decode, and spec decode's 1 + k)
    ALWAYS = 3  # full graphs of every batch, mixed prefill-decode included


@dataclass(frozen=True)
class AttentionBackendInfo:
    """An attention backend the harness models: the graph support its builder declares."""

    name: str
    class_name: str  # the backend class upstream's warnings name
    support: AttentionCGSupport
    source: str  # where upstream declares it


#: The backends a scenario may name (``graph.attention_backend``), with their declared support.
#: The harness computes attention with FIA (host lists) or its device-buffer form whatever the
#: backend: the name decides the graph mode the engine resolves, as the builder's level does.
ATTENTION_BACKENDS: dict[str, AttentionBackendInfo] = {b.name: b for b in (
    AttentionBackendInfo("ascend", "AscendAttentionBackend", AttentionCGSupport.ALWAYS,
                         "vllm-ascend vllm_ascend/attention/attention_v1.py get_cudagraph_support "
                         "(v0.15.0rc1 .. main)"),
    AttentionBackendInfo("ascend_mla", "AscendMLABackend", AttentionCGSupport.UNIFORM_BATCH,
                         "vllm-ascend vllm_ascend/attention/mla_v1.py get_cudagraph_support (v0.15.0rc1 .. main)"),
    AttentionBackendInfo("ascend_sfa", "AscendSFABackend", AttentionCGSupport.UNIFORM_BATCH,
                         "vllm-ascend vllm_ascend/attention/sfa_v1.py get_cudagraph_support (v0.15.0rc1 .. main)"),
    AttentionBackendInfo("flash_attn_3", "FlashAttentionBackend", AttentionCGSupport.ALWAYS,
                         "vllm vllm/v1/attention/backends/flash_attn.py _cudagraph_support (FA3)"),
    AttentionBackendInfo("flash_attn_2", "FlashAttentionBackend", AttentionCGSupport.UNIFORM_BATCH,
                         "vllm vllm/v1/attention/backends/flash_attn.py _cudagraph_support (FA2)"),
    AttentionBackendInfo("flashinfer", "FlashInferBackend", AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE,
                         "vllm vllm/v1/attention/backends/flashinfer.py _cudagraph_support"),
    AttentionBackendInfo("no_full_graphs", "NoFullGraphsBackend", AttentionCGSupport.NEVER,
                         "a backend whose builder keeps vLLM's default, AttentionMetadataBuilder._cudagraph_support "
                         "= NEVER (vllm/v1/attention/backend.py)"),
)}


class AttentionPath(enum.Enum):
    """Where FULL graphs keep attention's per-request lengths."""

    HOST_LISTS = "host_lists"  # FIA's host lists, updated in the graph after each replay (ACL graph)
    DEVICE_BUFFERS = "device_buffers"  # device buffers refreshed before each replay (FlashAttention)


class GraphModeRefused(EngineRefusal):
    """The engine refuses to start with this mode and backend (vLLM raises the same): the point
    cannot run anywhere (a skip with the engine's message, not a bad file)."""


class AttentionPathUnavailable(Exception):
    """The attention path a scenario names needs what this engine lacks (a skip on this backend)."""


@dataclass(frozen=True)
class Resolution:
    """What an item runs: the effective graph mode, its attention path, and why."""

    requested: CUDAGraphMode
    mode: CUDAGraphMode
    attention_path: AttentionPath
    backend: AttentionBackendInfo
    warnings: tuple[str, ...] = ()  # what the engine logs when it changes the mode (upstream's words)

    @property
    def downgraded(self) -> bool:
        return self.mode is not self.requested

    @property
    def graphs(self) -> bool:
        """Any graph is captured (NONE captures none, and has no capture sizes)."""
        return self.mode is not CUDAGraphMode.NONE

    @property
    def decode_full(self) -> bool:
        """Uniform decode batches replay FULL graphs (spec decode's sizes round up only then)."""
        return self.mode.decode_mode() is CUDAGraphMode.FULL

    @property
    def mixed_graphs(self) -> bool:
        """Mixed batches replay graphs too, each captured on a dummy batch."""
        return self.mode.mixed_mode() is not CUDAGraphMode.NONE


def resolve(requested: CUDAGraphMode, backend: AttentionBackendInfo, *, uniform_decode_query_len: int = 1,
            task_updates: bool = True, metadata: str = "auto",
            splitting_ops_contain_attention: bool = True) -> Resolution:
    """The mode and attention path of an item (vLLM's ``resolve_cudagraph_mode_and_sizes``).

    ``task_updates``: the engine can re-issue a captured op with new host arguments (ACL graph);
    ``metadata``: the scenario's ``graph.attention_metadata`` (``auto``: host lists where the
    engine can update them, device buffers elsewhere); ``splitting_ops_contain_attention``: the
    compiled model is split at attention (vLLM's VLLM_COMPILE with attention in the splitting
    ops, vLLM Ascend's default). Raises :class:`GraphModeRefused` where vLLM raises."""
    mode, support, warnings = requested, backend.support, []
    what = f"with {backend.class_name} backend (support: AttentionCGSupport.{support.name})"
    if mode is CUDAGraphMode.NONE:
        return Resolution(requested, mode, _path(task_updates, metadata), backend)
    # Full graphs of mixed batches need ALWAYS.
    if mode.mixed_mode() is CUDAGraphMode.FULL and support is not AttentionCGSupport.ALWAYS:
        message = f"CUDAGraphMode.{mode.name} is not supported {what}"
        if support is AttentionCGSupport.NEVER:
            raise GraphModeRefused(message + "; please try cudagraph_mode=PIECEWISE, and make sure compilation "
                                             "mode is VLLM_COMPILE")
        mode = CUDAGraphMode.FULL_AND_PIECEWISE if splitting_ops_contain_attention else CUDAGraphMode.FULL_DECODE_ONLY
        warnings.append(f"{message}; setting cudagraph_mode={mode.name}")
    # Full decode graphs need some full-graph support.
    if mode.decode_mode() is CUDAGraphMode.FULL and support is AttentionCGSupport.NEVER:
        message = f"CUDAGraphMode.{mode.name} is not supported {what}"
        if splitting_ops_contain_attention:
            mode = CUDAGraphMode.PIECEWISE
            warnings.append(f"{message}; setting cudagraph_mode=PIECEWISE because attention is compiled piecewise")
        else:
            mode = CUDAGraphMode.NONE
            warnings.append(f"{message}; setting cudagraph_mode=NONE because attention is not compiled piecewise")
    # Full decode graphs of spec decode (1 + k tokens a request) need UNIFORM_BATCH.
    if (mode.decode_mode() is CUDAGraphMode.FULL and uniform_decode_query_len > 1
            and support < AttentionCGSupport.UNIFORM_BATCH):
        message = (f"CUDAGraphMode.{mode.name} is not supported with spec-decode for attention backend "
                   f"{backend.class_name} (support: AttentionCGSupport.{support.name})")
        mode = CUDAGraphMode.PIECEWISE if splitting_ops_contain_attention else CUDAGraphMode.NONE
        warnings.append(f"{message}; setting cudagraph_mode={mode.name}")
    return Resolution(requested, mode, _path(task_updates, metadata), backend, tuple(warnings))


def _path(task_updates: bool, metadata: str) -> AttentionPath:
    if metadata == "auto":
        return AttentionPath.HOST_LISTS if task_updates else AttentionPath.DEVICE_BUFFERS
    path = AttentionPath(metadata)
    if path is AttentionPath.HOST_LISTS and not task_updates:
        raise AttentionPathUnavailable("graph.attention_metadata host_lists needs an engine that updates a captured op's "
                               "host arguments (task groups: ACL graph); this one has none, so its FULL graphs "
                               "keep lengths in device buffers (graph.attention_metadata: device_buffers or auto)")
    return path
