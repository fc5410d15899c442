"""Writes the bad-input corpus: one YAML file per way a scenario can be wrong.

Each file's first line says what is wrong with it; expected.txt holds the exact errors each must
give (rewrite it with update_expected.py, then review the diff). Usage, from the repository root:

    python tests/scenario/bad_inputs/make_corpus.py tests/scenario/bad_inputs
"""
import os, sys
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
W = "workload:\n  requests:\n    - {prompt_len: 3, output_len: 3}\n"
cases = {}
def case(name, text, note):
    body = text.encode() if isinstance(text, str) else text
    cases[name] = f"# {note}\n".encode() + body

# --- A. YAML and encoding
lol = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))
case("yaml_alias_bomb_sequences", lol + W, "billion laughs: nested aliases of lists")
case("yaml_alias_bomb_mappings", "x-a: &a {k1: v, k2: v, k3: v, k4: v, k5: v, k6: v, k7: v, k8: v}\n" + "".join(
    f"x-{c}: &{c} {{{', '.join(f'k{i}: *{p}' for i in range(8))}}}\n" for p, c in zip("abcdef", "bcdefg")) + W,
     "nested aliases of mappings")
case("yaml_alias_bomb_merge", "x-a: &a {k1: [1,2,3,4,5,6,7,8,9,10]}\n" + "".join(
    f"x-{c}: &{c} [{', '.join(['*' + p] * 10)}]\n" for p, c in zip("abcdef", "bcdefg")) + "model:\n  <<: *a\n" + W,
     "an alias bomb reached through a merge key")
case("yaml_recursive_alias_sequence", "x-loop: &loop [1, *loop]\n" + W, "a list that contains itself")
case("yaml_recursive_alias_mapping", "model: &m\n  layers: 2\n  self: *m\n" + W, "a mapping that contains itself")
case("yaml_recursive_merge", "model: &m\n  <<: *m\n" + W, "a mapping that merges itself")
case("yaml_undefined_alias", "model: *nowhere\n" + W, "alias without anchor")
case("yaml_anchor_twice", "x-a: &a 1\nx-b: &a 2\n" + W, "the same anchor twice")
case("yaml_invalid_utf8_byte", b"name: caf\xe9\n" + W.encode(), "latin-1 byte in a UTF-8 file")
case("yaml_invalid_utf8_ff", W.encode() + b"description: \xff\xfe\n", "0xff byte")
case("yaml_invalid_utf8_truncated", W.encode() + b"description: x\xe2\x82", "a multi-byte character cut at the end")
case("yaml_control_bel", W + 'description: "ring\x07"\n', "BEL character")
case("yaml_control_nul", W + "description: a\x00b\n", "NUL byte")
case("yaml_control_esc_in_comment", W + "# colours \x1b[31m\n", "ESC inside a comment")
case("yaml_control_del", "name: x\x7f\n" + W, "DEL character")
case("yaml_control_vertical_tab", W + "description: a\x0bb\n", "vertical tab")
case("yaml_tab_indent", "model:\n\tlayers: 2\n" + W, "a tab used as indentation")
case("yaml_unclosed_flow", "graph: {mode: FULL\n" + W, "unclosed flow mapping")
case("yaml_unclosed_quote", 'name: "open\n' + W, "unclosed double quote")
case("yaml_two_documents", W + "---\n" + W, "two YAML documents")
case("yaml_deep_nesting", "description: " + "[" * 40 + "]" * 40 + "\n" + W, "40 nested lists")
case("yaml_deep_through_alias", "x-d: &d " + "[" * 20 + "]" * 20 + "\nx-e: " + "[" * 15 + "*d" + "]" * 15 + "\n" + W,
     "an alias that nests the file too deep")
case("yaml_long_integer", "model: {seed: " + "9" * 40 + "}\n" + W, "an integer of 40 digits")
case("yaml_very_long_integer", "steps: " + "1" * 5000 + "\n" + W, "an integer of 5000 digits (Python refuses to convert it)")
case("yaml_merge_not_mapping", "model:\n  <<: 1\n" + W, "a merge key whose value is not a mapping")
case("yaml_unhashable_key", "model:\n  ? [a, b]\n  : 1\n" + W, "a list as a mapping key")
case("yaml_python_tag", "model: !!python/object:os.system {}\n" + W, "a Python object tag")
case("yaml_custom_tag", "steps: !env STEPS\n" + W, "an unknown local tag")
case("yaml_empty", "", "nothing but this comment")
case("yaml_top_level_list", "- name: x\n", "a list at the top level")
case("yaml_top_level_scalar", "just text\n", "a string at the top level")
case("yaml_duplicate_top_key", "steps: 4\n" + W + "steps: 5\n", "steps given twice")
case("yaml_duplicate_nested_key", "model:\n  layers: 2\n  layers: 3\n" + W, "model.layers given twice")
case("yaml_duplicate_key_in_anchor", "x-m: &m {layers: 2, layers: 3}\nmodel: *m\n" + W, "a duplicate inside an anchored mapping, used once more")
case("yaml_too_many_values", "x-big: [" + ",".join(["1"] * 60000) + "]\n" + W, "60000 values")
case("yaml_bad_indent", "model:\n  layers: 2\n hidden_size: 64\n" + W, "inconsistent indentation")
case("yaml_bom_then_bad_utf8", b"\xef\xbb\xbfname: x\n" + W.encode() + b"description: \xc0\xaf\n", "a BOM, then an overlong encoding")

# --- B. matrix
case("matrix_is_a_list", W + "matrix:\n  - graph.mode\n  - [FULL]\n", "matrix given as a list")
case("matrix_is_a_scalar", W + "matrix: FULL\n", "matrix given as a string")
case("matrix_axis_not_a_list", W + "matrix:\n  graph.mode: FULL\n", "an axis that is not a list")
case("matrix_axis_empty", W + "matrix:\n  graph.mode: []\n", "an empty axis")
case("matrix_unknown_path", W + "matrix:\n  graph.bogus: [1, 2]\n", "an axis path that is not a field")
case("matrix_name_axis", W + "matrix:\n  name: [a, b]\n", "name as an axis")
case("matrix_overlapping_axes", W + "matrix:\n  graph: [{mode: FULL}]\n  graph.mode: [FULL]\n", "overlapping axes")
case("matrix_duplicate_value", W + "matrix:\n  graph.mode: [FULL, PIECEWISE, FULL]\n", "a value listed twice")
case("matrix_too_many_points", W + "matrix:\n  model.seed: [" + ", ".join(map(str, range(21))) + "]\n  workload.prompt_seed: ["
     + ", ".join(map(str, range(21))) + "]\n  graph.max_num_seqs: [" + ", ".join(map(str, range(1, 22))) + "]\n", "21 x 21 x 21 points")
case("matrix_points_times_values", "workload:\n  requests:\n" + "    - {prompt_len: 1, output_len: 1}\n" * 300 + "matrix:\n  model.seed: ["
     + ", ".join(map(str, range(700))) + "]\n", "700 points of a 2200-value file")
case("matrix_huge_product", W + "matrix:\n" + "".join(f"  {a}: [{', '.join(map(str, range(1, 101)))}]\n" for a in ("model.seed", "workload.prompt_seed", "steps", "graph.max_num_seqs")), "10^8 points")
case("matrix_duplicate_id", W + "matrix:\n  workload:\n    - {_id: x, requests: [{prompt_len: 1, output_len: 1}]}\n    - {_id: x, requests: [{prompt_len: 2, output_len: 1}]}\n", "the same _id twice")
case("matrix_id_with_space", W + "matrix:\n  workload:\n    - {_id: two words, requests: [{prompt_len: 1, output_len: 1}]}\n", "an _id with a space")
case("matrix_id_with_bracket", W + "matrix:\n  workload:\n    - {_id: \"a]b\", requests: [{prompt_len: 1, output_len: 1}]}\n", "an _id with a bracket")
case("matrix_id_not_string", W + "matrix:\n  workload:\n    - {_id: 7, requests: [{prompt_len: 1, output_len: 1}]}\n", "an _id that is a number")
case("matrix_id_substring_of_mode", W + "matrix:\n  graph.mode: [FULL, FULL_DECODE_ONLY]\n  workload:\n    - {_id: decode, requests: [{prompt_len: 1, output_len: 4}]}\n", "-k decode would also select FULL_DECODE_ONLY")
case("matrix_string_substring_of_id", W + "matrix:\n  model.dtype: [float32]\n  workload:\n    - {_id: float32_only, requests: [{prompt_len: 1, output_len: 4}]}\n", "a string value inside another axis's _id")
case("matrix_exclude_unknown_axis", W + "matrix:\n  graph.mode: [FULL, NONE]\nmatrix_exclude:\n  - {graph.bogus: 1}\n", "exclude names no axis")
case("matrix_exclude_unknown_value", W + "matrix:\n  graph.mode: [FULL, NONE]\nmatrix_exclude:\n  - {graph.mode: PIECEWISE}\n", "exclude names a value not on the axis")
case("matrix_exclude_everything", W + "matrix:\n  graph.mode: [FULL]\nmatrix_exclude:\n  - {graph.mode: FULL}\n", "every point excluded")
case("matrix_exclude_without_matrix", W + "matrix_exclude:\n  - {graph.mode: FULL}\n", "exclude without a matrix")
case("matrix_exclude_not_a_list", W + "matrix:\n  graph.mode: [FULL]\nmatrix_exclude: {graph.mode: FULL}\n", "exclude as a mapping")
case("matrix_exclude_empty_entry", W + "matrix:\n  graph.mode: [FULL, NONE]\nmatrix_exclude:\n  - {}\n", "an empty exclude entry")
case("matrix_bad_value_for_field", W + "matrix:\n  model.layers: [2, 0]\n", "a matrix value the schema refuses")
case("matrix_value_above_bound", W + "matrix:\n  model.layers: [2, 1000]\n", "a matrix value above its bound")

# --- C. bounds
for key, val, note in [
    ("layers", 100000, "layers"), ("hidden_size", 1000000, "hidden size"), ("num_heads", 1000, "heads"),
    ("head_dim", 4096, "head dim"), ("vocab_size", 10000000, "vocabulary"), ("seed", 2**40, "weight seed"),
    ("seed", -1, "negative seed"), ("block_size", 100000, "block size"), ("num_blocks", 1000000, "KV blocks"),
    ("max_model_len", 1000000, "max model length")]:
    case(f"bound_model_{key}_{'neg' if val < 0 else 'huge'}", f"model:\n  {key}: {val}\n" + W, f"model.{key}: {val} ({note})")
case("bound_model_weights", "model: {kind: random, layers: 64, hidden_size: 4096, num_heads: 32, num_kv_heads: 8, head_dim: 128}\n" + W, "a model of about 8 billion weights")
case("bound_model_kv_cache", "model: {layers: 64, num_blocks: 65536, block_size: 64, num_kv_heads: 2, head_dim: 16}\n" + W, "a KV cache of 2^34 elements")
case("bound_capture_size", "graph:\n  capture_sizes: [1, 100000000]\n" + W, "a capture size of 10^8")
case("bound_capture_sizes_count", "graph:\n  capture_sizes: [" + ", ".join(map(str, range(1, 601))) + "]\n" + W, "600 capture sizes")
case("bound_max_capture_size", "graph: {max_capture_size: 100000}\n" + W, "max_capture_size 10^5")
case("bound_max_num_seqs", "graph: {max_num_seqs: 100000}\n" + W, "max_num_seqs 10^5")
case("bound_num_speculative_tokens", "graph: {num_speculative_tokens: 100}\n" + W, "100 speculative tokens")
case("bound_warmup_runs", "graph:\n  warmup_runs: 1000000\n" + W, "a million warm-up runs")
case("bound_steps", "steps: 1000000\n" + W, "a million steps")
case("bound_repeat", "workload:\n  requests:\n    - {prompt_len: 3, output_len: 3, repeat: 1000000}\n", "a million identical requests")
case("bound_total_requests", "workload:\n  requests:\n    - {prompt_len: 3, output_len: 3, repeat: 3000}\n    - {prompt_len: 2, output_len: 3, repeat: 3000}\n", "6000 requests in all")
case("bound_prompt_len", "workload:\n  requests:\n    - {prompt_len: 1000000, output_len: 3}\n", "prompt of 10^6 tokens")
case("bound_output_len", "workload:\n  requests:\n    - {prompt_len: 3, output_len: 1000000}\n", "output of 10^6 tokens")
case("bound_arrival_step", "workload:\n  requests:\n    - {prompt_len: 3, output_len: 3, arrival_step: 1000000}\n", "arrival at step 10^6")
case("bound_new_tokens", "workload:\n  steps:\n    - [{req: a, new_tokens: 1000000}]\n", "10^6 tokens in one step")
case("bound_max_num_batched_tokens", "workload:\n  max_num_batched_tokens: 10000000\n  requests:\n    - {prompt_len: 3, output_len: 3}\n", "a 10^7-token budget")
case("bound_prompt_seed", "workload:\n  prompt_seed: 1099511627776\n  requests:\n    - {prompt_len: 3, output_len: 3}\n", "prompt seed 2^40")
case("bound_sp_tp", "features: {sp: {tp: 100}}\n" + W, "tp 100")
case("bound_dp_size", "features:\n  dp:\n    size: 1000\n" + W, "1000 DP ranks")
case("bound_cp_size", "features:\n  cp: {size: 100000}\n" + W, "100000 CP ranks")
case("bound_mtp_k", "features: {mtp: {k: 100}}\n" + W, "100 draft tokens")
case("bound_world_size_dp_tp", "model: {num_heads: 8, num_kv_heads: 8}\ngraph: {mode: FULL, capture_sizes: [8, 16]}\nfeatures:\n  dp: {size: 4}\n  sp: {tp: 8}\n" + W, "4 x 8 = 32 ranks")
case("bound_world_size_in_matrix", "graph: {mode: FULL, capture_sizes: [2, 4, 8]}\n" + W + "matrix:\n  features:\n    - {_id: small, dp: {size: 2}}\n    - {_id: wide, dp: {size: 8}, cp: {size: 4}}\n", "one matrix point needs 32 ranks")
case("bound_stream_pool", "engine: {stream_pool: 10000000}\n" + W, "10^7 streams")
case("bound_streams_per_graph", "engine: {streams_per_graph: 1000}\n" + W, "1000 streams per graph")
case("bound_description", "description: " + "d" * 12000 + "\n" + W, "a 12000-character description")
case("bound_expect_reason", W + "fixes: {fia_padding: false}\nexpect:\n  fail: [fia_invariant]\n  reason: " + "r" * 12000 + "\n", "a 12000-character reason")
case("bound_explicit_steps_count", "x-s: &s [{req: a, new_tokens: 1}]\nworkload:\n  steps: [" + ",".join(["*s"] * 4100) + "]\n", "4100 explicit steps")

# --- D. things that must be rejected
case("reject_empty_name", 'name: ""\n' + W, "an empty name")
case("reject_multiline_name", 'name: "first\\nsecond"\n' + W, "a name with a line break")
case("reject_block_scalar_name", "name: |\n  first\n  second\n" + W, "a name given as a block scalar")
case("reject_name_with_space", "name: my scenario\n" + W, "a name with a space")
case("reject_name_with_brackets", 'name: "x[1]"\n' + W, "a name with brackets")
case("reject_name_with_colons", 'name: "a::b"\n' + W, "a name with a node-id separator")
case("reject_name_too_long", "name: " + "n" * 150 + "\n" + W, "a 150-character name")
case("reject_name_not_string", "name: 12\n" + W, "a number as the name")
case("reject_tolerance_inf", "tolerance: {atol: .inf, rtol: 0.0}\n" + W, "an infinite atol")
case("reject_tolerance_nan", "tolerance: {atol: 0.0, rtol: .nan}\n" + W, "a NaN rtol")
case("reject_tolerance_negative", "tolerance: {atol: -0.5}\n" + W, "a negative atol")
case("reject_tolerance_overflow", "tolerance: {atol: 1.0e+999}\n" + W, "1e999 is infinite")
case("reject_arrival_after_last_step", "steps: 4\nworkload:\n  requests:\n    - {prompt_len: 3, output_len: 3}\n    - {prompt_len: 3, output_len: 3, arrival_step: 4}\n", "a request arriving after the last step")
case("reject_explicit_steps_beyond_steps", "steps: 2\nworkload:\n  steps:\n    - [{req: a, new_tokens: 3}]\n    - [{req: a, new_tokens: 1}]\n    - [{req: a, new_tokens: 1}]\n", "three explicit steps, two steps run")

# --- E. the classic mistakes
case("classic_unknown_key", "model:\n  layer: 3\n" + W, "a typo in a key")
case("classic_wrong_type", "model:\n  layers: '3'\n" + W, "a string where an int goes")
case("classic_bool_for_int", "steps: true\n" + W, "a bool where an int goes")
case("classic_missing_workload", "name: nothing_to_run\n", "no workload")
case("classic_missing_request_field", "workload:\n  requests:\n    - {prompt_len: 3}\n", "a request without output_len")
case("classic_heads_not_divisible", "model:\n  num_heads: 6\n  num_kv_heads: 4\n" + W, "heads not divisible")
case("classic_requests_and_steps", W + "  steps:\n    - [{req: a, new_tokens: 1}]\n", "both requests and steps")
case("classic_bad_mode", "graph: {mode: FAST}\n" + W, "an unknown graph mode")
case("classic_bad_expect", W + "expect: fails\n", "an unknown expect word")
case("classic_expect_unknown_check", W + "expect:\n  fail: [speed]\n", "an unknown check name")
case("classic_empty_capture_sizes", "graph: {capture_sizes: []}\n" + W, "an empty capture_sizes list")
case("classic_capture_size_above_max", "graph: {capture_sizes: [1, 2, 16], max_capture_size: 8}\n" + W, "a capture size above max_capture_size")
case("upstream_max_above_the_list", "graph: {capture_sizes: [1, 2, 4, 8], max_capture_size: 16}\n" + W,
     "a user max above the user list's largest size (vLLM refuses both)")
case("upstream_max_after_token_filter", "graph: {capture_sizes: [1, 8, 16], max_capture_size: 16}\n"
     "workload:\n  max_num_batched_tokens: 12\n  requests:\n    - {prompt_len: 3, output_len: 3}\n",
     "the list's largest size within max_num_batched_tokens is 8, the user max 16")
case("upstream_max_after_sp_filter", "graph: {mode: FULL, capture_sizes: [2, 4, 6], max_capture_size: 6}\n"
     "model: {num_kv_heads: 4}\nfeatures: {sp: {tp: 4}}\n" + W, "SP tp 4 keeps [4]: the user max 6 disagrees (preflight)")
case("upstream_all_sizes_above_token_budget", "graph: {capture_sizes: [32, 64]}\n"
     "workload:\n  max_num_batched_tokens: 16\n  requests:\n    - {prompt_len: 3, output_len: 3}\n",
     "every user size above max_num_batched_tokens: no graph at all (preflight)")
case("stack_unknown", "stack: v9.9\n" + W, "an unknown stack profile")
case("stack_unknown_in_matrix", "matrix:\n  stack: [v0.23.0, vllm-0.18]\n" + W, "an unknown stack as a matrix value")
case("classic_request_too_long", "model: {max_model_len: 64, vocab_size: 512}\nworkload:\n  requests:\n    - {prompt_len: 60, output_len: 10}\n", "a request longer than max_model_len")
case("classic_step_over_budget", "workload:\n  max_num_batched_tokens: 8\n  steps:\n    - [{req: a, new_tokens: 5}, {req: b, new_tokens: 5}]\n", "a step over the token budget")
case("classic_request_twice_in_step", "workload:\n  steps:\n    - [{req: a, new_tokens: 1}, {req: a, new_tokens: 1}]\n", "a request twice in one step")
case("classic_spec_tokens_disagree", "graph: {num_speculative_tokens: 1}\nfeatures: {mtp: {k: 2}}\n" + W, "two spec-token counts")
case("classic_unequal_dp1", "features: {dp: {batches: unequal}}\n" + W, "unequal batches on one rank")
case("classic_canary_too_small", "model: {kind: canary, layers: 9}\ngraph: {mode: FULL}\n" + W, "a canary too small for its layers (preflight)")
case("classic_sp_no_capture_size", "graph: {mode: FULL, capture_sizes: [1, 3]}\nfeatures: {sp: {tp: 2}}\n" + W, "SP leaves no capture size (preflight)")
case("classic_sp_kv_heads_not_split", "model: {num_heads: 4, num_kv_heads: 1}\nfeatures: {sp: {tp: 2}}\n" + W, "one KV head for two TP ranks (preflight)")
case("classic_sp_mlp_not_split", "model: {hidden_size: 33, num_heads: 4, num_kv_heads: 4}\nmatrix:\n  features.sp.tp: [1, 4]\n" + W, "an MLP width of 66 for four TP ranks, in one matrix point (preflight)")
case("classic_unknown_feature", "features: {warp: {speed: 9}}\n" + W, "an unknown plugin feature (preflight)")
case("classic_kv_cache_too_small", "model: {max_model_len: 512, num_blocks: 4, block_size: 16}\n" + W, "max_model_len above the KV cache")
case("classic_mtp_drafts_past_max_model_len", "model: {max_model_len: 16, num_blocks: 8, block_size: 4}\nfeatures: {mtp: {k: 2}}\n"
     "workload:\n  requests:\n    - {prompt_len: 4, output_len: 12}\n", "MTP k 2 drafts one slot past max_model_len on the last step")
case("classic_prompt_above_token_budget", "workload:\n  max_num_batched_tokens: 4\n  requests:\n    - {prompt_len: 5, output_len: 2}\n",
     "a prompt longer than the step's token budget (no chunked prefill)")
case("classic_decode_above_token_budget", "features: {mtp: {k: 3}}\nworkload:\n  max_num_batched_tokens: 3\n  requests:\n    - {prompt_len: 2, output_len: 3}\n",
     "a spec-decode step (1 + k = 4 tokens) above the token budget")
case("classic_explicit_steps_overflow_cache", "model: {max_model_len: 8, num_blocks: 3, block_size: 4}\nworkload:\n  steps:\n"
     "    - [{req: a, new_tokens: 4}]\n    - [{req: b, new_tokens: 4}, {req: a, new_tokens: 1}]\n",
     "two explicit requests alive at once need more blocks than the cache has")
case("classic_capture_dummy_above_max_model_len", "model: {max_model_len: 16, num_blocks: 8, block_size: 4}\n"
     "graph: {mode: PIECEWISE, capture_sizes: [8, 24], max_num_seqs: 1}\n" + W,
     "a capture size whose dummy request outgrows max_model_len (preflight)")
case("classic_empty_requests", "workload:\n  requests: []\n", "an empty request list")

# --- F. dispatch tables (expect.dispatch)
D = "graph: {mode: FULL, capture_sizes: [1, 2, 4, 8]}\n" + W + "expect:\n  dispatch:\n"
case("dispatch_empty", W + "expect:\n  dispatch: []\n", "an empty dispatch table")
case("dispatch_pins_nothing", D + "    - {step: 0}\n", "a row that pins nothing")
case("dispatch_no_step", D + "    - {mode: FULL}\n", "a row without its step")
case("dispatch_unknown_field", D + "    - {step: 0, bukket: 8}\n", "a typo in a row's field")
case("dispatch_bad_runtime_mode", D + "    - {step: 0, mode: FULL_DECODE_ONLY}\n", "a configured mode where a runtime mode goes")
case("dispatch_bad_for_mode", D + "    - {step: 0, for_mode: FAST, mode: FULL}\n", "an unknown for_mode")
case("dispatch_negative_step", D + "    - {step: -1, mode: FULL}\n", "a negative step")
case("dispatch_string_bucket", D + "    - {step: 0, bucket: '8'}\n", "a string where the bucket goes")
case("dispatch_row_twice", D + "    - {step: 0, mode: FULL}\n    - {step: 0, bucket: 8}\n", "the same step pinned twice")
case("dispatch_none_with_descriptor", D + "    - {step: 0, mode: NONE, descriptor: {num_tokens: 8}}\n", "an eager step with a graph key")
case("dispatch_descriptor_unknown_key", D + "    - {step: 0, descriptor: {tokens: 8}}\n", "a typo in a descriptor")
case("dispatch_metadata_empty", D + "    - {step: 0, metadata: {}}\n", "empty metadata")
case("dispatch_metadata_unknown_list", D + "    - {step: 0, metadata: {seq_lens: [3]}}\n", "a host list the record does not keep")
case("dispatch_metadata_not_a_list", D + "    - {step: 0, metadata: {slot_mapping: 5}}\n", "a host list that is not a list")
case("dispatch_with_skip", W + "expect:\n  skip: not modelled\n  dispatch:\n    - {step: 0, mode: FULL}\n", "a table on a skipped item")
case("dispatch_fail_without_table", W + "expect:\n  fail: [dispatch]\n", "dispatch expected to fail with no table")
case("dispatch_rank_out_of_range", "features: {dp: {size: 2}}\n" + D + "    - {step: 0, rank: 2, mode: FULL}\n", "a rank the item does not have (preflight)")

for i, (name, body) in enumerate(sorted(cases.items())):
    with open(os.path.join(out, f"{name}.yaml"), "wb") as f:
        f.write(body)
print(len(cases))
