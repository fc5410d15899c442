"""``python -m harness.scenario [schema]``: print the JSON Schema of a scenario file.
``python -m harness.scenario check FILE...``: validate files, list their points (exit 1 on errors).
"""

from __future__ import annotations

import json
import sys

from .errors import ScenarioError
from .loader import load_scenario_file
from .schema import export_json_schema


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] == "schema":
        print(json.dumps(export_json_schema(), indent=2))
        return 0
    if args[0] == "check":
        status = 0
        for path in args[1:]:
            try:
                points = load_scenario_file(path)
            except ScenarioError as exc:
                print(exc, file=sys.stderr)
                status = 1
                continue
            for p in points:
                print(f"{p.source}: {p.display_name} ({p.scenario.graph.mode})")
        return status
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
