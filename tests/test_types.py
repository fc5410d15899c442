"""The type check runs with the suite: mypy over ``harness/`` with the project's config
(``[tool.mypy]`` in pyproject.toml: strict on the engine, the ops, the model, the pipeline, the
features, the checks and an item's path from resolution to verdict), so a seam that drifts
from its protocol fails ``make test`` on a fresh clone, not only in an editor."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import harness.engine.cuda
import harness.engine.emulated.api
from harness.engine import Engine

ROOT = Path(__file__).resolve().parents[1]


def _engine_members() -> set[str]:
    """Every name the Engine protocol declares (methods and attributes)."""
    return {name for name in vars(Engine) if not name.startswith("_")} | set(Engine.__annotations__)


def test_mypy_passes_on_harness() -> None:
    """mypy's verdict on the package; its cache (.mypy_cache, git-ignored) keeps a warm run to a
    couple of seconds. mypy comes with requirements-cpu.txt: without it this fails, never skips."""
    run = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(ROOT / ".mypy_cache")],
                         cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, f"mypy found type errors:\n{run.stdout}{run.stderr}"


@pytest.mark.parametrize("backend", [harness.engine.emulated.api, harness.engine.cuda], ids=["emulated", "cuda"])
def test_importable_backends_have_every_engine_member(backend: object) -> None:
    """Run-time half of the conformance mypy checks statically (``load`` returns each module as an
    Engine): every member present, so a backend missing one fails here too."""
    assert isinstance(backend, Engine), sorted(m for m in _engine_members() if not hasattr(backend, m))


def test_npu_backend_defines_every_engine_member() -> None:
    """The npu module imports torch_npu, never installed here: its top-level names are read from
    the source instead (their torch_npu signatures are tests/engine/test_npu_surface.py's)."""
    tree = ast.parse((ROOT / "harness" / "engine" / "npu.py").read_text())
    defined: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            defined.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            defined.add(node.target.id)
    assert _engine_members() - defined == set()
