"""The NPU backend checked without hardware: every name and keyword the harness passes to
torch_npu exists in the torch_npu releases its stack profiles model.

Each release's wheel is downloaded once (``pip download --no-deps``, into a cache outside the
repository) and read as files, never installed: torch-npu without CANN breaks ``import torch``.
The test skips, saying why, where the package index cannot be reached. What the harness uses is
read from its source (``tests/engine/npu_uses.py``), not from a list kept by hand; what a
release offers from its wheel (``tests/engine/npu_wheel.py``).
"""

from __future__ import annotations

import pytest

from tests.engine import npu_uses, npu_wheel
from tests.engine.npu_uses import Use, harness_uses
from tests.engine.npu_wheel import load_surface, parse_schema

RELEASES = npu_wheel.stack_releases()


@pytest.fixture(scope="module")
def uses() -> npu_uses.HarnessUses:
    return harness_uses()


_UNREACHABLE: list[str] = []  # once the index failed, the other releases skip at once


def _surface(version: str) -> npu_wheel.WheelSurface:
    if _UNREACHABLE:
        pytest.skip(f"torch_npu {version} not at hand: {_UNREACHABLE[0]}")
    wheel, why = npu_wheel.fetch_wheel(version, npu_wheel.cache_dir())
    if wheel is None:
        _UNREACHABLE.append(why)
        pytest.skip(f"torch_npu {version} not at hand: {why}")
    return load_surface(wheel)


@pytest.mark.parametrize("version", sorted(RELEASES), ids=lambda v: f"torch_npu-{v}")
def test_every_name_and_keyword_the_harness_passes_exists_in_the_release(version: str,
                                                                        uses: npu_uses.HarnessUses) -> None:
    surface = _surface(version)
    assert surface.version == version
    missing = [str(use) for use in uses.uses if not surface.has(use)]
    # A slot that forwards its caller's keywords takes those of its sibling (the workspace
    # queries take "the same keyword arguments" as the op they size).
    for target, where, sibling in uses.forwarded:
        passed = {u.detail for u in uses.uses if u.kind == "keyword" and u.target == sibling} - {"workspace"}
        missing += [f"{where}: {target}(..., {kw}=...) (forwarded from {sibling})"
                    for kw in sorted(passed) if not surface.has(Use("keyword", target, kw, where))]
    assert not missing, (f"torch_npu {version} (the release of stack {', '.join(RELEASES[version])}) lacks "
                         "what the harness passes it:\n" + "\n".join(missing))


def test_the_harness_side_is_read_from_the_source(uses: npu_uses.HarnessUses) -> None:
    """The reading finds what the NPU backend really passes (else the check above checks nothing)."""
    names = {u.target for u in uses.uses if u.kind == "name"}
    assert {"torch.npu.graph_task_group_begin", "torch.npu.graph_task_group_end", "torch.npu.graph_task_update_begin",
            "torch.npu.graph_task_update_end", "torch.npu.ExternalEvent", "torch.npu.NPUGraph", "torch.npu.graph",
            "torch.npu.graph_pool_handle", "torch_npu.npu_fused_infer_attention_score",
            "torch_npu._npu_fused_infer_attention_score_get_max_workspace", "torch_npu._npu_paged_attention",
            "torch_npu._npu_paged_attention_get_workspace"} <= names
    keywords = {(u.target, u.detail) for u in uses.uses if u.kind == "keyword"}
    fia, out = "torch_npu.npu_fused_infer_attention_score", "torch_npu.npu_fused_infer_attention_score.out"
    assert {(fia, "actual_seq_lengths"), (fia, "actual_seq_lengths_kv"), (fia, "softmax_lse_flag"),
            (out, "workspace"), (out, "out"), (out, "block_table"),
            ("torch_npu._npu_paged_attention", "context_lens"), ("torch.npu.graph", "pool")} <= keywords
    assert Use("overload", out, "", "harness/engine/npu.py:23").target in {u.target for u in uses.uses
                                                                         if u.kind == "overload"}
    assert {("torch.npu.NPUGraph", "capture_end"), ("torch.npu.NPUGraph", "reset")} <= {
        (u.target, u.detail) for u in uses.uses if u.kind == "method"}


def test_a_name_or_keyword_the_release_lacks_is_caught() -> None:
    surface = npu_wheel.WheelSurface(
        version="x", npu_names=["graph"], torch_npu_names=["npu_fused_infer_attention_score"],
        schemas={"npu_fused_infer_attention_score": ["query", "num_heads"],
                 "npu_fused_infer_attention_score.out": ["query", "workspace", "out"]},
        callables={"graph": (["npu_graph", "pool"], False)}, methods={"NPUGraph": ["reset"]})
    where = "harness/engine/npu.py:1"
    assert surface.has(Use("name", "torch.npu.graph", "", where))
    assert not surface.has(Use("name", "torch.npu.graph_task_group_begin", "", where))
    assert not surface.has(Use("name", "torch_npu._npu_paged_attention", "", where))
    assert surface.has(Use("overload", "torch_npu.npu_fused_infer_attention_score.out", "", where))
    assert not surface.has(Use("overload", "torch_npu.npu_fused_infer_attention_score.default_out", "", where))
    assert surface.has(Use("keyword", "torch_npu.npu_fused_infer_attention_score.out", "out", where))
    assert not surface.has(Use("keyword", "torch_npu.npu_fused_infer_attention_score", "out", where))
    assert not surface.has(Use("keyword", "torch.npu.graph", "auto_dispatch", where))
    assert not surface.has(Use("method", "torch.npu.NPUGraph", "capture_end", where))


def test_schema_strings_are_read_with_their_argument_names() -> None:
    schema = ("npu_fused_infer_attention_score.out(Tensor query, *, Tensor? atten_mask=None, "
              "SymInt[]? actual_seq_lengths=None, int[2] pads=[0, 0], str input_layout=\"BSH\", "
              "Tensor? workspace=None, Tensor[] out) -> (Tensor, Tensor)")
    assert parse_schema(schema) == ("npu_fused_infer_attention_score.out",
                                    ["query", "atten_mask", "actual_seq_lengths", "pads", "input_layout",
                                     "workspace", "out"])
    assert parse_schema("f(Tensor(a!) out, Tensor x) -> ()") == ("f", ["out", "x"])
    assert parse_schema("f(Tensor x)") is None  # no return: not a schema
    assert parse_schema("not a schema") is None
    header = "TORCH_NPU_API void op(const at::Tensor &query, const c10::optional<at::Tensor> &workspace);"
    assert npu_wheel._header_parameters(header, {"op"}) == {"op": ["query", "workspace"]}
