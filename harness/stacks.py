"""Version profiles: which release of the stack (vLLM, vLLM Ascend, torch_npu) a run models.

Several rules of the pipeline changed between releases (docs/conformance.md, "Profiles"), and
users run several stacks at once. A :class:`StackProfile` is the set of those rules as plain
data; a scenario names one (``stack: v0.18.0``), ``--stack`` sets it for every scenario that
names none, and the session hands each rule to the layer that owns it: capture sizes, the
stream budget, the dispatcher and the padding in :mod:`harness.graph`, the emulator's torch_npu
rules as engine options (:class:`harness.engine.DeviceRules`), so neither the domain nor the
engine knows profiles exist.

A leaf module (imports nothing of the harness) so that the scenario schema can list the names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["DEFAULT_STACK", "PROFILES", "StackProfile", "profile", "stack_names"]


@dataclass(frozen=True)
class StackProfile:
    """The version-dependent rules of one stack. Each field names the upstream change it follows.

    * ``mixed_full_key_num_reqs``: a mixed FULL batch descriptor carries
      ``num_reqs = min(T, max_num_seqs)`` (vLLM PR #34043, adopted by vLLM Ascend PR #7144 for
      vLLM v0.16.0); before it, ``None`` (``relax_for_mixed_batch_cudagraphs``).
    * ``capture_max_num_seqs``: the default grid gets ``max_num_seqs * q`` added when that is off
      the grid (vLLM Ascend PR #16623, open; issue #16049); else those decode batches run eager.
    * ``capture_max_num_batched_tokens``: ``max_num_batched_tokens`` off the grid is appended to
      the default grid (vLLM PR #40734); before it the grid is cut at the last size below (257 ->
      256).
    * ``budget_policy``: the legacy ``update_aclgraph_sizes`` budget, or none (vLLM Ascend PR
      #9962); a scenario's ``engine.budget_policy`` overrides it.
    * ``spec_sp_multiple``: spec decode with SP rounds sizes to ``max(q, tp)`` and the engine
      refuses to start when that is not a common multiple (``"max"``, vLLM
      ``adjust_cudagraph_sizes_for_spec_decode``), or to ``lcm(q, tp)`` (``"lcm"``: the
      harness's own composition, no real stack).
    * ``full_and_piecewise``: the platform keeps FULL_AND_PIECEWISE; False: vLLM Ascend's
      ``check_and_update_config`` turns it into PIECEWISE, silently (``platform.py`` up to
      v0.20.2rc1; vLLM Ascend PR #9572, 1bb58b5ff1, first tag v0.21.0rc1).
    * ``legacy_budget``: which ``update_aclgraph_sizes`` the ``legacy`` budget is: ``"pr9572"``
      (``utils.py`` at 5f2ef5a0b2^: FULL_AND_PIECEWISE deducts its full graphs, clamped at 0, and
      ``n <= 1`` keeps the largest size) or ``"v0.18.0"`` (no deduction, and ``n <= 1`` with more
      sizes than ``n`` crashes the engine at start-up: ``ZeroDivisionError`` or ``IndexError``).
    * ``dp_padding``: DP agreement on each rank's bucket-padded count and its own mode (min):
      ``"graph_ranks"`` (vLLM Ascend PR #7297: a rank whose own mode is eager keeps its own count;
      the re-dispatch is restricted to the agreed mode, ``valid_modes``, PR #6944) or
      ``"all_ranks"`` (every rank pads to the max; the re-dispatch only leaves FULL out when the
      agreed mode is not FULL, ``disable_full``).
    * ``spec_decode_needs_computed``: under speculative decoding a batch is uniform decode only
      when every request has computed tokens already (vLLM Ascend PR #6835: a fresh prompt of
      exactly ``1 + k`` tokens is a prefill).
    * ``capture_error_guidance``: the text vLLM Ascend's ``ACLGraphWrapper`` puts before a
      stream-resource capture failure: ``None`` (none: the runtime's error as it is), ``"pr9962"``
      (v0.21.0rc1 to v0.23.0) or ``"pr10555"`` (main: reworded, plus the old-HDK signature).
    * ``npu_unsupported_compilation``: a compilation mode other than NONE and VLLM_COMPILE on the
      NPU turns graphs off (``"graphs_off"``; ``"graphs_off_v0.18"`` logs the older line) or, on
      main since PR #13692 (054bd698ab), turns compilation off and keeps the FULL modes
      (``"compile_off"``); see :func:`harness.graph.modes.resolve_mode`.
    * ``tp_aligned_layouts``: shared-expert DP and DSA-CP also keep only TP-aligned capture sizes,
      as SP does (vLLM Ascend PR #13946, 92616f3a64, main only).
    * ``pad_requests_without_full``: PIECEWISE/NONE runtime without SP also pads the requests
      (one dummy request; the harness before issue 10, no real stack). False: upstream since
      vLLM Ascend PR #6475: no padded request, attention slices the query to the real tokens.
    * torch_npu: ``rng_in_capture`` (random ops in a default ``NPUGraph`` capture, commit
      8b8d865aa, torch_npu v2.11.0 and later), ``capture_survives_rejected_sync``
      (``capture_end`` after a rejected ``.item()``, commit 882896a6c, master and the v2.12.0
      branch), ``generator_registration`` (lazy since commit 42c2f77d7, else explicit).
    """

    name: str
    summary: str
    mixed_full_key_num_reqs: bool
    capture_max_num_seqs: bool
    capture_max_num_batched_tokens: bool
    budget_policy: Literal["legacy", "none"]
    spec_sp_multiple: Literal["max", "lcm"]
    pad_requests_without_full: bool
    full_and_piecewise: bool
    legacy_budget: Literal["v0.18.0", "pr9572"]
    dp_padding: Literal["all_ranks", "graph_ranks"]
    spec_decode_needs_computed: bool
    capture_error_guidance: Literal["pr9962", "pr10555"] | None
    tp_aligned_layouts: bool
    npu_unsupported_compilation: Literal["graphs_off_v0.18", "graphs_off", "compile_off"]
    rng_in_capture: bool
    capture_survives_rejected_sync: bool
    generator_registration: Literal["lazy", "explicit"]
    real: bool = True  # False: a harness alternative, not a release anyone runs


_V0_15 = StackProfile(
    name="v0.15.0rc1",
    summary="vLLM Ascend v0.15.0rc1 (2026-02-27), vLLM v0.15.0, torch_npu 2.9.0",
    mixed_full_key_num_reqs=False, capture_max_num_seqs=False, capture_max_num_batched_tokens=False,
    budget_policy="legacy", spec_sp_multiple="max", pad_requests_without_full=False,
    full_and_piecewise=False, legacy_budget="v0.18.0", dp_padding="all_ranks", spec_decode_needs_computed=False,
    capture_error_guidance=None, tp_aligned_layouts=False, npu_unsupported_compilation="graphs_off_v0.18",
    rng_in_capture=False, capture_survives_rejected_sync=False, generator_registration="explicit",
)
_V0_18 = StackProfile(
    name="v0.18.0",
    summary="vLLM Ascend v0.18.0 (2026-04-30), its vLLM release, torch_npu 2.9.0",
    mixed_full_key_num_reqs=True, capture_max_num_seqs=False, capture_max_num_batched_tokens=False,
    budget_policy="legacy", spec_sp_multiple="max", pad_requests_without_full=False,
    full_and_piecewise=False, legacy_budget="v0.18.0", dp_padding="graph_ranks", spec_decode_needs_computed=True,
    capture_error_guidance=None, tp_aligned_layouts=False, npu_unsupported_compilation="graphs_off_v0.18",
    rng_in_capture=False, capture_survives_rejected_sync=False, generator_registration="explicit",
)
_V0_23 = StackProfile(
    name="v0.23.0",
    summary="vLLM Ascend v0.23.0 (2026-08-17, the newest release), its vLLM release, torch_npu 2.10.0.post4",
    mixed_full_key_num_reqs=True, capture_max_num_seqs=False, capture_max_num_batched_tokens=True,
    budget_policy="none", spec_sp_multiple="max", pad_requests_without_full=False,
    full_and_piecewise=True, legacy_budget="pr9572", dp_padding="graph_ranks", spec_decode_needs_computed=True,
    capture_error_guidance="pr9962", tp_aligned_layouts=False, npu_unsupported_compilation="graphs_off",
    rng_in_capture=False, capture_survives_rejected_sync=False, generator_registration="explicit",
)
_MAIN = StackProfile(
    name="main",
    summary="vLLM Ascend main (182b75ea84, 2026-08-22) with torch_npu master (9e73e708ab, the 2.12 line)",
    mixed_full_key_num_reqs=True, capture_max_num_seqs=False, capture_max_num_batched_tokens=True,
    budget_policy="none", spec_sp_multiple="max", pad_requests_without_full=False,
    full_and_piecewise=True, legacy_budget="pr9572", dp_padding="graph_ranks", spec_decode_needs_computed=True,
    capture_error_guidance="pr10555", tp_aligned_layouts=True, npu_unsupported_compilation="compile_off",
    rng_in_capture=True, capture_survives_rejected_sync=True, generator_registration="lazy",
)
_MAIN_PR16623 = StackProfile(
    name="main+pr16623",
    summary="main with vLLM Ascend PR #16623 applied (open): the off-grid max_num_seqs ceiling captured",
    mixed_full_key_num_reqs=True, capture_max_num_seqs=True, capture_max_num_batched_tokens=True,
    budget_policy="none", spec_sp_multiple="max", pad_requests_without_full=False,
    full_and_piecewise=True, legacy_budget="pr9572", dp_padding="graph_ranks", spec_decode_needs_computed=True,
    capture_error_guidance="pr10555", tp_aligned_layouts=True, npu_unsupported_compilation="compile_off",
    rng_in_capture=True, capture_survives_rejected_sync=True, generator_registration="lazy",
)
_HARNESS_COMPOSE = StackProfile(
    name="harness-compose",
    summary="not a release: v0.23.0 with the harness's own rules from before issue 10 "
            "(SP x MTP sizes composed to lcm(q, tp), a dummy request in every PIECEWISE/NONE batch)",
    mixed_full_key_num_reqs=True, capture_max_num_seqs=False, capture_max_num_batched_tokens=True,
    budget_policy="none", spec_sp_multiple="lcm", pad_requests_without_full=True,
    full_and_piecewise=True, legacy_budget="pr9572", dp_padding="graph_ranks", spec_decode_needs_computed=True,
    capture_error_guidance="pr9962", tp_aligned_layouts=False, npu_unsupported_compilation="graphs_off",
    rng_in_capture=False, capture_survives_rejected_sync=False, generator_registration="explicit",
    real=False,
)

#: Every profile by name, oldest release first, then the alternatives.
PROFILES: dict[str, StackProfile] = {
    p.name: p for p in (_V0_15, _V0_18, _V0_23, _MAIN, _MAIN_PR16623, _HARNESS_COMPOSE)
}
#: The newest release: what a scenario that names no stack models, unless ``--stack`` says otherwise.
DEFAULT_STACK = _V0_23.name


def stack_names() -> list[str]:
    return list(PROFILES)


def profile(name: str | None = None) -> StackProfile:
    """The profile called ``name`` (None: the default). ValueError lists the known names."""
    if name is None:
        name = DEFAULT_STACK
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown stack {name!r}; known: {', '.join(PROFILES)}") from None
