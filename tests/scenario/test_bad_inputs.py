"""The bad-input corpus: every file in bad_inputs/ gives exactly the errors expected.txt lists
for it (file, line, field, message), fast and in bounded memory, and ``python -m
harness.scenario check`` says exactly what collection says.

Timings here are CPU seconds of this process (``time.process_time``) around the call only: no
process start, and a loaded machine does not inflate them the way it inflates wall time.
"""

from __future__ import annotations

import ctypes
import gc
import re
import time
import tracemalloc
from pathlib import Path

import pytest

import harness.session  # noqa: F401 - imported (torch included) before anything is timed
from harness.collection import collect_points
from harness.scenario import ScenarioError
from harness.scenario.__main__ import main as scenario_cli
from harness.scenario.bounds import MAX_FILE_BYTES, MAX_MATRIX_POINTS

CORPUS = Path(__file__).resolve().parent / "bad_inputs"
FILES = sorted(CORPUS.glob("*.yaml"))
CPU_LIMIT_S = 2.0
MEMORY_LIMIT_BYTES = 256 * 1024 * 1024
_LINE = re.compile(r"^[\w.-]+\.yaml:\d+: ")


def _expected() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    current = None
    for line in (CORPUS / "expected.txt").read_text().splitlines():
        if line.startswith("== "):
            current = line[3:]
            out[current] = []
        elif current is not None:
            out[current].append(line)
    return out


EXPECTED = _expected()


def _peak_memory(fn) -> int:
    """Bytes the peak resident set grew by while ``fn`` ran.

    On Linux the kernel's high-water mark (VmHWM) is reset through ``/proc/self/clear_refs``,
    so the peak costs nothing to watch; tracemalloc, the fallback elsewhere, hooks every
    allocation and made the largest of these loads four times slower."""
    _trim_heap()  # first: the peak is then reset to the trimmed resident set, not above it
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # 5: reset the peak RSS to the current RSS
    except OSError:
        tracemalloc.start()
        try:
            fn()
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    before = _status_kib("VmRSS")
    fn()
    return (_status_kib("VmHWM") - before) * 1024


def _trim_heap() -> None:
    """Hand free heap memory back to the OS (glibc), so a load that reuses what an earlier one
    freed still shows as growth of the resident set."""
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the probe is a lower bound there
        pass


def _status_kib(field: str) -> int:
    status = Path("/proc/self/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+) kB", status, re.M).group(1))


def test_the_memory_probe_sees_a_peak_that_is_gone() -> None:
    """The probe can fail: 300 MiB held for a moment and freed still counts."""
    def spike() -> None:
        block = bytearray(300 * 2**20)
        block[:: 4096] = b"x" * len(block[:: 4096])  # touched: resident

    assert _peak_memory(spike) > 250 * 2**20
    assert _peak_memory(lambda: None) < 50 * 2**20


def _errors(path: Path) -> list[str]:
    try:
        collect_points(path)
    except ScenarioError as error:
        return [line.replace(str(path), path.name, 1) for line in str(error).splitlines()]
    return []


def test_the_corpus_is_large_and_every_file_has_its_expected_errors():
    assert len(FILES) >= 100
    assert sorted(EXPECTED) == [p.name for p in FILES]
    for name, lines in EXPECTED.items():
        assert lines, f"{name}: no expected error"
        for line in lines:  # file:line: [field: ]message, one line, of bounded length
            assert _LINE.match(line), line
            assert len(line) < 400, line


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_bad_file_gives_exactly_its_errors_quickly(path: Path):
    started = time.process_time()
    errors = _errors(path)
    cpu = time.process_time() - started
    assert errors == EXPECTED[path.name]
    assert cpu < CPU_LIMIT_S, f"{path.name}: {cpu:.2f}s of CPU"


def test_check_command_agrees_exactly_with_collection(capsys):
    status = scenario_cli(["check", *map(str, FILES)])
    err = capsys.readouterr().err.splitlines()
    assert status == 1
    expected = [line.replace(path.name, str(path), 1) for path in FILES for line in EXPECTED[path.name]]
    assert err == expected


# ------------------------------------------------------------------------ files of up to 1 MB

W = "workload:\n  requests:\n    - {prompt_len: 3, output_len: 3}\n"
ALMOST_1MB = MAX_FILE_BYTES - 200


def _lol(levels: int, width: int) -> str:
    """A "billion laughs" document: ``width ** levels`` strings in a few hundred bytes."""
    lines = [f"x0: &a0 [{', '.join(['lol'] * width)}]"]
    for i in range(1, levels):
        lines.append(f"x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]")
    return "\n".join(lines) + "\n" + W


BIG = {
    "one_huge_flow_list": lambda: "x-a: [" + "1," * (ALMOST_1MB // 2 - 10) + "1]\n" + W,
    "one_huge_string": lambda: W + 'description: "' + "y" * (ALMOST_1MB - 60) + '"\n',
    "one_huge_key": lambda: W + "model:\n  " + "k" * (ALMOST_1MB - 80) + ": 1\n",
    "one_huge_comment": lambda: "#" + "c" * (ALMOST_1MB - 80) + "\n" + W,
    "many_blank_lines": lambda: "\n" * (ALMOST_1MB - 80) + W,
    "many_unknown_keys": lambda: W + "model:\n" + "".join(f"  k{i}: 1\n" for i in range(ALMOST_1MB // 12)),
    "many_bad_requests": lambda: "workload:\n  requests:\n" + "    - {prompt_len: 0, output_len: 0}\n" * 12000,
    "many_anchors": lambda: "".join(f"x-{i}: &a{i} [1]\n" for i in range(ALMOST_1MB // 22)) + W,
    "alias_bomb_wide": lambda: _lol(12, 12),
    "alias_bomb_deep": lambda: _lol(30, 2),
    "deep_flow_nesting": lambda: "x-a: " + "[" * 500 + "]" * 500 + "\n" + W,
    "deep_block_nesting": lambda: "".join("  " * i + f"k{i}:\n" for i in range(400)) + W,
    "matrix_of_1024_points": lambda: W + "matrix:\n  model.seed: [" + ", ".join(map(str, range(32)))
    + "]\n  workload.prompt_seed: [" + ", ".join(map(str, range(32))) + "]\n",
    "matrix_of_1024_bad_points": lambda: W + "matrix:\n  model.layers: [" + ", ".join(map(str, range(65, 97)))
    + "]\n  model.head_dim: [" + ", ".join(map(str, range(600, 632))) + "]\n",
    "over_1mb": lambda: W + "#" * (MAX_FILE_BYTES + 10) + "\n",
    # 32 x 16 x 16 = MAX_MATRIX_POINTS: every point is validated and preflighted (~0.4 ms each)
    "matrix_of_the_maximum_points": lambda: W + "matrix:\n  model.seed: [" + ", ".join(map(str, range(32)))
    + "]\n  workload.prompt_seed: [" + ", ".join(map(str, range(16))) + "]\n  steps: ["
    + ", ".join(map(str, range(4, 20))) + "]\n",
}
#: The one exception to 2 s: a matrix at the maximum size costs linear time per point.
CPU_LIMITS_S = {"matrix_of_the_maximum_points": 4 * CPU_LIMIT_S}


VALID = {"one_huge_comment", "many_blank_lines", "matrix_of_1024_points", "matrix_of_the_maximum_points"}


@pytest.mark.parametrize("name", list(BIG))
def test_any_file_up_to_1mb_collects_in_bounded_time_and_memory(tmp_path: Path, name: str):
    path = tmp_path / f"{name}.yaml"
    path.write_text(BIG[name]())
    assert path.stat().st_size <= MAX_FILE_BYTES + 100 or name == "over_1mb"
    if name == "matrix_of_the_maximum_points":
        assert 32 * 16 * 16 == MAX_MATRIX_POINTS
    started = time.process_time()
    errors = _errors(path)
    cpu = time.process_time() - started
    assert cpu < CPU_LIMITS_S.get(name, CPU_LIMIT_S), f"{name}: {cpu:.2f}s of CPU"
    peak = _peak_memory(lambda: _errors(path))
    assert peak < MEMORY_LIMIT_BYTES, f"{name}: {peak / 2**20:.0f} MiB"
    for line in errors:  # every problem is one located, bounded line
        assert _LINE.match(line) or line.startswith(path.name + ": "), line
        assert len(line) < 400
    if name in VALID:
        assert errors == []
    else:
        assert errors, name
