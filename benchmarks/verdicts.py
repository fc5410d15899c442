"""Scenario verdicts on a device backend beside the emulator's, for the same items.

Used by ``benchmarks/device_check.py --verdicts`` on a lent GPU or NPU machine. Each backend
runs the SAME pytest selection in its own process (``pytest <files> -k <expr> --backend=<b>
--results-json=<out>``: the path nightly CI takes, and a crash of one backend cannot take the
other's results with it). Items are matched by source file and item id; a row differs when the
outcome or the set of failed checks differs. The table is written as JSON and as text.

The comparison itself is the product's (:mod:`harness.report.verdicts`, ``graph-harness
verdicts A.json B.json``); this module runs the two selections around it. Plain functions, no
pytest and no torch at import, so the comparison is testable on any machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from harness.report import verdicts as _verdicts  # noqa: E402
from harness.report.verdicts import Row, differences, render_text  # noqa: E402,F401 - this module's API

#: The default part of the library: cheap, and covering NONE, PIECEWISE and every FULL variant,
#: bucket hits and padding, a hand-written step list, and a known-bad scenario that must fail.
DEFAULT_SELECTION: tuple[str, ...] = (
    "scenarios/decode_buckets.yaml",
    "scenarios/explicit_steps.yaml",
    "scenarios/known_bad/no_host_param_update.yaml",
)
DEFAULT_K = "not between and not eight_at_8"


def run_selection(backend: str, files: list[str], k: str | None, out: Path, timeout_s: float,
                  extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """Run the selection under ``backend`` in a fresh pytest process; return the results payload.

    ``extra``: more pytest arguments (``--mode=...``, ``-n 8``), the same for both backends.

    Never raises for the run itself: a timeout or a crash gives a payload with no items and a
    ``"run_error"``, so the table still gets written.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pytest", *files, "-q", "-p", "no:cacheprovider", f"--backend={backend}",
           f"--results-json={out}"]
    if k:
        cmd += ["-k", k]
    cmd += list(extra)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    started = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
        tail = (proc.stdout + proc.stderr)[-2000:]
        # 0: all passed, 1: some items failed (a verdict, not a broken run); others: usage/internal errors
        error = None if proc.returncode in (0, 1) else f"pytest exited with code {proc.returncode}"
    except subprocess.TimeoutExpired as expired:
        tail = str(expired.stdout or "")[-2000:]
        error = f"timed out after {timeout_s:.0f}s"
    payload: dict[str, Any] = {"items": []}
    if out.exists():
        payload = json.loads(out.read_text())
        payload.setdefault("items", [])
    elif error is None:
        error = "pytest wrote no results file"
    payload["run_error"] = error
    payload["run_seconds"] = round(time.perf_counter() - started, 1)
    payload["pytest_tail"] = tail
    return payload


def compare(emulated: dict[str, Any], device: dict[str, Any]) -> list[Row]:
    """:func:`harness.report.verdicts.compare`, file paths read relative to the repository."""
    return _verdicts.compare(emulated, device, root=ROOT)


def write_table(rows: list[Row], out_dir: Path, device_name: str, runs: dict[str, dict[str, Any]]) -> tuple[Path, Path]:
    """``verdicts.json`` (rows plus each run's timing and error) and ``verdicts.txt``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {name: {k: run.get(k) for k in ("run_error", "run_seconds", "summary", "environment")}
            for name, run in runs.items()}
    json_path, text_path = out_dir / "verdicts.json", out_dir / "verdicts.txt"
    json_path.write_text(json.dumps({"device": device_name, "runs": meta, "rows": [asdict(r) for r in rows]},
                                    indent=1, default=str))
    text_path.write_text(render_text(rows, device_name) + "\n")
    return json_path, text_path


def verdicts_beside_emulator(device_backend: str, out_dir: Path, files: list[str] | None = None,
                             k: str | None = DEFAULT_K, budget_s: float = 540.0,
                             extra: tuple[str, ...] = ()) -> tuple[list[Row], str]:
    """Run the selection on the emulator, then on ``device_backend``; write and return the table.

    ``budget_s`` bounds both runs together (the emulator gets at most 45% of it).
    """
    files = list(files or DEFAULT_SELECTION)
    started = time.perf_counter()
    emulated = run_selection("emulated", files, k, out_dir / "emulated.json", 0.45 * budget_s, extra)
    left = max(30.0, budget_s - (time.perf_counter() - started))
    device = run_selection(device_backend, files, k, out_dir / f"{device_backend}.json", left, extra)
    rows = compare(emulated, device)
    write_table(rows, out_dir, device_backend, {"emulated": emulated, device_backend: device})
    return rows, render_text(rows, device_backend)
