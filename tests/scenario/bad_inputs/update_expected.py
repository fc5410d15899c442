"""Rewrite expected.txt from what the harness says today about every file here.

Run it only after an intended change of a message, and review the diff line by line: the file
is the contract of tests/scenario/test_bad_inputs.py (each bad file, the exact errors it gives).

    PYTHONPATH=. python tests/scenario/bad_inputs/update_expected.py
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from harness.collection import collect_points  # noqa: E402
from harness.scenario import ScenarioError  # noqa: E402


def errors_of(path: Path) -> list[str]:
    """The error lines for ``path``, the path written as the bare file name."""
    try:
        collect_points(path)
    except ScenarioError as error:
        return [line.replace(str(path), path.name, 1) for line in str(error).splitlines()]
    return []


def main() -> None:
    blocks = []
    for path in sorted(HERE.glob("*.yaml")):
        blocks.append(f"== {path.name}\n" + "".join(line + "\n" for line in errors_of(path)))
    (HERE / "expected.txt").write_text("".join(blocks))
    print(f"{len(blocks)} files")


if __name__ == "__main__":
    main()
