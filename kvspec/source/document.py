"""YAML documents with positions: every value's line and column by its path.

The text is composed once (libyaml's C parser where PyYAML has it) and the data
built from the node tree by one iterative walk that records where each value
and key starts. The walk is bounded: nesting deeper than :data:`MAX_DEPTH`,
duplicate keys, non-string keys, strings UTF-8 cannot store and values whose
tag cannot be constructed are errors at their position, never tracebacks.

>>> doc = parse_yaml("engine:\\n  block_size: 24\\n", "m.yaml")
>>> doc.data
{'engine': {'block_size': 24}}
>>> doc.position(("engine", "block_size"))
(2, 15)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from kvspec.errors import SourceError, format_path
from kvspec.jsonpos import MAX_DEPTH, MAX_DIGITS

Path_ = tuple[str | int, ...]

class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """libyaml's parser (where present) with the safe resolver, minus the path
    resolvers no source uses: tags are resolved exactly as ``SafeLoader`` does."""

    def resolve(self, kind: type, value: Any, implicit: Any) -> str:
        if kind is yaml.ScalarNode:
            if implicit[0]:
                table = self.yaml_implicit_resolvers
                for tag, regexp in table.get(value[0] if value else "", ()):
                    if regexp.match(value):
                        return tag
                for tag, regexp in table.get(None, ()):
                    if regexp.match(value):
                        return tag
            return self.DEFAULT_SCALAR_TAG
        if kind is yaml.SequenceNode:
            return self.DEFAULT_SEQUENCE_TAG
        return self.DEFAULT_MAPPING_TAG


assert not _Loader.yaml_path_resolvers
_LOADER = _Loader
_CONSTRUCTOR = yaml.SafeLoader("")  # builds scalars by their tag
_SCALARS = _CONSTRUCTOR.yaml_constructors
_SURROGATE = re.compile("[\ud800-\udfff]")
_MERGE = "tag:yaml.org,2002:merge"
_SEQ, _MAP = "tag:yaml.org,2002:seq", "tag:yaml.org,2002:map"
_STR, _INT = "tag:yaml.org,2002:str", "tag:yaml.org,2002:int"
#: The smallest integer of more than MAX_DIGITS decimal digits.
_TOO_BIG = 10 ** MAX_DIGITS


@dataclass(frozen=True)
class Document:
    """A parsed YAML document and where each of its values starts.

    With ``text``, positions are found when first asked for (an error is being
    reported), by composing the text again: a document that compiles never pays
    for them."""

    data: Any
    file: str
    positions: dict[Path_, tuple[int, int]] = field(default_factory=dict)
    #: Where each mapping key starts (for "unknown field" errors).
    key_positions: dict[Path_, tuple[int, int]] = field(default_factory=dict)
    #: The YAML text, when positions are still to be found from it.
    text: str | None = field(default=None, repr=False, compare=False)
    _located: list[bool] = field(default_factory=list, repr=False, compare=False)

    def _locate(self) -> None:
        if self.text is None or self._located:
            return
        self._located.append(True)
        try:
            node = yaml.compose(self.text, Loader=_LOADER)
        except (yaml.YAMLError, RecursionError):  # it composed once: cannot happen
            return
        if node is not None:
            _Builder(self, record=True).build(node)

    def position(self, path: Sequence[str | int]) -> tuple[int, int] | None:
        """1-based (line, column) of the value at ``path``, or of its nearest parent."""
        self._locate()
        path = tuple(path)
        while True:
            if path in self.positions:
                return self.positions[path]
            if not path:
                return None
            path = path[:-1]

    def key_position(self, path: Sequence[str | int]) -> tuple[int, int] | None:
        self._locate()
        return self.key_positions.get(tuple(path)) or self.position(path)

    def error(self, message: str, path: Sequence[str | int], *, key: bool = False,
              cls: type[SourceError] = SourceError, **kw: Any) -> SourceError:
        pos = self.key_position(path) if key else self.position(path)
        line, col = pos or (None, None)
        return cls(message, file=self.file, line=line, column=col,
                   path=format_path(path), **kw)


def _mark(node: yaml.Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


def _fail(message: str, node: yaml.Node, file: str, path: Path_, **kw: Any) -> SourceError:
    line, col = _mark(node)
    return SourceError(message, file=file, line=line, column=col, path=format_path(path), **kw)


class _Builder:
    """Builds Python data from a node tree without recursion, recording positions."""

    def __init__(self, doc: Document, *, record: bool = False) -> None:
        self.doc = doc
        self.record = record  # keep every value's and key's position
        self.built: dict[int, Any] = {}  # aliases share what their anchor built

    def scalar(self, node: yaml.ScalarNode, path: Path_) -> Any:
        tag, text = node.tag, node.value
        if tag == _STR:  # the common cases, as SafeConstructor builds them
            # the text has no surrogates (parse_yaml): only a "\u" escape makes one
            if node.style != '"' or _SURROGATE.search(text) is None:
                return text
        elif tag == _INT and text.isdigit() and (text[0] != "0" or text == "0") \
                and len(text) <= MAX_DIGITS:
            return int(text)
        if tag == _INT and sum(c.isdigit() for c in text) > MAX_DIGITS:
            raise self._too_long(node, path)
        try:
            build = _SCALARS.get(node.tag) or _SCALARS[None]
            value = build(_CONSTRUCTOR, node)
        except Exception:  # noqa: BLE001 - any tag's constructor may fail
            kind = node.tag.rsplit(":", 1)[-1]
            raise _fail(f"cannot read {node.value[:40]!r} as {kind}", node, self.doc.file,
                        path, found=repr(node.value)[:80], hint="quote it to make it a "
                        "string, or remove the explicit !!tag") from None
        if type(value) is int and abs(value) >= _TOO_BIG:  # 0x + 3,600 digits, say
            raise self._too_long(node, path)
        if isinstance(value, str) and _SURROGATE.search(value):
            raise _fail("a string holds a lone surrogate, which UTF-8 cannot store", node,
                        self.doc.file, path, found=ascii(value)[:80],
                        hint="remove the \\ud800-\\udfff escape")
        return value

    def _too_long(self, node: yaml.ScalarNode, path: Path_) -> SourceError:
        """An integer Python cannot write in decimal (more than 4,300 digits)."""
        return _fail(f"a number of more than {MAX_DIGITS:,} decimal digits: more than a "
                     "source can hold", node, self.doc.file, path,
                     found=f"{node.value[:12]}... ({len(node.value):,} characters)",
                     expected=f"a number of at most {MAX_DIGITS:,} digits",
                     hint="check the value; quote it if it is meant as text")

    def build(self, root: yaml.Node) -> Any:
        out: list[Any] = []
        stack: list[tuple[yaml.Node, Path_, Any, Any]] = [(root, (), out, 0)]
        while stack:
            node, path, parent, key = stack.pop()
            if self.record:
                self.doc.positions.setdefault(path, _mark(node))
            if len(path) > MAX_DEPTH:
                raise _fail(f"the document is nested more than {MAX_DEPTH} levels deep",
                            node, self.doc.file, path[:3], hint="a source needs a few "
                            "levels; check the brackets and indentation")
            if id(node) in self.built:
                value = self.built[id(node)]
            elif isinstance(node, yaml.ScalarNode):
                value = self.scalar(node, path)
            elif node.tag not in (_SEQ, _MAP):
                raise _fail(f"unsupported tag {node.tag!r}", node, self.doc.file, path,
                            hint="a source holds plain mappings, lists and values")
            elif isinstance(node, yaml.SequenceNode):
                value = self.built[id(node)] = [None] * len(node.value)
                stack.extend((item, path + (i,), value, i)
                             for i, item in reversed(list(enumerate(node.value))))
            else:
                assert isinstance(node, yaml.MappingNode)  # yaml's third kind of node
                value = self.built[id(node)] = {}
                stack.extend(reversed(self.mapping(node, path, value)))
            if isinstance(parent, list) and parent is out:
                out.append(value)
            else:
                parent[key] = value
        return out[0]

    def mapping(self, node: yaml.MappingNode, path: Path_, value: dict) -> list[tuple]:
        """The children of a mapping to build, keys checked; merge keys (``<<``) resolved."""
        pairs = []
        seen: dict[Any, int] = {}
        for key_node, value_node in self._merged(node, path):
            if not isinstance(key_node, yaml.ScalarNode):
                raise _fail("a mapping key must be a plain name", key_node, self.doc.file,
                            path, hint="keys are field or type names, e.g. block_size")
            key = self.scalar(key_node, path)
            if isinstance(key, bool) or not isinstance(key, (str, int)):
                key = str(key_node.value)
            if key in seen:
                raise _fail(f"duplicate key {key!r}", key_node, self.doc.file, path + (key,),
                            hint=f"it is already set on line {seen[key]}; keep one")
            seen[key] = key_node.start_mark.line + 1
            if self.record:
                self.doc.key_positions[path + (key,)] = _mark(key_node)
            pairs.append((value_node, path + (key,), value, key))
        return pairs

    def _merged(self, node: yaml.MappingNode, path: Path_) -> list[tuple]:
        if all(k.tag != _MERGE for k, _ in node.value):
            return node.value
        own = [(k, v) for k, v in node.value if k.tag != _MERGE]
        merges = [v for k, v in node.value if k.tag == _MERGE]
        keys = {k.value for k, _ in own if isinstance(k, yaml.ScalarNode)}
        for source in merges:
            maps = source.value if isinstance(source, yaml.SequenceNode) else [source]
            for m in maps:
                if not isinstance(m, yaml.MappingNode):
                    raise _fail("a merge key (<<) needs a mapping", m, self.doc.file, path,
                                expected="<<: *anchor, where the anchor names a mapping",
                                hint="merge keys copy the fields of another mapping")
                for k, v in m.value:
                    if isinstance(k, yaml.ScalarNode) and k.value not in keys:
                        own.append((k, v))
                        keys.add(k.value)
        return own


def _yaml_error(exc: yaml.YAMLError, text: str, file: str) -> SourceError:
    first = text.lstrip("\ufeff").split("\n", 1)[0].strip()
    if first.startswith("{") and '"prompt_tokens"' in first:  # a JSONL request trace
        return SourceError("this is a request trace (JSON Lines), not a layout source",
                           file=file, expected="a layout source (YAML) or a .kvlayout.json",
                           hint=f"a trace is replayed with `kvspec simulate LAYOUT --workload "
                                f"{file}`, or named by pooling.workload.trace in a source")
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or getattr(exc, "context", None)
    if isinstance(exc, yaml.reader.ReaderError):
        line = text.count("\n", 0, exc.position) + 1
        col = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        char = exc.character if isinstance(exc.character, str) else chr(exc.character)
        return SourceError(f"invalid YAML: the character {char!r} is not allowed here",
                           file=file, line=line, column=col,
                           hint="remove it, or write it as an escape in a quoted string")
    return SourceError(f"invalid YAML: {problem or exc}", file=file,
                       line=mark.line + 1 if mark else None,
                       column=mark.column + 1 if mark else None,
                       hint="check indentation, colons and quoting near this position")


def _python_parser_error(text: str) -> yaml.YAMLError | None:
    """The pure-Python parser's error for ``text``: its messages are the same on
    every machine, with or without libyaml."""
    try:
        yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        return exc
    except RecursionError:
        return None
    return None


def parse_yaml(text: str, file: str = "<input>") -> Document:
    """Parse one YAML document, keeping positions; every problem is a
    :class:`SourceError` with its line and column."""
    if (bad := _SURROGATE.search(text)) is not None:  # only from a Python str, never a file
        line = text.count("\n", 0, bad.start()) + 1
        column = bad.start() - (text.rfind("\n", 0, bad.start()) + 1) + 1
        raise SourceError("the text holds a lone surrogate, which UTF-8 cannot store",
                          file=file, line=line, column=column, found=ascii(bad.group()),
                          hint="pass text that came from decoding UTF-8")
    try:
        node = yaml.compose(text, Loader=_LOADER)
    except yaml.YAMLError as exc:
        raise _yaml_error(_python_parser_error(text) or exc, text, file) from None
    except RecursionError:
        raise SourceError(f"the document is nested more than {MAX_DEPTH} levels deep",
                          file=file, line=1, column=1, hint="a source needs a few levels; "
                          "check the brackets and indentation") from None
    if node is None:
        raise SourceError("the file is empty", file=file, line=1, column=1,
                          expected="kvspec: 1, name: ..., engine: ..., layers: ...",
                          hint="see layouts/ for examples")
    return Document(_Builder(Document(None, file)).build(node), file, text=text)
