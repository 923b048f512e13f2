"""Composing one YAML document's node tree from parser events: no recursion, a depth limit.

The first half of ``yamlsafe.parse_yaml``. PyYAML's composers recurse once per nesting
level: the pure-Python one raises ``RecursionError`` near 1,000 levels (a 10 KB file),
libyaml's (``CSafeLoader``) crashes the whole process with a segmentation fault near
100,000, and both parsers slow down quadratically with depth. So the nodes are built
here with an explicit stack from the parser's events, and composition stops with
``TooDeep`` as soon as a collection opens deeper than ``MAX_DEPTH``, before the parser
has read anything deeper.

The events come from libyaml's parser when PyYAML was built with it (about 25 times
faster than the pure-Python one, which is otherwise most of the cost of a spec) and
from the pure-Python parser otherwise. Both give marks with 0-based line and column,
so every position stays ``file:line:column``. Aliases are kept as ``AliasUse`` (the
anchored node and where the alias was written), so an alias expansion bomb can be
reported where it was set off.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.events import (
    AliasEvent,
    CollectionStartEvent,
    DocumentEndEvent,
    Event,
    MappingStartEvent,
    ScalarEvent,
    SequenceStartEvent,
    StreamEndEvent,
)
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.resolver import Resolver

MAX_DEPTH = 64  # nested collections; a spec needs 4 (dataSchema.metrics[0].field)
HAVE_LIBYAML = bool(getattr(yaml, "__with_libyaml__", False))

_RESOLVER = Resolver()  # no path resolvers are registered: resolve() keeps no state


@dataclass
class AliasUse:
    """An alias (``*name``) where it was written: ``target`` is the anchored node."""

    target: Node
    start_mark: Any


class TooDeep(Exception):
    """A collection opens deeper than the limit; ``mark`` is where."""

    def __init__(self, mark: Any, limit: int):
        super().__init__(f"nested deeper than {limit} levels")
        self.mark = mark
        self.limit = limit


class SecondDocument(Exception):
    """The stream holds another document after the first; ``mark`` is where it starts."""

    def __init__(self, mark: Any):
        super().__init__("a second YAML document")
        self.mark = mark


@dataclass
class _Open:
    """A collection being filled, and a mapping's key waiting for its value."""

    node: SequenceNode | MappingNode
    key: Node | AliasUse | None = None


def compose_single(text: str, *, libyaml: bool = HAVE_LIBYAML, max_depth: int = MAX_DEPTH) -> Node | None:
    """The root node of the only document in ``text``, or None for an empty stream.

    Raises what the parser raises (``yaml.MarkedYAMLError``, ``yaml.reader.ReaderError``),
    ``ComposerError`` for an undefined or duplicate anchor, ``TooDeep`` and ``SecondDocument``.
    """
    loader = yaml.CSafeLoader if libyaml else yaml.SafeLoader
    events = yaml.parse(text, Loader=loader)
    try:
        next(events)  # StreamStartEvent
        event = next(events)
        if isinstance(event, StreamEndEvent):
            return None
        root = _document(events, max_depth)
        event = next(events)
        if not isinstance(event, StreamEndEvent):
            raise SecondDocument(event.start_mark)
        return root
    finally:
        events.close()


def _document(events: Iterator[Event], max_depth: int) -> Node | None:
    """Nodes from the events after a DocumentStartEvent, through its DocumentEndEvent."""
    stack: list[_Open] = []
    anchors: dict[str, Node] = {}
    root: Node | AliasUse | None = None
    for event in events:
        if isinstance(event, DocumentEndEvent):
            return root  # type: ignore[return-value]  (a root is never an alias)
        if isinstance(event, CollectionStartEvent):
            if len(stack) >= max_depth:
                raise TooDeep(event.start_mark, max_depth)
            node: Node | AliasUse = _collection(event, anchors)
        elif isinstance(event, ScalarEvent):
            node = _scalar(event, anchors)
        elif isinstance(event, AliasEvent):
            if event.anchor not in anchors:
                raise ComposerError(None, None, f"found undefined alias {event.anchor!r}", event.start_mark)
            node = AliasUse(anchors[event.anchor], event.start_mark)
        else:  # SequenceEndEvent / MappingEndEvent
            done = stack.pop()
            done.node.end_mark = event.end_mark
            continue
        if stack:
            _add(stack[-1], node)
        else:
            root = node
        if isinstance(event, CollectionStartEvent):
            stack.append(_Open(node))  # type: ignore[arg-type]
    raise ComposerError(None, None, "the document ends inside a collection", None)


def _add(parent: _Open, node: Node | AliasUse) -> None:
    if isinstance(parent.node, SequenceNode):
        parent.node.value.append(node)
    elif parent.key is None:
        parent.key = node
    else:
        parent.node.value.append((parent.key, node))
        parent.key = None


def _register(anchor: str | None, node: Node, start_mark: Any, anchors: dict[str, Node]) -> None:
    if anchor is None:
        return
    if anchor in anchors:
        raise ComposerError(f"found duplicate anchor {anchor!r}; first occurrence",
                            anchors[anchor].start_mark, "second occurrence", start_mark)
    anchors[anchor] = node


def _scalar(event: ScalarEvent, anchors: dict[str, Node]) -> ScalarNode:
    tag = event.tag
    if tag is None or tag == "!":
        tag = _RESOLVER.resolve(ScalarNode, event.value, event.implicit)
    node = ScalarNode(tag, event.value, event.start_mark, event.end_mark, style=event.style)
    _register(event.anchor, node, event.start_mark, anchors)
    return node


def _collection(event: CollectionStartEvent, anchors: dict[str, Node]) -> Node:
    kind = SequenceNode if isinstance(event, SequenceStartEvent) else MappingNode
    assert isinstance(event, (SequenceStartEvent, MappingStartEvent))
    tag = event.tag
    if tag is None or tag == "!":
        tag = _RESOLVER.resolve(kind, None, event.implicit)
    node = kind(tag, [], event.start_mark, None, flow_style=event.flow_style)
    _register(event.anchor, node, event.start_mark, anchors)
    return node
