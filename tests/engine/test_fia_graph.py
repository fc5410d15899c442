"""The FIA op in captured graphs on the emulated engine: the peers' tests, made exact.

Mirrors (reference section 9) torch_npu ``test/npu/test_aclgraph_update.py`` (capture FIA with
``actual_seq_lengths=[29]``, update to ``[100]``, replay: output and softmax LSE equal eager with
``[100]``) and ``test_aclgraph_rng_state.py`` (a host sync inside a capture raises and the capture
can be redone), and the vLLM Ascend FULL-graph decode loop (reference section 6): one graph per
bucket, a per-layer ExternalEvent + task group around FIA ``.out``, host lists updated after each
``replay()`` on an update stream. Every comparison with eager is bitwise (``torch.equal``): the
emulated engine replays the same CPU kernels on the same shapes.

Each test fails if the engine's semantics are wrong: a replay that does not wait for the
event, an update that is not applied (or applied to the wrong node), host values that are not
frozen at capture, a host sync that is not refused, a budget that is not enforced.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch
from torch import Tensor

from harness.engine import CaptureError, GraphHangError, StreamBudgetError, StreamConfig, TaskUpdateError
from harness.ops.attention import LayerTask, capture_task_group, update_task_group
from harness.engine.emulated.recorder import OpNode
from harness.engine.emulated.tensors import host_data
from harness.model import ModelConfig, PagedKVCache, build_model, make_eager_attend
from harness.ops import (
    FIA_OP_NAME,
    fia_contract,
    get_max_workspace,
    npu_fused_infer_attention_score,
    npu_fused_infer_attention_score_out,
    register_updatable_ops,
)

# Tensors these tests make live on the emulated NPU, as the pipeline's do (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("on_npu")

# =========================================================================== single FIA op

N_HEADS, N_KV_HEADS, HEAD_DIM, BLOCK = 4, 2, 16, 16


@dataclass
class FiaInputs:
    query: Tensor
    key: Tensor
    value: Tensor
    block_table: Tensor

    def kwargs(self, q_lens: list[int], kv_lens: list[int], lse: bool = True) -> dict:
        return dict(
            actual_seq_lengths=q_lens, actual_seq_lengths_kv=kv_lens, block_table=self.block_table,
            block_size=BLOCK, num_heads=N_HEADS, num_key_value_heads=N_KV_HEADS, scale=0.25,
            input_layout="TND", sparse_mode=3, softmax_lse_flag=lse,
        )


def _fia_inputs(T: int, kv_capacity: int = 112, seed: int = 0) -> FiaInputs:
    g = torch.Generator().manual_seed(seed)
    blocks = -(-kv_capacity // BLOCK)
    key = torch.randn(blocks + 1, BLOCK, N_KV_HEADS, HEAD_DIM, generator=g)
    value = torch.randn(blocks + 1, BLOCK, N_KV_HEADS, HEAD_DIM, generator=g)
    query = torch.randn(T, N_HEADS, HEAD_DIM, generator=g)
    block_table = torch.arange(1, blocks + 1, dtype=torch.int32).unsqueeze(0)  # block 0 is null
    return FiaInputs(query, key, value, block_table)


# (T, capture lists, update lists, contract):
# "decode": the IFA shape of torch_npu's test, one query token, KV length 29 -> 100 (strict);
# "prefill": one request whose query length is 29 -> 100 in a T=100 query; 29 < T needs the
#            relaxed contract (reference section 4), the rows past 29 are padding until updated.
SHAPES = {
    "decode": (1, ([1], [29]), ([1], [100]), "strict"),
    "prefill": (100, ([29], [29]), ([100], [100]), "relaxed"),
}


def _capture_task_group(npu, x: FiaInputs, q_lens, kv_lens):
    """Capture FIA ``.out`` as vLLM Ascend does: event wait/reset, then a task group."""
    g = npu.NPUGraph()
    with npu.graph(g):
        task = capture_task_group(npu, x.query, x.key, x.value, x.kwargs(q_lens, kv_lens))
    return g, task.event, task.handle, task.workspace, task.out, task.lse


def _update(npu, stream, handle, event, x: FiaInputs, q_lens, kv_lens, workspace, out, lse) -> None:
    task = LayerTask(handle, event, x.query, out, lse, workspace)
    with npu.stream(stream):
        update_task_group(npu, stream, task, x.key, x.value, x.kwargs(q_lens, kv_lens))


@pytest.mark.parametrize("order", ["replay-then-update", "update-then-replay"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_aclgraph_update_task_group(npu, shape, order):
    """torch_npu test_aclgraph_update: [29] captured, [100] updated, output and LSE == eager [100]."""
    T, (q0, kv0), (q1, kv1), contract = SHAPES[shape]
    x = _fia_inputs(T)
    with fia_contract(contract):
        eager_new = npu_fused_infer_attention_score(x.query, x.key, x.value, **x.kwargs(q1, kv1))
        eager_old = npu_fused_infer_attention_score(x.query, x.key, x.value, **x.kwargs(q0, kv0))
        assert not torch.equal(eager_new[0], eager_old[0])  # the update must matter
        g, event, handle, workspace, out, lse = _capture_task_group(npu, x, q0, kv0)
        assert out.isnan().all()  # nothing ran at capture
        update_stream = npu.Stream()
        if order == "replay-then-update":  # vLLM Ascend: the replay stalls at the event
            g.replay()
            assert not npu.current_stream().query(), "the replay did not stop at the event wait"
            # FIA has not run, with either list (peeked at: reading device memory would wait for ever)
            assert not torch.equal(host_data(out), host_data(eager_old[0]))
            _update(npu, update_stream, handle, event, x, q1, kv1, workspace, out, lse)
        else:  # torch_npu's test: update and record first, then replay
            _update(npu, update_stream, handle, event, x, q1, kv1, workspace, out, lse)
            g.replay()
        npu.synchronize()
    assert torch.equal(out, eager_new[0])
    assert torch.equal(lse, eager_new[1])
    assert npu.executed_host_arguments(g, FIA_OP_NAME, ("actual_seq_lengths", "actual_seq_lengths_kv")) == [
        {"actual_seq_lengths": q1, "actual_seq_lengths_kv": kv1}
    ]


@pytest.mark.parametrize("shape", list(SHAPES))
def test_aclgraph_without_update_replays_capture_time_lengths(npu, shape):
    """The bug the update fixes: a replay re-issues the frozen [29], whatever the live batch is."""
    T, (q0, kv0), (q1, kv1), contract = SHAPES[shape]
    x = _fia_inputs(T)
    with fia_contract(contract):
        eager_old = npu_fused_infer_attention_score(x.query, x.key, x.value, **x.kwargs(q0, kv0))
        eager_new = npu_fused_infer_attention_score(x.query, x.key, x.value, **x.kwargs(q1, kv1))
        live_q, live_kv = list(q0), list(kv0)
        g, event, _, _, out, lse = _capture_task_group(npu, x, live_q, live_kv)
        live_q[:], live_kv[:] = q1, kv1  # the caller's lists change: the graph kept copies
        g.replay()
        event.record(npu.Stream())  # released, but nothing was updated
        npu.synchronize()
    assert torch.equal(out, eager_old[0]) and torch.equal(lse, eager_old[1])
    assert not torch.equal(out, eager_new[0])


@pytest.mark.parametrize("form", ["out", "functional"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_aclgraph_update_auto_dispatch_capture(npu, shape, form):
    """``graph(g, auto_dispatch_capture=True)`` + ``g.update(cpu_update_input=[{...}])``."""
    register_updatable_ops(npu)
    T, (q0, kv0), (q1, kv1), contract = SHAPES[shape]
    x = _fia_inputs(T)
    with fia_contract(contract):
        eager_new = npu_fused_infer_attention_score(x.query, x.key, x.value, **x.kwargs(q1, kv1))
        g = npu.NPUGraph()
        with npu.graph(g, auto_dispatch_capture=True):
            if form == "out":
                kwargs = x.kwargs(q0, kv0)
                workspace = get_max_workspace(x.query, x.key, x.value, **kwargs)
                out = torch.empty_like(x.query)
                lse = torch.empty(T, N_HEADS, 1, dtype=torch.float32)
                npu_fused_infer_attention_score_out(x.query, x.key, x.value, **kwargs, workspace=workspace,
                                                    out=(out, lse))
            else:
                out, lse = npu_fused_infer_attention_score(x.query, x.key, x.value, **x.kwargs(q0, kv0))
        g.update(cpu_update_input=[{"actual_seq_lengths": q1, "actual_seq_lengths_kv": kv1}])
        g.replay()
        npu.synchronize()
    assert torch.equal(out, eager_new[0]) and torch.equal(lse, eager_new[1])
    # torch_npu's dispatch mode captured an event wait before FIA and update() records it: the
    # update persists, but a second replay needs another update() or it never finishes.
    out.fill_(float("nan"))
    g.update(cpu_update_input=[{}])
    g.replay()
    npu.synchronize()
    assert torch.equal(out, eager_new[0])
    g.replay()
    with pytest.raises(GraphHangError, match=r"waits at node #\d+ \(before harness::npu_fused_infer_attention_score"):
        npu.synchronize()


def test_fia_capture_records_one_node_in_its_task_group(npu):
    x = _fia_inputs(1)
    g, event, handle, _, _, _ = _capture_task_group(npu, x, [1], [29])
    fia_nodes = [n for n in g.nodes if isinstance(n, OpNode) and n.func._schema.name == FIA_OP_NAME]
    assert len(fia_nodes) == 1, [n.name for n in g.nodes if isinstance(n, OpNode)]
    assert fia_nodes[0].kind == "mutating" and fia_nodes[0].name == FIA_OP_NAME + ".out"
    assert handle.nodes() == fia_nodes  # the task group holds exactly the FIA node
    # The host lists are stored frozen, as plain values (no tensor), in that one node, and a
    # replay reports running with them.
    assert npu.executed_host_arguments(g, FIA_OP_NAME, ("actual_seq_lengths",)) == []  # none ran yet
    g.replay()
    event.record(npu.Stream())
    npu.synchronize()
    assert npu.executed_host_arguments(g, FIA_OP_NAME, ("actual_seq_lengths", "actual_seq_lengths_kv")) == [
        {"actual_seq_lengths": [1], "actual_seq_lengths_kv": [29]}
    ]


@pytest.mark.parametrize("swap", ["query", "workspace", "out"])
def test_task_update_with_another_tensor_is_rejected(npu, swap):
    x = _fia_inputs(1)
    g, event, handle, workspace, out, lse = _capture_task_group(npu, x, [1], [29])
    stream = npu.Stream()
    query = x.query.clone() if swap == "query" else x.query
    ws = workspace.clone() if swap == "workspace" else workspace
    o = out.clone() if swap == "out" else out
    name = {"query": "query", "workspace": "workspace", "out": "attention_out"}[swap]
    npu.graph_task_update_begin(stream, handle)
    with pytest.raises(TaskUpdateError, match=f"'{name}' is a different tensor"):
        npu_fused_infer_attention_score_out(query, x.key, x.value, **x.kwargs([1], [100]),
                                            workspace=ws, out=(o, lse))
    with pytest.raises(TaskUpdateError, match="no operation was re-issued"):
        npu.graph_task_update_end(stream)  # the rejected call changed nothing
    g.replay()
    event.record(stream)
    npu.synchronize()
    eager_old = npu_fused_infer_attention_score(x.query, x.key, x.value, **x.kwargs([1], [29]))
    assert torch.equal(out, eager_old[0])  # the graph still runs the captured lengths


def test_task_update_accepts_a_view_at_the_captured_address(npu):
    """Tensors are bound by address: a fresh view of the same memory is the same argument."""
    x = _fia_inputs(1)
    g, event, handle, workspace, out, lse = _capture_task_group(npu, x, [1], [29])
    same = FiaInputs(x.query.view(x.query.shape), x.key, x.value, x.block_table)
    g.replay()
    _update(npu, npu.Stream(), handle, event, same, [1], [100], workspace, out, lse)
    npu.synchronize()
    assert torch.equal(out, npu_fused_infer_attention_score(x.query, x.key, x.value, **x.kwargs([1], [100]))[0])


# =========================================================================== decoder, FULL graph

CFG = ModelConfig(kind="random", num_layers=3, hidden_size=32, num_heads=4, num_kv_heads=2, head_dim=8,
                  vocab_size=97, block_size=4, num_blocks=64, max_model_len=64, seed=11)
MAX_BLOCKS = CFG.max_model_len // CFG.block_size
BUCKET = 4  # T of the one captured graph; up to 4 real decode requests


@dataclass
class Request:
    tokens: list[int]
    blocks: list[int]
    computed: int = 0  # tokens whose KV is in the cache


@dataclass
class StepMeta:
    """One decode step's host lists; ``padded`` adds the dummy request so that [-1] == T."""

    input_ids: list[int]
    positions: list[int]
    slots: list[int]
    q_cum: list[int]
    kv_lens: list[int]
    block_rows: list[list[int]]

    def padded(self, T: int) -> "StepMeta":
        n, pad = len(self.input_ids), T - len(self.input_ids)
        if pad == 0:
            return self
        return StepMeta(self.input_ids + [0] * pad, self.positions + [0] * pad, self.slots + [-1] * pad,
                        self.q_cum + [n + pad], self.kv_lens + [0], self.block_rows + [[0] * MAX_BLOCKS])


def _slot(req: Request, pos: int) -> int:
    return req.blocks[pos // CFG.block_size] * CFG.block_size + pos % CFG.block_size


def _decode_meta(requests: list[Request]) -> StepMeta:
    pos = [r.computed for r in requests]
    return StepMeta(
        input_ids=[r.tokens[p] for r, p in zip(requests, pos)],
        positions=pos,
        slots=[_slot(r, p) for r, p in zip(requests, pos)],
        q_cum=list(range(1, len(requests) + 1)),
        kv_lens=[p + 1 for p in pos],
        block_rows=[r.blocks + [0] * (MAX_BLOCKS - len(r.blocks)) for r in requests],
    )


def _eager(model, cache: PagedKVCache, meta: StepMeta) -> Tensor:
    table = torch.tensor(meta.block_rows, dtype=torch.int32)
    attend = make_eager_attend(CFG, meta.q_cum, meta.kv_lens, table)
    return model(torch.tensor(meta.input_ids), torch.tensor(meta.positions), torch.tensor(meta.slots),
                 cache, attend)


def _prefill(model, cache: PagedKVCache, req: Request) -> None:
    n = len(req.tokens) - 1  # the last prompt token is decoded by the first decode step
    meta = StepMeta(req.tokens[:n], list(range(n)), [_slot(req, p) for p in range(n)], [n], [n],
                    [req.blocks + [0] * (MAX_BLOCKS - len(req.blocks))])
    _eager(model, cache, meta)
    req.computed = n


@dataclass(eq=False)
class Layer:
    handle: object
    event: object
    query: Tensor
    out: Tensor
    lse: Tensor
    workspace: Tensor


@dataclass(eq=False)
class FullDecodeGraph:
    """A FULL graph of the decoder for one bucket, captured and replayed with the engine API."""

    npu: object
    model: object
    cache: PagedKVCache
    T: int
    update: bool = True
    layers: list[Layer] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.input_ids = torch.zeros(self.T, dtype=torch.int64)
        self.positions = torch.zeros(self.T, dtype=torch.int64)
        self.slots = torch.full((self.T,), -1, dtype=torch.int64)
        self.block_table = torch.zeros(self.T, MAX_BLOCKS, dtype=torch.int32)
        self.update_stream = self.npu.Stream()
        self.graph = None

    def fia_kwargs(self, meta: StepMeta) -> dict:
        return dict(actual_seq_lengths=list(meta.q_cum), actual_seq_lengths_kv=list(meta.kv_lens),
                    block_table=self.block_table, block_size=CFG.block_size, num_heads=CFG.num_heads,
                    num_key_value_heads=CFG.num_kv_heads, scale=self.model.attention_scale,
                    input_layout="TND", sparse_mode=3)

    def write_static(self, meta: StepMeta) -> None:
        self.input_ids.copy_(torch.tensor(meta.input_ids))
        self.positions.copy_(torch.tensor(meta.positions))
        self.slots.copy_(torch.tensor(meta.slots))
        self.block_table.zero_()
        self.block_table[: len(meta.block_rows)].copy_(torch.tensor(meta.block_rows, dtype=torch.int32))

    def capture(self, meta: StepMeta, pool=None, graph=None) -> None:
        npu = self.npu
        self.layers.clear()
        self.write_static(meta)

        def attend(layer, query, key_cache, value_cache):
            stream = npu.current_stream()
            kwargs = self.fia_kwargs(meta)
            workspace = get_max_workspace(query, key_cache, value_cache, **kwargs)
            out = torch.empty_like(query)
            lse = torch.empty(query.shape[0], query.shape[1], 1, dtype=torch.float32)
            event = npu.ExternalEvent()
            event.wait(stream)
            event.reset(stream)
            npu.graph_task_group_begin(stream)
            npu_fused_infer_attention_score_out(query, key_cache, value_cache, **kwargs,
                                                workspace=workspace, out=(out, lse))
            self.layers.append(Layer(npu.graph_task_group_end(stream), event, query, out, lse, workspace))
            return out

        self.graph = graph if graph is not None else npu.NPUGraph()
        with npu.graph(self.graph, pool=pool):
            self.logits = self.model(self.input_ids, self.positions, self.slots, self.cache, attend)

    def run(self, meta: StepMeta) -> Tensor:
        npu = self.npu
        self.write_static(meta)
        self.graph.replay()  # stalls at layer 0's event
        stream = self.update_stream
        with npu.stream(stream):
            for i, layer in enumerate(self.layers):
                if self.update:
                    npu.graph_task_update_begin(stream, layer.handle)
                    npu_fused_infer_attention_score_out(
                        layer.query, self.cache.key_cache[i], self.cache.value_cache[i], **self.fia_kwargs(meta),
                        workspace=layer.workspace, out=(layer.out, layer.lse))
                    npu.graph_task_update_end(stream)
                layer.event.record(stream)
        npu.synchronize()
        return self.logits


# Decode batches over 14 steps: requests join (prefilled eagerly first) and leave; the count of
# real requests goes 2,3,4,3,2,1,2,3,4,... while the bucket stays T=4. Prompts of various lengths
# cross block boundaries (block_size 4) so block-table rows change too.
PROMPTS = {"a": 5, "b": 3, "c": 9, "d": 2, "e": 7, "f": 4, "g": 6}
SCHEDULE = [
    "ab", "abc", "abcd", "bcd", "bd", "d", "de", "def", "defg", "efg", "eg", "g", "ag", "acg",
]


def _run_schedule(npu, graph_update: bool, steps: int = len(SCHEDULE)):
    """Run SCHEDULE through eager (own cache, unpadded) and a FULL graph (own cache, padded).

    Both paths decode the eager path's tokens (teacher forcing), so the batches are identical
    and the only difference is how the step is executed. Yields (step, eager, graph) logits.
    """
    register_updatable_ops(npu)
    model = build_model(CFG, npu.device)
    caches = {"eager": PagedKVCache(CFG, npu.device), "graph": PagedKVCache(CFG, npu.device)}
    gen = torch.Generator().manual_seed(5)
    next_block = 1
    requests: dict[str, dict[str, Request]] = {"eager": {}, "graph": {}}
    full = FullDecodeGraph(npu, model, caches["graph"], BUCKET, update=graph_update)
    for step, batch in enumerate(SCHEDULE[:steps]):
        for rid in batch:
            if rid not in requests["eager"]:  # joins: blocks for its whole life, eager prefill
                prompt = torch.randint(0, CFG.vocab_size, (PROMPTS[rid],), generator=gen).tolist()
                blocks = list(range(next_block, next_block + 4))
                next_block += 4
                for path in caches:
                    requests[path][rid] = Request(list(prompt), list(blocks))
                    _prefill(model, caches[path], requests[path][rid])
        live = {path: [requests[path][rid] for rid in batch] for path in caches}
        meta = _decode_meta(live["eager"])
        assert meta == _decode_meta(live["graph"])
        eager_logits = _eager(model, caches["eager"], meta)
        padded = meta.padded(BUCKET)
        assert padded.q_cum[-1] == BUCKET and len(padded.input_ids) == BUCKET
        if full.graph is None:
            full.capture(padded)
        graph_logits = full.run(padded)[: len(batch)].clone()
        yield step, meta, eager_logits, graph_logits, full
        for rid, row in zip(batch, eager_logits.argmax(dim=-1).tolist()):
            for path in caches:
                req = requests[path][rid]
                req.computed += 1
                if req.computed == len(req.tokens):
                    req.tokens.append(int(row))


def test_full_graph_with_per_layer_updates_is_bitwise_eager_over_changing_batches(npu):
    counts, kv_seen = set(), []
    for step, meta, eager_logits, graph_logits, full in _run_schedule(npu, graph_update=True):
        assert torch.equal(graph_logits, eager_logits), f"step {step}: replay differs from eager"
        counts.add(len(meta.input_ids))
        kv_seen.append(meta.kv_lens)
        executed = npu.executed_host_arguments(full.graph, FIA_OP_NAME, ("actual_seq_lengths", "actual_seq_lengths_kv"))
        padded = meta.padded(BUCKET)
        assert executed == [{"actual_seq_lengths": padded.q_cum, "actual_seq_lengths_kv": padded.kv_lens}] * CFG.num_layers
    assert step + 1 >= 12 and counts == {1, 2, 3, 4}
    assert len({tuple(k) for k in kv_seen}) == len(kv_seen)  # every step had other lengths
    assert len(full.graph.nodes) > 0 and full.graph.streams_held == 1  # one graph, captured once


def test_full_graph_without_updates_reproduces_the_stale_result(npu):
    """Without the update every replay attends with the capture-time lengths: wrong logits."""
    diffs = []
    for step, meta, eager_logits, graph_logits, full in _run_schedule(npu, graph_update=False, steps=6):
        executed = npu.executed_host_arguments(full.graph, FIA_OP_NAME, ("actual_seq_lengths_kv",))
        assert executed == [{"actual_seq_lengths_kv": [5, 3, 0]}] * CFG.num_layers  # step 0's, frozen
        if step == 0:
            assert torch.equal(graph_logits, eager_logits)  # the capture-time batch itself is right
        else:
            diffs.append((graph_logits - eager_logits).abs().max().item())
    assert len(diffs) == 5 and min(diffs) > 1e-3, diffs


def _one_request(model, cache: PagedKVCache) -> Request:
    req = Request([3, 1, 4, 1, 5], [1, 2, 3, 4])
    _prefill(model, cache, req)
    return req


def test_item_inside_capture_raises_and_capture_can_be_redone(npu):
    """torch_npu test_aclgraph_rng_state: a host sync refuses the capture; the graph is reusable."""
    model = build_model(CFG, npu.device)
    caches = [PagedKVCache(CFG, npu.device), PagedKVCache(CFG, npu.device)]
    req = [_one_request(model, c) for c in caches][0]
    meta = _decode_meta([req])
    full = FullDecodeGraph(npu, model, caches[0], BUCKET)
    full.write_static(meta.padded(BUCKET))
    g = npu.NPUGraph()
    in_use = npu.stream_usage()["in_use"]
    kv_before = caches[0].key_cache[0].clone()

    def attend_with_item(layer, query, key_cache, value_cache):
        scale = query.abs().max().item()  # a host read in the middle of the forward
        return query / scale

    with pytest.raises(CaptureError, match="operation not permitted when stream is capturing"):
        with npu.graph(g):
            model(full.input_ids, full.positions, full.slots, caches[0], attend_with_item)
    assert npu.stream_usage()["in_use"] == in_use  # the failed capture holds no stream
    assert g.nodes == [] and g.bytes_held == 0 and "captured" not in repr(g)
    assert torch.equal(caches[0].key_cache[0], kv_before)  # and had no side effect
    assert torch.tensor([1.5]).item() == 1.5  # host reads work again

    full.capture(meta.padded(BUCKET), graph=g)  # the same NPUGraph object, captured again
    assert full.graph is g and g.streams_held == 1
    logits = full.run(meta.padded(BUCKET))[:1]
    assert torch.equal(logits, _eager(model, caches[1], meta))


def test_stream_budget_exhaustion_raises_207008_for_decoder_graphs(npu):
    """One FULL graph per bucket; a pool of 3 streams takes 3 graphs, the 4th capture fails."""
    npu.reset_device(StreamConfig(pool_size=3, per_graph=1))
    model = build_model(CFG, npu.device)
    cache = PagedKVCache(CFG, npu.device)
    req = _one_request(model, cache)
    meta = _decode_meta([req])
    pool = npu.graph_pool_handle()
    graphs = {}
    for T in (8, 4, 2):  # largest first, one shared pool, as vLLM captures
        graphs[T] = FullDecodeGraph(npu, model, cache, T)
        graphs[T].capture(meta.padded(T), pool=pool)
    assert npu.stream_usage()["in_use"] == 3
    one = FullDecodeGraph(npu, model, cache, 1)
    with pytest.raises(StreamBudgetError, match="error code 207008: Stream resources are insufficient") as info:
        one.capture(meta.padded(1), pool=pool)
    assert info.value.code == 207008 and info.value.pool_size == 3
    assert npu.stream_usage()["in_use"] == 3 and one.graph.streams_held == 0
    graphs[8].graph.reset()  # giving a graph back frees its stream: the capture now fits
    one.capture(meta.padded(1), pool=pool, graph=one.graph)
    assert npu.stream_usage()["in_use"] == 3
    got = one.run(meta.padded(1))[:1].clone()
    assert torch.equal(got, _eager(model, cache, meta))  # eager rewrites the same KV: same bits
