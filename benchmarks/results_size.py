"""Size of a run's JSON results and junit files, per scenario item, and what the bytes are.

    python benchmarks/results_size.py RESULTS.json [JUNIT.xml]

Prints the file sizes, the bytes per scenario item, and for the JSON the share of each part of
an item's record (checks, steps, texts, scenario, ...), so a record that grows shows where.
Used for the figures in the README's "Nightly CI and triage" section (before and after
results v2, on the same selection: `pytest scenarios/ --mode=FULL -n 2`); the bytes of each
part are counted compact, as the results file writes them. `benchmarks/report.py --sizes`
gives the bytes per item by outcome.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path


def _size(value) -> int:
    # as the results file writes a record: compact, one line per item (harness.report.results)
    return len(json.dumps(value, separators=(",", ":"), default=str))


def main(argv: list[str]) -> int:
    results = Path(argv[0])
    data = json.loads(results.read_text())
    items = data["items"]
    total = results.stat().st_size
    print(f"{results}: {total:,} bytes, {len(items)} items, {total / max(len(items), 1) / 1024:.1f} KiB per item"
          f" (schema {data.get('schema')})")
    parts: Counter[str] = Counter()
    for item in items:
        for key, value in item.items():
            if key == "run" and isinstance(value, dict):
                for sub, inner in value.items():
                    parts[f"run.{sub}"] += _size(inner)
            elif key == "checks" and isinstance(value, dict):
                for name, check in value.items():
                    parts[f"checks.{name}"] += _size(check)
            else:
                parts[key] += _size(value)
    largest = max(items, key=_size, default=None)
    for name, size in parts.most_common(8):
        print(f"  {name:28s} {size / max(len(items), 1) / 1024:8.1f} KiB per item")
    if largest is not None:
        print(f"  largest item: {_size(largest) / 1024:.1f} KiB ({largest.get('nodeid') or largest.get('name')})")
    if len(argv) > 1:
        junit = Path(argv[1])
        cases = list(ET.parse(junit).getroot().iter("testcase"))
        size = junit.stat().st_size
        print(f"{junit}: {size:,} bytes, {len(cases)} test cases, {size / max(len(cases), 1) / 1024:.2f} KiB per case")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
