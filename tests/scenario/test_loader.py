"""harness.scenario: schema defaults, matrix expansion, located errors, overrides, JSON schema."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.scenario import (
    Scenario,
    ScenarioError,
    ScenarioFileError,
    apply_overrides,
    export_json_schema,
    load_scenario_file,
    load_scenario_text,
    modes_of,
    parse_override,
    render_id,
)

MINIMAL = """\
workload:
  requests:
    - {prompt_len: 5, output_len: 3}
"""


def write(tmp_path: Path, text: str, name: str = "case.yaml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def errors_of(tmp_path: Path, text: str, **kw) -> list[ScenarioError]:
    p = write(tmp_path, text)
    with pytest.raises(ScenarioFileError) as info:
        load_scenario_file(p, **kw)
    for e in info.value.errors:
        assert e.path == str(p)
    return info.value.errors


def only(errs: list[ScenarioError]) -> ScenarioError:
    assert len(errs) == 1, "\n".join(map(str, errs))
    return errs[0]


# ------------------------------------------------------------------------------------- loading


def test_minimal_file_gets_defaults(tmp_path):
    p = write(tmp_path, MINIMAL, "small_decode.yaml")
    (pt,) = load_scenario_file(p)
    s = pt.scenario
    assert pt.id == "" and pt.axes == {} and pt.display_name == "small_decode"
    assert pt.source.path == str(p) and pt.source.line == 1
    assert s.name == "small_decode" and s.description == ""
    m = s.model
    assert (m.kind, m.layers, m.hidden_size, m.num_heads, m.num_kv_heads, m.head_dim) == (
        "canary", 2, 64, 4, 2, 16,
    )
    assert (m.vocab_size, m.dtype, m.seed, m.block_size, m.num_blocks, m.max_model_len) == (
        512, "float32", 0, 16, 128, 512,
    )
    g = s.graph
    assert (g.mode, g.capture_sizes, g.max_num_seqs, g.num_speculative_tokens) == ("FULL", None, 8, 0)
    assert (g.platform, g.max_capture_size, g.warmup_runs) == ("npu", None, 1)
    assert (g.attention_backend, g.attention_metadata, g.async_scheduling) == ("ascend", "auto", False)
    w = s.workload
    assert w.steps is None and w.max_num_batched_tokens == 512 and w.prompt_seed == 0
    (r,) = w.requests
    assert (r.prompt_len, r.output_len, r.arrival_step, r.repeat) == (5, 3, 0, 1)
    assert s.fixes.model_dump() == dict.fromkeys(
        ["device_placement", "fia_padding", "host_param_update", "static_inputs", "refresh_device_buffers",
         "sync_before_replay", "sp_padding", "dp_sync",
         "drafter_unpadded", "drafter_param_update", "cp_kv_padding"], True)
    f = s.features
    assert (f.sp.tp, f.dp.size, f.dp.batches, f.mtp.k, f.cp.size) == (1, 1, "equal", 0, 1)
    assert s.fia_contract == "strict" and s.tolerance is None and s.steps == 16
    e = s.engine
    assert (e.stream_pool, e.streams_per_graph, e.budget_policy, e.hccl_mode) == (
        2048, 1, None, "default")  # budget_policy None: the stack's
    assert s.stack is None  # the default stack, or --stack
    assert s.expect.outcome == "pass" and s.expect.failing_checks == frozenset()
    assert s.matrix is None and s.matrix_exclude == []
    assert modes_of(pt) == "FULL"


def test_full_file_normalises(tmp_path):
    p = write(tmp_path, """\
        name: fia_bucket
        graph:
          mode: full_decode_only
          capture_sizes: [8, 2, 4, 2, 1]
          max_capture_size: 8
          num_speculative_tokens: 1
        workload:
          steps:
            - [{req: a, new_tokens: 4}, {req: 1, new_tokens: 1}]
            - [{req: a, new_tokens: 1}]
        tolerance: {atol: 0.001}
        expect:
          fail: [fia_invariant, equality]
          reason: dummy-request padding switched off
        fixes: {fia_padding: false}
        """)
    (pt,) = load_scenario_file(p)
    s = pt.scenario
    assert s.name == "fia_bucket" and pt.display_name == "fia_bucket"
    assert s.graph.mode == "FULL_DECODE_ONLY"
    assert s.graph.capture_sizes == [1, 2, 4, 8]
    assert s.features.mtp.k == 1  # follows graph.num_speculative_tokens
    assert s.workload.requests is None and s.workload.steps[0][1].req == 1
    assert s.tolerance.atol == 0.001 and s.tolerance.rtol == 0.0
    assert s.expect.outcome == "fail"
    assert s.expect.failing_checks == {"fia_invariant", "equality"}
    assert s.fixes.fia_padding is False and s.fixes.static_inputs is True


def test_mtp_k_is_mirrored_into_graph():
    (pt,) = load_scenario_text(MINIMAL + "features: {mtp: {k: 2}}\n")
    assert pt.scenario.graph.num_speculative_tokens == 2 and pt.scenario.features.mtp.k == 2


def test_expect_skip():
    (pt,) = load_scenario_text(MINIMAL + "expect: {skip: CP with SP unsupported}\n")
    assert pt.scenario.expect.outcome == "skip"
    assert pt.scenario.expect.skip == "CP with SP unsupported"


# -------------------------------------------------------------------------------------- matrix


MATRIX = MINIMAL + """\
matrix:
  graph.mode: [FULL, piecewise, FULL_DECODE_ONLY]
  features.sp.tp: [1, 2]
  fixes.fia_padding: [true, false]
matrix_exclude:
  - {graph.mode: piecewise, fixes.fia_padding: false}
  - {features.sp.tp: 2, graph.mode: FULL_DECODE_ONLY}
"""


def test_matrix_cross_product_ids_and_excludes(tmp_path):
    points = load_scenario_file(write(tmp_path, MATRIX, "mx.yaml"))
    ids = [p.id for p in points]
    assert ids == [
        "FULL-tp1-fia_padding",
        "FULL-tp1-no_fia_padding",
        "FULL-tp2-fia_padding",
        "FULL-tp2-no_fia_padding",
        "PIECEWISE-tp1-fia_padding",
        "PIECEWISE-tp2-fia_padding",
        "FULL_DECODE_ONLY-tp1-fia_padding",
        "FULL_DECODE_ONLY-tp1-no_fia_padding",
    ]
    p = points[3]
    assert p.axes == {"graph.mode": "FULL", "features.sp.tp": 2, "fixes.fia_padding": False}
    assert p.scenario.features.sp.tp == 2 and p.scenario.fixes.fia_padding is False
    assert p.scenario.matrix is None and p.scenario.matrix_exclude == []
    assert p.display_name == "mx[FULL-tp2-no_fia_padding]"
    assert p.source.line == 4  # the `matrix:` line
    assert [modes_of(q) for q in points].count("PIECEWISE") == 2


def test_id_rendering():
    assert render_id({"graph.mode": "FULL", "features.sp.tp": 2, "features.mtp.k": 1}) == "FULL-tp2-k1"
    assert render_id({"graph.capture_sizes": [1, 2, 4]}) == "1x2x4"
    assert render_id({"graph.capture_sizes": None}) == "capture_sizes_default"
    assert render_id({"tolerance": {"atol": 0.1, "rtol": 0}}) == "atol0.1_rtol0"
    assert render_id({"workload": {"_id": "mixed", "requests": []}}) == "mixed"


def test_matrix_dict_values_with_explicit_id():
    text = """\
        matrix:
          workload:
            - _id: decode
              requests: [{prompt_len: 4, output_len: 8, repeat: 3}]
            - _id: mixed
              requests: [{prompt_len: 30, output_len: 2}, {prompt_len: 1, output_len: 9}]
        """
    points = load_scenario_text(textwrap.dedent(text), path="w.yaml")
    assert [p.id for p in points] == ["decode", "mixed"]
    assert points[0].scenario.workload.requests[0].repeat == 3
    assert "_id" not in points[0].axes["workload"]


# ---------------------------------------------------------------------------------- overrides


def test_apply_overrides_helper():
    raw = {"graph": {"mode": "PIECEWISE"}, "workload": {"requests": []}}
    out = apply_overrides(raw, {"graph.mode": "FULL", "features.sp.tp": 2})
    assert out["graph"]["mode"] == "FULL" and out["features"] == {"sp": {"tp": 2}}
    assert raw["graph"]["mode"] == "PIECEWISE"  # not mutated
    with pytest.raises(ScenarioError, match="graph.nope"):
        apply_overrides(raw, {"graph.nope": 1})
    assert parse_override("graph.capture_sizes=[1, 2]") == ("graph.capture_sizes", [1, 2])
    assert parse_override("graph.mode=full") == ("graph.mode", "full")


def test_load_with_overrides_replaces_axis(tmp_path):
    points = load_scenario_file(write(tmp_path, MATRIX), overrides={"graph.mode": "full"})
    assert {p.scenario.graph.mode for p in points} == {"FULL"}
    assert [p.id for p in points] == [
        "FULL-tp1-fia_padding", "FULL-tp1-no_fia_padding",
        "FULL-tp2-fia_padding", "FULL-tp2-no_fia_padding",
    ]
    (pt,) = load_scenario_file(write(tmp_path, MINIMAL), overrides={"graph.mode": "PIECEWISE"})
    assert pt.scenario.graph.mode == "PIECEWISE"


def test_override_error_is_located(tmp_path):
    errs = errors_of(tmp_path, MINIMAL + "graph:\n  mode: FULL\n", overrides={"graph.mode": "HALF"})
    e = only(errs)
    assert (e.line, e.field) == (5, "graph.mode")
    assert "override graph.mode='HALF'" in e.message


# ------------------------------------------------------------------------------------- errors


def test_unknown_key_points_at_the_key(tmp_path):
    e = only(errors_of(tmp_path, """\
        model:
          layers: 2
          layerz: 3
        workload:
          requests: [{prompt_len: 5, output_len: 3}]
        """))
    assert (e.line, e.field) == (3, "model.layerz")
    assert "unknown key 'layerz'" in e.message and "did you mean 'layers'" in e.message
    assert str(e).endswith(":3: model.layerz: " + e.message)


def test_wrong_type_points_at_the_value(tmp_path):
    e = only(errors_of(tmp_path, """\
        workload:
          requests:
            - prompt_len: 5
              output_len: "3"
        """))
    assert (e.line, e.field) == (4, "workload.requests[0].output_len")
    assert e.message == "must be a whole number, got '3'"  # the file's words, not pydantic's


def test_heads_not_divisible(tmp_path):
    p = write(tmp_path, MINIMAL + "model:\n  num_heads: 6\n  num_kv_heads: 4\n", "foo.yaml")
    with pytest.raises(ScenarioFileError) as info:
        load_scenario_file(p)
    e = only(info.value.errors)
    assert (e.line, e.field) == (6, "model.num_kv_heads")
    assert str(e) == f"{p}:6: model.num_kv_heads: 6 heads are not divisible by 4 KV heads"
    assert str(info.value) == str(e)


def test_kv_heads_above_heads(tmp_path):
    e = only(errors_of(tmp_path, MINIMAL + "model:\n  num_kv_heads: 8\n"))
    assert (e.line, e.field) == (5, "model.num_kv_heads")
    assert "8 KV heads exceed 4 heads" in e.message


def test_capture_size_above_max(tmp_path):
    e = only(errors_of(tmp_path, textwrap.dedent("""\
        graph:
          max_capture_size: 16
          capture_sizes:
            - 1
            - 32
            - 8
        """) + MINIMAL))
    assert (e.line, e.field) == (2, "graph.max_capture_size")  # vLLM refuses a user max unlike the list
    assert e.message.startswith("customized max_cudagraph_capture_size(=16) should be consistent with the "
                                "max value of cudagraph_capture_sizes(=32)")


def test_empty_capture_sizes(tmp_path):
    e = only(errors_of(tmp_path, MINIMAL + "graph:\n  capture_sizes: []\n"))
    assert (e.line, e.field) == (5, "graph.capture_sizes")
    assert "empty" in e.message


def test_nonpositive_capture_size(tmp_path):
    e = only(errors_of(tmp_path, MINIMAL + "graph:\n  capture_sizes: [1, 0]\n"))
    assert (e.line, e.field) == (5, "graph.capture_sizes[1]")


def test_both_requests_and_steps(tmp_path):
    e = only(errors_of(tmp_path, """\
        workload:
          requests: [{prompt_len: 5, output_len: 3}]
          steps:
            - [{req: a, new_tokens: 1}]
        """))
    assert (e.line, e.field) == (3, "workload.steps")
    assert "exactly one of 'requests' or 'steps'" in e.message


def test_neither_requests_nor_steps(tmp_path):
    e = only(errors_of(tmp_path, "name: x\nworkload:\n  prompt_seed: 3\n"))
    assert (e.line, e.field) == (2, "workload")


def test_missing_workload_points_at_root(tmp_path):
    e = only(errors_of(tmp_path, "# comment\nname: x\n"))
    assert (e.line, e.field) == (2, "workload")
    assert "missing required key 'workload'" in e.message


def test_missing_nested_key_points_at_parent(tmp_path):
    e = only(errors_of(tmp_path, "workload:\n  requests:\n    - prompt_len: 4\n"))
    assert (e.line, e.field) == (3, "workload.requests[0].output_len")


def test_request_longer_than_max_model_len(tmp_path):
    e = only(errors_of(tmp_path, """\
        model: {max_model_len: 64}
        workload:
          requests:
            - {prompt_len: 5, output_len: 3}
            - {prompt_len: 60, output_len: 8}
        """))
    assert (e.line, e.field) == (5, "workload.requests[1]")
    assert "68 exceeds model.max_model_len 64" in e.message


def test_spec_tokens_disagree(tmp_path):
    e = only(errors_of(tmp_path, MINIMAL + """\
        graph: {num_speculative_tokens: 1}
        features:
          mtp: {k: 2}
        """.replace("        ", "")))
    assert (e.line, e.field) == (4, "graph.num_speculative_tokens")


def test_bad_expect(tmp_path):
    errs = errors_of(tmp_path, MINIMAL + "expect:\n  fail: [equality, bogus, equality]\n")
    assert [(e.line, e.field) for e in errs] == [(5, "expect.fail[1]")]
    errs = errors_of(tmp_path, MINIMAL + "expect:\n  fail: [equality, equality]\n")
    assert [(e.line, e.field) for e in errs] == [(5, "expect.fail[1]")]
    errs = errors_of(tmp_path, MINIMAL + "expect: fail\n")
    assert [(e.line, e.field) for e in errs] == [(4, "expect")]


def test_bad_matrix_path(tmp_path):
    e = only(errors_of(tmp_path, MINIMAL + """\
matrix:
  graph.mode: [FULL]
  graph.bogus: [1, 2]
"""))
    assert (e.line, e.field) == (6, "matrix.graph.bogus")
    assert "graph has no field 'bogus'" in e.message


def test_matrix_value_error_points_at_the_value(tmp_path):
    e = only(errors_of(tmp_path, MINIMAL + """\
matrix:
  graph.mode:
    - FULL
    - FULLL
  features.sp.tp: [1, 2]
"""))
    assert (e.line, e.field) == (7, "matrix.graph.mode[1]")
    assert "'FULLL'" in e.message


def test_matrix_value_error_inside_dict_value(tmp_path):
    e = only(errors_of(tmp_path, """\
matrix:
  workload:
    - requests: [{prompt_len: 4, output_len: 8}]
    - requests:
        - {prompt_len: 4, output_len: 8}
        - {prompt_len: 0, output_len: 8}
"""))
    assert (e.line, e.field) == (6, "matrix.workload[1].requests[1].prompt_len")


def test_matrix_combination_error_names_points(tmp_path):
    errs = errors_of(tmp_path, MINIMAL + """\
matrix:
  model.num_heads: [4, 6]
  model.num_kv_heads: [2, 4]
""")
    e = only(errs)
    assert (e.line, e.field) == (6, "matrix.model.num_kv_heads[1]")
    assert "6 heads are not divisible by 4 KV heads" in e.message
    assert "heads6-num_kv_heads4" in e.message


def test_matrix_empty_axis_and_bad_exclude(tmp_path):
    errs = errors_of(tmp_path, MINIMAL + """\
matrix:
  graph.mode: []
""")
    assert [(e.line, e.field) for e in errs] == [(5, "matrix.graph.mode")]
    errs = errors_of(tmp_path, MINIMAL + """\
matrix:
  graph.mode: [FULL, NONE]
matrix_exclude:
  - {graph.mode: PIECEWISE}
  - {features.sp.tp: 2}
""")
    assert [(e.line, e.field) for e in errs] == [
        (7, "matrix_exclude[0].graph.mode"),
        (8, "matrix_exclude[1].features.sp.tp"),
    ]


def test_yaml_syntax_error(tmp_path):
    e = only(errors_of(tmp_path, """\
        name: x
        model:
          layers: [1, 2
        workload: {}
        """))
    assert e.line == 4 and e.field == ""
    assert e.message.startswith("YAML syntax error")


def test_yaml_bad_indent(tmp_path):
    e = only(errors_of(tmp_path, "name: x\nmodel:\n  layers: 2\n bad: 1\n"))
    assert e.line == 4 and "YAML syntax error" in e.message


def test_duplicate_key(tmp_path):
    e = only(errors_of(tmp_path, MINIMAL + "graph:\n  mode: FULL\n  mode: NONE\n"))
    assert (e.line, e.field) == (6, "graph.mode")
    assert "duplicate key 'mode' (first at line 5)" in e.message


def test_empty_and_non_mapping_files(tmp_path):
    assert only(errors_of(tmp_path, "# nothing\n")).message == "the file is empty"
    e = only(errors_of(tmp_path, "- a\n- b\n"))
    assert e.line == 1 and "mapping" in e.message


def test_several_errors_collected(tmp_path):
    p = write(tmp_path, """\
        model:
          num_heads: 6
          num_kv_heads: 4
        graph:
          mode: fast
          capture_sizes: []
        workload:
          requests:
            - {prompt_len: 5, output_len: 3, colour: red}
        fia_contract: lax
        steps: 0
        engine: {stream_pool: -1}
        """)
    with pytest.raises(ScenarioFileError) as info:
        load_scenario_file(p)
    got = [(e.line, e.field) for e in info.value.errors]
    assert got == [
        (3, "model.num_kv_heads"),
        (5, "graph.mode"),
        (9, "workload.requests[0].colour"),
        (10, "fia_contract"),
        (11, "steps"),
        (12, "engine.stream_pool"),
    ]
    text = str(info.value)
    assert text.count("\n") == len(got) - 1
    assert text.splitlines()[0] == f"{p}:3: model.num_kv_heads: 6 heads are not divisible by 4 KV heads"
    # ScenarioFileError is a ScenarioError located at its first error, and pickles
    assert isinstance(info.value, ScenarioError) and info.value.line == 3
    again = pickle.loads(pickle.dumps(info.value))
    assert str(again) == text


# ------------------------------------------------------------------------------------- schema


def test_json_schema_export():
    schema = export_json_schema()
    json.dumps(schema)
    props = schema["properties"]
    for key in ("name", "model", "graph", "workload", "fixes", "features", "fia_contract",
                "tolerance", "steps", "engine", "expect", "matrix", "matrix_exclude"):
        assert key in props
    defs = schema["$defs"]
    assert defs["GraphSpec"]["properties"]["mode"]["enum"] == [
        "NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"]
    assert defs["ModelSpec"]["additionalProperties"] is False
    assert {"sp_padding", "dp_sync", "drafter_unpadded", "drafter_param_update", "cp_kv_padding"} <= set(
        defs["Fixes"]["properties"])
    assert {"const": "pass", "type": "string"} in defs["Expect"]["anyOf"]


def test_schema_command_line():
    out = subprocess.run(
        [sys.executable, "-m", "harness.scenario.schema"], capture_output=True, text=True,
        check=True,
    ).stdout
    assert "FULL_DECODE_ONLY" in json.loads(out)["$defs"]["GraphSpec"]["properties"]["mode"]["enum"]


def test_scenario_model_direct_use():
    s = Scenario.model_validate({"workload": {"requests": [{"prompt_len": 1, "output_len": 1}]}})
    assert s.name is None and s.graph.mode == "FULL"
    with pytest.raises(ValueError, match="not divisible"):
        Scenario.model_validate({"model": {"num_heads": 6, "num_kv_heads": 4},
                                 "workload": {"requests": [{"prompt_len": 1, "output_len": 1}]}})


def test_package_is_pure():
    code = ("import sys, harness.scenario; "
            "bad = [m for m in ('torch', 'pytest') if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_docs_example_loads():
    import re

    doc = (Path(__file__).resolve().parents[2] / "docs" / "scenarios.md").read_text()
    example = re.search(r"## An annotated example\n\n```yaml\n(.*?)```", doc, re.S).group(1)
    points = load_scenario_text(example, path="scenarios/fia_mixed_batch.yaml")
    assert [p.display_name for p in points] == [
        "fia_mixed_batch[tp1-k0]", "fia_mixed_batch[tp1-k1]", "fia_mixed_batch[tp2-k0]"]
    assert points[0].scenario.expect.failing_checks == {"fia_invariant"}


# ------------------------------------------------------------------- YAML features that are valid


def test_merge_keys_and_extension_anchors_load(tmp_path):
    p = write(tmp_path, """\
        x-model: &model {kind: random, layers: 3, seed: 7}
        x-request: &request {prompt_len: 2, output_len: 3}
        model:
          <<: *model
          seed: 9                    # a local key wins over the merged one
        workload:
          requests:
            - *request
            - {<<: *request, arrival_step: 1}
        matrix:
          graph:
            - &full {_id: full, mode: FULL}
            - {<<: *full, _id: full_seqs4, max_num_seqs: 4}
        """)
    points = load_scenario_file(p)
    assert [pt.id for pt in points] == ["full", "full_seqs4"]
    model = points[0].scenario.model
    assert (model.kind, model.layers, model.seed) == ("random", 3, 9)
    requests = points[0].scenario.workload.requests
    assert [(r.prompt_len, r.arrival_step) for r in requests] == [(2, 0), (2, 1)]
    assert points[1].scenario.graph.max_num_seqs == 4 and points[1].scenario.graph.mode == "FULL"


def test_an_anchor_used_many_times_is_checked_once(tmp_path):
    # the duplicate key is inside the anchored mapping: one error, at its own line
    errs = errors_of(tmp_path, """\
        x-r: &r {prompt_len: 2, output_len: 2, output_len: 3}
        workload:
          requests: [*r, *r, *r, *r]
        """)
    assert [(e.line, e.field) for e in errs] == [(1, "x-r.output_len")]


def test_rendered_ids_are_made_unique_without_collisions(tmp_path):
    # "a b" and "a_b" both render as a_b; a third value already is a_b_1
    p = write(tmp_path, MINIMAL + 'matrix:\n  description: ["a b", "a_b", "a_b_1"]\n')
    ids = [pt.id for pt in load_scenario_file(p)]
    assert len(set(ids)) == 3 and "a_b_1" in ids, ids


def test_an_error_line_quotes_a_huge_value_only_in_part(tmp_path):
    err = only(errors_of(tmp_path, MINIMAL + "model: {kind: " + "z" * 200_000 + "}\n"))
    assert err.field == "model.kind" and len(str(err)) < 400 and "more characters]" in err.message


def test_the_id_of_a_matrix_value_is_not_part_of_another_axis_value(tmp_path):
    err = only(errors_of(tmp_path, MINIMAL + textwrap.dedent("""\
        matrix:
          graph.mode: [FULL_DECODE_ONLY]
          workload:
            - {_id: decode, requests: [{prompt_len: 1, output_len: 1}]}
        """)))
    assert err.field == "matrix.workload[0]" and "-k would select both" in err.message
