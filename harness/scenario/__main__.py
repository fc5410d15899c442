"""``python -m harness.scenario [schema]``: print the JSON Schema of a scenario file.
``python -m harness.scenario check [--mode=M[,M...]] FILE...``: validate files exactly as pytest
collection does (schema, limits, preflight), list their items; exit 1 on errors.
"""

from __future__ import annotations

import json
import sys

from .errors import ScenarioError
from .schema import export_json_schema


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] == "schema":
        print(json.dumps(export_json_schema(), indent=2))
        return 0
    if args[0] == "check":
        return check(args[1:])
    print(__doc__, file=sys.stderr)
    return 2


def check(args: list[str]) -> int:
    # The command line is the top of the stack: it may use the collection the plugin uses
    # (which needs the harness's preflight); the package itself stays free of it.
    from harness.collection import collect_points, parse_modes

    option = None
    paths = []
    for arg in args:
        if arg.startswith("--mode="):
            option = arg.partition("=")[2]
        else:
            paths.append(arg)
    try:
        modes = parse_modes(option)
    except ValueError as error:
        print(f"--mode: {error}", file=sys.stderr)
        return 2
    if not paths:
        print(__doc__, file=sys.stderr)
        return 2
    status = 0
    for path in paths:
        try:
            items = collect_points(path, modes)
        except ScenarioError as exc:
            print(exc, file=sys.stderr)
            status = 1
            continue
        for suffix, p in items:
            name = f"{p.name}[{suffix}]" if suffix else p.name
            print(f"{p.source}: {name} ({p.scenario.graph.mode})")
    return status


if __name__ == "__main__":
    sys.exit(main())
