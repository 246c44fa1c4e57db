"""YAML documents with positions: every value's line and column by its path.

>>> doc = parse_yaml("engine:\\n  block_size: 24\\n", "m.yaml")
>>> doc.data
{'engine': {'block_size': 24}}
>>> doc.position(("engine", "block_size"))
(2, 15)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from kvspec.errors import SourceError

Path_ = tuple[str | int, ...]


def format_path(path: Sequence[str | int]) -> str:
    """``("layers", 2, "pattern", 0)`` -> ``layers[2].pattern[0]``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "<document>"


@dataclass(frozen=True)
class Document:
    """A parsed YAML document and where each of its values starts."""

    data: Any
    file: str
    positions: dict[Path_, tuple[int, int]] = field(default_factory=dict)
    #: Where each mapping key starts (for "unknown field" errors).
    key_positions: dict[Path_, tuple[int, int]] = field(default_factory=dict)

    def position(self, path: Sequence[str | int]) -> tuple[int, int] | None:
        """1-based (line, column) of the value at ``path``, or of its nearest parent."""
        path = tuple(path)
        while True:
            if path in self.positions:
                return self.positions[path]
            if not path:
                return None
            path = path[:-1]

    def key_position(self, path: Sequence[str | int]) -> tuple[int, int] | None:
        return self.key_positions.get(tuple(path)) or self.position(path)

    def error(self, message: str, path: Sequence[str | int], *, key: bool = False,
              cls: type[SourceError] = SourceError, **kw: Any) -> SourceError:
        pos = self.key_position(path) if key else self.position(path)
        line, col = pos if pos else (None, None)
        return cls(message, file=self.file, line=line, column=col,
                   path=format_path(path), **kw)


def _walk(node: yaml.Node, path: Path_, doc: Document, file: str,
          seen_nodes: set[int] | None = None) -> None:
    doc.positions[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
    # An alias repeats a node already walked: do not descend again (a document of
    # nested aliases would otherwise take exponential time).
    seen_nodes = set() if seen_nodes is None else seen_nodes
    if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
        if id(node) in seen_nodes:
            return
        seen_nodes.add(id(node))
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value
            if key in seen:
                raise SourceError(
                    f"duplicate key {key!r}", file=file, line=key_node.start_mark.line + 1,
                    column=key_node.start_mark.column + 1,
                    path=format_path(path + (key,)),
                    hint=f"it is already set on line {seen[key]}; keep one")
            seen[key] = key_node.start_mark.line + 1
            doc.key_positions[path + (key,)] = (key_node.start_mark.line + 1,
                                                key_node.start_mark.column + 1)
            _walk(value_node, path + (key,), doc, file, seen_nodes)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _walk(item, path + (i,), doc, file, seen_nodes)


def parse_yaml(text: str, file: str = "<input>") -> Document:
    """Parse one YAML document, keeping positions; YAML errors become
    :class:`SourceError` with the parser's line and column."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise SourceError(
            f"invalid YAML: {exc.problem or exc.context}", file=file,
            line=mark.line + 1 if mark else None, column=mark.column + 1 if mark else None,
            hint="check indentation, colons and quoting near this position") from exc
    except yaml.YAMLError as exc:
        raise SourceError(f"invalid YAML: {exc}", file=file) from exc
    doc = Document(data, file)
    if node is not None:
        _walk(node, (), doc, file)
    return doc
