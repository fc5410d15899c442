"""The feature interface: what a parallel or speculative feature does to a graph-mode step.

Every feature that changes the token count collides with the FIA check, with stale host
parameters and with the stream budget (reference section 5). A feature tells the pipeline,
through these hooks and nothing else:

* which capture sizes it admits (``capture_sizes``);
* how it changes ``T`` (``pad_tokens``: SP rounds up to a multiple of tp), and whether the
  ranks must agree on it (``agree``: DP pads every rank to the group max, takes the min mode);
* what a uniform decode batch looks like (``extra_query_tokens``: MTP's k draft tokens);
* how many ranks it needs along its axis (``ranks``), and combinations it cannot run
  (``unsupported``), which make the item a skip with the reason;
* its fix switch (``fix``), which a known-bad scenario turns off.

Model-level mechanics (sharded weights, collectives, LSE merges) live in :mod:`harness.model`;
a feature only wires them into the pipeline. A new feature is a new module with a subclass of
:class:`Feature`, registered in the ``graph_harness.features`` entry-point group.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

from harness.graph.shape import MODE_ORDER, SINGLE_RANK, RankContext, StepShape  # noqa: F401


class Feature:
    """Base class: every hook is the identity, so a feature overrides only what it changes."""

    name: ClassVar[str]  # its key under the scenario's `features:`
    fix: ClassVar[str | None] = None  # its switch under `fixes:`
    ledger: ClassVar[str] = ""  # its column in the padding ledger

    def __init__(self, settings: Mapping[str, Any], fixes: Mapping[str, bool]) -> None:
        self.settings = dict(settings)
        self.fix_on = fixes.get(self.fix, True) if self.fix else True

    def enabled(self) -> bool:
        raise NotImplementedError

    def ranks(self) -> int:
        return 1

    def extra_query_tokens(self) -> int:
        return 0

    def capture_sizes(self, sizes: list[int], max_size: int) -> list[int]:
        return sizes

    def pad_tokens(self, num_tokens: int) -> int:
        return num_tokens

    def agree(self, shape: StepShape, ctx: RankContext) -> StepShape:
        return shape

    def rank_metadata(self, meta: Any, ctx: RankContext, block_size: int) -> Any:
        """This rank's attention metadata (context parallel shards it)."""
        return meta

    def attention_style(self, ctx: RankContext) -> Any:
        """How attention runs on this rank (None: the default causal FIA)."""
        return None

    def before_forward(self, shape: StepShape, ctx: RankContext, step: int) -> None:
        """Called on the graph path right before the forward (a guard, never a fix)."""

    def unsupported(self, scenario: Mapping[str, Any]) -> str | None:
        return None


class RankAxisFeature(Feature):
    """A feature that spreads a step over ranks along one axis, sized by one setting."""

    size_key: ClassVar[str] = "size"

    @property
    def size(self) -> int:
        return int(self.settings.get(self.size_key, 1))

    def enabled(self) -> bool:
        return self.size > 1

    def ranks(self) -> int:
        return self.size
