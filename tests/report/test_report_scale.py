"""The HTML report at nightly size, in headless Chromium: the nightly's 4,200 rows (every point
of the cross product's matrix, as ``make nightly`` runs it) through the real plugin and
pytest-html, each carrying the record of a real item of its outcome. The page must fit a
1,400 px window (the grid scrolls in its own box), open with only the failed rows open, and
say one number for one count. Skipped where no Chromium is installed (Debian:
``apt-get install chromium``). The time the page takes to open is a benchmark figure
(``benchmarks/report.py --matrix ...``), not asserted here.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from harness.report.results import item_record
from harness.scenario import load_scenario_text
from harness.session import run_point

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import report as report_bench  # noqa: E402

from tests.report.chromium import needs_chromium  # noqa: E402

TINY = """
name: tiny
graph: {mode: FULL, capture_sizes: [1, 2, 4]}
steps: 3
workload:
  requests:
    - {prompt_len: 3, output_len: 3}
"""
TEMPLATES = {  # one real item of each outcome
    "passed": TINY,
    "skipped": TINY + "expect: {skip: not modelled here}\n",
    "xfailed": TINY + "fixes: {host_param_update: false}\nexpect: {fail: [stale_params]}\n",
    "failed": TINY + "fixes: {fia_padding: false}\n",
}
WINDOW = 1400
#: pytest-html's collapsed row is about 32 px tall; an open failure's details a few screens.
ROW_PX, OPEN_ROW_PX, FIXED_PX = 40, 4000, 6000


@pytest.mark.slow
@needs_chromium
def test_a_nightly_sized_page_fits_the_window_and_opens_on_its_failures(tmp_path):
    templates = {}
    for outcome, text in TEMPLATES.items():
        (point,) = load_scenario_text(text)
        templates[outcome] = item_record(run_point(point), {"torch": "x"})
        assert templates[outcome]["outcome"] == outcome
    records = report_bench.matrix_records(templates, ROOT / "scenarios/cross_product/cross_product.yaml",
                                          failing={"failed": 600, "xfailed": 500})
    outcomes = [r["outcome"] for r in records]
    assert len(records) == 4200 and outcomes.count("skipped") == 1610 and outcomes.count("failed") == 4
    page, _ = report_bench.build_page(records, tmp_path)

    seen = report_bench.page_geometry(page, width=WINDOW)
    assert seen["errors"] == []
    assert seen["rows"] == 4200
    # the page is as wide as the window: the 72 x 5 grid scrolls inside its own box
    assert seen["page_width"] <= WINDOW and seen["grid_box_right"] <= WINDOW, seen
    assert seen["grid_box_height"] <= 430, seen
    # only the failed rows start open; the page is as tall as its rows and those failures
    assert seen["open_rows"] == 4 and seen["open_outcomes"] == ["failed"], seen
    assert seen["page_height"] < FIXED_PX + ROW_PX * seen["rows"] + OPEN_ROW_PX * seen["open_rows"], seen
    # pytest-html's run count agrees with the rows (it leaves the skipped out of "N tests")
    count = re.match(r"(\d+) tests took .* \((\d+) ran, (\d+) skipped\)\.$", seen["run_count"])
    assert count and [int(n) for n in count.groups()] == [4200, 2590, 1610], seen["run_count"]
