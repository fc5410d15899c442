"""The graph wrapper's rules, case by case as upstream's own tests pin them.

Mirrored by name (on the emulated engine, a real capture and replay instead of mocks):

* vLLM Ascend ``tests/ut/compilation/a2/test_acl_graph.py``, classes ``TestACLGraphEntry`` and
  ``TestACLGraphWrapper`` (``ACLGraphWrapper`` in ``vllm_ascend/compilation/acl_graph.py``);
* vLLM ``tests/v1/cudagraph/test_cudagraph_dispatch.py``, classes ``TestCUDAGraphWrapper`` and
  ``TestCudagraphIntegration`` (``CUDAGraphWrapper`` in ``vllm/compilation/cuda_graph.py``).

Not mirrored (memory and speed only, invisible to the harness's checks): ``gc_disable``,
``weak_ref_output``, the weak set of wrappers and the sleep-mode graph parameters.

The last part checks the runner: every scenario's graph path goes through these wrappers.
"""

from __future__ import annotations

import logging

import pytest
import torch

from harness.graph.dispatcher import BatchDescriptor, Dispatcher
from harness.graph.graph_wrapper import (
    CaptureDisabledError,
    CaptureMonitor,
    ForwardContext,
    GraphEntry,
    GraphWrapper,
    InputAddressError,
    get_forward_context,
    set_forward_context,
)
from harness.graph.modes import CUDAGraphMode

# Tensors these tests make live on the emulated NPU, as the pipeline's do (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("on_npu")

FULL, PIECEWISE, NONE = CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE, CUDAGraphMode.NONE
KEY = BatchDescriptor(num_tokens=30)


@pytest.fixture
def engine(npu):
    """The emulated backend on a fresh device (``npu``, tests/conftest.py), by the runner's name."""
    return npu


class Counting:
    """A runnable that counts its calls: ``2 * x + 1`` on device ops the emulator records."""

    def __init__(self) -> None:
        self.calls = 0
        self.test_attr = "test_value"
        self.capturing: list[bool] = []  # the forward context's flag at each call

    def __call__(self, x: torch.Tensor, *rest: object) -> torch.Tensor:
        self.calls += 1
        self.capturing.append(get_forward_context().capturing)
        return x * 2 + 1


def call(wrapper, mode, key, *args):
    with set_forward_context(mode, key):
        return wrapper(*args)


# -- vLLM Ascend: TestACLGraphEntry ---------------------------------------------------------------
def test_aclgraph_entry_initialization():
    entry = GraphEntry(KEY)
    assert entry.batch_descriptor == KEY
    assert entry.graph is None and entry.output is None and entry.input_addresses is None


def test_aclgraph_entry_with_values():
    entry = GraphEntry(KEY, graph="g", output="o", input_addresses=[12345, 67890])
    assert (entry.graph, entry.output, entry.input_addresses) == ("g", "o", [12345, 67890])


# -- vLLM Ascend: TestACLGraphWrapper -------------------------------------------------------------
def test_initialization_with_default_options(engine, monkeypatch):
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "INFO")
    pool = engine.graph_pool_handle()
    runnable = Counting()
    wrapper = GraphWrapper(runnable, FULL, engine, pool=pool)
    assert wrapper.runnable is runnable and wrapper.graph_pool is pool and wrapper.runtime_mode is FULL
    assert not wrapper.is_debugging_mode
    assert wrapper.entries == {}


def test_initialization_with_custom_options(engine, monkeypatch):
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "DEBUG")  # upstream's switch for the address check
    assert GraphWrapper(Counting(), FULL, engine).is_debugging_mode
    assert not GraphWrapper(Counting(), FULL, engine, debug=False).is_debugging_mode  # explicit wins


def test_initialization_assertion_error(engine):
    with pytest.raises(ValueError, match="FULL or PIECEWISE batches, not NONE"):
        GraphWrapper(Counting(), NONE, engine)


def test_call_with_none_runtime_mode(engine):
    runnable = Counting()
    wrapper = GraphWrapper(runnable, FULL, engine)
    x = torch.ones(3)
    assert torch.equal(call(wrapper, NONE, KEY, x, "arg2"), torch.full((3,), 3.0))
    assert runnable.calls == 1 and wrapper.entries == {} and runnable.capturing == [False]


def test_call_with_mismatched_runtime_mode(engine):
    runnable = Counting()
    wrapper = GraphWrapper(runnable, FULL, engine)
    assert torch.equal(call(wrapper, PIECEWISE, KEY, torch.ones(3), "arg2"), torch.full((3,), 3.0))
    assert runnable.calls == 1 and wrapper.entries == {}


def test_call_capture_graph_first_time(engine):
    runnable = Counting()
    wrapper = GraphWrapper(runnable, FULL, engine)
    x = torch.tensor([1.0, 2.0, 3.0])
    with set_forward_context(FULL, KEY) as context:
        out = wrapper(x, "arg2")
        assert not context.capturing  # set only while the capture runs
    assert runnable.calls == 1 and wrapper.num_captured == 1
    assert runnable.capturing == [True]  # what attention reads to capture its task group
    entry = wrapper.entries[KEY]
    # the entry keeps a weak reference to the output's memory (upstream: weak_ref_tensors(output))
    assert entry.graph is not None and entry.output is not out and entry.output.data_ptr() == out.data_ptr()
    assert entry.input_addresses == [x.data_ptr()]  # tensors only; "arg2" is not an address


def test_call_replay_graph(engine):
    runnable = Counting()
    wrapper = GraphWrapper(runnable, FULL, engine)
    x = torch.tensor([1.0, 2.0, 3.0])
    first = call(wrapper, FULL, KEY, x, "arg2")
    x.copy_(torch.tensor([10.0, 20.0, 30.0]))  # new contents at the captured address
    second = call(wrapper, FULL, KEY, x, "arg2")
    engine.synchronize()
    assert runnable.calls == 1  # the replay did not run the Python
    # a replay hands back the entry's (weak) output, at the captured output's address
    assert second is wrapper.entries[KEY].output and second.data_ptr() == first.data_ptr()
    assert torch.equal(second, torch.tensor([21.0, 41.0, 61.0]))


def test_call_with_debug_mode_input_address_check(engine):
    wrapper = GraphWrapper(Counting(), FULL, engine, debug=True)
    x = torch.tensor([1.0, 2.0, 3.0])
    call(wrapper, FULL, KEY, x, "arg2")
    call(wrapper, FULL, KEY, x, "arg2")  # the same tensor: no error


def test_call_with_debug_mode_input_address_mismatch(engine):
    wrapper = GraphWrapper(Counting(), FULL, engine, debug=True)
    call(wrapper, FULL, KEY, torch.tensor([1.0, 2.0, 3.0]), "arg2")
    with pytest.raises(InputAddressError, match=r"Input addresses for aclgraphs are different during replay\. "
                                                r"Expected \[\d+\], got \[\d+\]"):
        call(wrapper, FULL, KEY, torch.tensor([4.0, 5.0, 6.0]), "arg2")


def test_address_mismatch_is_silent_without_debug_mode(engine):
    """Upstream's default (INFO): nothing checks, and the graph reads the captured buffer."""
    wrapper = GraphWrapper(Counting(), FULL, engine, debug=False)
    x = torch.tensor([1.0, 2.0, 3.0])
    out = call(wrapper, FULL, KEY, x, "arg2")
    call(wrapper, FULL, KEY, torch.tensor([4.0, 5.0, 6.0]), "arg2")
    engine.synchronize()
    assert torch.equal(out, torch.tensor([3.0, 5.0, 7.0]))  # x's values, not the new tensor's


def test_call_capture_graph_with_debug_log(engine, caplog):
    wrapper = GraphWrapper(Counting(), FULL, engine, debug_log_enable=True)
    with caplog.at_level(logging.DEBUG, logger="harness.graph.graph_wrapper"):
        call(wrapper, FULL, KEY, torch.ones(3))
        call(wrapper, FULL, KEY, torch.ones(3))
    assert [r.getMessage() for r in caplog.records] == [f"Capturing a graph on (FULL, {KEY})"]


def test_getattr_access_runnable_attributes(engine):
    assert GraphWrapper(Counting(), FULL, engine).test_attr == "test_value"


def test_getattr_attribute_not_exists(engine):
    class EmptyRunnable:
        def __call__(self):
            return None

    with pytest.raises(AttributeError, match="Attribute non_existent_attr not found"):
        _ = GraphWrapper(EmptyRunnable(), FULL, engine).non_existent_attr


def test_unwrap_method(engine):
    runnable = Counting()
    assert GraphWrapper(runnable, FULL, engine).unwrap() is runnable


def test_full_replay_synchronizes_the_current_stream_first(engine, monkeypatch):
    """vLLM Ascend PR #4233: a FULL replay waits for the current stream; PIECEWISE does not."""
    synced: list[str] = []
    stream = engine.current_stream()
    monkeypatch.setattr(type(stream), "synchronize", lambda self: synced.append("sync"))
    for mode in (FULL, PIECEWISE):
        wrapper = GraphWrapper(Counting(), mode, engine)
        x = torch.ones(2)
        call(wrapper, mode, KEY, x)
        call(wrapper, mode, KEY, x)
    assert synced == ["sync"]


# -- vLLM: TestCUDAGraphWrapper -------------------------------------------------------------------
def test_capture_and_replay(engine):
    model = torch.nn.Linear(10, 10)
    wrapper = GraphWrapper(lambda x: model(x).detach(), FULL, engine)
    key = BatchDescriptor(num_tokens=10)
    x = torch.randn(1, 10)
    with torch.no_grad():
        call(wrapper, NONE, None, x)  # 0. global warm-up
        output1 = call(wrapper, FULL, key, x)  # 1. capture
        # Capture computes nothing (upstream: a zero output on a fresh pool; the emulator marks
        # uncomputed memory NaN).
        assert output1.isnan().all()
        output2 = call(wrapper, FULL, key, x)  # 2. replay
        engine.synchronize()
        assert torch.equal(output2, model(x))


def test_bypass_on_mode_mismatch(engine):
    runnable = Counting()
    wrapper = GraphWrapper(runnable, FULL, engine)
    call(wrapper, PIECEWISE, BatchDescriptor(num_tokens=10), torch.ones(1, 10))
    assert runnable.calls == 1 and not wrapper.entries


def test_bypass_on_mode_none(engine):
    wrapper = GraphWrapper(Counting(), FULL, engine)
    call(wrapper, NONE, BatchDescriptor(num_tokens=10), torch.ones(1, 10))
    assert not wrapper.entries


# -- vLLM: TestCudagraphIntegration ---------------------------------------------------------------
def _action(wrapper, runnable, mode, key, x) -> str:
    """What one call did: captured, replayed or passed through (upstream's ``_run_and_monitor_call``)."""
    calls, captured = runnable.calls, wrapper.num_captured
    call(wrapper, mode, key, x)
    if wrapper.num_captured > captured:
        return "capture_global"
    return "bypass" if runnable.calls > calls else "replay"


def test_capture_replay_bypass_logic(engine):
    dispatcher = Dispatcher(FULL, [10, 20])
    runnable = Counting()
    monitor = CaptureMonitor()
    wrapper = GraphWrapper(runnable, FULL, engine, monitor=monitor)
    buffer = torch.zeros(32, 10)  # persistent input buffer; each key reads a slice of it
    call(wrapper, NONE, None, buffer[:10])  # 0. global warm-up
    first = dispatcher.dispatch(1, 1, False)
    assert _action(wrapper, runnable, first.runtime_mode, first.batch_descriptor, buffer[:10]) == "capture_global"
    assert _action(wrapper, runnable, first.runtime_mode, first.batch_descriptor, buffer[:10]) == "replay"
    second = dispatcher.dispatch(15, 15, False)
    assert _action(wrapper, runnable, second.runtime_mode, second.batch_descriptor, buffer[:20]) == "capture_global"
    assert _action(wrapper, runnable, FULL, BatchDescriptor(num_tokens=20), buffer[:20]) == "replay"
    unseen = dispatcher.dispatch(30, 30, False)  # above the largest capture size
    assert unseen.runtime_mode is NONE
    assert _action(wrapper, runnable, unseen.runtime_mode, unseen.batch_descriptor, buffer[:30]) == "bypass"
    monitor.enabled = False  # after the capture phase, a capture of an unseen key is an error
    with pytest.raises(CaptureDisabledError, match="capturing detected at an inappropriate time"):
        call(wrapper, FULL, BatchDescriptor(num_tokens=30), buffer[:30])


def test_nested_wrappers(engine):
    """A PIECEWISE wrapper inside a FULL one: each mode is served by its own wrapper."""
    inner = Counting()
    piecewise = GraphWrapper(inner, PIECEWISE, engine)
    outer_calls = []

    def outer(x):
        outer_calls.append(1)
        return piecewise(x) - 1

    full = GraphWrapper(outer, FULL, engine)
    key = BatchDescriptor(num_tokens=1)
    x = torch.ones(1, 10)
    call(full, NONE, None, x)  # 0. global warm-up: both pass through
    assert (len(outer_calls), inner.calls) == (1, 1)
    call(full, FULL, key, x)  # FULL: the outer captures, the inner is captured inside it
    assert (full.num_captured, piecewise.num_captured) == (1, 0)
    assert (len(outer_calls), inner.calls) == (2, 2)
    call(full, FULL, key, x)  # FULL again: the outer replays, nothing runs
    assert (len(outer_calls), inner.calls) == (2, 2)
    call(full, PIECEWISE, key, x)  # PIECEWISE: the outer passes through, the inner captures
    assert (full.num_captured, piecewise.num_captured) == (1, 1)
    assert (len(outer_calls), inner.calls) == (3, 3)
    out = call(full, PIECEWISE, key, x)  # PIECEWISE again: the outer passes, the inner replays
    engine.synchronize()
    assert (len(outer_calls), inner.calls) == (4, 3)
    assert torch.equal(out, torch.full((1, 10), 2.0))


# -- the forward context --------------------------------------------------------------------------
def test_forward_context_is_scoped():
    with pytest.raises(RuntimeError, match="no forward context is set"):
        get_forward_context()
    with set_forward_context(FULL, KEY) as outer:
        with set_forward_context(NONE) as inner:
            assert get_forward_context() is inner
        assert get_forward_context() is outer == ForwardContext(FULL, KEY)
    with pytest.raises(RuntimeError):
        get_forward_context()


def test_forward_context_takes_runtime_modes_only():
    with pytest.raises(ValueError, match="FULL_DECODE_ONLY is not a runtime mode"):
        with set_forward_context(CUDAGraphMode.FULL_DECODE_ONLY):
            pass


def test_capture_failure_leaves_no_entry_and_can_be_retried(engine):
    """A capture that raises (a host sync, streams exhausted) keeps no graph; the next call captures."""
    fail = [True]

    def runnable(x):
        if fail[0]:
            return x.sum().item()  # illegal in a capture
        return x + 1

    wrapper = GraphWrapper(runnable, FULL, engine)
    with pytest.raises(Exception, match="operation not permitted when stream is capturing"):
        call(wrapper, FULL, KEY, torch.ones(2))
    assert wrapper.num_captured == 0
    fail[0] = False
    call(wrapper, FULL, KEY, torch.ones(2))
    assert wrapper.num_captured == 1


# -- the runner: every scenario's graph path goes through the wrappers ---------------------------
RUNNER_SCENARIO = """
name: wrapped
model: {{kind: random, layers: 2}}
graph: {{mode: {mode}, capture_sizes: [1, 2, 4, 8], debug_input_addresses: {debug}}}
steps: 8
workload:
  requests:
    - {{prompt_len: 5, output_len: 8}}
    - {{prompt_len: 3, output_len: 6, arrival_step: 2, repeat: 2}}
    - {{prompt_len: 12, output_len: 2, arrival_step: 4}}
"""
GRAPH_MODES = ["PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"]


def _run(mode: str, debug: bool = False, extra: str = ""):
    from harness.scenario import load_scenario_text
    from harness.session import run_point

    (point,) = load_scenario_text(RUNNER_SCENARIO.format(mode=mode, debug=str(debug).lower()) + extra)
    return run_point(point, backend="emulated")


@pytest.mark.parametrize("mode", GRAPH_MODES)
def test_runner_replays_never_run_the_model(mode, monkeypatch):
    """Capture on the first call per key, replay after: the graph path's pieces run only in
    eager forwards (warm-up, NONE batches) and inside captures, once per captured graph."""
    from harness.graph import runner as runner_module

    seen: list[tuple[CUDAGraphMode, bool]] = []
    original = runner_module._Piece.__call__

    def spy(self, *args):
        context = get_forward_context()
        seen.append((context.runtime_mode, context.capturing))
        return original(self, *args)

    monkeypatch.setattr(runner_module._Piece, "__call__", spy)
    result = _run(mode)
    assert result.outcome == "passed", result.verdict
    record = result.record
    replayed = [s for s in record.steps if s.runtime_mode != "NONE"]
    assert replayed, "the scenario must replay graphs"
    assert all(m is NONE or capturing for m, capturing in seen)  # no piece ran in a replay
    pieces = 3  # two layers: three pieces
    full_keys = sum(1 for b in record.stream_usage["by_bucket"] if b["mode"] == "FULL")
    piecewise_keys = sum(1 for b in record.stream_usage["by_bucket"] if b["mode"] == "PIECEWISE")
    assert sum(capturing for _, capturing in seen) == pieces * (full_keys + piecewise_keys)
    assert record.graphs_captured == full_keys + pieces * piecewise_keys


@pytest.mark.parametrize("mode", GRAPH_MODES)
def test_runner_keeps_every_input_at_its_captured_address(mode):
    """With the debug check on, the correct pipeline passes in every mode, MTP included: every
    replay reads the static buffers, the pieces' outputs and the attention buffers it captured."""
    assert _run(mode, debug=True).outcome == "passed"
    assert _run(mode, debug=True, extra="features: {mtp: {k: 1}}\n").outcome == "passed"


def test_runner_refuses_a_capture_after_its_capture_phase():
    """A key the dispatcher names but nobody captured raises (vLLM's monitor), never captures lazily."""
    _, _, runner, plans = _capturing_runner("FULL")
    runner.capture([])
    dummy = next(meta for _, key, meta in plans if key.num_tokens == 8)
    with pytest.raises(CaptureDisabledError):
        with set_forward_context(FULL, BatchDescriptor(8)):
            runner.forward(*runner._static_args(dummy))


def _capturing_runner(mode: str, streams=None):
    """The 2-layer scenario's spec in ``mode``, a runner of it on a fresh emulated device, and its capture plans."""
    from harness.engine import load as load_engine
    from harness.graph.plan import StepPlanner
    from harness.graph.runner import GraphRunner, RunnerConfig
    from harness.model import build_model
    from harness.model.parallel import make_kv_cache
    from harness.resolve import resolve_item
    from harness.executor import build_spec

    spec = build_spec(resolve_item(_point_scenario(mode)))
    engine = load_engine("emulated")
    engine.reset_device(*([streams] if streams else []))
    model = build_model(spec.model, engine.device)
    runner = GraphRunner(engine, model, make_kv_cache(model.config, model.parallel, engine.device),
                         RunnerConfig(max(spec.graph.capture_sizes), spec.graph.max_num_seqs, spec.max_blocks_per_req,
                                      mode=spec.graph.mode))
    return engine, spec, runner, StepPlanner(spec.planner_config(), spec.features).capture_plans()


def _point_scenario(mode: str):
    from harness.scenario import load_scenario_text

    (point,) = load_scenario_text(RUNNER_SCENARIO.format(mode=mode, debug="false"))
    return point.scenario


@pytest.mark.parametrize("mode", ["FULL", "FULL_DECODE_ONLY"])
def test_runner_shares_one_workspace_per_capture_size(mode):
    """vLLM Ascend asks FIA for its workspace once per capture size (``graph_params.workspaces``):
    every layer of every FULL graph of that size updates into the same buffer."""
    engine, spec, runner, plans = _capturing_runner(mode)
    runner.capture(plans)
    try:
        assert runner.layer_tasks
        for key, tasks in runner.layer_tasks.items():
            assert len(tasks) == spec.model.num_layers == 2
            assert all(task.workspace is runner.workspaces[key.num_tokens] for task in tasks)
        sizes = {key.num_tokens for key in runner.layer_tasks}
        assert set(runner.workspaces) == sizes
        assert len({ws.data_ptr() for ws in runner.workspaces.values()}) == len(sizes)  # one buffer per size
    finally:
        runner.release()
        engine.reset_device()
    assert not runner.workspaces


def test_a_failed_capture_keeps_no_workspace_it_made():
    """With one stream the second FULL graph fails when its capture ends: the pool takes its
    memory back, so the runner keeps the first size's workspace and not the one the failed
    capture made."""
    from harness.engine import StreamConfig

    engine, _, runner, plans = _capturing_runner("FULL", StreamConfig(pool_size=1))
    with pytest.raises(Exception, match="stream"):
        runner.capture(plans)
    try:
        ok, failed = runner.streams_by_bucket
        assert not ok["failed"] and failed["failed"] and ok["bucket"] != failed["bucket"]
        assert set(runner.workspaces) == {ok["bucket"]}
    finally:
        runner.release()
        engine.reset_device()
