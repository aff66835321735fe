"""Reading stack files: strict, bounded YAML into plain values, or one error naming where.

A stack file is YAML that Pulumi reads too, so it holds only what both read the
same way: mappings with string keys, lists, strings, numbers, booleans and null.
The loader refuses every other tag (`!!binary`, `!!set`, `!!python/...`, local
tags), duplicate keys (Pulumi's YAML parser, go-yaml v3, rejects them: "mapping
key already defined"), and input that would hang or flood whatever reads it
next: nesting past `spec.MAX_NESTING`, more than `spec.MAX_VALUES` values with
every alias expanded (an alias bomb is 1 KB of YAML and billions of values),
aliases inside themselves, numbers past `spec.MAX_NUMBER_CHARS` digits. Dates
stay the strings they are written as (YAML 1.1 would make them `date` objects).
It never imports Pulumi or calls AWS.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent, MappingEndEvent, SequenceEndEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.resolver import Resolver

from gpucluster.spec import (
    MAX_INPUT_BYTES,
    MAX_NESTING,
    MAX_NUMBER_CHARS,
    MAX_VALUES,
    PROJECT,
    Finding,
    SpecError,
    clip,
    format_path,
    plain_value_problem,
    shown,
)

_CORE = "tag:yaml.org,2002:"
PLAIN_TAGS = {f"{_CORE}{t}" for t in ("str", "int", "float", "bool", "null", "seq", "map")}
"""Explicit tags allowed: the JSON-like core; `!!int` and friends only on text that is one."""
_NUMBERS = (f"{_CORE}int", f"{_CORE}float")
_MERGE = f"{_CORE}merge"


class _Refused(yaml.YAMLError):
    """Valid YAML that is not a plain, bounded stack file, at a node (for its line)."""

    def __init__(self, problem: str, node_or_mark: Any) -> None:
        super().__init__(problem)
        self.problem = problem
        self.mark = getattr(node_or_mark, "start_mark", node_or_mark)


class _Bounded(Composer):
    """Composer that checks tags, keys, depth and size while it builds the node graph.

    Sizes are counted as if every alias were expanded: each anchored node remembers
    its expanded size and height, and an alias adds them where it stands.
    """

    def __init__(self) -> None:
        super().__init__()
        self.depth = 0
        self.deepest = 0
        self.values = 0
        self.open_anchors: set[str] = set()
        self.anchored: dict[str, tuple[int, int]] = {}  # anchor -> (expanded values, height)
        self.where: list[str | int] = []

    # Supplied by the parser and resolver _Loader mixes this composer with.
    check_event: Callable[..., bool]
    peek_event: Callable[[], Any]
    get_event: Callable[[], Any]
    resolve: Callable[..., str]

    def _grow(self, values: int, deepest: int, at: Any) -> None:
        self.values += values
        self.deepest = max(self.deepest, deepest)
        if self.values > MAX_VALUES:
            raise _Refused(f"more than {MAX_VALUES} values with YAML aliases expanded", at)
        if deepest > MAX_NESTING:
            raise _Refused(f"nested more than {MAX_NESTING} deep", at)

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        if self.check_event(AliasEvent):
            event = self.peek_event()
            if event.anchor in self.open_anchors:
                raise _Refused(f"alias *{clip(event.anchor, 40)} refers to a value that holds it", event)
            node = super().compose_node(parent, index)  # an undefined alias raises ComposerError
            values, height = self.anchored.get(event.anchor, (1, 0))
            self._grow(values, self.depth + height, event)
            return node
        event = self.peek_event()
        tag = event.tag
        if tag not in (None, "!") and tag not in PLAIN_TAGS:
            shown_tag = "!!" + tag.removeprefix(_CORE) if tag.startswith(_CORE) else tag
            raise _Refused(f"YAML tag {clip(shown_tag, 40)} is not allowed (plain strings, numbers, "
                           "booleans, null, lists and mappings only)", event)
        self.depth += 1
        outer_deepest, start_values = self.deepest, self.values
        self.deepest = self.depth
        self._grow(1, self.depth, event)
        if event.anchor is not None:
            self.open_anchors.add(event.anchor)
        node = super().compose_node(parent, index)
        if event.anchor is not None:
            self.open_anchors.discard(event.anchor)
            self.anchored[event.anchor] = (self.values - start_values, self.deepest - self.depth)
        self.deepest = max(outer_deepest, self.deepest)
        self.depth -= 1
        return node

    # types-PyYAML types `anchor` as a dict; PyYAML passes the anchor's name (or None).
    def compose_scalar_node(self, anchor: str | None) -> ScalarNode:  # type: ignore[override]
        explicit = self.peek_event().tag not in (None, "!")
        node = super().compose_scalar_node(anchor)  # type: ignore[arg-type]
        if explicit and node.tag != f"{_CORE}str" and node.tag != self.resolve(ScalarNode, node.value,
                                                                               (True, False)):
            raise _Refused(f"{shown(node.value)} is not a valid !!{node.tag.removeprefix(_CORE)}", node)
        if node.tag in _NUMBERS and len(node.value) > MAX_NUMBER_CHARS:
            raise _Refused(f"a number of {len(node.value)} characters; at most {MAX_NUMBER_CHARS}", node)
        return node

    def compose_sequence_node(self, anchor: str | None) -> SequenceNode:  # type: ignore[override]
        start = self.get_event()
        node = SequenceNode(self._tag(start, SequenceNode), [], start.start_mark, None,
                            flow_style=start.flow_style)
        if anchor is not None:
            self.anchors[anchor] = node
        while not self.check_event(SequenceEndEvent):
            self.where.append(len(node.value))
            node.value.append(self.compose_node(node, len(node.value)))
            self.where.pop()
        node.end_mark = self.get_event().end_mark
        return node

    def compose_mapping_node(self, anchor: str | None) -> MappingNode:  # type: ignore[override]
        start = self.get_event()
        node = MappingNode(self._tag(start, MappingNode), [], start.start_mark, None,
                           flow_style=start.flow_style)
        if anchor is not None:
            self.anchors[anchor] = node
        seen: dict[str, ScalarNode] = {}
        while not self.check_event(MappingEndEvent):
            key = self.compose_node(node, None)
            if not isinstance(key, ScalarNode):
                raise _Refused("mapping keys must be plain strings, not lists or mappings", key)
            if key.tag != _MERGE:
                first = seen.get(key.value)
                if first is not None:
                    self.where.append(key.value)
                    raise _Refused(f"duplicate key {shown(key.value)} (first on line "
                                   f"{first.start_mark.line + 1}); Pulumi rejects it", key)
                seen[key.value] = key
            self.where.append(key.value)
            node.value.append((key, self.compose_node(node, key)))
            self.where.pop()
        node.end_mark = self.get_event().end_mark
        return node

    def _tag(self, event: Any, kind: type[Node]) -> str:
        return self.resolve(kind, None, event.implicit) if event.tag in (None, "!") else event.tag


class _Constructor(SafeConstructor):
    """Plain values only: keys are the text written, dates stay strings."""

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        self.flatten_mapping(node)  # `<<: *defaults` merges, as go-yaml does
        return {key.value: self.construct_object(value, deep=deep) for key, value in node.value}


# types-PyYAML admits only yaml's own loaders as a constructor's first argument; any constructor class works.
_Constructor.add_constructor(f"{_CORE}timestamp", SafeConstructor.construct_yaml_str)  # type: ignore[type-var]
_Constructor.add_constructor(f"{_CORE}value", SafeConstructor.construct_yaml_str)  # type: ignore[type-var]
for _tag in ("binary", "set", "omap", "pairs"):  # unreachable past the composer; never built
    _Constructor.yaml_constructors.pop(f"{_CORE}{_tag}", None)

try:  # libyaml's scanner and parser are ~4x faster; composing and building stay in Python
    # types-PyYAML leaves CParser out of yaml.cyaml's __all__; PyYAML binds it there.
    from yaml.cyaml import CParser as _Parser  # type: ignore[attr-defined]

    def _init_parser(loader: Any, text: str) -> None:
        _Parser.__init__(loader, text)
except ImportError:  # PyYAML without libyaml: its own reader, scanner and parser
    from yaml.parser import Parser
    from yaml.reader import Reader
    from yaml.scanner import Scanner

    class _Parser(Reader, Scanner, Parser):  # type: ignore[no-redef]
        """The pure-Python half of yaml.SafeLoader that turns text into events."""

    def _init_parser(loader: Any, text: str) -> None:
        Reader.__init__(loader, text)
        Scanner.__init__(loader)
        Parser.__init__(loader)


class _Loader(_Bounded, _Constructor, Resolver, _Parser):
    def __init__(self, text: str) -> None:
        _init_parser(self, text)
        _Bounded.__init__(self)
        _Constructor.__init__(self)
        Resolver.__init__(self)


def key_path(where: list[str | int]) -> str:
    """A position in the file as the validator names it: `config.gpucluster:cluster.tags` ->
    `cluster.tags`, `config.aws:region` -> `aws:region`; outside `config:` the YAML path."""
    if len(where) >= 2 and where[0] == "config" and isinstance(where[1], str):
        namespace, _, name = where[1].rpartition(":")
        head = name if namespace in ("", PROJECT) else where[1]
        return format_path([head, *where[2:]])
    return format_path(where) or "(stack file)"


def _describe(err: yaml.YAMLError, text: str) -> str:
    """`line L, column C: problem`, one short line, from any PyYAML or libyaml error."""
    mark = getattr(err, "mark", None) or getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or getattr(err, "reason", None) or str(err)
    if mark is not None:
        line = f"line {mark.line + 1}, column {mark.column + 1}: "
    elif isinstance(err, yaml.reader.ReaderError):  # a character no YAML may hold, at an offset
        line = f"line {text.count(chr(10), 0, err.position) + 1}: "
    else:
        line = ""
    what = "" if isinstance(err, _Refused) else "not valid YAML: "
    return f"{line}{what}{clip(str(problem), 120)}"


def load_yaml(text: str) -> Any:
    """The one document in `text` as plain values; SpecError (one finding) if it is not one."""
    if len(text) > MAX_INPUT_BYTES:
        raise SpecError([Finding("(stack file)", f"{len(text)} characters; a stack file holds at most "
                                 f"{MAX_INPUT_BYTES}")])
    loader: _Loader | None = None
    try:
        loader = _Loader(text)  # the pure-Python reader checks every character here
        value = loader.get_single_data()
    except yaml.YAMLError as err:
        raise SpecError([Finding(key_path(loader.where if loader else []), _describe(err, text))]) \
            from None
    finally:
        if loader is not None:
            loader.dispose()
    problem = plain_value_problem(value)  # a second, independent check of what was built
    if problem is not None:
        raise SpecError([Finding(key_path(list(problem[0])), problem[1])])
    return value
