"""One results file from the groups of a split run (``graph-harness merge``).

A nightly that outgrows one machine runs pytest-split's groups on several runners; each writes
its own results file. Merged, they are one run again: one results file that ``graph-harness
diff`` and ``verdicts`` read like any other, and one HTML page (rebuilt from the merged file by
:mod:`harness.report.replay`).

A merge that hides a lost or repeated item is worse than none, so every group is checked
against the others before anything is written, and every problem is named:

* the same commit, the same harness options (backend, stack, modes, matrix, FIA contract) and
  the same resolved backend: items of two commits or two stacks are not one run;
* the same split: the same number of groups, algorithm and durations file, and the same items
  collected before the split (the run record's ``split``, :mod:`harness.pytest_groups`);
* every group once, and every item collected exactly once in the groups' results: a missing
  group, an item with no record (its worker crashed) and an item in two groups are errors,
  each naming the item.

Files without a ``split`` (runs of hand-made selections) merge too, checked for agreement and
doubled items only: nothing says which items they should hold.

Pure: reads and writes JSON, imports neither pytest nor torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from harness.plain import JsonObject
from harness.report.diff import ResultsFileError, load_results

__all__ = ["MergeError", "Shard", "merge", "merge_files", "AGREED_OPTIONS"]

#: The run options every group must share (``harness.report.suite.RUN_OPTIONS``, less the
#: evidence kept, which changes what a record holds, not its verdict).
AGREED_OPTIONS = ("backend", "stack", "mode", "matrix", "fia_contract")
#: Items named per problem before "and N more".
SHOWN = 5


class MergeError(ValueError):
    """Groups that are not one run: every problem found, one per line."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


@dataclass(frozen=True)
class Shard:
    """One group's results file."""

    path: str
    data: JsonObject

    @property
    def run(self) -> JsonObject:
        return self.data.get("run") or {}

    @property
    def split(self) -> JsonObject | None:
        split = self.run.get("split")
        return split if isinstance(split, dict) else None

    @property
    def name(self) -> str:
        group = (self.split or {}).get("group")
        return f"{self.path} (group {group})" if group is not None else self.path


def _names(items: Sequence[str] | set[str]) -> str:
    ordered = sorted(items)
    shown = ", ".join(ordered[:SHOWN])
    return shown + (f" and {len(ordered) - SHOWN} more" if len(ordered) > SHOWN else "")


def _disagreement(shards: Sequence[Shard], what: str, label: str, value: Callable[[Shard], object]) -> str | None:
    """``value`` differs between the shards: which files have which value, or None."""
    by_value: dict[str, list[str]] = {}
    for shard in shards:
        by_value.setdefault(repr(value(shard)), []).append(shard.path)
    if len(by_value) < 2:
        return None
    sides = "; ".join(f"{_names(paths)}: {shown}" for shown, paths in by_value.items())
    return f"groups from different {label}: {what} differs ({sides})"


def _option(name: str) -> Callable[[Shard], object]:
    return lambda shard: (shard.run.get("options") or {}).get(name)


def _split_field(name: str) -> Callable[[Shard], object]:
    return lambda shard: (shard.split or {}).get(name)


def _environment(shard: Shard) -> JsonObject:
    return shard.run.get("environment") or shard.data.get("environment") or {}


#: What every group must share: (what the message calls it, "groups from different ...", value).
_RUN_AGREES: list[tuple[str, str, Callable[[Shard], object]]] = [
    ("commit", "commits", lambda shard: shard.run.get("commit")),
    ("the resolved backend", "backends", lambda shard: _environment(shard).get("backend")),
    *((f"--{name.replace('_', '-')}", "stacks" if name == "stack" else "options", _option(name))
      for name in AGREED_OPTIONS),
]
_SPLIT_AGREES: list[tuple[str, str, Callable[[Shard], object]]] = [
    ("--splits", "splits", _split_field("splits")),
    ("--splitting-algorithm", "splits", _split_field("algorithm")),
    ("the durations file (its sha256)", "splits",
     lambda shard: ((shard.split or {}).get("durations") or {}).get("sha256")),
]


def _agreement(shards: Sequence[Shard]) -> list[str]:
    problems = [p for what, label, value in _RUN_AGREES if (p := _disagreement(shards, what, label, value))]
    split = [shard for shard in shards if shard.split is not None]
    if split and len(split) != len(shards):
        plain = [shard.path for shard in shards if shard.split is None]
        problems.append(f"groups of a split mixed with runs that were not split: {_names(plain)} ran no "
                        "--splits/--group")
    elif split:
        problems += [p for what, label, value in _SPLIT_AGREES if (p := _disagreement(shards, what, label, value))]
    return problems


def _collections(shards: Sequence[Shard]) -> list[str]:
    """Groups of one split collected the same items before the split."""
    first = shards[0]
    expected = set(first.split["collected"]) if first.split else set()
    problems = []
    for shard in shards[1:]:
        collected = set((shard.split or {}).get("collected") or [])
        if collected != expected:
            only_here, only_there = collected - expected, expected - collected
            parts = [f"{len(collected)} items collected against {len(expected)} in {first.path}"]
            if only_here:
                parts.append(f"only in {shard.path}: {_names(only_here)}")
            if only_there:
                parts.append(f"only in {first.path}: {_names(only_there)}")
            problems.append(f"groups from different item sets: {shard.path}: " + "; ".join(parts))
    return problems


def _groups(shards: Sequence[Shard]) -> list[str]:
    splits = int((shards[0].split or {}).get("splits") or 0)
    seen: dict[int, list[str]] = {}
    for shard in shards:
        seen.setdefault(int((shard.split or {}).get("group") or 0), []).append(shard.path)
    problems = [f"group {group} of {splits} appears {len(paths)} times: {_names(paths)}"
                for group, paths in sorted(seen.items()) if len(paths) > 1]
    missing = [group for group in range(1, splits + 1) if group not in seen]
    problems += [f"group {group} of {splits} is missing: no results file for it" for group in missing]
    collected = set((shards[0].split or {}).get("collected") or [])
    selected = {nodeid for shard in shards for nodeid in (shard.split or {}).get("selected") or []}
    if lost := collected - selected:
        problems.append(f"missing: {_names(lost)}: collected, and no group " +
                        ("present ran them" if missing else "selected them"))
    return problems


def _items(shards: Sequence[Shard]) -> tuple[list[JsonObject], list[str]]:
    """Every record, and the problems: doubled items, records outside their group, selected
    items without a record."""
    records: list[JsonObject] = []
    where: dict[str, list[str]] = {}
    problems = []
    for shard in shards:
        have = set()
        for record in shard.data.get("items") or []:
            nodeid = str(record.get("nodeid") or record.get("key") or "")
            where.setdefault(nodeid, []).append(shard.name)
            have.add(nodeid)
            records.append(record)
        split = shard.split
        if split is None:
            continue
        chosen = set(split.get("selected") or [])
        if stray := have - chosen:
            problems.append(f"{shard.name} holds items its group did not select: {_names(stray)}")
        if lost := chosen - have:
            problems.append(f"missing from {shard.name}: {_names(lost)} (selected by its group, no record: "
                            "the item crashed its worker, or the run stopped early)")
    doubled: dict[tuple[str, ...], list[str]] = {}
    for nodeid, paths in where.items():
        if len(paths) > 1:
            doubled.setdefault(tuple(paths), []).append(nodeid)
    for files, nodeids in sorted(doubled.items()):
        problems.append(f"doubled: {len(nodeids)} item(s) in each of {', '.join(files)}: {_names(nodeids)}")
    return records, problems


def _times(shards: Sequence[Shard], field: str) -> dict[str, float]:
    """Each shard's ``run[field]`` (an ISO time) -> its timestamp, the unreadable ones left out."""
    found = {}
    for shard in shards:
        text = str(shard.run.get(field) or "")
        try:
            found[text] = datetime.fromisoformat(text).timestamp()
        except ValueError:
            continue
    return found


def _merged_run(shards: Sequence[Shard]) -> JsonObject:
    """The merged run record: the first group's identity, the whole span of time, each group's
    own times and, where a group ran on a different machine, its environment."""
    ordered = sorted(shards, key=lambda shard: int((shard.split or {}).get("group") or 0))
    first = ordered[0].run
    run = {key: value for key, value in first.items() if key not in ("split", "command", "title")}
    starts = _times(ordered, "started")
    ends = _times(ordered, "finished")
    if starts:
        run["started"] = min(starts, key=starts.__getitem__)
    if ends:
        run["finished"] = max(ends, key=ends.__getitem__)
    if starts and ends:
        run["duration"] = round(max(ends.values()) - min(starts.values()), 3)
    run["command"] = _without_group(first.get("command") or [])
    title = str(first.get("title") or "graph-harness")
    split = ordered[0].split
    if split:
        title = title.replace(f" (group {split.get('group')} of {split.get('splits')})", "")
    run["title"] = f"{title} ({len(ordered)} groups merged)" if len(ordered) > 1 else title
    groups = []
    for shard in ordered:
        entry: JsonObject = {"path": shard.path, "items": len(shard.data.get("items") or [])}
        for key in ("started", "finished", "duration"):
            entry[key] = shard.run.get(key)
        if shard.split:
            entry["group"] = shard.split.get("group")
        if shard.run.get("environment") != first.get("environment"):
            entry["environment"] = shard.run.get("environment")
        groups.append(entry)
    run["groups"] = groups
    run["group_seconds"] = round(sum(float(g.get("duration") or 0) for g in groups), 3)
    if split:
        run["split"] = {"splits": split.get("splits"), "algorithm": split.get("algorithm"),
                        "durations": split.get("durations"), "items": len(split.get("collected") or []),
                        "merged": True}
    return run


def _without_group(command: Sequence[object]) -> list[str]:
    """The command with its ``--group`` left out: what every group ran."""
    out: list[str] = []
    skip = False
    for arg in map(str, command):
        if skip:
            skip = False
            continue
        if arg == "--group":
            skip = True
            continue
        if arg.startswith("--group="):
            continue
        out.append(arg)
    return out


def merge(shards: Sequence[Shard]) -> tuple[JsonObject, list[JsonObject]]:
    """The merged run record and records, or :class:`MergeError` with every problem found."""
    if not shards:
        raise MergeError(["no results files to merge"])
    if already := [shard.path for shard in shards if (shard.split or {}).get("merged")]:
        raise MergeError([f"{_names(already)}: already a merged file; merge the groups' own results files"])
    problems = _agreement(shards)
    if not problems and shards[0].split is not None:
        problems += _collections(shards)
        if not problems:
            problems += _groups(shards)
    records, item_problems = _items(shards)
    problems += item_problems
    if problems:
        raise MergeError(problems)
    return _merged_run(shards), records


def merge_files(paths: Sequence[str | Path]) -> tuple[JsonObject, list[JsonObject]]:
    """:func:`merge` of the results files at ``paths`` (each must be a readable results file)."""
    shards, problems = [], []
    for path in paths:
        try:
            shards.append(Shard(str(path), load_results(path)))
        except ResultsFileError as error:
            problems.append(str(error))
    if problems:
        raise MergeError(problems)
    return merge(shards)
