"""Version profiles: every rule the issue names changes behaviour under the stack, end to end.

Each test runs the same scenario text under two stacks whose rule differs and asserts the
upstream behaviour of each (docs/conformance.md, "Profiles").
"""

from __future__ import annotations

import pytest

from harness.graph.dispatcher import Dispatcher
from harness.graph.modes import CUDAGraphMode
from harness.scenario import load_scenario_text
from harness.resolve import resolve_item
from harness.session import PASSED, SKIPPED, XFAILED, preflight, run_point
from harness.stacks import DEFAULT_STACK, PROFILES, profile

BASE = """
model: {{kind: random, layers: 1}}
steps: 4
workload:
  max_num_batched_tokens: {tokens}
  requests:
    - {{prompt_len: 3, output_len: 3}}
"""


def _scenario(text: str, stack: str | None = None, tokens: int = 512):
    (point,) = load_scenario_text(text + BASE.format(tokens=tokens) + (f"stack: {stack}\n" if stack else ""))
    return point


def test_profiles_are_named_and_the_default_is_the_newest_release():
    assert DEFAULT_STACK == "v0.23.0" and profile() is PROFILES["v0.23.0"]
    assert profile(None).real and not profile("harness-compose").real
    with pytest.raises(ValueError, match="unknown stack 'v9'; known: v0.15.0rc1, v0.18.0, v0.23.0"):
        profile("v9")


def test_budget_policy_is_the_stacks_unless_the_scenario_names_one():
    text = "graph: {mode: PIECEWISE, max_num_seqs: 512}\n"
    budget = resolve_item(_scenario(text, "v0.18.0").scenario).budget
    assert budget.explanation.startswith("MAX=1800")  # legacy update_aclgraph_sizes
    assert resolve_item(_scenario(text, "v0.23.0").scenario).budget.max_num_sizes is None  # no budget after PR #9962
    own = _scenario(text + "engine: {budget_policy: none}\n", "v0.18.0").scenario
    assert resolve_item(own).budget.max_num_sizes is None


def test_off_grid_max_num_batched_tokens_by_stack():
    text = "graph: {mode: FULL, max_num_seqs: 512}\n"
    older = list(resolve_item(_scenario(text, "v0.18.0", tokens=257).scenario).capture_sizes)
    newer = list(resolve_item(_scenario(text, "v0.23.0", tokens=257).scenario).capture_sizes)
    assert older[-1] == 256 and newer[-2:] == [256, 257]


def test_off_grid_max_num_seqs_by_stack():
    text = "graph: {mode: FULL_DECODE_ONLY, max_num_seqs: 12}\n"
    assert list(resolve_item(_scenario(text, "main").scenario).capture_sizes) == [1, 2, 4, 8]
    assert list(resolve_item(_scenario(text, "main+pr16623").scenario).capture_sizes) == [1, 2, 4, 8, 12]


def test_mixed_full_keys_carry_num_reqs_on_newer_stacks():
    for stack, expected in (("v0.15.0rc1", None), ("v0.18.0", 4)):
        rules = profile(stack)
        d = Dispatcher(CUDAGraphMode.FULL, [4, 8], 1, max_num_seqs=4,
                       mixed_full_key_num_reqs=rules.mixed_full_key_num_reqs)
        decision = d.dispatch(7, 3, uniform_decode=False)
        assert decision.runtime_mode is CUDAGraphMode.FULL
        assert decision.batch_descriptor.num_reqs == (None if expected is None else min(8, expected))


def test_spec_decode_with_sp_is_refused_upstream_and_composed_by_the_harness_alternative():
    text = "graph: {mode: FULL, capture_sizes: [1, 2, 4, 8]}\nfeatures: {sp: {tp: 2}, mtp: {k: 2}}\n"
    refused = run_point(_scenario(text), backend="emulated")
    assert refused.outcome == SKIPPED
    assert "the real engine refuses to start" in refused.verdict and "both a multiple of 3" in refused.verdict
    composed = _scenario(text, "harness-compose").scenario
    assert list(resolve_item(composed).capture_sizes) == [6]
    assert preflight(_scenario(text).scenario) is None  # not a bad file: a skip at run time


def test_spec_decode_rounding_only_with_a_full_decode_routine():
    text = "graph: {{mode: {mode}, capture_sizes: [1, 2, 4, 8]}}\nfeatures: {{mtp: {{k: 2}}}}\n"
    for mode, expected in (("PIECEWISE", [1, 2, 4, 8]), ("NONE", []), ("FULL", [3, 6]),
                           ("FULL_DECODE_ONLY", [3, 6]), ("FULL_AND_PIECEWISE", [3, 6])):
        s = _scenario(text.format(mode=mode)).scenario
        assert list(resolve_item(s).capture_sizes) == expected, mode


def test_sizes_above_max_num_batched_tokens_are_dropped_and_the_report_says_so():
    text = "graph: {mode: FULL, capture_sizes: [1, 2, 4, 8, 600]}\n"
    result = run_point(_scenario(text), backend="emulated")
    assert result.outcome == PASSED
    assert result.record.capture_sizes == [1, 2, 4, 8]
    assert any("[600] dropped" in note for note in result.record.notes)
    assert any(note.startswith("stack v0.23.0:") for note in result.record.notes)


def test_piecewise_without_sp_slices_the_query_instead_of_a_dummy_request():
    text = "graph: {mode: PIECEWISE, capture_sizes: [4, 8]}\nfixes: {fia_padding: false}\n"
    upstream = run_point(_scenario(text), backend="emulated")
    assert upstream.outcome == PASSED  # the fix is not needed where the attention slices
    sliced = [s for s in upstream.record.steps if s.padding_source.startswith("sliced")]
    assert sliced and all(s.num_reqs_padded == s.num_reqs for s in sliced)  # no dummy request
    old = run_point(_scenario(text + "expect: {fail: [fia_invariant]}\n", "harness-compose"), backend="emulated")
    assert old.outcome == XFAILED


def test_stack_option_sets_only_scenarios_that_name_none():
    point = _scenario("graph: {mode: FULL, capture_sizes: [1, 2, 4]}\n")
    result = run_point(point, backend="emulated", stack="v0.18.0")
    assert result.scenario["stack"] == "v0.18.0"
    named = _scenario("graph: {mode: FULL, capture_sizes: [1, 2, 4]}\n", "main")
    assert run_point(named, backend="emulated", stack="v0.18.0").scenario["stack"] == "main"


def test_device_rules_follow_the_torch_npu_release():
    old = resolve_item(_scenario("graph: {mode: FULL, capture_sizes: [1, 2, 4]}\n", "v0.23.0").scenario).device_rules
    new = resolve_item(_scenario("graph: {mode: FULL, capture_sizes: [1, 2, 4]}\n", "main").scenario).device_rules
    assert (old.rng_in_capture, old.capture_survives_rejected_sync, old.generator_registration) == (
        False, False, "explicit")
    assert (new.rng_in_capture, new.capture_survives_rejected_sync, new.generator_registration) == (
        True, True, "lazy")
