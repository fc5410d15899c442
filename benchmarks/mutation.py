"""The mutation run: inject each bug of ``benchmarks/mutants.py`` alone, and see what catches it.

Every mutant is applied to a throwaway copy of the tree (``harness/``, ``scenarios/``,
``tests/``, ``benchmarks/``, ``conftest.py``, ``pyproject.toml``; the working tree is never
touched), then the
kill commands run there, cheapest first, each stopping at its first failure (``-x``):

1. import: ``import harness.session, harness.pytest_plugin``; a mutant that does not import
   (or whose snippet does not apply) is *broken*, counted apart, never as a kill;
2. probe: the mutant's own probe (a few scenario files or one unit-test module, no xdist);
3. scenarios: the whole shipped library as ``make test`` runs it (``pytest scenarios/ -n 2``,
   every mode of every file, the pairwise cross product);
4. tests: the whole unit suite (``pytest tests -n 2``), less ``tests/benchmarks/test_mutants.py``,
   which checks that every snippet is in the unpatched source and so fails on any patched copy.

A kill by the probe is a kill by the library or the unit suite (the probe is a part of one of
them), so the probe only saves time; a mutant the probe misses runs stages 3 and 4 in full
before it counts as surviving. The probes are first run on the unmutated copy: a probe that
fails there would make every kill meaningless, so the run stops.

Writes ``reports/mutation/mutation.json`` and ``mutation.md`` and prints the kill ratio.

    python benchmarks/mutation.py                 # every mutant
    python benchmarks/mutation.py --only dp-mode-max,pad-slot-zero
    python benchmarks/mutation.py --list
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from mutants import MUTANTS, RULES, Mutant  # noqa: E402

COPIED = ("harness", "scenarios", "tests", "benchmarks", "conftest.py", "pyproject.toml")
#: The list's own rot test fails on every patched copy by design (its snippet is gone): no kill.
NOT_A_KILL = "tests/benchmarks/test_mutants.py"
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
PYTEST = ("-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "no:randomly")
STAGES = (
    ("scenarios", ("scenarios/", "-n", "2"), 1800),
    ("tests", ("tests", "-n", "2", f"--ignore={NOT_A_KILL}"), 2400),
)


@dataclass
class Outcome:
    id: str
    rule: str
    file: str
    bug: str
    status: str  # killed, survived, broken
    by: str = ""  # probe:scenarios, probe:tests, scenarios, tests; or why it is broken
    evidence: str = ""  # the first failure line of the command that killed it
    seconds: float = 0.0
    commands: list[str] = field(default_factory=list)


def _copy_tree(dest: Path) -> None:
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, dest / name, ignore=IGNORED)
        else:
            shutil.copy2(source, dest / name)


def _env(tree: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1", COLUMNS="250")
    env.pop("PYTEST_ADDOPTS", None)
    return env


def _run(tree: Path, args: tuple[str, ...], timeout: float) -> tuple[int | None, str]:
    """Run ``python args`` in ``tree``; rc None on timeout."""
    try:
        done = subprocess.run([sys.executable, *args], cwd=tree, env=_env(tree), capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired as error:
        out = error.stdout.decode() if isinstance(error.stdout, bytes) else (error.stdout or "")
        return None, out
    return done.returncode, done.stdout + done.stderr


def _first_failure(output: str) -> str:
    for line in output.splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            return line[:300]
    lines = [line for line in output.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def _kind(paths: tuple[str, ...]) -> str:
    return "scenarios" if all(p.startswith("scenarios") for p in paths) else "tests"


def apply(tree: Path, mutant: Mutant) -> str | None:
    """Patch the copy; the reason it cannot be patched, or None."""
    path = tree / mutant.file
    text = path.read_text()
    count = text.count(mutant.before)
    if count != 1:
        return f"snippet found {count} times in {mutant.file}"
    path.write_text(text.replace(mutant.before, mutant.after))
    return None


def run_mutant(mutant: Mutant, workdir: Path, probe_only: bool = False) -> Outcome:
    started = time.perf_counter()
    outcome = Outcome(mutant.id, mutant.rule, mutant.file, mutant.bug, "survived")
    tree = workdir / mutant.id
    _copy_tree(tree)
    try:
        problem = apply(tree, mutant)
        if problem:
            outcome.status, outcome.by = "broken", problem
            return outcome
        rc, out = _run(tree, ("-c", "import harness.session, harness.pytest_plugin, harness.collection"), 300)
        if rc != 0:
            outcome.status, outcome.by, outcome.evidence = "broken", "does not import", _first_failure(out)
            return outcome
        stages = [("probe:" + _kind(mutant.probe), mutant.probe, 900)] + ([] if probe_only else list(STAGES))
        for name, args, timeout in stages:
            outcome.commands.append("pytest " + " ".join(args))
            rc, out = _run(tree, (*PYTEST, *args), timeout)
            if rc in (4, 5):  # usage error or nothing collected: the run itself is wrong
                raise RuntimeError(f"{mutant.id}: {name} collected nothing or was misused:\n{out[-2000:]}")
            if rc != 0:
                outcome.status, outcome.by = "killed", name
                outcome.evidence = "timed out (a hang)" if rc is None else _first_failure(out)
                return outcome
        return outcome
    finally:
        outcome.seconds = round(time.perf_counter() - started, 1)
        shutil.rmtree(tree, ignore_errors=True)


def baseline(workdir: Path, mutants: list[Mutant]) -> None:
    """Every probe passes on the unmutated tree (else a kill would prove nothing)."""
    tree = workdir / "baseline"
    _copy_tree(tree)
    probes = tuple(sorted({p for m in mutants for p in m.probe}))
    rc, out = _run(tree, (*PYTEST, *probes, "-n", "2"), 1800)
    shutil.rmtree(tree, ignore_errors=True)
    if rc != 0:
        raise SystemExit(f"the probes fail on the unmutated tree (rc {rc}):\n{out[-3000:]}")


def write_reports(outcomes: list[Outcome], seconds: float, out_dir: Path) -> tuple[str, dict]:
    killed = [o for o in outcomes if o.status == "killed"]
    survived = [o for o in outcomes if o.status == "survived"]
    broken = [o for o in outcomes if o.status == "broken"]
    valid = len(killed) + len(survived)
    ratio = len(killed) / valid if valid else 0.0
    rules_killed = sorted({o.rule for o in killed})
    summary = {
        "mutants": len(outcomes), "killed": len(killed), "survived": len(survived), "broken": len(broken),
        "kill_ratio": round(ratio, 4), "wall_seconds": round(seconds, 1),
        "killed_by": {k: sum(o.by == k for o in killed) for k in sorted({o.by for o in killed})},
        "rules": len(RULES), "rules_with_a_kill": len(rules_killed),
        "rules_without_a_kill": sorted(set(RULES) - set(rules_killed)),
        "python": sys.version.split()[0], "stages": ["import", "probe", *(s[0] for s in STAGES)],
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "mutation.json").write_text(json.dumps({"summary": summary, "mutants": [asdict(o) for o in outcomes]},
                                                      indent=2) + "\n")
    lines = [f"# Mutation run: {len(killed)} of {valid} killed ({ratio:.0%}), {len(broken)} broken",
             "", f"{len(outcomes)} mutants, {seconds / 60:.1f} min wall; rules with a kill: "
             f"{len(rules_killed)} of {len(RULES)}", "",
             "| mutant | rule | status | by | evidence | s |", "|---|---|---|---|---|---|"]
    for o in outcomes:
        evidence = o.evidence.replace("|", "\\|")[:160]
        lines.append(f"| `{o.id}` | {o.rule} | {o.status} | {o.by} | {evidence} | {o.seconds:.0f} |")
    text = "\n".join(lines) + "\n"
    (out_dir / "mutation.md").write_text(text)
    return text, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="comma-separated mutant ids")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--out", default=str(ROOT / "reports" / "mutation"))
    parser.add_argument("--no-baseline", action="store_true", help="skip the probes' run on the unmutated tree")
    parser.add_argument("--probe-only", action="store_true",
                        help="development: stop after the probe (a survivor there is not a survivor of the run)")
    args = parser.parse_args(argv)
    chosen = list(MUTANTS)
    if args.only:
        wanted = args.only.split(",")
        unknown = set(wanted) - {m.id for m in MUTANTS}
        if unknown:
            parser.error(f"unknown mutant(s): {', '.join(sorted(unknown))}")
        chosen = [m for m in MUTANTS if m.id in wanted]
    if args.list:
        for m in chosen:
            print(f"{m.id:28} {m.rule:18} {m.file}: {m.bug}")
        return 0
    started = time.perf_counter()
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="graph-harness-mutation-") as tmp:
        workdir = Path(tmp)
        if not args.no_baseline:
            baseline(workdir, chosen)
            print(f"baseline: every probe passes on the unmutated tree ({time.perf_counter() - started:.0f} s)",
                  flush=True)
        for i, mutant in enumerate(chosen, 1):
            outcome = run_mutant(mutant, workdir, args.probe_only)
            outcomes.append(outcome)
            print(f"[{i}/{len(chosen)}] {mutant.id}: {outcome.status} {outcome.by} ({outcome.seconds:.0f} s) "
                  f"{outcome.evidence[:140]}", flush=True)
    if args.probe_only:
        args.out = str(Path(args.out) / "probe-only")
    text, summary = write_reports(outcomes, time.perf_counter() - started, Path(args.out))
    print(text)
    print(f"kill ratio {summary['kill_ratio']:.1%}: {summary['killed']} killed, {summary['survived']} survived, "
          f"{summary['broken']} broken, of {summary['mutants']}; reports in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
