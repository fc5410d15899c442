"""``python -m harness.scenario [schema]``: print the JSON Schema of a scenario file.
``python -m harness.scenario check [--mode=M[,M...]] [--items] PATH...``: validate scenario
files exactly as pytest collection does (schema, limits, preflight); a PATH is a file, a
directory (every .yaml/.yml file below it) or a glob (quoted: ``'scenarios/**/*.yaml'``).
Prints every error of every file (``file:line: field: message``), then one summary line;
``--items`` also lists each file's items. Exit 1 on errors, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import glob
import json
import sys
from pathlib import Path

from .errors import ScenarioError
from .schema import export_json_schema

SUFFIXES = (".yaml", ".yml")


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] == "schema":
        print(json.dumps(export_json_schema(), indent=2))
        return 0
    if args[0] == "check":
        return check(args[1:])
    print(__doc__, file=sys.stderr)
    return 2


def expand_paths(paths: list[str]) -> tuple[list[Path], list[str]]:
    """Scenario files named by ``paths`` (files, directories, globs), each once, in order; and
    the arguments that named none."""
    files: list[Path] = []
    nothing: list[str] = []
    for text in paths:
        path = Path(text)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.suffix in SUFFIXES and p.is_file())
        elif path.exists() or not glob.has_magic(text):
            found = [path]  # a missing file is reported by the loader, with its name
        else:
            found = sorted(Path(p) for p in glob.glob(text, recursive=True) if Path(p).is_file())
        if not found:
            nothing.append(text)
        files.extend(p for p in found if p not in files)
    return files, nothing


def add_check_options(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of ``check``: ``python -m harness.scenario check``'s and ``graph-harness check``'s."""
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="a scenario file, a directory (its .yaml/.yml files, recursively) or a quoted glob")
    parser.add_argument("--mode", default=None, metavar="M[,M...]",
                        help="expand files that name no mode into these modes, as pytest --mode does")
    parser.add_argument("--items", action="store_true", help="list every item of every valid file")
    return parser


def check(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.scenario check",
                                     description="Validate scenario files as pytest collects them.")
    try:
        args = add_check_options(parser).parse_args(argv)
    except SystemExit as exit_:
        return 2 if exit_.code else 0
    return run_check(args.paths, mode=args.mode, items=args.items)


def run_check(paths: list[str], *, mode: str | None = None, items: bool = False) -> int:
    # The command line is the top of the stack: it may use the collection the plugin uses
    # (which needs the harness's preflight); the package itself stays free of it.
    from harness.collection import collect_points, parse_modes

    try:
        modes = parse_modes(mode)
    except ValueError as error:
        print(f"--mode: {error}", file=sys.stderr)
        return 2
    files, nothing = expand_paths(paths)
    for text in nothing:
        print(f"{text}: no scenario file there (.yaml or .yml)", file=sys.stderr)
    bad_files = errors = total = 0
    for path in files:
        try:
            points = collect_points(path, modes)
        except ScenarioError as exc:
            found = getattr(exc, "errors", [exc])
            print(exc, file=sys.stderr)
            bad_files += 1
            errors += len(found)
            continue
        except Exception as exc:  # noqa: BLE001 - a harness bug on one file never stops the others
            print(f"{path}: harness error while checking this file ({type(exc).__name__}: {exc}); "
                  "please report it with the file", file=sys.stderr)
            bad_files += 1
            errors += 1
            continue
        total += len(points)
        if items:
            for suffix, p, _ in points:
                name = f"{p.name}[{suffix}]" if suffix else p.name
                print(f"{p.source}: {name} ({p.scenario.graph.mode})")
    valid = len(files) - bad_files
    summary = f"checked {len(files)} file(s): {valid} valid with {total} item(s)"
    if bad_files:
        summary += f", {bad_files} with {errors} error(s)"
    print(summary)
    return 1 if bad_files or nothing else 0


if __name__ == "__main__":
    sys.exit(main())
