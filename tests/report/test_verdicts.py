"""graph-harness verdicts: two backends' verdicts on the same items, item by item.

Hand-made results files, so every kind of row is shown: agreeing items, a different outcome, a
different set of failed checks, an item one run lacks, and items a device run skipped: for a
device reason (listed, not counted; the two reasons are tied to the code that writes them) or
for any other reason (counted).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import main
from harness.report.verdicts import compare, device_reason, differences, render_markdown, render_text


def _item(key: str, outcome: str = "passed", checks: tuple[str, ...] = (), verdict: str = "") -> dict:
    return {"key": key, "nodeid": key, "outcome": outcome, "failed_checks": list(checks),
            "verdict": verdict or f"{outcome} verdict"}


def _results(backend: str, *items: dict) -> dict:
    return {"schema": 2, "environment": {"backend": backend}, "items": list(items)}


TOO_FEW = "needs 2 devices, found 1"
NO_POOL = "unsupported on cuda: cuda: no graph stream pool to limit to 16 streams"
EMULATED = _results(
    "emulated",
    _item("a.yaml::a[FULL]"),
    _item("b.yaml::b[FULL]", "xfailed", ("stale_params",)),
    _item("c.yaml::c[FULL]", "failed", ("equality",)),
    _item("dp.yaml::dp[FULL]"),
    _item("budget.yaml::budget[FULL]", "xfailed", ("stream_budget",)),
    _item("task.yaml::task[FULL]"),
    _item("gone.yaml::g[FULL]"),
)
CUDA = _results(
    "cuda",
    _item("a.yaml::a[FULL]"),
    _item("b.yaml::b[FULL]", "failed", ("equality", "stale_params")),
    _item("c.yaml::c[FULL]", "failed", ("fia_invariant",)),
    _item("dp.yaml::dp[FULL]", "skipped", verdict=TOO_FEW),
    _item("budget.yaml::budget[FULL]", "skipped", verdict=NO_POOL),
    _item("task.yaml::task[FULL]", "skipped", verdict="unsupported on cuda: graph_task_group_begin: no task groups"),
)


def test_rows_mark_differences_and_list_device_skips_apart() -> None:
    rows = {r.item.split("::")[0]: r for r in compare(EMULATED, CUDA)}
    assert rows["a.yaml"].agree and not rows["a.yaml"].differs
    assert rows["b.yaml"].differs and rows["c.yaml"].differs  # another outcome; other failed checks
    assert rows["gone.yaml"].device == "missing" and rows["gone.yaml"].differs
    assert rows["dp.yaml"].device_reason == "too few devices" and not rows["dp.yaml"].differs
    assert rows["budget.yaml"].device_reason == "no graph stream pool" and not rows["budget.yaml"].differs
    assert rows["task.yaml"].differs and not rows["task.yaml"].device_reason  # not a device reason: counted
    assert [r.item.split("::")[0] for r in differences(list(rows.values()))] == [
        "b.yaml", "c.yaml", "gone.yaml", "task.yaml"]
    text = render_text(compare(EMULATED, CUDA), "cuda")
    assert "7 item(s), 4 differ between emulated and cuda; 2 skipped for a device reason (not counted)" in text
    assert text.count("DIFF") == 4 and "skipped: too few devices" in text and "skipped: no graph stream pool" in text
    assert "failed [equality,stale_params]" in text


def test_the_device_reasons_are_the_ones_the_harness_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tied to their sources: the device-count skip and the CUDA engine's stream-pool refusal."""
    import torch

    from harness.engine import StreamConfig, UnsupportedOnBackend
    from harness.engine import cuda as cuda_engine
    from harness.ranks import too_few_devices

    assert device_reason({"outcome": "skipped", "verdict": too_few_devices("cuda", 4, 2)}) == "too few devices"
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    with pytest.raises(UnsupportedOnBackend) as refused:
        cuda_engine.reset_device(StreamConfig(pool_size=16))
    assert device_reason({"outcome": "skipped", "verdict": f"unsupported on cuda: {refused.value}"}) == \
        "no graph stream pool"
    assert device_reason({"outcome": "failed", "verdict": TOO_FEW}) == ""  # only a skip is excused


def test_markdown_lists_the_differences_first() -> None:
    text = render_markdown(compare(EMULATED, CUDA), "cuda")
    lines = [line for line in text.splitlines() if line.startswith("| `")]
    assert [line.split("`")[1].split("::")[0] for line in lines] == [
        "b.yaml", "c.yaml", "gone.yaml", "task.yaml", "budget.yaml", "dp.yaml"]
    assert "a.yaml" not in text  # agreeing rows are counted, not listed


def _write(tmp_path: Path, name: str, payload: dict) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(payload))
    return str(path)


def test_the_command_exits_1_on_a_difference_and_0_when_all_agree(tmp_path: Path, capsys) -> None:
    a, b = _write(tmp_path, "emulated.json", EMULATED), _write(tmp_path, "cuda.json", CUDA)
    assert main(["verdicts", a, b]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["item", "emulated", "cuda"]
    assert "4 differ between emulated and cuda" in out
    only_device_skips = _results("cuda", *[i for i in CUDA["items"] if i["outcome"] != "failed"
                                             and "task" not in i["key"]])
    same = _results("emulated", *[i for i in EMULATED["items"] if i["key"] in {x["key"] for x in only_device_skips["items"]}])
    assert main(["verdicts", _write(tmp_path, "e2.json", same), _write(tmp_path, "c2.json", only_device_skips)]) == 0
    assert "0 differ between emulated and cuda; 2 skipped for a device reason" in capsys.readouterr().out
    assert main(["verdicts", a, a]) == 0
    assert "emulated.json (emulated)" in capsys.readouterr().out  # one backend twice: named by file
    md = tmp_path / "out" / "verdicts.md"
    assert main(["verdicts", a, b, "--format=markdown", "-o", str(md)]) == 1
    assert md.read_text().startswith("## Verdicts: emulated vs cuda")


@pytest.mark.parametrize("content, says", [
    (None, "cannot read"), ("{not json", "not JSON"), ('{"schema": 2}', "not a graph-harness results file"),
])
def test_unreadable_input_is_one_line_and_exit_2(tmp_path: Path, capsys, content: str | None, says: str) -> None:
    good = _write(tmp_path, "good.json", EMULATED)
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_text(content)
    assert main(["verdicts", good, str(bad)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.strip().splitlines()
    assert line.startswith("graph-harness verdicts: ") and str(bad) in line and says in line


def test_the_installed_command_runs(tmp_path: Path) -> None:
    a = _write(tmp_path, "a.json", EMULATED)
    done = subprocess.run([sys.executable, "-m", "harness.cli", "verdicts", a, a], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "7 item(s), 0 differ" in done.stdout, done.stderr
