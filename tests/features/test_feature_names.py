"""No feature is named outside its own module.

A feature owns its place: the pipeline, the resolution, the checks and the reports ask features
for properties (``shards_model()``, ``token_multiple()``, ``label()``), so a feature that comes
from outside meets every rule the built-in ones do. A name written elsewhere (``"sp"``,
``scenario.features.cp``) is a rule only the built-in feature gets. The model layer is left
out: its parallel context names the mechanics a feature drives (``ParallelContext.sp``), and so
is the upstream room: its adapters write upstream's settings as scenario data, whose keys are
the features' names as a scenario file writes them (``features: {mtp: ...}``).
"""

from __future__ import annotations

import ast
from pathlib import Path

from harness.features import registry

HARNESS = Path(__file__).resolve().parents[2] / "harness"


def _mentions(path: Path, names: set[str]) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and node.value in names:
            found.append(f"{path.relative_to(HARNESS.parent)}:{node.lineno}: {node.value!r}")
        elif isinstance(node, ast.Attribute) and node.attr in names:
            found.append(f"{path.relative_to(HARNESS.parent)}:{node.lineno}: .{node.attr}")
    return found


def test_no_feature_name_is_written_outside_its_module() -> None:
    names = set(registry())
    own = {HARNESS / "features" / f"{name}.py" for name in names}
    found = [hit for path in sorted(HARNESS.rglob("*.py"))
             if path not in own and (HARNESS / "model") not in path.parents
             and (HARNESS / "upstream") not in path.parents
             for hit in _mentions(path, names)]
    assert found == []


def test_the_scan_finds_a_name_where_one_is_written() -> None:
    probe = HARNESS / "features" / "cp.py"
    assert _mentions(probe, {"sp"}) == []  # CP asks for a model shard, not for SP by name
    assert _mentions(HARNESS / "features" / "sp.py", {"sp"})  # a feature names itself
