"""Charts for the HTML report, drawn with matplotlib as inline SVG text.

Inline SVG keeps the self-contained report working offline and costs no image decoding; text
stays text (``svg.fonttype: none``), so a chart is a few kilobytes. matplotlib is imported on
the first chart only, and figures are built without pyplot (no global state, thread-safe).
Three pictures where a table reads worse:

- :func:`step_tokens_svg`: per step, the real tokens against the padding, stacked by the
  padding ledger's sources (the bucket, each feature's column), the first failing step marked;
- :func:`streams_svg`: per captured bucket, the device streams held against the pool;
- :func:`padding_waste_svg`: per bucket over a whole run, the share of its tokens that were
  padding, by source.

Each returns ``""`` when there is nothing to draw, so a caller never draws an empty frame.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Callable, ParamSpec

__all__ = ["step_tokens_svg", "streams_svg", "padding_waste_svg", "padding_by_bucket", "step_padding",
           "source_colours", "preload", "safely"]

#: The ledger's own sources; each feature declares its column's colour (``Feature.ledger_colour``).
_CORE_COLOURS = {"real": "#4c78a8", "bucket": "#f58518"}
_OTHER = "#9d755d"
_FAIL = "#c62828"
_P = ParamSpec("_P")  # a chart's parameters, which safely passes through


def safely(draw: Callable[_P, str], *args: _P.args, **kwargs: _P.kwargs) -> str:
    """A chart, or ``""`` if drawing it failed: a chart must never cost the report."""
    try:
        return draw(*args, **kwargs)
    except Exception as error:  # noqa: BLE001
        return f'<p class="gh-muted">[chart not drawn: {type(error).__name__}]</p>'


def source_colours() -> dict[str, str]:
    """One colour per ledger source, the same in every chart (real work is blue, padding warm):
    the ledger's own, then each registered feature's column."""
    from harness.features import ledger_colours

    return {**_CORE_COLOURS, **ledger_colours()}


def _colour(source: str) -> str:
    return source_colours().get(source, _OTHER)


def _sources(ledgers: Iterable[Mapping]) -> list[str]:
    """Ledger sources in a stable order: real first, the known ones, then any others by name."""
    seen = {key for ledger in ledgers for key in ledger}
    known = source_colours()
    return [s for s in known if s in seen] + sorted(seen - set(known))


# matplotlib is optional (and loosely typed): its Figure class, figures and axes stay untyped here.
def _matplotlib() -> Any:
    # Not cached: a cached class would outlive a re-import of matplotlib (pytester restores
    # sys.modules between in-process runs), and the import is a dict lookup after the first.
    import matplotlib

    matplotlib.use("Agg", force=False)  # no display, no GUI toolkit
    from matplotlib.figure import Figure

    return Figure


def preload() -> None:
    """Import matplotlib now (about a second), ahead of the first chart; never raises."""
    try:
        _matplotlib()
    except Exception:  # noqa: BLE001 - the chart that needs it reports the problem
        pass


def _figure(width: float, height: float, bottom: float = 0.42) -> tuple[Any, Any]:
    """A figure with fixed margins (in inches): a layout engine would cost more than the drawing."""
    Figure = _matplotlib()
    fig = Figure(figsize=(width, height))
    fig.subplots_adjust(left=0.5 / width, right=1 - 0.1 / width, bottom=bottom / height, top=1 - 0.32 / height)
    ax = fig.add_subplot()
    ax.spines[["top", "right"]].set_visible(False)
    ax.tick_params(labelsize=7, length=2)
    return fig, ax


def _svg(fig: Any, salt: str) -> str:
    """The figure as an inline ``<svg>`` element: no XML prolog, no metadata, ids unique per salt."""
    import matplotlib

    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": salt or "gh"}):
        fig.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None, "Format": None,
                                                    "Type": None})
    text = buffer.getvalue()
    text = text[text.index("<svg"):]
    text = re.sub(r"<metadata>.*?</metadata>\s*", "", text, flags=re.S)
    # Unreferenced group ids (patch_3, axes_1, ...) would repeat across the charts of one page.
    text = re.sub(r' id="(?:figure|axes|patch|line2d|text|xtick|ytick|matplotlib\.axis|legend)_\d+"', "", text)
    return re.sub(r">\s+<", "><", text).strip()


def _legend(ax: Any, ncols: int) -> None:
    ax.legend(fontsize=7, frameon=False, ncols=max(1, ncols), loc="lower left", bbox_to_anchor=(0, 1.0),
              handlelength=1, columnspacing=1, borderaxespad=0.2)


def step_tokens_svg(steps: Sequence[Mapping], *, failed_step: int | None = None, salt: str = "") -> str:
    """Per step: real tokens against the padding that filled the bucket, by ledger source."""
    rows = [s for s in steps if isinstance(s, Mapping) and isinstance(s.get("ledger"), Mapping) and s["ledger"]]
    if not rows:
        return ""
    ledgers = [{k: v for k, v in s["ledger"].items() if isinstance(v, (int, float))} for s in rows]
    # A source that added nothing on any step (``bucket=0`` everywhere) would be legend noise.
    sources = [src for src in _sources(ledgers) if src == "real" or any(led.get(src) for led in ledgers)]
    fig, ax = _figure(max(3.2, min(7.5, 1.6 + 0.32 * len(rows))), 1.9)
    xs = list(range(len(rows)))
    bottom = [0.0] * len(rows)
    for source in sources:
        heights = [float(ledger.get(source, 0)) for ledger in ledgers]
        ax.bar(xs, heights, bottom=bottom, width=0.7, color=_colour(source), label=source, linewidth=0)
        bottom = [b + h for b, h in zip(bottom, heights)]
    ax.set_xticks(xs, [str(s.get("step", i)) for i, s in enumerate(rows)])
    ax.set_xlabel("step", fontsize=7)
    ax.set_ylabel("tokens (T)", fontsize=7)
    for i, s in enumerate(rows):
        if failed_step is not None and s.get("step") == failed_step:
            ax.bar([i], [bottom[i]], width=0.9, fill=False, edgecolor=_FAIL, linewidth=1.4, label="first failure")
            break
    _legend(ax, len(sources) + 1)
    return _svg(fig, f"steps-{salt}")


def streams_svg(by_bucket: Sequence[Mapping], pool: object, *, salt: str = "") -> str:
    """Per captured bucket (in capture order): streams held after its capture, against the pool."""
    rows = [b for b in by_bucket if isinstance(b, Mapping) and isinstance(b.get("in_use"), (int, float))]
    if not rows or not isinstance(pool, (int, float)) or pool <= 0:
        return ""
    fig, ax = _figure(max(3.2, min(7.5, 1.6 + 0.3 * len(rows))), 2.1 if len(rows) > 16 else 1.9,
                      bottom=0.62 if len(rows) > 16 else 0.42)
    xs = list(range(len(rows)))
    held = [float(b["in_use"]) for b in rows]
    ax.bar(xs, held, width=0.7, color=_CORE_COLOURS["real"], linewidth=0, label="streams held")
    failed = [(x, h, b.get("needed")) for x, h, b in zip(xs, held, rows) if b.get("failed")]
    if failed:  # what the failed capture asked for, on top of what was held: over the line
        ax.bar([x for x, _, _ in failed], [float(n) if isinstance(n, (int, float)) else 0.0 for _, _, n in failed],
               bottom=[h for _, h, _ in failed], width=0.7, color=_FAIL, linewidth=0, label="needed (failed)")
    ax.axhline(float(pool), color="#333", linestyle="--", linewidth=1, label=f"pool ({pool})")
    ax.set_xticks(xs, [f"{b.get('bucket')}" + ("" if b.get("mode") in (None, "FULL") else "p") for b in rows],
                  rotation=90 if len(rows) > 16 else 0)
    ax.set_xlabel("capture size (p: piecewise pieces)", fontsize=7)
    ax.set_ylabel("streams", fontsize=7)
    _legend(ax, 3)
    return _svg(fig, f"streams-{salt}")


def step_padding(steps: Iterable[Mapping]) -> dict[str, dict[str, float]]:
    """Per bucket (a string: a JSON key), over the steps that replayed a graph: how many
    steps, and the tokens of each padding-ledger source. Every item record keeps this
    (``run.padding``), so the run's chart needs no per-step data of a passing item."""
    table: dict[int, dict[str, float]] = {}
    for step in steps or []:
        if not isinstance(step, Mapping) or step.get("runtime_mode") in (None, "NONE"):
            continue
        bucket, ledger = step.get("num_tokens_padded"), step.get("ledger")
        if not isinstance(bucket, int) or not isinstance(ledger, Mapping):
            continue
        entry = table.setdefault(bucket, {"steps": 0})
        entry["steps"] += 1
        for source, tokens in ledger.items():
            if isinstance(tokens, (int, float)):
                entry[source] = entry.get(source, 0) + tokens
    return {str(bucket): entry for bucket, entry in sorted(table.items())}


def padding_by_bucket(records: Iterable[Mapping]) -> dict[int, dict[str, float]]:
    """Per bucket over a run: :func:`step_padding` of every item, added up (an older record
    without ``run.padding`` is summed from its steps)."""
    table: dict[int, dict[str, float]] = {}
    for record in records:
        run = record.get("run") if isinstance(record, Mapping) else None
        if not isinstance(run, Mapping):
            continue
        per_bucket = run.get("padding")
        if not isinstance(per_bucket, Mapping):
            per_bucket = step_padding(run.get("steps") or [])
        for bucket, counts in per_bucket.items():
            if not str(bucket).isdigit() or not isinstance(counts, Mapping):
                continue
            entry = table.setdefault(int(bucket), {})
            for source, tokens in counts.items():
                if isinstance(tokens, (int, float)):
                    entry[source] = entry.get(source, 0) + tokens
    return dict(sorted(table.items()))


def padding_waste_svg(records: Iterable[Mapping], *, salt: str = "page") -> str:
    """Per bucket over the whole run: the share of its tokens that were padding, by source."""
    table = padding_by_bucket(records)
    if not table:
        return ""
    sources = [s for s in _sources(table.values()) if s not in ("real", "steps")]
    if not sources:
        return ""
    fig, ax = _figure(max(3.6, min(7.5, 1.8 + 0.4 * len(table))), 2.1)
    xs = list(range(len(table)))
    totals = [sum(v for k, v in entry.items() if k != "steps") or 1 for entry in table.values()]
    bottom = [0.0] * len(table)
    for source in sources:
        shares = [100.0 * entry.get(source, 0) / total for entry, total in zip(table.values(), totals)]
        ax.bar(xs, shares, bottom=bottom, width=0.7, color=_colour(source), label=source, linewidth=0)
        bottom = [b + s for b, s in zip(bottom, shares)]
    for x, top, entry in zip(xs, bottom, table.values()):
        ax.annotate(f"{int(entry['steps'])}", (x, top), textcoords="offset points", xytext=(0, 1),
                    ha="center", fontsize=6, color="#555")
    ax.set_xticks(xs, [str(b) for b in table])
    ax.set_ylim(0, max(10.0, min(100.0, max(bottom) * 1.25)))
    ax.set_xlabel("bucket (capture size); above each bar: steps replayed", fontsize=7)
    ax.set_ylabel("padding, % of tokens", fontsize=7)
    _legend(ax, len(sources))
    return _svg(fig, f"waste-{salt}")
