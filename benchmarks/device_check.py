#!/usr/bin/env python
"""One short check of a lent GPU (CUDA) or NPU machine; prints PASS/FAIL per check.

Run from the repository root (no install needed, only torch)::

    python benchmarks/device_check.py            # exit 0: all passed (or "SKIP: no GPU or NPU")
                                                 # exit 1: a check failed

What it checks, through the torch.npu-shaped names of ``harness.engine.load("cuda")``:

1. ``backend``: the cuda backend loads and ``resolve("auto")`` picks a device backend;
2. ``full-graph-device-metadata``: a small decoder's FULL graph, captured once for one bucket,
   replayed over decode steps whose request count and KV lengths change, equals eager within a
   tolerance. CUDA graphs cannot update host lists, so attention is
   ``harness.ops.fia_device_metadata``: the lengths live in static device tensors that are
   refreshed before each replay (how FlashAttention takes ``cu_seqlens``). Eager uses the
   host-list FIA on unpadded metadata, so the two attention implementations are compared too;
3. ``stale-host-lists``: the control. The host-list FIA captured in a CUDA graph keeps its
   capture-time lengths: after the lengths change its logits must differ from eager, which
   shows that check 2 can fail;
4. ``task-groups-unsupported``: task-group calls, ``auto_dispatch_capture`` and
   ``NPUGraph.update`` raise ``UnsupportedOnBackend`` naming the device-metadata variant;
5. ``timing`` (information only): median replay vs eager time of one decode step.

6. ``scenario-verdicts`` (CUDA or NPU): a chosen part of the scenario library (default
   :data:`verdicts.DEFAULT_SELECTION` with ``-k`` :data:`verdicts.DEFAULT_K`; ``--scenarios`` and
   ``-k`` choose another) runs on the emulator and on the device backend, each in its own pytest
   process, and the two verdicts of every item are written side by side
   (``--out``/verdicts.json and verdicts.txt; DIFF marks an item whose outcome or failed checks
   differ). It fails when any item differs or a run did not finish. Both runs together are
   bounded by ``--verdict-budget`` seconds (default 480), so the whole script stays under 10
   minutes. On an NPU machine only checks 1 and 6 run (the others are CUDA-graph specific).

Every check runs even when an earlier one fails; the summary lists them all. Where neither a GPU
nor an NPU is present the script prints SKIP and exits 0.

``--emulate`` runs the same steps on the CPU emulator (``load("emulated")``, on its own device
memory, so a tensor this script left on the host fails there as it would on a GPU) to test this
script where no GPU is lent; it is not a device check and skips the CUDA-only checks.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/verdicts.py

import torch  # noqa: E402

TOL = 2e-3  # max |logit difference| allowed between replay and eager (float32; not bitwise on GPU)
STALE_MIN = 1e-2  # the stale control must differ from eager by at least this much
BUCKET = 4
DECODE_BATCHES = ["ab", "abc", "abcd", "bcd", "bd", "d", "de", "def"]
PROMPTS = {"a": 5, "b": 3, "c": 9, "d": 2, "e": 7, "f": 4}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--emulate", action="store_true", help="dry run on the CPU emulator (no GPU needed)")
    parser.add_argument("--verdicts", action="store_true",
                        help="with --emulate: also run the scenario-verdict comparison (emulated vs emulated)")
    parser.add_argument("--no-verdicts", action="store_true", help="skip the scenario-verdict comparison")
    parser.add_argument("--no-device-checks", action="store_true",
                        help="only the scenario-verdict comparison (checks 1 to 5 skipped)")
    parser.add_argument("--scenarios", nargs="+", default=None, metavar="PATH",
                        help="scenario files or folders for the verdict comparison")
    parser.add_argument("-k", dest="keyword", default=None,
                        help="pytest -k expression for the comparison (default: the default selection's, "
                             "none with --scenarios)")
    parser.add_argument("--mode", default=None, help="pytest --mode for both runs (e.g. all five, comma-separated)")
    parser.add_argument("--workers", type=int, default=0, help="pytest-xdist workers for both runs (0: none)")
    parser.add_argument("--out", default="reports/device-check", help="folder for verdicts.json / verdicts.txt")
    parser.add_argument("--verdict-budget", type=float, default=480.0, help="seconds for both verdict runs")
    args = parser.parse_args(argv)
    device = device_backend()
    if not args.emulate and device is None:
        print(f"SKIP: no GPU or NPU (torch {torch.__version__}: torch.cuda.is_available() is False, "
              "torch_npu absent or sees no device)")
        return 0
    results: list[tuple[str, str, str]] = []

    def run(name: str, fn: Callable[[], str]) -> None:
        started = time.perf_counter()
        try:
            detail = fn()
            status = "INFO" if name == "timing" else "PASS"
        except AssertionError as error:
            status, detail = "FAIL", str(error) or "assertion failed"
        except Exception as error:  # noqa: BLE001 - a crash is a failed check, not a crashed script
            status, detail = "FAIL", f"{type(error).__name__}: {error}"
            traceback.print_exc()
        results.append((name, status, f"{detail} ({time.perf_counter() - started:.2f}s)"))
        print(f"[{status}] {name}: {results[-1][2]}", flush=True)

    where = "the CPU emulator" if args.emulate else f"a {device} device"
    if args.no_device_checks:
        pass
    elif args.emulate or device == "cuda":
        try:
            ctx = Context(emulate=args.emulate)
        except Exception as error:  # noqa: BLE001 - nothing else can run; still a clean FAIL
            traceback.print_exc()
            print(f"FAIL: setup: {type(error).__name__}: {error}")
            return 1
        where = ctx.engine.device_name()
        if not args.emulate:
            run("backend", ctx.check_backend)
        run("full-graph-device-metadata", ctx.check_full_graph)
        run("stale-host-lists", ctx.check_stale_control)
        if not args.emulate:
            run("task-groups-unsupported", ctx.check_unsupported)
        run("timing", ctx.timing)
    else:
        run("backend", lambda: check_npu_backend())
        where = "an Ascend NPU"
    if not args.no_verdicts and (not args.emulate or args.verdicts):
        target = "emulated" if args.emulate else device
        run("scenario-verdicts", lambda: check_verdicts(target, args))

    failed = [r for r in results if r[1] == "FAIL"]
    print("\n| check | result | detail |\n|---|---|---|")
    for name, status, detail in results:
        print(f"| {name} | {status} | {detail} |")
    print(f"\n{'FAIL' if failed else 'PASS'}: {len(results) - len(failed)}/{len(results)} checks "
          f"on {where}" + (" (--emulate: NOT a device check)" if args.emulate else ""))
    return 1 if failed else 0


def device_backend() -> str | None:
    """``"npu"`` when torch_npu sees a device, else ``"cuda"`` when CUDA is available, else None."""
    from harness.engine import cuda_available, npu_available

    if npu_available():
        return "npu"
    return "cuda" if cuda_available() else None


def check_npu_backend() -> str:
    from harness.engine import load, resolve

    engine = load("npu")
    assert resolve("auto") == "npu", f"resolve('auto') gave {resolve('auto')!r} on an NPU machine"
    return f"load('npu') ok, {engine.device_name()}"


def check_verdicts(target: str, args: argparse.Namespace) -> str:
    """The scenario library's verdicts on ``target`` beside the emulator's (see benchmarks/verdicts.py)."""
    from verdicts import DEFAULT_K, verdicts_beside_emulator

    out = Path(args.out)
    k = args.keyword if args.keyword is not None else (DEFAULT_K if args.scenarios is None else None)
    extra = ((f"--mode={args.mode}",) if args.mode else ()) + (("-n", str(args.workers)) if args.workers else ())
    rows, text = verdicts_beside_emulator(target, out, args.scenarios, k, args.verdict_budget, extra)
    print(text, flush=True)
    runs = json.loads((out / "verdicts.json").read_text())["runs"]
    errors = {name: run["run_error"] for name, run in runs.items() if run.get("run_error")}
    assert not errors, f"a verdict run did not finish: {errors}"
    assert rows, "the selection matched no scenario item"
    differ = [r.item for r in rows if r.differs]  # a skip for a device reason is listed, not counted
    assert not differ, f"{len(differ)} of {len(rows)} item(s) differ from the emulator: {differ[:5]}"
    return f"{len(rows)} items agree with the emulator; table in {out}/verdicts.txt"


class Context:
    """The model, caches and static buffers shared by the checks."""

    def __init__(self, emulate: bool = False) -> None:
        from harness.engine import load
        from harness.model import ModelConfig, PagedKVCache, build_model

        self.engine = load("emulated" if emulate else "cuda")
        if emulate:
            self.engine.reset_device()
        self.device = self.engine.device  # the emulated NPU's own memory, or the GPU: never the host
        self.cfg = ModelConfig(kind="random", num_layers=3, hidden_size=64, num_heads=4, num_kv_heads=2,
                               head_dim=16, vocab_size=257, block_size=4, num_blocks=64, max_model_len=64,
                               seed=11)
        self.max_blocks = self.cfg.max_model_len // self.cfg.block_size
        self.model = build_model(self.cfg, device=self.device)
        self.new_cache = lambda: PagedKVCache(self.cfg, device=self.device)

    # -- metadata -------------------------------------------------------------------------------
    def _slot(self, blocks: list[int], pos: int) -> int:
        bs = self.cfg.block_size
        return blocks[pos // bs] * bs + pos % bs

    def _table(self, rows: list[list[int]], num_rows: int | None = None) -> torch.Tensor:
        rows = [r + [0] * (self.max_blocks - len(r)) for r in rows]
        rows += [[0] * self.max_blocks] * ((num_rows or len(rows)) - len(rows))
        return torch.tensor(rows, dtype=torch.int32, device=self.device)

    def eager(self, cache, ids, positions, slots, q_cum, kv_lens, rows) -> torch.Tensor:
        from harness.model import make_eager_attend

        attend = make_eager_attend(self.cfg, q_cum, kv_lens, self._table(rows))
        as_t = lambda v: torch.tensor(v, dtype=torch.int64, device=self.device)  # noqa: E731
        return self.model(as_t(ids), as_t(positions), as_t(slots), cache, attend)

    def workload(self):
        """Decode steps of DECODE_BATCHES; yields (batch, per-request (token, pos, blocks))."""
        gen = torch.Generator().manual_seed(5)
        state: dict[str, dict] = {}
        next_block = 1
        for batch in DECODE_BATCHES:
            joined = []
            for rid in batch:
                if rid not in state:
                    tokens = torch.randint(0, self.cfg.vocab_size, (PROMPTS[rid],), generator=gen).tolist()
                    state[rid] = {"tokens": tokens, "blocks": list(range(next_block, next_block + 4)),
                                  "computed": len(tokens) - 1}
                    next_block += 4
                    joined.append(rid)
            yield batch, joined, state
            # the caller appended sampled tokens; advance
            for rid in batch:
                state[rid]["computed"] += 1

    def prefill(self, caches, req) -> None:
        n = req["computed"]
        for cache in caches:
            self.eager(cache, req["tokens"][:n], list(range(n)), [self._slot(req["blocks"], p) for p in range(n)],
                       [n], [n], [req["blocks"]])

    def decode_lists(self, batch, state):
        reqs = [state[r] for r in batch]
        pos = [r["computed"] for r in reqs]
        return dict(ids=[r["tokens"][p] for r, p in zip(reqs, pos)], positions=pos,
                    slots=[self._slot(r["blocks"], p) for r, p in zip(reqs, pos)],
                    q_cum=list(range(1, len(reqs) + 1)), kv_lens=[p + 1 for p in pos],
                    rows=[r["blocks"] for r in reqs])

    # -- graphs -----------------------------------------------------------------------------------
    def static_buffers(self, T: int) -> dict[str, torch.Tensor]:
        d = self.device
        return dict(ids=torch.zeros(T, dtype=torch.int64, device=d), positions=torch.zeros(T, dtype=torch.int64, device=d),
                    slots=torch.full((T,), -1, dtype=torch.int64, device=d),
                    qsl=torch.zeros(T + 1, dtype=torch.int32, device=d), kv=torch.zeros(T, dtype=torch.int32, device=d),
                    table=torch.zeros(T, self.max_blocks, dtype=torch.int32, device=d))

    def write_static(self, buf: dict[str, torch.Tensor], lists: dict) -> None:
        T, n = buf["ids"].shape[0], len(lists["ids"])
        pad = T - n
        cpu = lambda v, dt=torch.int64: torch.tensor(v, dtype=dt)  # noqa: E731
        buf["ids"].copy_(cpu(lists["ids"] + [0] * pad))
        buf["positions"].copy_(cpu(lists["positions"] + [0] * pad))
        buf["slots"].copy_(cpu(lists["slots"] + [-1] * pad))
        starts = [0] + lists["q_cum"]
        buf["qsl"].copy_(cpu(starts + [starts[-1]] * (T + 1 - len(starts)), torch.int32))  # unused: empty
        buf["kv"].copy_(cpu(lists["kv_lens"] + [0] * pad, torch.int32))
        buf["table"].copy_(self._table(lists["rows"], T))

    def device_metadata_attend(self, buf: dict[str, torch.Tensor]):
        from harness.ops import fia_device_metadata

        T = buf["ids"].shape[0]

        def attend(layer, query, key_cache, value_cache):
            out, _ = fia_device_metadata(
                query, key_cache, value_cache, buf["qsl"], buf["kv"], buf["table"],
                block_size=self.cfg.block_size, num_heads=self.cfg.num_heads,
                num_key_value_heads=self.cfg.num_kv_heads, scale=self.model.attention_scale,
                max_num_reqs=T, sparse_mode=3)
            return out

        return attend

    def host_list_attend(self, buf: dict[str, torch.Tensor], lists: dict):
        """FIA with host lists (frozen at capture on CUDA); padded so that [-1] == T."""
        from harness.model import make_eager_attend

        T, n = buf["ids"].shape[0], len(lists["ids"])
        q_cum = lists["q_cum"] + ([T] if n < T else [])
        kv = lists["kv_lens"] + ([0] if n < T else [])
        return make_eager_attend(self.cfg, q_cum, kv, buf["table"])

    def capture(self, buf, attend, cache):
        engine = self.engine
        forward = lambda: self.model(buf["ids"], buf["positions"], buf["slots"], cache, attend)  # noqa: E731
        side = engine.Stream()
        side.wait_stream(engine.current_stream())
        with engine.stream(side):  # warm-up off the default stream (cuBLAS handles, allocator)
            for _ in range(2):
                forward()
        engine.current_stream().wait_stream(side)
        engine.synchronize()
        g = engine.NPUGraph()
        with engine.graph(g, pool=engine.graph_pool_handle()):
            logits = forward()
        return g, logits

    def run_workload(self, make_attend, label: str):
        """Replay one FULL graph over the workload; return per-step max |graph - eager|."""
        engine = self.engine
        caches = {"eager": self.new_cache(), "graph": self.new_cache()}
        buf = self.static_buffers(BUCKET)
        graph = logits = None
        diffs, argmax_agree = [], 0
        for batch, joined, state in self.workload():
            for rid in joined:
                self.prefill(caches.values(), state[rid])
            lists = self.decode_lists(batch, state)
            self.write_static(buf, lists)  # before capture too: the warm-up reads it
            if graph is None:
                graph, logits = self.capture(buf, make_attend(buf, lists), caches["graph"])
                self.write_static(buf, lists)
            graph.replay()
            engine.synchronize()
            got = logits[: len(batch)].clone()
            want = self.eager(caches["eager"], lists["ids"], lists["positions"], lists["slots"],
                              lists["q_cum"], lists["kv_lens"], lists["rows"])
            diffs.append((got - want).abs().max().item())
            argmax_agree += int(torch.equal(got.argmax(-1), want.argmax(-1)))
            for rid, tok in zip(batch, want.argmax(-1).tolist()):  # teacher forcing from eager
                req = state[rid]
                if req["computed"] + 1 == len(req["tokens"]):
                    req["tokens"].append(int(tok))
        graph.reset()
        return diffs, argmax_agree

    # -- checks -------------------------------------------------------------------------------------
    def check_backend(self) -> str:
        from harness.engine import resolve

        assert self.engine.name == "cuda" and not self.engine.capabilities.task_updates
        auto = resolve("auto")
        assert auto in ("cuda", "npu"), f"resolve('auto') gave {auto!r} on a CUDA machine"
        return f"load('cuda') ok, resolve('auto') = {auto}, {self.engine.device_name()}"

    def check_full_graph(self) -> str:
        diffs, agree = self.run_workload(lambda buf, lists: self.device_metadata_attend(buf), "device-metadata")
        worst = max(diffs)
        assert worst <= TOL, f"replay differs from eager by {worst:.3g} > {TOL} (per step: {diffs})"
        return (f"{len(diffs)} decode steps, bucket T={BUCKET}, max abs diff {worst:.2e} <= {TOL}, "
                f"argmax equal on {agree}/{len(diffs)} steps")

    def check_stale_control(self) -> str:
        diffs, _ = self.run_workload(self.host_list_attend, "host-list")
        assert diffs[0] <= TOL, f"the capture-time step itself differs from eager by {diffs[0]:.3g}"
        later = diffs[1:]
        assert min(later) > STALE_MIN, (
            f"host lists frozen at capture should give stale logits after the lengths change, but the "
            f"differences are {later}: the full-graph check could not detect staleness"
        )
        return f"step 0 max abs diff {diffs[0]:.1e}; later steps stale, smallest max abs diff {min(later):.3g}"

    def check_unsupported(self) -> str:
        from harness.engine import UnsupportedOnBackend

        engine = self.engine
        stream = engine.current_stream()
        calls = {
            "graph_task_group_begin": lambda: engine.graph_task_group_begin(stream),
            "graph_task_group_end": lambda: engine.graph_task_group_end(stream),
            "graph_task_update_begin": lambda: engine.graph_task_update_begin(stream, None),
            "graph_task_update_end": lambda: engine.graph_task_update_end(stream),
            "graph(auto_dispatch_capture=True)": lambda: engine.graph(engine.NPUGraph(), auto_dispatch_capture=True),
            "NPUGraph.update": lambda: engine.NPUGraph().update(cpu_update_input=[{"actual_seq_lengths": [1]}]),
        }
        for name, call in calls.items():
            try:
                call()
            except UnsupportedOnBackend as error:
                assert "fia_device_metadata" in str(error), f"{name}: message does not point at the variant: {error}"
            else:
                raise AssertionError(f"{name} did not raise UnsupportedOnBackend")
        return f"{len(calls)} calls raise UnsupportedOnBackend pointing at fia_device_metadata"

    def timing(self) -> str:
        engine = self.engine
        cache = self.new_cache()
        buf = self.static_buffers(BUCKET)
        lists = dict(ids=[1, 2, 3], positions=[4, 5, 6], slots=[self._slot([1, 2], p) for p in (4, 5, 6)],
                     q_cum=[1, 2, 3], kv_lens=[5, 6, 7], rows=[[1, 2], [3, 4], [5, 6]])
        self.write_static(buf, lists)
        attend = self.device_metadata_attend(buf)
        graph, _ = self.capture(buf, attend, cache)

        def timed(fn, reps=30):
            samples = []
            for _ in range(reps):
                engine.synchronize()
                t0 = time.perf_counter()
                fn()
                engine.synchronize()
                samples.append(time.perf_counter() - t0)
            return statistics.median(samples)

        replay = timed(graph.replay)
        eager = timed(lambda: self.model(buf["ids"], buf["positions"], buf["slots"], cache, attend))
        graph.reset()
        return f"one decode step T={BUCKET}: replay {replay * 1e6:.0f} us, eager {eager * 1e6:.0f} us, " \
               f"eager/replay {eager / replay:.1f}x (median of 30)"


if __name__ == "__main__":
    sys.exit(main())
