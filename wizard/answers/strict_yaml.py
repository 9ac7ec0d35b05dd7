"""Reading an answers file's YAML strictly: what plain `yaml.safe_load` lets through is refused.

An empty file, a key given twice (the second would silently win; `network.master_port`
and `master_port` under `network:` are one key), more than a
few aliases (an alias bomb expands to gigabytes), nesting deeper than answers
ever need (Python's recursion limit) and numbers of thousands of digits are
each refused as a problem naming the line, before anything is built from them, as are
the merge key `<<` (it hides a key given twice) and a number YAML 1.1 misreads (`1_0`,
`010`); a base-60 number such as `1:30` is kept as the text written, as YAML 1.2 reads it.
"""

from __future__ import annotations

import re
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from wizard.errors import FILE, NO_VALUE, AnswersError, Problem

MAX_BYTES = 1024 * 1024  # a 4096-node host list is about 120 KB
MAX_ALIASES = 16
MAX_DEPTH = 32
MAX_NODES = 100_000  # after expanding aliases
MAX_INT_DIGITS = 100
_OCTAL = re.compile(r"[-+]?0[0-7]+")
EMPTY = "the answers file is empty: write the answers as key: value lines (see examples/)"


class _Refused(yaml.YAMLError):
    """A document refused while reading it; `line` is 1-based or None."""

    def __init__(self, message: str, mark: yaml.Mark | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.line = None if mark is None else mark.line + 1


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that counts aliases and depth while composing, and refuses huge integers."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.aliases = 0
        self.depth = 0

    def compose_node(self, parent: Node | None, index: object) -> Node | None:
        """Compose one node, refusing an alias past the budget or nesting past MAX_DEPTH."""
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                mark = self.peek_event().start_mark
                raise _Refused(f"more than {MAX_ALIASES} aliases (*name); write the values out", mark)
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise _Refused(f"nested more than {MAX_DEPTH} levels deep", self.peek_event().start_mark)
            return super().compose_node(parent, index)  # type: ignore[no-untyped-call]
        finally:
            self.depth -= 1

    def construct_yaml_int(self, node: ScalarNode) -> int:
        """An integer, unless it has more digits than any answer can use or YAML 1.1 would misread it."""
        if len(str(node.value)) > MAX_INT_DIGITS:
            raise _Refused(f"a number of {len(node.value)} digits; no answer takes one that long", node.start_mark)
        if "_" in node.value:
            raise _Refused(
                f"{node.value}: YAML reads it as a number without the '_'; write the digits alone", node.start_mark
            )
        if ":" in node.value:  # YAML 1.1 base 60 (1:30 is 90): kept as written, as YAML 1.2 does
            return node.value  # type: ignore[return-value]
        if _OCTAL.fullmatch(node.value):
            raise _Refused(
                f"{node.value}: YAML reads a number with a leading 0 as octal; write it without the 0, or quote it",
                node.start_mark,
            )
        return super().construct_yaml_int(node)  # type: ignore[no-untyped-call, no-any-return]

    def construct_yaml_float(self, node: ScalarNode) -> float:
        """A number with a fraction, unless YAML 1.1 would misread it (1_0.5 as 10.5, 1:30.5 as 90.5)."""
        if "_" in node.value:
            raise _Refused(
                f"{node.value}: YAML reads it as a number without the '_'; write the digits alone", node.start_mark
            )
        if ":" in node.value:  # base 60: kept as written, as YAML 1.2 does
            return node.value  # type: ignore[return-value]
        return super().construct_yaml_float(node)  # type: ignore[no-untyped-call, no-any-return]


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _StrictLoader.construct_yaml_int)
_StrictLoader.add_constructor("tag:yaml.org,2002:float", _StrictLoader.construct_yaml_float)
MERGE_TAG = "tag:yaml.org,2002:merge"


def read_document(text: str) -> Any:
    """The answers file's document; AnswersError for anything refused (empty, duplicates, bombs, ...)."""
    if len(text) > MAX_BYTES:
        _refuse(f"the answers file has {len(text):,} characters; at most {MAX_BYTES:,} are read")
    loader: _StrictLoader | None = None
    try:
        loader = _StrictLoader(text)  # its reader refuses control characters at once
        node = loader.get_single_node()
        if node is None:
            _refuse(EMPTY)
        if _expanded_size(node, {}, set()) > MAX_NODES:
            _refuse(f"the answers file holds more than {MAX_NODES:,} values (each alias counted as what it repeats)")
        duplicates = list(_duplicates(node, ""))
        if duplicates:
            raise AnswersError(duplicates)
        document = loader.construct_document(node)
        if document is None:
            _refuse(EMPTY)
        return document
    except _Refused as refused:
        where = "" if refused.line is None else f", line {refused.line}"
        _refuse(f"the answers file{where}: {refused.message}")
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        reason = " ".join(str(getattr(error, "problem", None) or error).split())
        _refuse(f"the answers file is not valid YAML{where}: {reason}")
    finally:
        if loader is not None:
            loader.dispose()


def _refuse(message: str) -> Any:
    raise AnswersError([Problem(FILE, NO_VALUE, message)])


def _duplicates(node: Node, prefix: str, first_line: dict[str, int] | None = None) -> Any:
    """A problem for every key given twice, naming both lines; nested keys as section.key.

    One table of names serves the whole document, so `network.master_port` and `master_port`
    under `network:` are the same key given twice; each item of a list starts its own.
    """
    if isinstance(node, SequenceNode):
        for item in node.value:
            yield from _duplicates(item, prefix, {})
    if not isinstance(node, MappingNode):
        return
    seen = {} if first_line is None else first_line
    for key, value in node.value:
        if key.tag == MERGE_TAG:  # its keys would hide under the ones written beside it, unseen
            raise _Refused("the merge key '<<' is not read in answers; write the keys out", key.start_mark)
        name = f"{prefix}{key.value}" if isinstance(key, ScalarNode) else None
        if name is not None and name in seen:
            lines = f"lines {seen[name]} and {key.start_mark.line + 1}"
            yield Problem(name, NO_VALUE, f"given twice, at {lines}; keep one")
            continue  # what a repeated key holds would only repeat the problem
        if name is not None:
            seen[name] = key.start_mark.line + 1
        yield from _duplicates(value, f"{name}." if name is not None else prefix, seen)


def _expanded_size(node: Node, sizes: dict[int, int], open_nodes: set[int]) -> int:
    """How many nodes the document holds once every alias is expanded; a value holding itself is refused."""
    known = sizes.get(id(node))
    if known is not None:
        return known
    if id(node) in open_nodes:
        raise _Refused("an alias refers to the value that holds it", node.start_mark)
    open_nodes.add(id(node))
    children: list[Node] = []
    if isinstance(node, SequenceNode):
        children = list(node.value)
    elif isinstance(node, MappingNode):
        children = [part for pair in node.value for part in pair]
    size = 1 + sum(_expanded_size(child, sizes, open_nodes) for child in children)
    open_nodes.discard(id(node))
    sizes[id(node)] = size
    return size
