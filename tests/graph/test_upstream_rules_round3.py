"""The upstream rules of issue 27 (conformance, third round), one test per rule, the expected
values taken from upstream's own tests or from the upstream lines named (docs/conformance.md)."""

from __future__ import annotations

import pytest

from harness.engine.errors import StreamBudgetError
from harness.graph.capture_errors import GUIDANCE, OLD_HDK_GUIDANCE, capture_error_text
from harness.graph.capture_sizes import EngineRefusal, needs_tp_aligned_sizes, resolve_sizes
from harness.graph.dispatcher import BatchDescriptor as K, Dispatcher
from harness.graph.metadata import ScheduledRequest
from harness.graph.modes import CUDAGraphMode as M, resolve_mode
from harness.graph.plan import PlannerConfig, StepPlanner
from harness.graph.stream_budget import legacy_stream_budget
from harness.stacks import PROFILES


class TestModeResolution:
    """Point 2 and point 7: the mode a release runs for the mode asked for."""

    @pytest.mark.parametrize("stack, expected", [("v0.15.0rc1", M.PIECEWISE), ("v0.18.0", M.PIECEWISE),
                                                 ("v0.23.0", M.FULL_AND_PIECEWISE), ("main", M.FULL_AND_PIECEWISE)])
    def test_full_and_piecewise_is_piecewise_before_pr9572(self, stack, expected):
        # platform.py at v0.15.0rc1 / v0.18.0: `if cudagraph_mode == FULL_AND_PIECEWISE: cudagraph_mode = PIECEWISE`
        rules = PROFILES[stack]
        resolved = resolve_mode(M.FULL_AND_PIECEWISE, full_and_piecewise=rules.full_and_piecewise)
        assert resolved.mode is expected and resolved.changed == (expected is M.PIECEWISE)
        if resolved.changed:
            assert "PR #9572" in resolved.notes[0] and "no log line" in resolved.notes[0]

    @pytest.mark.parametrize("mode", [M.NONE, M.PIECEWISE, M.FULL, M.FULL_DECODE_ONLY])
    def test_other_modes_are_kept_by_every_release(self, mode):
        for rules in PROFILES.values():
            assert resolve_mode(mode, full_and_piecewise=rules.full_and_piecewise).mode is mode

    @pytest.mark.parametrize("mode, expected", [(M.PIECEWISE, M.NONE), (M.FULL_AND_PIECEWISE, M.NONE),
                                                (M.FULL, M.FULL), (M.FULL_DECODE_ONLY, M.FULL_DECODE_ONLY)])
    def test_piecewise_graphs_need_vllm_compile(self, mode, expected):
        # vLLM VllmConfig.__post_init__: requires_piecewise_compilation() and mode != VLLM_COMPILE -> NONE
        resolved = resolve_mode(mode, compilation_mode="NONE")
        assert resolved.mode is expected
        if expected is M.NONE:
            assert resolved.notes[0].startswith(
                f"Cudagraph mode {mode.name} is not compatible with compilation mode 0.Overriding to NONE.")

    def test_torch_compile_modes_on_the_npu_by_release(self):
        line_v023 = "NPU does not support compilation mode. mode=1, action: setting CUDAGraphMode to NONE."
        v023 = resolve_mode(M.FULL, compilation_mode="STOCK_TORCH_COMPILE", npu_unsupported_compilation="graphs_off")
        assert v023.mode is M.NONE and v023.notes[0].startswith(line_v023)
        v018 = resolve_mode(M.FULL, compilation_mode="STOCK_TORCH_COMPILE", npu_unsupported_compilation="graphs_off_v0.18")
        assert v018.mode is M.NONE and v018.notes[0].startswith("NPU does not support 1 compilation mode. Setting CUDAGraphMode to NONE")
        main = resolve_mode(M.FULL, compilation_mode="DYNAMO_TRACE_ONCE", npu_unsupported_compilation="compile_off")
        assert main.mode is M.FULL and "PR #13692" in main.notes[0]
        assert resolve_mode(M.FULL, compilation_mode="STOCK_TORCH_COMPILE", platform="gpu").mode is M.FULL
        # the piecewise rule comes first: a torch.compile mode turns PIECEWISE into NONE on every release
        assert resolve_mode(M.PIECEWISE, compilation_mode="STOCK_TORCH_COMPILE",
                            npu_unsupported_compilation="compile_off").mode is M.NONE


    def test_the_attention_backend_has_the_last_word(self):
        # the capability step comes after the platform's rules, as vLLM's model runner resolves
        # (resolve_cudagraph_mode_and_sizes) after check_and_update_config
        from harness.resolve import resolve_item
        from harness.scenario import load_scenario_text

        def item(mode, stack, backend):
            (point,) = load_scenario_text(
                f"graph: {{mode: {mode}, capture_sizes: [1, 2], attention_backend: {backend}}}\nstack: {stack}\n"
                "workload: {requests: [{prompt_len: 2, output_len: 2}]}\n")
            return resolve_item(point.scenario)

        full = item("FULL", "v0.23.0", "ascend_mla")  # UNIFORM_BATCH: no full mixed graphs
        assert (full.graph.requested, full.mode) == (M.FULL, M.FULL_AND_PIECEWISE)
        assert any("AscendMLABackend" in n for n in full.notes)
        old = item("FULL_AND_PIECEWISE", "v0.18.0", "ascend_mla")  # the platform's downgrade first
        assert (old.graph.requested, old.mode) == (M.FULL_AND_PIECEWISE, M.PIECEWISE)
        assert [n for n in old.notes if n.startswith("FULL_AND_PIECEWISE -> PIECEWISE")]
        assert not any("AscendMLABackend" in n for n in old.notes)  # the backend saw PIECEWISE: nothing to say


class TestUpstreamDispatcherTest:
    """vLLM ``tests/v1/cudagraph/test_cudagraph_dispatch.py::test_dispatcher`` restated: capture
    sizes [1, 8], max_num_seqs 8, q = 1, no LoRA; its five numbered cases per mode."""

    @pytest.mark.parametrize("mode", [M.NONE, M.PIECEWISE, M.FULL, M.FULL_DECODE_ONLY, M.FULL_AND_PIECEWISE])
    def test_dispatcher(self, mode):
        d = Dispatcher(mode, [1, 8], 1, max_num_seqs=8, mixed_full_key_num_reqs=True)
        piecewise = mode in (M.PIECEWISE, M.FULL_AND_PIECEWISE)
        assert len(d.piecewise_keys) == (2 if piecewise else 0)
        assert len(d.full_keys) == (0 if mode in (M.NONE, M.PIECEWISE) else 2)
        # 1. non-uniform batch of 8: FULL exact key with num_reqs; piecewise relaxed; else NONE
        got = d.dispatch(8, 8, False)
        if mode is M.FULL:
            assert (got.runtime_mode, got.batch_descriptor) == (M.FULL, K(8, 8, False))
        elif piecewise:
            assert (got.runtime_mode, got.batch_descriptor) == (M.PIECEWISE, K(8, None, False))
        else:
            assert got.runtime_mode is M.NONE
        # 2. uniform decode batch of 8
        got = d.dispatch(8, 8, True)
        expected = {M.FULL: (M.FULL, K(8, 8, False)), M.FULL_DECODE_ONLY: (M.FULL, K(8, 8, True)),
                    M.FULL_AND_PIECEWISE: (M.FULL, K(8, 8, True)), M.PIECEWISE: (M.PIECEWISE, K(8, None, False))}
        if mode in expected:
            assert (got.runtime_mode, got.batch_descriptor) == expected[mode]
        else:
            assert got.runtime_mode is M.NONE
        # 3. no key: 15 tokens
        got = d.dispatch(15, 15, False)
        assert (got.runtime_mode, got.batch_descriptor, got.num_tokens_padded) == (M.NONE, None, 15)
        # 4. invalid_modes={FULL}: a fallback (cascade attention)
        got = d.dispatch(8, 8, False, invalid_modes={M.FULL})
        if piecewise:
            assert (got.runtime_mode, got.batch_descriptor) == (M.PIECEWISE, K(8, None, False))
        else:
            assert got.runtime_mode is M.NONE
        # 5. valid_modes={NONE} always returns NONE even when keys exist (unpadded)
        got = d.dispatch(8, 8, False, valid_modes={M.NONE})
        assert (got.runtime_mode, got.num_tokens_padded) == (M.NONE, 8)

    def test_allowed_modes_must_not_be_empty_and_a_miss_needs_none(self):
        d = Dispatcher(M.FULL_DECODE_ONLY, [1, 8], 1, max_num_seqs=8)
        with pytest.raises(ValueError, match="No allowed cudagraph modes"):
            d.dispatch(8, 8, False, valid_modes={M.FULL}, invalid_modes={M.FULL})
        # a mixed batch has no FULL_DECODE_ONLY graph: with NONE not allowed, vLLM asserts
        with pytest.raises(ValueError, match="NONE is not in allowed_modes"):
            d.dispatch(8, 8, False, valid_modes={M.FULL})

    def test_uniform_full_key_keeps_num_reqs_capped_at_max_num_seqs(self):
        # vLLM _create_padded_batch_descriptor (v0.18 on): num_reqs = min(T // q, max_num_seqs)
        d = Dispatcher(M.FULL_AND_PIECEWISE, [2, 4, 8], 2, max_num_seqs=4)
        assert d.dispatch(8, 4, True).batch_descriptor == K(8, 4, True)
        assert K(8, 4, True) in d.full_keys and d._uniform_key(16) == K(16, 4, True)

    def test_mode_none_has_no_capture_sizes(self):
        d = Dispatcher(M.NONE, [], 1)
        assert d.capture_sizes == () and d.capture_keys() == []
        assert d.dispatch(5, 2, False).runtime_mode is M.NONE
        with pytest.raises(ValueError, match="needs capture sizes"):
            Dispatcher(M.PIECEWISE, [], 1)


class TestSpecDecodeUniform:
    """Point 4: vLLM Ascend ``tests/ut/worker/a2/test_model_runner_v1_with_device.py`` spec-decode
    cases (k = 3, three requests of 4 scheduled tokens), with ``is_all_decode`` from PR #6835."""

    @pytest.mark.parametrize("computed, needs_computed, uniform", [
        ([5, 10, 15], True, True),     # spec_decode_all_decode
        ([0, 0, 0], True, False),      # spec_decode_all_prefill
        ([0, 5, 10], True, False),     # spec_decode_mixed
        ([0, 5, 10], False, True),     # v0.15.0rc1: no is_all_decode
    ])
    def test_uniform_decode_needs_computed_tokens(self, computed, needs_computed, uniform):
        planner = StepPlanner(PlannerConfig(M.FULL_DECODE_ONLY, (4, 8, 12), 8, 4, 16, 4, num_speculative_tokens=3,
                                            spec_decode_needs_computed=needs_computed))
        requests = [ScheduledRequest(f"r{i}", c, 4, (1, 2)) for i, c in enumerate(computed)]
        assert planner.is_uniform(planner.metadata(requests), requests) is uniform

    def test_without_spec_decode_a_fresh_one_token_prompt_is_uniform(self):
        planner = StepPlanner(PlannerConfig(M.FULL_DECODE_ONLY, (1, 2, 4), 8, 1, 16, 4))
        requests = [ScheduledRequest("r0", 0, 1, (1,)), ScheduledRequest("r1", 4, 1, (2,))]
        assert planner.is_uniform(planner.metadata(requests), requests)


class TestV018StreamBudget:
    """Point 2: ``update_aclgraph_sizes`` at vLLM Ascend v0.18.0 (and v0.15.0rc1), line by line."""

    SIZES = list(range(1, 52))  # 51 sizes: the default grid at 512

    def test_no_full_and_piecewise_deduction(self):
        # v0.18.0 never sees FULL_AND_PIECEWISE here (the platform made it PIECEWISE before), and
        # its function has no deduction: floor(1800 / 41) = 43; PR #9572's: floor((1800 - 51) / 41) = 42
        old = legacy_stream_budget(self.SIZES, num_layers=40, mode=M.FULL_AND_PIECEWISE, release="v0.18.0")
        new = legacy_stream_budget(self.SIZES, num_layers=40, mode=M.FULL_AND_PIECEWISE, release="pr9572")
        assert (old.max_num_sizes, old.max_graphs) == (43, 1800)
        assert (new.max_num_sizes, new.max_graphs) == (42, 1749)

    def test_one_size_left_crashes_the_release(self):
        # step = (len - 1) / (n - 1): n == 1 divides by zero; n == 0: indices == [] and indices[0] = 0 fails
        with pytest.raises(EngineRefusal, match="n=1 of 51.*ZeroDivisionError: division by zero"):
            legacy_stream_budget(self.SIZES, num_layers=1000, mode=M.PIECEWISE, release="v0.18.0")
        with pytest.raises(EngineRefusal, match="n=0 of 51.*IndexError: list assignment index out of range"):
            legacy_stream_budget(self.SIZES, num_layers=2000, mode=M.PIECEWISE, release="v0.18.0")
        # PR #9572's guard keeps the largest size instead
        assert legacy_stream_budget(self.SIZES, num_layers=1000, mode=M.PIECEWISE).sizes_kept == [51]
        # enough room for every size: no division at all, on either release
        assert legacy_stream_budget([8], num_layers=1000, mode=M.PIECEWISE, release="v0.18.0").sizes_kept == [8]

    def test_same_formula_otherwise(self):
        for kwargs in (dict(num_layers=12, hccl_mode="AIV"), dict(num_layers=94, tp=8), dict(num_layers=28, pcp=2),
                       dict(num_layers=27, dp=2, tp=2, hccl_mode="AIV", is_moe=True, expert_parallel=True)):
            old = legacy_stream_budget(list(range(1, 151)), mode=M.PIECEWISE, release="v0.18.0", **kwargs)
            new = legacy_stream_budget(list(range(1, 151)), mode=M.PIECEWISE, **kwargs)
            assert old.sizes_kept == new.sizes_kept


class TestCaptureSizeRules:
    def test_mode_none_has_no_sizes_and_no_size_error(self):
        # vLLM _set_cudagraph_sizes: cudagraph_mode NONE -> cudagraph_capture_sizes [], max 0; none of the
        # errors of the other modes (SP leaving nothing, every size above max_num_batched_tokens, a user
        # max inconsistent with the list) can happen
        for kwargs in (dict(capture_sizes=[1, 3], tp=2, sequence_parallel=True),
                       dict(capture_sizes=[600], max_num_batched_tokens=512),
                       dict(capture_sizes=[1, 2, 4], max_capture_size=8)):
            with pytest.raises(ValueError):
                resolve_sizes(max_num_seqs=8, **kwargs)
            none = resolve_sizes(max_num_seqs=8, graphs=False, **kwargs)
            assert none.sizes == [] and "max_cudagraph_capture_size 0" in none.notes[0]

    @pytest.mark.parametrize("layout, layouts_rule, expected", [
        (dict(sequence_parallel=True), False, True),
        (dict(sequence_parallel=False, shared_expert_dp=True), False, False),  # v0.23.0
        (dict(sequence_parallel=False, shared_expert_dp=True), True, True),    # main, PR #13946
        (dict(sequence_parallel=False, dsa_cp=True), True, True),
        (dict(sequence_parallel=False), True, False),
    ])
    def test_tp_aligned_sizes_for_token_sharding_layouts(self, layout, layouts_rule, expected):
        # vLLM Ascend main _setup_compile_backend: requires_tp_aligned_capture_sizes =
        # enable_sp or enable_shared_expert_dp or enable_dsa_cp, with tp > 1 and graphs on
        assert needs_tp_aligned_sizes(2, tp_aligned_layouts=layouts_rule, **layout) is expected
        assert not needs_tp_aligned_sizes(1, tp_aligned_layouts=layouts_rule, **layout)
        assert not needs_tp_aligned_sizes(2, tp_aligned_layouts=layouts_rule, graphs=False, **layout)
        assert PROFILES["main"].tp_aligned_layouts and not PROFILES["v0.23.0"].tp_aligned_layouts


class TestCaptureErrorGuidance:
    """Point 8: ``vllm_ascend/compilation/acl_graph.py`` at v0.23.0 and main."""

    RUNTIME = "error code 207008: Stream resources are insufficient (capture of g needs 1 stream(s); 32 of 32 in use)"

    def test_v0_23_0_text(self):
        text = capture_error_text(self.RUNTIME, "pr9962")
        assert text == (
            "ACL graph capture failed with a known stream-resource exhaustion signature. Consider upgrading to a "
            "newer HDK/CANN stack, reducing cudagraph_capture_sizes, lowering max_cudagraph_capture_size, "
            "preferring FULL or FULL_DECODE_ONLY for mostly uniform decode workloads, or temporarily disabling "
            "graph mode to confirm the failure is capture-related.\nOriginal error:\n" + self.RUNTIME)

    def test_main_text_and_the_old_hdk_signature(self):
        assert capture_error_text(self.RUNTIME, "pr10555") == f"{GUIDANCE['pr10555']}\nOriginal error:\n{self.RUNTIME}"
        assert "upgrading" not in GUIDANCE["pr10555"]
        old = "ACL error: Alloc sq cq fail, 207008"
        assert capture_error_text(old, "pr10555") == f"{OLD_HDK_GUIDANCE}\nOriginal error:\n{old}"
        assert capture_error_text(old, "pr9962") is None  # v0.23.0 has no such marker ("stream resource" absent)

    @pytest.mark.parametrize("message, matches", [
        ("INSUFFICIENT_STREAM_RESOURCES", True),
        ("rtStreamCreate failed: 207008 stream resource exhausted", True),
        ("207008", False),
        ("operation not permitted when stream is capturing", False),
    ])
    def test_the_signature(self, message, matches):
        assert (capture_error_text(message, "pr9962") is not None) is matches

    def test_releases_before_pr9962_keep_the_runtime_error(self):
        assert capture_error_text(self.RUNTIME, None) is None
        assert PROFILES["v0.18.0"].capture_error_guidance is None
        assert PROFILES["v0.23.0"].capture_error_guidance == "pr9962"

    def test_the_rewritten_error_is_still_a_stream_budget_error(self):
        original = StreamBudgetError(1, 32, 32, "g")
        guided = original.reworded(capture_error_text(str(original), "pr9962"))
        assert type(guided) is StreamBudgetError and guided.needed == 1 and guided.pool_size == 32
        assert str(guided).startswith(GUIDANCE["pr9962"]) and str(guided).endswith(str(original))
