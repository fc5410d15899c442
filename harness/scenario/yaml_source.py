"""Safe YAML for scenario files: bytes -> located node tree -> plain data, in bounded time.

Why not ``yaml.compose`` + ``construct_document``: PyYAML's composer is recursive (deep nesting
raises RecursionError), accepts recursive aliases, and a duplicate-key check over its node tree
walks every alias occurrence again (a "billion laughs" file of a few hundred bytes then never
finishes). Here the node tree is built iteratively from the parser's event stream, and while it
is built:

* each node's expanded size and height are known when it closes, so an alias costs what it
  expands to and the file is refused as soon as it would exceed :data:`~.bounds.MAX_VALUES`
  values or :data:`~.bounds.MAX_DEPTH` levels, at the line of the alias that tips it over;
* an alias to an anchor that is still open (a recursive alias) is refused;
* duplicate keys are found once per mapping, when it closes: an aliased mapping was checked
  where it was defined, and merge keys (``<<: *base``) are not keys of their own.

Bytes are decoded as UTF-8 first (an invalid byte is reported with its line) and characters
YAML forbids are reported with line and column, so no reader error escapes without a line.
Integer literals longer than :data:`~.bounds.MAX_INT_DIGITS` digits are refused before Python
would spend time converting them. The parser is libyaml's when PyYAML has it (fast on a 1 MB
file); the composer and constructor are PyYAML's ``SafeConstructor`` rules.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

import yaml
from yaml import events as ev
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from harness.plain import Loc

from .errors import ScenarioError, ScenarioFileError
from .bounds import MAX_DEPTH, MAX_FILE_BYTES, MAX_INT_DIGITS, MAX_VALUES

__all__ = ["Composed", "compose_text", "decode", "read_source"]

_PARSER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_MERGE = "tag:yaml.org,2002:merge"
_INT = "tag:yaml.org,2002:int"
# What YAML 1.1 (PyYAML's reader) refuses: C0/C1 controls other than tab, LF, CR, NEL.
_FORBIDDEN = re.compile("[^\x09\x0a\x0d\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_LINE_BREAK = re.compile("\r\n|[\r\n\x85\u2028\u2029]")



def _fail(message: str, path: str, line: int | None, field: str = "") -> ScenarioFileError:
    return ScenarioFileError([ScenarioError(message, path=path, line=line, field=field)])


def read_source(path: str) -> str:
    """The text of a scenario file, or a :class:`ScenarioFileError` saying why it has none."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise _fail(f"cannot read the file: {reason}", path, None) from None
    if len(data) > MAX_FILE_BYTES:
        raise _fail(f"the file is larger than the maximum of {MAX_FILE_BYTES} bytes", path, None)
    return decode(data, path)


def decode(data: bytes, path: str) -> str:
    """UTF-8 (an optional BOM is dropped) with no character that YAML forbids."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        column = error.start - (data.rfind(b"\n", 0, error.start) + 1) + 1
        byte = data[error.start]
        raise _fail(f"not valid UTF-8: byte 0x{byte:02x} at column {column}", path, line) from None
    bad = _FORBIDDEN.search(text)
    if bad:
        before = text[: bad.start()]
        line = len(_LINE_BREAK.findall(before)) + 1
        last = max(before.rfind("\n"), before.rfind("\r"))
        column = bad.start() - last
        raise _fail(
            f"control character U+{ord(bad.group()):04X} at column {column} is not allowed in YAML",
            path,
            line,
        )
    return text


@dataclass
class Composed:
    """A composed document: the node tree (lines for errors), the data, duplicate keys found."""

    root: Node | None
    data: object  # what the YAML holds: a reader checks its shape
    duplicates: list[tuple[Loc, int, str]] = field(default_factory=list)
    values: int = 0  # scalars, mappings and sequences, each alias counted as what it expands to

    @property
    def root_line(self) -> int:
        """The 1-based line the document starts on (1 for an empty one)."""
        return self.root.start_mark.line + 1 if self.root is not None else 1


@dataclass
class _Open:
    """A mapping or sequence whose end event has not come yet."""

    node: MappingNode | SequenceNode
    anchor: str | None
    loc: Loc
    items: list = field(default_factory=list)
    key: Node | None = None  # a mapping's key waiting for its value
    size: int = 1
    height: int = 1


def _line(event: ev.Event) -> int:
    return event.start_mark.line + 1 if event.start_mark is not None else 1  # the parser marks every event


def compose_text(text: str, path: str) -> Composed:
    """Parse ``text`` into a :class:`Composed` document; every problem is a located
    :class:`ScenarioFileError` (the first one: composing stops there)."""
    try:
        root, duplicates, values = _compose(text, path)
        if root is None:
            return Composed(None, None)
        data = _Constructor().construct_document(root)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        message = " ".join(p for p in (exc.context, exc.problem) if p) or str(exc)
        kind = "value" if isinstance(exc, _UnreadableValue) else "syntax"
        raise _fail(f"YAML {kind} error: {message}", path, line) from None
    except yaml.YAMLError as exc:
        raise _fail(f"YAML error: {exc}", path, None) from None
    return Composed(root, data, duplicates, values)


class _Constructor(yaml.constructor.SafeConstructor):
    """PyYAML's safe constructor, with a scalar it cannot read (``2024-02-30``, ``!!int x``)
    reported at its line: PyYAML's own scalar constructors raise plain Python errors there."""

    def construct_object(self, node: Node, deep: bool = False) -> object:
        try:
            return super().construct_object(node, deep)
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as error:
            kind = str(node.tag).rpartition(":")[2] or str(node.tag)
            why = str(error) if not isinstance(error, (KeyError, AttributeError)) else "not a value of this type"
            raise _UnreadableValue(None, None, f"{node.value!r} is not a valid {kind} ({why})",
                                   node.start_mark) from None


class _UnreadableValue(yaml.constructor.ConstructorError):
    """A scalar that parses but is no value of its type (a date with no such day)."""


def _compose(text: str, path: str) -> tuple[Node | None, list[tuple[Loc, int, str]], int]:
    """The node tree of ``text``, the duplicate keys found, and the values it expands to."""
    composer = _Composer(path)
    handlers = composer.handlers()
    for event in yaml.parse(text, Loader=_PARSER):
        handle = handlers.get(type(event))
        if handle is not None:  # stream and document ends change nothing
            handle(event)
    return composer.root, composer.duplicates, composer.total


class _Composer:
    """Builds the node tree one parser event at a time, with the bounds checked as it goes
    (the module's docstring says which and why)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.resolver = yaml.resolver.Resolver()
        self.anchors: dict[str, tuple[Node, int, int]] = {}  # anchor -> (node, expanded size, height)
        self.open_anchors: dict[str, int] = {}  # anchors of nodes still being composed -> their line
        self.stack: list[_Open] = []
        self.duplicates: list[tuple[Loc, int, str]] = []
        self.total = 0
        self.root: Node | None = None
        self.documents = 0

    def handlers(self) -> dict[type, Callable[[Any], None]]:  # Any: each step takes its own event class
        """The step for each kind of event (PyYAML's parsers emit these classes exactly)."""
        return {ev.DocumentStartEvent: self.document_start, ev.AliasEvent: self.alias,
                ev.ScalarEvent: self.scalar, ev.SequenceStartEvent: self.collection_start,
                ev.MappingStartEvent: self.collection_start, ev.SequenceEndEvent: self.collection_end,
                ev.MappingEndEvent: self.collection_end}

    # -- one step per event

    def document_start(self, event: ev.DocumentStartEvent) -> None:
        self.documents += 1
        if self.documents > 1:
            raise _fail("a scenario file holds one YAML document; this is a second one", self.path,
                        _line(event))

    def alias(self, event: ev.AliasEvent) -> None:
        """An alias costs what its anchor's node expands to, and may not refer to an open node."""
        name = event.anchor
        if name in self.open_anchors:
            raise _fail(f"recursive alias *{name}: it refers to the node it is part of "
                        f"(anchor &{name} at line {self.open_anchors[name]})", self.path, _line(event))
        if name not in self.anchors:
            raise _fail(f"YAML syntax error: alias *{name} has no anchor &{name} before it",
                        self.path, _line(event))
        node, size, height = self.anchors[name]
        if len(self.stack) + height > MAX_DEPTH:
            raise _fail(f"alias *{name} nests the file deeper than the maximum of {MAX_DEPTH} "
                        "levels", self.path, _line(event))
        self._count(size, event, alias=name)
        self._attach(node, size, height)

    def scalar(self, event: ev.ScalarEvent) -> None:
        tag = event.tag
        if tag is None or tag == "!":
            tag = self.resolver.resolve(ScalarNode, event.value, event.implicit)
        if tag == _INT and (digits := len(event.value.lstrip("+-").replace("_", ""))) > MAX_INT_DIGITS:
            raise _fail(f"integer of {digits} digits is above the maximum of {MAX_INT_DIGITS}",
                        self.path, _line(event), _fmt(self._child_loc()))
        # (types-PyYAML types the C parser's marks apart from yaml.error.Mark; nodes take either)
        node = ScalarNode(tag, event.value, event.start_mark, event.end_mark, style=event.style)  # type: ignore[arg-type]
        self._count(1, event)
        if event.anchor is not None:
            self._check_new_anchor(event.anchor, event)
            self.anchors[event.anchor] = (node, 1, 1)
        self._attach(node, 1, 1)

    def collection_start(self, event: ev.SequenceStartEvent | ev.MappingStartEvent) -> None:
        """A mapping or sequence opens: it stays on the stack until its end event."""
        kind = MappingNode if isinstance(event, ev.MappingStartEvent) else SequenceNode
        tag = event.tag
        if tag is None or tag == "!":
            tag = self.resolver.resolve(kind, None, event.implicit)
        node = kind(tag, [], event.start_mark, None, flow_style=event.flow_style)  # type: ignore[arg-type]
        if len(self.stack) + 1 > MAX_DEPTH:
            raise _fail(f"the file nests deeper than the maximum of {MAX_DEPTH} levels", self.path,
                        _line(event))
        self._count(1, event)
        loc = self._child_loc()
        if event.anchor is not None:
            self._check_new_anchor(event.anchor, event)
            self.open_anchors[event.anchor] = _line(event)
        self.stack.append(_Open(node, event.anchor, loc))

    def collection_end(self, event: ev.SequenceEndEvent | ev.MappingEndEvent) -> None:
        """A mapping or sequence closes: its size and height are known, its keys checked once."""
        top = self.stack.pop()
        top.node.value = top.items
        top.node.end_mark = event.end_mark
        if isinstance(top.node, MappingNode):
            self.duplicates.extend(_duplicate_keys(top.node, top.loc))
        if top.anchor is not None:
            del self.open_anchors[top.anchor]
            self.anchors[top.anchor] = (top.node, top.size, top.height)
        self._attach(top.node, top.size, top.height)

    # -- helpers

    def _child_loc(self) -> Loc:
        """The data location of the node about to be attached."""
        if not self.stack:
            return ()
        top = self.stack[-1]
        if isinstance(top.node, SequenceNode):
            return top.loc + (len(top.items),)
        key = top.key
        return top.loc + (key.value if isinstance(key, ScalarNode) else "?",)

    def _attach(self, node: Node, size: int, height: int) -> None:
        """``node`` becomes the root, an item of the open sequence, or a key or value of the
        open mapping; the open node grows by its size and height."""
        if not self.stack:
            self.root = node
            return
        top = self.stack[-1]
        top.size += size
        top.height = max(top.height, height + 1)
        if isinstance(top.node, SequenceNode):
            top.items.append(node)
        elif top.key is None:
            top.key = node
        else:
            top.items.append((top.key, node))
            top.key = None

    def _count(self, n: int, event: ev.Event, alias: str | None = None) -> None:
        self.total += n
        if self.total > MAX_VALUES:
            what = f"alias *{alias} expands the file beyond" if alias else "the file has more than"
            raise _fail(f"{what} the maximum of {MAX_VALUES} values (scalars, keys included, "
                        "mappings and sequences)", self.path, _line(event))

    def _check_new_anchor(self, anchor: str, event: ev.Event) -> None:
        if anchor in self.anchors or anchor in self.open_anchors:
            raise _fail(f"YAML syntax error: anchor &{anchor} is defined twice", self.path, _line(event))


def _duplicate_keys(node: MappingNode, loc: Loc) -> list[tuple[Loc, int, str]]:
    """Keys given twice in this one mapping (merge keys are not keys of their own)."""
    out: list[tuple[Loc, int, str]] = []
    seen: dict[str, int] = {}
    for key, _ in node.value:
        if not isinstance(key, ScalarNode) or key.tag == _MERGE:
            continue
        line = key.start_mark.line + 1
        if key.value in seen:
            out.append((loc + (key.value,), line, f"duplicate key {key.value!r} (first at line {seen[key.value]})"))
        else:
            seen[key.value] = line
    return out


def _fmt(loc: Loc) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else ("." if out else "") + str(part)
    return out
