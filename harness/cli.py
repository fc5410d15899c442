"""``graph-harness``: the command-line tools, one subcommand each.

    graph-harness schema                      the JSON Schema of a scenario file
    graph-harness check PATH...               validate scenario files (files, directories, globs)
    graph-harness diff BASELINE CURRENT       what changed between two results files
    graph-harness verdicts A.json B.json      two backends' verdicts on the same items, item by item
    graph-harness narrow FILE.yaml::ITEM      the smallest scenario that still fails
    graph-harness durations RESULTS.json...   pytest-split's durations file from results files
    graph-harness merge SHARD.json... -o OUT  one results file (and --html page) from a split run's groups
    graph-harness conformance                 the harness's start-up rules against upstream's executed code

The scenario suite itself runs under pytest (``pytest scenarios/``); these tools read and
write the same files. Subcommands import what they need when they run, so ``--help`` and
``diff`` stay fast (no torch import).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.stacks import DEFAULT_STACK, stack_names


def _schema(args: argparse.Namespace) -> int:
    from harness.scenario.__main__ import main

    return main(["schema"])


def _check(args: argparse.Namespace) -> int:
    from harness.scenario.__main__ import run_check

    return run_check(args.paths, mode=args.mode, items=args.items)


def _diff(args: argparse.Namespace) -> int:
    from harness.report.diff import RENDERERS, ResultsFileError, diff_files, parse_threshold

    try:
        thresholds = dict(parse_threshold(text) for text in args.threshold)
        diff = diff_files(args.baseline, args.current, thresholds=thresholds)
    except (ResultsFileError, ValueError) as error:
        print(f"graph-harness diff: {error}", file=sys.stderr)
        return 2
    if not _write("diff", RENDERERS[args.format](diff), args.output):
        return 2
    return diff.exit_status


def _verdicts(args: argparse.Namespace) -> int:
    from harness.report.diff import ResultsFileError
    from harness.report.verdicts import compare_files, differences, render_markdown, render_text

    try:
        rows, reference, other = compare_files(args.reference, args.other)
    except ResultsFileError as error:
        print(f"graph-harness verdicts: {error}", file=sys.stderr)
        return 2
    render = render_markdown if args.format == "markdown" else render_text
    if not _write("verdicts", render(rows, other, reference).rstrip("\n") + "\n", args.output):
        return 2
    return 1 if differences(rows) else 0


def _write(command: str, text: str, output: str | None) -> bool:
    """``text`` to the ``--output`` file, or to standard output; False (said on stderr) when the
    file cannot be written."""
    if not output:
        sys.stdout.write(text)
        return True
    try:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        Path(output).write_text(text)
    except OSError as error:
        print(f"graph-harness {command}: cannot write {output}: {error.strerror or error}", file=sys.stderr)
        return False
    return True


def _durations(args: argparse.Namespace) -> int:
    from harness.report.diff import ResultsFileError, load_results
    from harness.report.durations import durations, durations_text

    try:
        table = durations(load_results(path) for path in args.results)
    except ResultsFileError as error:
        print(f"graph-harness durations: {error}", file=sys.stderr)
        return 2
    return 0 if _write("durations", durations_text(table), args.output) else 2


def _merge(args: argparse.Namespace) -> int:
    from harness.report.merge import MergeError, merge_files
    from harness.report.results import write_results

    try:
        run, records = merge_files(args.results)
    except MergeError as error:
        for problem in error.problems:
            print(f"graph-harness merge: {problem}", file=sys.stderr)
        return 2
    try:
        write_results(Path(args.output), records, run)
    except OSError as error:
        print(f"graph-harness merge: cannot write {args.output}: {error.strerror or error}", file=sys.stderr)
        return 2
    groups = run.get("groups") or []
    print(f"graph-harness merge: {len(records)} items from {len(groups)} results files -> {args.output}")
    for group in groups:
        print(f"  group {group.get('group', '-')}: {group.get('items')} items, {group.get('duration')} s "
              f"({group.get('path')})")
    if args.html or args.junitxml:
        from harness.report.replay import rebuild_reports

        status = rebuild_reports(Path(args.output), html=args.html, junitxml=args.junitxml)
        if status != 0:
            print(f"graph-harness merge: writing the reports failed (pytest exit {status})", file=sys.stderr)
            return 2
        for kind, path in (("HTML", args.html), ("junit", args.junitxml)):
            if path:
                print(f"  {kind}: {path}")
    return 0


def _conformance(args: argparse.Namespace) -> int:
    from harness.upstream.conformance import random_points, render, run

    try:
        report = run(random_points(args.random, seed=args.seed), args.profile, progress=not args.quiet)
    except (FileNotFoundError, RuntimeError) as error:
        print(f"graph-harness conformance: {error}", file=sys.stderr)
        return 2
    if not _write("conformance", render(report, shown=args.shown), args.output):
        return 2
    return 1 if report.unrecorded or report.adapter_errors else 0


def _narrow(args: argparse.Namespace) -> int:
    from harness.narrow import NarrowError, default_runner, find_point, narrow, render_report, split_target, write_minimal

    try:
        path, item = split_target(args.target)
        point = find_point(path, item)
        if args.stack and point.scenario.stack is None:  # as --stack under pytest; the minimal YAML keeps it
            from dataclasses import replace

            point = replace(point, scenario=point.scenario.model_copy(update={"stack": args.stack}))
        say = None if args.quiet else (lambda line: print(f"  {line}", flush=True))
        if say:
            print(f"narrowing {args.target} ({point.scenario.graph.mode}, backend {args.backend})", flush=True)
        result = narrow(point, runner=default_runner(args.backend, args.fia_contract), target=args.target,
                        check=args.check, max_trials=args.max_trials, progress=say)
        write_minimal(result, Path(args.output_dir))
    except NarrowError as error:
        print(f"graph-harness narrow: {error}", file=sys.stderr)
        return 2
    sys.stdout.write(render_report(result, trials=args.quiet))  # without -q they were printed as they ran
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="graph-harness", description="Graph-mode scenario harness: tools around the pytest suite.",
        epilog="Run the scenarios themselves with: pytest scenarios/ [--mode=FULL] [--results-json=PATH]")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    schema = commands.add_parser("schema", help="print the JSON Schema of a scenario file")
    schema.set_defaults(run=_schema)

    check = commands.add_parser(
        "check", help="validate scenario files, directories or globs as pytest collects them (exit 1 on errors)",
        description="Validate scenario files exactly as pytest collection does: every error of every file "
                    "(file:line: field: message), then one summary line. Exit 1 on errors.")
    from harness.scenario.__main__ import add_check_options  # its options are python -m harness.scenario's too

    add_check_options(check)
    check.set_defaults(run=_check)

    diff = commands.add_parser(
        "diff", help="compare two results files: new failures, fixed, changed checks, added, removed, metrics",
        description="Compare two JSON results files (--results-json). Exit 1 when the current run has new "
                    "failures, 2 when a file cannot be read, else 0.")
    diff.add_argument("baseline", metavar="BASELINE.json")
    diff.add_argument("current", metavar="CURRENT.json")
    diff.add_argument("--format", choices=("text", "markdown", "json"), default="text",
                      help="text (default), markdown (a CI step summary) or json")
    diff.add_argument("--output", "-o", metavar="PATH", help="write here instead of standard output")
    diff.add_argument("--threshold", action="append", default=[], metavar="METRIC=REL[:FLOOR]",
                      help="report a metric move only beyond REL (relative) and FLOOR (absolute); "
                           "metrics: graphs_captured, streams_in_use, padding_ratio, capture_seconds")
    diff.set_defaults(run=_diff)

    verdicts = commands.add_parser(
        "verdicts", help="two runs' verdicts item by item (e.g. the emulator and a GPU); exit 1 on a difference",
        description="Compare two JSON results files (--results-json) of the same items on two backends, item "
                    "by item: outcome and failed checks. An item one run skipped for a device reason (too few "
                    "devices, no graph stream pool) is listed as such and not counted. Exit 1 when any item "
                    "differs, 2 when a file cannot be read, else 0.")
    verdicts.add_argument("reference", metavar="A.json", help="the reference run (e.g. --backend=emulated)")
    verdicts.add_argument("other", metavar="B.json", help="the run compared with it (e.g. --backend=cuda)")
    verdicts.add_argument("--format", choices=("text", "markdown"), default="text",
                          help="text (default: every item) or markdown (the differences: a CI step summary)")
    verdicts.add_argument("--output", "-o", metavar="PATH", help="write here instead of standard output")
    verdicts.set_defaults(run=_verdicts)

    durations = commands.add_parser(
        "durations", help="pytest-split's durations file (node id -> rank-seconds) from results files",
        description="Write pytest-split's durations file (.test_durations) from results files (--results-json): "
                    "each item's wall time times its world size, so a multi-rank item counts its ranks. "
                    "A later file's figure wins for an item in several. Exit 2 when a file cannot be read.")
    durations.add_argument("results", nargs="+", metavar="RESULTS.json")
    durations.add_argument("--output", "-o", metavar="PATH", help="write here instead of standard output")
    durations.set_defaults(run=_durations)

    merge = commands.add_parser(
        "merge", help="one results file (and HTML page) from the groups of a split run (--splits/--group)",
        description="Merge the results files of a split run's groups (pytest --splits N --group i) into one "
                    "results file, and with --html one HTML report (the page of an unsplit run). Refuses "
                    "groups of different commits, options, stacks or item sets, a missing or doubled group, "
                    "and any item missing or in two groups, naming each. Exit 2 on any of those.")
    merge.add_argument("results", nargs="+", metavar="SHARD.json")
    merge.add_argument("--output", "-o", required=True, metavar="PATH", help="the merged results file")
    merge.add_argument("--html", metavar="PATH", help="also write the HTML report of the merged run")
    merge.add_argument("--junitxml", metavar="PATH", help="also write a junit XML file of the merged run")
    merge.set_defaults(run=_merge)

    conformance = commands.add_parser(
        "conformance", help="the harness's start-up rules against vLLM / vLLM Ascend executed (needs make upstream)",
        description="For seeded random points, compare the harness's start-up decisions (refusal, graph mode, "
                    "capture sizes, dispatcher keys) with the answers of vLLM and vLLM Ascend's own code, "
                    "executed in the upstream venv that `make upstream` creates. Exit 1 on a difference not "
                    "recorded as intended, 2 when the upstream venv is missing.")
    conformance.add_argument("--profile", default="v0.23.0", help="the upstream venv (default v0.23.0)")
    conformance.add_argument("--random", type=int, default=2000, metavar="N", help="random points (default 2000)")
    conformance.add_argument("--seed", type=int, default=0, help="the points' seed (default 0)")
    conformance.add_argument("--shown", type=int, default=10, metavar="N", help="differences shown per rule")
    conformance.add_argument("--output", "-o", metavar="PATH", help="write here instead of standard output")
    conformance.add_argument("--quiet", "-q", action="store_true", help="no progress line")
    conformance.set_defaults(run=_conformance)

    narrow = commands.add_parser(
        "narrow", help="delta-debug a failing item down to the smallest scenario that fails the same check",
        description="Narrow FILE.yaml::ITEM (a pytest node id or a results-file key) by dropping features, "
                    "lowering their sizes and shrinking the workload and capture sizes, keeping every change "
                    "after which the same check still fails. Writes the minimal scenario as YAML.")
    narrow.add_argument("target", metavar="FILE.yaml::ITEM")
    narrow.add_argument("--backend", default="auto", choices=("emulated", "npu", "cuda", "auto"))
    narrow.add_argument("--fia-contract", default=None, choices=("strict", "relaxed"))
    narrow.add_argument("--stack", default=None, choices=stack_names(),
                        help=f"the release the item models when its file names none (default {DEFAULT_STACK})")
    narrow.add_argument("--check", default=None, help="the check that must keep failing (default: the first failing)")
    narrow.add_argument("--max-trials", type=int, default=40, metavar="N", help="trial budget (default 40)")
    narrow.add_argument("--output-dir", default="reports", metavar="DIR", help="where the minimal YAML goes")
    narrow.add_argument("--quiet", "-q", action="store_true", help="print only the final report")
    narrow.set_defaults(run=_narrow)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
