"""Every command in README.md and docs/*.md runs, as printed, so that an example cannot rot.

A command is a line of a fenced shell block (no info string, or ``sh``, ``shell``, ``bash``,
``console``); blocks of other text say ``text``, ``yaml``, ``ini``... Each runs from the
repository root through bash (quotes and globs as a reader's shell takes them), with
``.venv/bin/`` meaning this test's interpreter's bin directory and ``reports/`` a temporary
directory (a pytest command that names no results file gets one there too, not the root's). A ``make`` target runs its recipe as ``make -n`` prints it; a pytest command whose
whole run is too long for the suite (``make test`` would run itself) collects only, and must
collect items without an error; every other command runs whole and must exit 0. Some carry
claims the prose around them makes, checked on their output.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.report.html import read_fragments

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_BLOCKS = {"", "sh", "shell", "bash", "console"}
PROGRAMS = ("make", ".venv/bin/pytest", ".venv/bin/python", ".venv/bin/graph-harness", "python", "pytest",
            "graph-harness", "bash")


@dataclass(frozen=True)
class Command:
    doc: str  # e.g. "README.md:23"
    text: str

    def __str__(self) -> str:
        return f"{self.doc}: {self.text}"


def doc_commands() -> list[Command]:
    found = []
    for path in DOCS:
        fence, info = None, ""
        for number, line in enumerate(path.read_text().splitlines(), 1):
            stripped = line.strip()
            if stripped.startswith("```"):
                fence, info = (None, "") if fence else (number, stripped[3:].strip())
                continue
            if fence is None or info not in SHELL_BLOCKS or not stripped or stripped.startswith("#"):
                continue
            text = re.sub(r"\s{2,}#.*$", "", stripped)  # "make test   # what it does"
            found.append(Command(f"{path.relative_to(ROOT)}:{number}", text))
    return found


COMMANDS = doc_commands()

#: pytest commands too long to run whole in the suite, and why; they collect only. Every other
#: command runs whole, so that a new example is run unless someone says here why it cannot be.
COLLECT_ONLY = {
    '.venv/bin/pytest scenarios/ -m "not slow" -n 2': "the whole library in every mode: 258 items, minutes",
    ".venv/bin/pytest scenarios/cross_product --matrix=full -n 2": "the nightly: 4,200 items",
    ".venv/bin/pytest scenarios/cross_product --matrix=full --splits 4 --group 2 -n 2 "
    "--results-json=reports/shard-2.json": "a quarter of the nightly: 1,050 items",
}

SAMPLE_RESULTS = ROOT / "tests/triage/data/same_commit_a.json"


def _split_shards(reports: Path) -> None:
    """Two groups' results files of one split, made from a real run's results (for ``merge``:
    tests/triage/test_split.py runs real groups)."""
    data = json.loads(SAMPLE_RESULTS.read_text())
    nodeids = [item["nodeid"] for item in data["items"]]
    for group in (1, 2):
        items = data["items"][group - 1::2]
        run = dict(data["run"], split={"splits": 2, "group": group, "algorithm": "least_duration",
                                       "durations": {"path": ".test_durations", "found": False},
                                       "collected": nodeids, "selected": [item["nodeid"] for item in items]})
        (reports / f"shard-{group}.json").write_text(json.dumps(dict(data, run=run, items=items)))


def _nightly_results(reports: Path) -> None:
    (reports / "nightly.json").write_text(SAMPLE_RESULTS.read_text())


#: Commands that read files an earlier command (or a night) made, and what makes them here.
PREPARE = {
    ".venv/bin/graph-harness merge reports/shard-*.json -o reports/nightly.json --html reports/nightly.html":
        _split_shards,
    ".venv/bin/graph-harness durations reports/nightly.json -o .test_durations": _nightly_results,
}


def _walkthrough(out: str, reports: Path) -> None:
    """README's walk-through: what the opened row says."""
    fragments = read_fragments((reports / "walkthrough.html").read_text())
    (fragment,) = fragments.values()
    text = re.sub(r"<[^>]+>", "", fragment)
    assert "stale_params at step 0, bucket 8: graph replayed capture-time actual_seq_lengths " \
           "[1, 2, 3, 4, 5, 6, 7, 8] at step 0 (layer 0, bucket 8), expected [5, 8]; 28 stale list(s) in all" in text
    assert "fixes.host_param_update is false in this file" in text
    assert "Stale host parameters: 28 stale list(s)" in text
    assert "scenarios/known_bad/no_host_param_update.yaml:18" in text  # "line 18" in the README
    states = dict(re.findall(r"<tr><th>(\w+)</th><td><span [^>]*>([^<]+)</span>", fragment))
    assert states == {"fia_invariant": "PASS", "stale_params": "FAIL", "stream_budget": "PASS",
                      "equality": "explained by stale_params"}, states
    return True


CLAIMS = {
    '.venv/bin/pytest scenarios/known_bad -m "full and not cp" --backend=emulated':
        lambda out, reports: re.search(r"XFAIL \[\d+\] known-bad scenario items failed exactly the checks", out),
    ".venv/bin/pytest scenarios/known_bad/no_host_param_update.yaml --mode=FULL --html=reports/walkthrough.html "
    "--self-contained-html": _walkthrough,
    ".venv/bin/graph-harness check scenarios":
        lambda out, reports: re.search(r"^checked (\d+) file\(s\): \1 valid with \d+ item\(s\)$", out, re.M),
    "bash benchmarks/device_run.sh reports/device-run":  # on this CPU machine: the environment, then the skip
        lambda out, reports: "torch " in out and ("no device here" in out or (reports / "device-run/verdicts.txt").exists()),
    "graph-harness diff tests/triage/data/same_commit_a.json tests/triage/data/same_commit_b.json":
        lambda out, reports: out.splitlines()[1] == "no changes",
    ".venv/bin/graph-harness merge reports/shard-*.json -o reports/nightly.json --html reports/nightly.html":
        lambda out, reports: out.startswith("graph-harness merge: 87 items from 2 results files")
        and len(read_fragments((reports / "nightly.html").read_text())) == 87,
    ".venv/bin/graph-harness durations reports/nightly.json -o .test_durations":
        lambda out, reports: len(json.loads((reports / ".test_durations").read_text())) == 87,
}


def _environment() -> dict[str, str]:
    return dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", COLUMNS="200",
                PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))


def _shell(text: str, reports: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    text = re.sub(r"(?<![\w./])\.venv/bin/", f"{BIN}/", text)
    text = re.sub(r"(?<![\w./])reports/", f"{reports}/", text)
    text = re.sub(r"(?<![\w./])\.test_durations\b", f"{reports}/.test_durations", text)  # never the committed one
    return subprocess.run(["bash", "-c", text], cwd=ROOT, env=_environment(), capture_output=True, text=True,
                          timeout=timeout)


def _collect_only(pytest_command: str, reports: Path) -> None:
    done = _shell(f"{pytest_command} --collect-only -q", reports)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert re.search(r"^[1-9]\d*(/\d+)? tests? collected", done.stdout, re.M), done.stdout[-2000:]


def _make_recipe(target: str) -> list[str]:
    """The commands ``make TARGET`` runs, as make prints them (the venv step taken as done)."""
    done = subprocess.run(["make", "-n", "-o", ".venv/.installed", f"PY={sys.executable}", target], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [line for line in done.stdout.replace("\\\n", " ").splitlines() if line.strip()]


def test_the_docs_have_commands_and_every_one_is_a_program_this_test_runs():
    assert len(COMMANDS) >= 10
    for command in COMMANDS:
        assert shlex.split(command.text)[0] in PROGRAMS, f"{command}: add this program to tests/docs/test_commands.py"
    for text in (*COLLECT_ONLY, *CLAIMS, *PREPARE):  # an entry for a command the docs no longer give is stale
        assert text in {c.text for c in COMMANDS}, text


@pytest.mark.parametrize("command", COMMANDS, ids=[c.doc for c in COMMANDS])
def test_command_runs_as_printed(command: Command, tmp_path: Path):
    reports = tmp_path / "reports"
    reports.mkdir()
    words = shlex.split(command.text)
    if words[0] == "make":
        (target,) = words[1:]
        recipe = _make_recipe(target)
        pytest_lines = [line for line in recipe if " -m pytest " in line]
        assert pytest_lines, recipe
        for line in pytest_lines:  # make test, make scenarios, make nightly: minutes each
            _collect_only(line, reports)
        return
    is_pytest = words[0].endswith("pytest") or words[1:3] == ["-m", "pytest"]
    if is_pytest and command.text in COLLECT_ONLY:
        _collect_only(command.text, reports)
        return
    text = command.text
    if command.text in PREPARE:
        PREPARE[command.text](reports)
    if is_pytest and "--results-json" not in text:  # its default file, under the root's reports/
        text += " --results-json=reports/graph-harness-results.json"
    done = _shell(text, reports)
    assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-2000:]}"
    claim = CLAIMS.get(command.text)
    if claim is not None:
        assert claim(done.stdout, reports), f"{command}: its output no longer says what the docs say\n{done.stdout[-3000:]}"
