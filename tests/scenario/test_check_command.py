"""``graph-harness check`` (and ``python -m harness.scenario check``) as a user runs it: files,
directories and globs; every error of a file in one pass, at the line of the value to change,
in the scenario's words; one summary line instead of a line per item unless asked."""

from __future__ import annotations

from pathlib import Path

import pytest

import harness.session  # noqa: F401 - torch imported once, before the command runs
from harness.cli import main as graph_harness
from harness.scenario.__main__ import main as scenario_cli

GOOD = """name: good
graph: {capture_sizes: [1, 2, 4]}
workload:
  requests:
    - {prompt_len: 3, output_len: 3}
matrix:
  graph.mode: [FULL, PIECEWISE]
"""
# Two mistakes of two kinds: tp 3 does not split the 4 heads of the default model (a preflight
# problem, at the tp the file sets: line 4), dp is not a mapping (the schema's: line 5).
TWO_MISTAKES = """name: two
graph: {mode: FULL_DECODE_ONLY, capture_sizes: [3, 6]}
features:
  sp: {tp: 3}
  dp: 2
workload:
  requests:
    - {prompt_len: 3, output_len: 3}
"""


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "mine" / "deeper").mkdir(parents=True)
    (tmp_path / "mine" / "good.yaml").write_text(GOOD)
    (tmp_path / "mine" / "deeper" / "two.yml").write_text(TWO_MISTAKES)
    (tmp_path / "mine" / "notes.txt").write_text("not a scenario")
    return tmp_path


@pytest.mark.parametrize("cli", [graph_harness, scenario_cli], ids=["graph-harness", "python -m harness.scenario"])
def test_a_directory_is_every_scenario_below_it_with_all_errors_and_one_summary(tree, capsys, cli):
    assert cli(["check", str(tree / "mine")]) == 1
    out, err = capsys.readouterr()
    two = tree / "mine" / "deeper" / "two.yml"
    assert err.splitlines() == [
        f"{two}:4: features.sp.tp: tensor parallel: num_heads (4) must be divisible by tp (3) (q/k/v are split by "
        "whole heads, gate/up/down by MLP columns), with features.sp.tp=3 (model.num_heads is not in this file: "
        "it keeps its default)",
        f"{two}:5: features.dp: must be a mapping of its settings (size, batches), such as {{size: 2}}, got 2",
    ]
    assert "DPSettings" not in err and "Input should" not in err
    assert out.splitlines() == ["checked 2 file(s): 1 valid with 2 item(s), 1 with 2 error(s)"]


def test_a_glob_and_the_item_list_on_request(tree, capsys):
    assert graph_harness(["check", str(tree / "**" / "good.yaml")]) == 0
    assert capsys.readouterr().out.splitlines() == ["checked 1 file(s): 1 valid with 2 item(s)"]
    assert graph_harness(["check", "--items", str(tree / "mine" / "good.yaml")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(": ", 1)[1] for line in lines[:2]] == ["good[FULL] (FULL)", "good[PIECEWISE] (PIECEWISE)"]
    assert lines[2] == "checked 1 file(s): 1 valid with 2 item(s)"


def test_a_path_that_names_no_scenario_is_an_error(tree, capsys):
    assert graph_harness(["check", str(tree / "nothing" / "*.yaml")]) == 1
    out, err = capsys.readouterr()
    assert "no scenario file there" in err and "checked 0 file(s)" in out


def test_a_harness_error_on_one_file_is_one_line_and_the_others_are_still_checked(tree, capsys, monkeypatch):
    import harness.collection

    real = harness.collection.collect_points

    def collect(path, modes=None, **kw):
        if Path(path).name == "good.yaml":
            raise RuntimeError("a bug of the harness")
        return real(path, modes, **kw)

    monkeypatch.setattr(harness.collection, "collect_points", collect)
    assert graph_harness(["check", str(tree / "mine")]) == 1
    out, err = capsys.readouterr()
    assert f"{tree / 'mine' / 'good.yaml'}: harness error while checking this file (RuntimeError: a bug of the " \
           "harness); please report it with the file" in err.splitlines()
    assert "Traceback" not in err
    assert "two.yml:5: features.dp" in err  # the file after it was checked
    assert out.splitlines() == ["checked 2 file(s): 0 valid with 0 item(s), 2 with 3 error(s)"]
