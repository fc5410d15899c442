"""Check c: no stale host parameters.

A replayed graph re-issues the host lists it holds. Per step and layer, the lists the engine
says the graph executed with are compared with the live batch's; where the engine cannot say
(native backends), the generated text is the evidence: a stale graph repeats itself while the
eager reference does not. Both texts are kept side by side with their repetition scores.

The draft model's FULL graphs (speculative decoding) are compared the same way, per step, round
and layer, with the lists of their own rounds. A stale draft only lowers the acceptance (the
output stays the target's), so the engine's report is the only evidence: none on a backend that
cannot say.
"""

from __future__ import annotations


from harness.checks.result import CheckName, CheckResult, not_evaluated
from harness.graph.record import RunRecord
from harness.model import longest_repeat_run, repetition_score
from harness.plain import JsonObject

#: A graph text this much more repetitive than the reference's reads as stale.
REPETITION_MARGIN = 0.5


def _repetition(texts: dict[str, list[int]]) -> dict[str, dict[str, float]]:
    return {req: {"score": repetition_score(t), "longest_run": longest_repeat_run(t)} for req, t in texts.items()}


def check_stale_params(record: RunRecord) -> CheckResult:
    stale: list[JsonObject] = []  # one row of the report's table per stale list
    compared = 0
    for step in record.steps:
        if step.executed is None:
            continue
        for layer, executed in enumerate(step.executed):
            compared += 1
            for name in ("actual_seq_lengths", "actual_seq_lengths_kv"):
                live = step.metadata.get(name)
                ran = list(executed.get(name) or [])
                if ran != live:
                    stale.append({"step": step.step, "layer": layer, "argument": name,
                                  "executed": ran, "expected": live, "bucket": step.num_tokens_padded})
    draft_compared, draft_stale = _draft_stale(record)
    compared += draft_compared
    stale += draft_stale
    repetition = {path: _repetition(record.texts.get(path, {})) for path in ("reference", "graph")}
    details = {"compared_layer_steps": compared, "draft_layer_steps": draft_compared, "stale": stale,
               "repetition": repetition, "texts": {p: record.texts.get(p, {}) for p in ("reference", "graph")}}
    if stale:
        stale.sort(key=lambda entry: entry["step"])  # the first step's, the target's before its draft's
        first = stale[0]
        draft = first.get("model") == "draft"
        later = None if draft else _later_step_with(record, first)
        what = f"capture-time {first['argument']} {first['executed']}" if later is None else (
            f"{first['argument']} {first['executed']} of step {later} (its update reached the graph before this "
            f"replay had run)")
        where = f"draft round {first['round']}, layer {first['layer']}" if draft else f"layer {first['layer']}"
        summary = (
            f"{'draft ' if draft else ''}graph replayed {what} at step {first['step']} "
            f"({where}, bucket {first['bucket']}), expected {first['expected']}; "
            f"{len(stale)} stale list(s) in all; {_acceptance(record) if draft else _scores(repetition)}"
        )
        return CheckResult(CheckName.STALE_PARAMS, False, summary, first["step"], details)
    unverifiable = any(step.host_lists_unverifiable for step in record.steps)
    eager = repetition["reference"]
    repeated = [
        req for req, rep in repetition["graph"].items()
        if rep["score"] - eager.get(req, {"score": 0.0})["score"] >= REPETITION_MARGIN
    ] if record.reference_here else []  # a rank without the eager text leaves this to the peer that has it
    if unverifiable and repeated:  # the engine could not say what ran: the text is the evidence
        summary = (f"graph text repeats where eager does not (requests {', '.join(repeated)}; "
                   f"{_scores(repetition)}): host parameters were probably frozen at capture")
        return CheckResult(CheckName.STALE_PARAMS, False, summary, _first_divergence(record, repeated), details)
    if unverifiable and any(record.texts.get("graph", {}).values()):
        how = "the backend cannot report executed lists; texts compared"
    elif compared:
        how = f"{compared} layer-steps compared"
        if draft_compared:
            how += f", {draft_compared} of them the draft model's rounds"
    else:  # no FULL replay ran (or the graph path stopped first): attention read live lists
        return not_evaluated(CheckName.STALE_PARAMS, "no FULL replay ran, so no host list could go stale", details)
    return CheckResult(CheckName.STALE_PARAMS, True, f"host lists live on every replay ({how})", details=details)


def _draft_stale(record: RunRecord) -> tuple[int, list[JsonObject]]:
    """The draft graphs' (round, layer)-steps compared, and the stale lists among them."""
    compared, stale = 0, list[JsonObject]()
    for step in record.steps:
        draft = step.draft or {}
        if not draft.get("executed"):
            continue
        layers, lists = draft.get("layers") or 1, draft.get("metadata") or []
        for index, executed in enumerate(draft["executed"]):
            round_, layer = divmod(index, layers)
            compared += 1
            for name in ("actual_seq_lengths", "actual_seq_lengths_kv"):
                live = lists[round_].get(name) if round_ < len(lists) else None
                ran = list(executed.get(name) or [])
                if ran != live:
                    stale.append({"step": step.step, "layer": layer, "argument": name, "executed": ran,
                                  "expected": live, "bucket": draft.get("bucket"), "model": "draft",
                                  "round": round_ + 1})
    return compared, stale


def _later_step_with(record: RunRecord, stale: JsonObject) -> int | None:
    """The later step of the same bucket whose live list is what ran (an update that raced the
    replay before it: async scheduling without the sync), else None (the capture's list)."""
    for step in record.steps:
        if step.step > stale["step"] and step.num_tokens_padded == stale["bucket"] \
                and step.metadata.get(stale["argument"]) == stale["executed"]:
            return step.step
    return None


def _acceptance(record: RunRecord) -> str:
    """What a stale draft changes: the drafts accepted (the output stays the target's)."""
    rates = [f"{path} {s['accepted']}/{s['proposed']}" for path, s in record.speculation.items()
             if path in ("graph", "padded")]
    return "drafts accepted: " + (", ".join(rates) if rates else "none recorded") + " (the text is the target's)"


def _scores(repetition: dict[str, dict[str, dict[str, float]]]) -> str:
    def mean(path: str) -> float:
        scores = [r["score"] for r in repetition[path].values()]
        return sum(scores) / len(scores) if scores else 0.0

    return f"text repetition score graph {mean('graph'):.2f} vs eager {mean('reference'):.2f}"


def _first_divergence(record: RunRecord, reqs: list[str]) -> int | None:
    for step in record.steps:
        if step.sampled.get("graph") != step.sampled.get("reference"):
            return step.step
    return None
