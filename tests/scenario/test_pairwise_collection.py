"""A ``matrix_selection: pairwise`` file under pytest: the selection judges raw points before
any is validated, so it must read them as the loader will (the file's own fields under the
axis values) and leave a value the schema refuses to the schema, which reports it at its line.

Found by fuzzing: a valid file whose axis needed a field set outside the matrix failed to
collect, and an invalid axis value gave a traceback instead of the error ``check`` prints.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import pytest_matrix
from harness.collection import collect_points
from harness.scenario import ScenarioFileError

W = "workload: {requests: [{prompt_len: 1, output_len: 1}]}\n"


class _Config:
    """What the selection reads of pytest's config: the ``--matrix`` option."""

    def __init__(self, matrix: str | None = None) -> None:
        self.matrix = matrix

    def getoption(self, name: str) -> str | None:
        assert name == "--matrix"
        return self.matrix


def _collect(path: Path, modes: list[str] | None = None, how: str | None = None):
    chosen = pytest_matrix.combinations(_Config(how), path, modes)  # type: ignore[arg-type]
    assert chosen is not None, "the file declares a pairwise selection"
    return collect_points(path, modes, combinations=chosen)


def _file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "pairwise.yaml"
    path.write_text(W + "matrix_selection: pairwise\n" + body)
    return path


def test_a_point_is_judged_with_the_file_s_own_fields(tmp_path: Path) -> None:
    # idle batches need dp size >= 2: the size is the file's, outside the matrix
    path = _file(tmp_path, "features: {dp: {size: 2}}\nmatrix:\n  features.dp.batches: [equal, idle]\n"
                           "  model.seed: [0, 1]\n")
    items = _collect(path)
    assert sorted({item.point.scenario.features.dp.batches for item in items}) == ["equal", "idle"]
    assert all(item.point.scenario.features.dp.size == 2 for item in items)


@pytest.mark.parametrize("axis", [
    "features.sp.tp: [x]",
    "features.mtp.k: [-1]",
    "features.sp: [5]",
    "features: [5]",
    "features: [{bogus: {}}]",
    "fixes: [5]",
    "graph: [5]",
    "graph.mode: [bogus]",
    "graph.compilation_mode: [bogus]",
    "stack: [bogus]",
])
def test_an_axis_value_the_schema_refuses_is_its_located_error(tmp_path: Path, axis: str) -> None:
    path = _file(tmp_path, f"matrix:\n  {axis}\n  features.sp.tp: [2]\n" if not axis.startswith("features")
                 else f"matrix:\n  {axis}\n  model.seed: [0]\n")
    with pytest.raises(ScenarioFileError) as selected:
        _collect(path)
    with pytest.raises(ScenarioFileError) as expanded:  # what `graph-harness check` reads
        collect_points(path)
    assert [str(e) for e in selected.value.errors] == [str(e) for e in expanded.value.errors]
    assert all(e.line == 4 and e.field.startswith("matrix.") for e in selected.value.errors)


def test_a_run_whose_modes_leave_no_value_of_the_mode_axis_has_no_item_of_the_file(tmp_path: Path) -> None:
    path = _file(tmp_path, "matrix:\n  graph.mode: [FULL, NONE]\n  model.seed: [0, 1]\n")
    assert _collect(path, modes=["PIECEWISE"]) == []
    assert {item.point.scenario.graph.mode for item in _collect(path, modes=["FULL"])} == {"FULL"}
