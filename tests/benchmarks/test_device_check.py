"""The CPU side of benchmarks/device_check.py: the SKIP path and the verdict comparison.

The comparison is exercised for real on two emulator runs of one cheap scenario item (the same
code a lent GPU/NPU machine runs, with the emulator on both sides), and on hand-made results
that disagree, so the check is shown to fail when verdicts differ.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


verdicts = _load("verdicts")


def _item(id_, outcome, failed=(), source="scenarios/a.yaml:3"):
    return {"id": id_, "source": str(ROOT / source), "outcome": outcome, "failed_checks": list(failed),
            "verdict": f"{outcome} verdict"}


def test_skip_without_a_device():
    try:
        import torch
        if torch.cuda.is_available():
            pytest.skip("a GPU is present: the SKIP path does not apply")
    except ImportError:
        pass
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "device_check.py")], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("SKIP: no GPU or NPU"), proc.stdout


def test_compare_marks_every_kind_of_difference():
    emulated = {"items": [_item("FULL-a", "passed"), _item("FULL-b", "failed", ["fia_invariant"]),
                          _item("FULL-c", "passed"), _item("NONE-d", "xfailed")]}
    device = {"items": [_item("FULL-a", "passed"), _item("FULL-b", "failed", ["equality"]),
                        _item("FULL-c", "failed", ["equality"]), _item("NONE-e", "passed")]}
    rows = {r.item.split("::")[1]: r for r in verdicts.compare(emulated, device)}
    assert rows["FULL-a"].agree
    assert not rows["FULL-b"].agree  # same outcome, other failed check
    assert not rows["FULL-c"].agree  # other outcome
    assert rows["NONE-d"].device == "missing" and rows["NONE-e"].emulated == "missing"
    text = verdicts.render_text(list(rows.values()), "cuda")
    assert text.count("DIFF") == 4 and "5 item(s), 4 differ between emulated and cuda" in text


def test_items_with_the_same_id_in_two_files_are_kept_apart():
    a, b = _item("FULL", "passed", source="scenarios/x.yaml:1"), _item("FULL", "failed", source="scenarios/y.yaml:1")
    rows = verdicts.compare({"items": [a, b]}, {"items": [a, b]})
    assert [r.item for r in rows] == ["scenarios/x.yaml::FULL", "scenarios/y.yaml::FULL"] and all(r.agree for r in rows)


def test_two_emulator_runs_agree_and_the_table_is_written(tmp_path):
    rows, text = verdicts.verdicts_beside_emulator(
        "emulated", tmp_path, files=["scenarios/decode_buckets.yaml"], k="NONE and one_at_1", budget_s=500)
    assert [r.item for r in rows] == ["scenarios/decode_buckets.yaml::decode_buckets[NONE-one_at_1]"]  # the results key
    assert rows[0].agree and rows[0].emulated == rows[0].device == "passed"
    table = json.loads((tmp_path / "verdicts.json").read_text())
    assert table["rows"][0]["agree"] and not any(run["run_error"] for run in table["runs"].values())
    assert "1 item(s), 0 differ" in (tmp_path / "verdicts.txt").read_text()


def test_a_run_that_writes_nothing_is_reported_not_raised(tmp_path):
    payload = verdicts.run_selection("emulated", ["scenarios/does_not_exist.yaml"], None, tmp_path / "r.json", 300)
    assert payload["items"] == [] and payload["run_error"]


def test_the_device_checks_pass_on_the_emulated_device():
    """``--emulate``: the checks a GPU runs, on the emulator's own device memory, where a tensor
    the script left on the host makes the capture fail as it does on a GPU (the emulator caught
    the script's own host-placed model once the device stopped being the host)."""
    device_check = _load("device_check")
    ctx = device_check.Context(emulate=True)
    assert ctx.device.type == "npu" and ctx.model.device == ctx.device
    assert "argmax equal on 8/8" in ctx.check_full_graph()
    assert "later steps stale" in ctx.check_stale_control()


def test_the_whole_library_comparison_takes_modes_and_workers(tmp_path):
    """What ``benchmarks/device_run.sh`` asks of a device (``--scenarios`` with no ``-k``, all
    modes, workers), run with the emulator on both sides."""
    device_check = _load("device_check")
    code = device_check.main(["--emulate", "--verdicts", "--no-device-checks", "--scenarios",
                              "scenarios/explicit_steps.yaml", "--mode=NONE,FULL", "--workers", "2",
                              "--out", str(tmp_path)])
    assert code == 0
    table = json.loads((tmp_path / "verdicts.json").read_text())
    assert {row["item"].split("[")[1].split("-")[0].rstrip("]") for row in table["rows"]} == {"NONE", "FULL"}
    assert all(row["agree"] for row in table["rows"])


def test_the_device_run_script_skips_cleanly_without_a_device(tmp_path):
    try:
        import torch
        if torch.cuda.is_available():
            pytest.skip("a GPU is present: the script would run for minutes")
    except ImportError:
        pass
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "device_run.sh"), str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHON=sys.executable))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no device here: the library comparison is skipped" in proc.stdout
    assert "torch " in (tmp_path / "env.txt").read_text()
    assert (tmp_path / "device_check.log").read_text().startswith("SKIP: no GPU or NPU")
