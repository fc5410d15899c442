"""The mutation run's list of injected bugs cannot rot: every snippet is still in the source.

Cheap: it reads files and compares text, it runs no mutant (``benchmarks/mutation.py`` does).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from mutants import MUTANTS, RULES  # noqa: E402


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.id for m in MUTANTS])
def test_every_mutant_snippet_occurs_exactly_once_in_the_current_source(mutant):
    text = (ROOT / mutant.file).read_text()
    assert text.count(mutant.before) == 1, f"{mutant.id}: {mutant.file} has its snippet {text.count(mutant.before)} times"
    assert mutant.after != mutant.before
    assert mutant.rule in RULES, mutant.rule
    for probe in mutant.probe:
        assert (ROOT / probe.split("::")[0]).exists(), probe


def test_mutant_ids_are_unique_and_every_rule_has_a_mutant():
    ids = [m.id for m in MUTANTS]
    assert len(ids) == len(set(ids))
    assert sorted({m.rule for m in MUTANTS}) == sorted(RULES)
