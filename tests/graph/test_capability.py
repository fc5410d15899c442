"""The capability step: the graph mode an engine resolves from its attention backend's support,
and where a FULL graph keeps attention's lengths. Expected values are upstream's: the rules of
vLLM's ``CompilationConfig.resolve_cudagraph_mode_and_sizes`` (the function vLLM Ascend's
``NPUModelRunner._check_and_update_cudagraph_mode`` calls too), with the warning text vLLM logs
(the first case is a real log line: FlashAttention 2 on a GPU asked for FULL)."""

from __future__ import annotations

import pytest

from harness.graph.capability import (
    ATTENTION_BACKENDS,
    AttentionCGSupport,
    AttentionPath,
    AttentionPathUnavailable,
    GraphModeRefused,
    resolve,
)
from harness.graph.modes import CUDAGraphMode as M

B = ATTENTION_BACKENDS


def test_a_uniform_batch_backend_turns_full_into_full_and_piecewise_with_upstreams_warning():
    result = resolve(M.FULL, B["flash_attn_2"])
    assert result.mode is M.FULL_AND_PIECEWISE and result.downgraded
    assert result.warnings == ("CUDAGraphMode.FULL is not supported with FlashAttentionBackend backend (support: "
                               "AttentionCGSupport.UNIFORM_BATCH); setting cudagraph_mode=FULL_AND_PIECEWISE",)


@pytest.mark.parametrize("requested, backend, q, splitting, expected", [
    # ALWAYS keeps every mode (vLLM Ascend's attention_v1, FlashAttention 3)
    *[(mode, "ascend", q, True, mode) for mode in M for q in (1, 2)],
    *[(mode, "flash_attn_3", 1, True, mode) for mode in M],
    # mixed FULL needs ALWAYS: FULL_AND_PIECEWISE where attention is split out, else FULL_DECODE_ONLY
    (M.FULL, "ascend_mla", 1, True, M.FULL_AND_PIECEWISE),
    (M.FULL, "ascend_mla", 1, False, M.FULL_DECODE_ONLY),
    (M.FULL, "ascend_sfa", 2, True, M.FULL_AND_PIECEWISE),  # UNIFORM_BATCH serves spec decode's 1 + k
    (M.FULL_DECODE_ONLY, "ascend_mla", 2, True, M.FULL_DECODE_ONLY),
    # single-token decode support: spec decode's full decode graphs fall back
    (M.FULL_DECODE_ONLY, "flashinfer", 1, True, M.FULL_DECODE_ONLY),
    (M.FULL_DECODE_ONLY, "flashinfer", 2, True, M.PIECEWISE),
    (M.FULL_DECODE_ONLY, "flashinfer", 2, False, M.NONE),
    (M.FULL, "flashinfer", 2, True, M.PIECEWISE),  # first to FULL_AND_PIECEWISE, then the spec-decode rule
    # NEVER: full decode graphs become PIECEWISE (attention compiled piecewise) or NONE
    (M.FULL_DECODE_ONLY, "no_full_graphs", 1, True, M.PIECEWISE),
    (M.FULL_AND_PIECEWISE, "no_full_graphs", 1, True, M.PIECEWISE),
    (M.FULL_DECODE_ONLY, "no_full_graphs", 1, False, M.NONE),
    (M.PIECEWISE, "no_full_graphs", 1, True, M.PIECEWISE),
    (M.NONE, "no_full_graphs", 1, True, M.NONE),
])
def test_the_resolved_mode_follows_vllms_rules(requested, backend, q, splitting, expected):
    result = resolve(requested, B[backend], uniform_decode_query_len=q, splitting_ops_contain_attention=splitting)
    assert result.mode is expected
    assert bool(result.warnings) == (expected is not requested)  # every change is logged, nothing else


def test_full_of_mixed_batches_with_a_never_backend_is_refused_as_vllm_refuses_to_start():
    with pytest.raises(GraphModeRefused, match=r"CUDAGraphMode.FULL is not supported with NoFullGraphsBackend "
                                               r"backend \(support: AttentionCGSupport.NEVER\); please try "
                                               r"cudagraph_mode=PIECEWISE"):
        resolve(M.FULL, B["no_full_graphs"])


def test_the_declared_support_levels_are_upstreams():
    assert [(b.name, b.support) for b in B.values()] == [
        ("ascend", AttentionCGSupport.ALWAYS), ("ascend_mla", AttentionCGSupport.UNIFORM_BATCH),
        ("ascend_sfa", AttentionCGSupport.UNIFORM_BATCH), ("flash_attn_3", AttentionCGSupport.ALWAYS),
        ("flash_attn_2", AttentionCGSupport.UNIFORM_BATCH),
        ("flashinfer", AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE),
        ("no_full_graphs", AttentionCGSupport.NEVER)]


@pytest.mark.parametrize("task_updates, metadata, expected", [
    (True, "auto", AttentionPath.HOST_LISTS),  # ACL graph: capture in task groups, update after replay
    (False, "auto", AttentionPath.DEVICE_BUFFERS),  # CUDA graph: refresh device buffers before replay
    (True, "device_buffers", AttentionPath.DEVICE_BUFFERS),  # the GPU design, run on an ACL-graph engine
    (False, "device_buffers", AttentionPath.DEVICE_BUFFERS),
])
def test_the_attention_path_follows_the_engines_task_groups(task_updates, metadata, expected):
    assert resolve(M.FULL, B["ascend"], task_updates=task_updates, metadata=metadata).attention_path is expected


def test_host_lists_on_an_engine_without_task_groups_cannot_run():
    with pytest.raises(AttentionPathUnavailable, match="needs an engine that updates a captured op's host arguments"):
        resolve(M.FULL, B["ascend"], task_updates=False, metadata="host_lists")
