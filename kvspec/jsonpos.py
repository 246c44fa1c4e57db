"""JSON text with positions: where every value and key starts, at any depth.

:func:`scan` parses a JSON document with an explicit stack (no recursion, any
depth) and records each value's and key's 1-based line and column by its path.
Strict, it refuses what JSON has not (``NaN``, ``Infinity``, a key twice in one
object) and integers longer than Python reads, each a :class:`Located` problem
at its offset; lenient, it reads what ``json`` reads, as ``json`` reads it. The
dump and config.json readers report their errors at their lines through it,
and the artifact reader points at the value an edit changed.

>>> data, pos, keys = scan('{"a": [1,\\n 2]}')
>>> data, pos[("a", 1)], keys[("a",)]
({'a': [1, 2]}, (2, 2), (1, 2))
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from json.decoder import scanstring  # type: ignore[attr-defined]  # not in typeshed
from typing import Any, TypeVar, overload

from kvspec.errors import KvspecError, SourceError

_WS = re.compile(r"[ \t\n\r]*")
#: ``_WS.match``: it matches the empty string, so it never gives None.
_ws: Callable[[str, int], re.Match[str]] = _WS.match  # type: ignore[assignment]
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?")
_LITERALS = {"true": True, "false": False, "null": None}
#: What Python's ``json`` reads but JSON does not have.
_NON_JSON = ("NaN", "Infinity", "-Infinity")
#: Longest integer Python reads (``sys.get_int_max_str_digits``'s default).
MAX_DIGITS = 4300
#: Deeper than any kvspec document is nested (a source or an artifact needs about 6
#: levels; ``json`` recurses once per level and gives up near a thousand).
MAX_DEPTH = 64

_E = TypeVar("_E", bound=KvspecError)

#: Where each value (or key) starts: ``(line, column)`` by its path of keys and indices.
Positions = dict[tuple[str | int, ...], tuple[int, int]]


class Located(Exception):
    """A problem of a JSON text at a character offset."""

    def __init__(self, message: str, pos: int, **kw: Any) -> None:
        super().__init__(message)
        self.message, self.pos, self.kw = message, pos, kw

    @overload
    def error(self, text: str, file: str, hint: str) -> SourceError: ...
    @overload
    def error(self, text: str, file: str, hint: str, cls: type[_E]) -> _E: ...
    def error(self, text: str, file: str, hint: str,
              cls: type[KvspecError] = SourceError) -> KvspecError:
        """This problem as a ``cls`` error at its line and column of ``text``
        (``hint`` unless the problem has its own)."""
        line, col = line_col(text, self.pos)
        return cls(self.message, file=file, line=line, column=col,
                   **{"hint": hint, **self.kw})


def line_col(text: str, pos: int) -> tuple[int, int]:
    """1-based line and column of offset ``pos`` of ``text``."""
    line = text.count("\n", 0, pos) + 1
    return line, pos - (text.rfind("\n", 0, pos) + 1) + 1


def scan(text: str, lenient: bool = False, what: str = "the document",
         max_depth: int | None = None) -> tuple[Any, Positions, Positions]:
    """Parse ``text`` (a JSON document) iteratively, recording positions;
    ``lenient``: as ``json`` reads it (NaN and Infinity are numbers, a key given
    twice keeps its last value); ``what`` names the document in messages;
    ``max_depth``: refuse nesting deeper (None: any depth)."""
    pos: Positions = {}
    keys: Positions = {}
    marks = _Marks(text)
    stack: list[tuple[Any, tuple]] = []  # (container, its path)
    root: list[Any] = []
    i = _ws(text, 0).end()
    key: str | int | None = None
    while True:
        path = stack[-1][1] + (key,) if stack else ()
        if max_depth is not None and len(path) > max_depth:
            raise Located(f"{what} is nested more than {max_depth} levels deep", i,
                          expected="a few levels of nesting")
        if i >= len(text):
            raise Located("not valid JSON: the document ends early", i)
        pos[path] = marks.at(i)
        ch = text[i]
        if ch in "{[":
            value: Any = {} if ch == "{" else []
            _attach(stack, root, key, value)
            stack.append((value, path))
            i = _ws(text, i + 1).end()
            if text.startswith("}" if ch == "{" else "]", i):
                i += 1
                stack.pop()
            elif ch == "{":
                key, i = _key(text, i, stack[-1], keys, marks, lenient, what)
                continue
            else:
                key = 0
                continue
        else:
            value, i = _scalar(text, i, lenient, what)
            _attach(stack, root, key, value)
        while True:  # after a value: a comma, or the end of containers
            i = _ws(text, i).end()
            if not stack:
                if i != len(text):
                    raise Located("not valid JSON: extra data after the document", i)
                return root[0], pos, keys
            container, _ = stack[-1]
            ch = text[i:i + 1]
            if ch == ",":
                i = _ws(text, i + 1).end()
                if isinstance(container, dict):
                    key, i = _key(text, i, stack[-1], keys, marks, lenient, what)
                else:
                    key = len(container)
                break
            if ch == ("}" if isinstance(container, dict) else "]"):
                i += 1
                stack.pop()
                continue
            raise Located("not valid JSON: expected ',' or a closing bracket", i)


class _Marks:
    """Line and column of a character offset, computed incrementally."""

    def __init__(self, text: str) -> None:
        self.text, self.pos, self.line, self.start = text, 0, 1, 0

    def at(self, i: int) -> tuple[int, int]:
        if i < self.pos:  # never goes back, but be correct if it does
            self.pos, self.line, self.start = 0, 1, 0
        newlines = self.text.count("\n", self.pos, i)
        if newlines:
            self.line += newlines
            self.start = self.text.rfind("\n", self.pos, i) + 1
        self.pos = i
        return self.line, i - self.start + 1


def _attach(stack: list, root: list, key: Any, value: Any) -> None:
    if not stack:
        root.append(value)
    elif isinstance(stack[-1][0], dict):
        stack[-1][0][key] = value
    else:
        stack[-1][0].append(value)


def _key(text: str, i: int, top: tuple, keys: dict, marks: _Marks,
         lenient: bool, what: str) -> tuple[str, int]:
    if not text.startswith('"', i):
        raise Located("not valid JSON: expected a key in double quotes", i)
    start = i
    key, i = _string(text, i)
    container, path = top
    if key in container and not lenient:
        raise Located(f"{what} has the key {key!r} twice in one object", start,
                      expected="each key once", hint="keep one of them")
    keys[path + (key,)] = marks.at(start)
    i = _ws(text, i).end()
    if not text.startswith(":", i):
        raise Located("not valid JSON: expected ':' after a key", i)
    container[key] = None  # taken, for the duplicate check
    return key, _ws(text, i + 1).end()


def _string(text: str, i: int) -> tuple[str, int]:
    try:
        return scanstring(text, i + 1)
    except json.JSONDecodeError as exc:
        raise Located(f"not valid JSON: {exc.msg}", exc.pos) from None


def _scalar(text: str, i: int, lenient: bool = False, what: str = "the document"
            ) -> tuple[Any, int]:
    if text.startswith('"', i):
        return _string(text, i)
    for word, value in _LITERALS.items():
        if text.startswith(word, i):
            return value, i + len(word)
    for word in _NON_JSON:
        if text.startswith(word, i):
            if lenient:
                return float(word.lower().replace("infinity", "inf")), i + len(word)
            raise Located(f"not valid JSON: {word} is not a JSON number", i,
                          expected="a finite number, or null")
    m = _NUMBER.match(text, i)
    if not m:
        raise Located("not valid JSON: expected a value", i)
    digits = m.group()
    real = any(c in digits for c in ".eE")
    long = len(digits.lstrip("-").split(".")[0].split("e")[0].split("E")[0]) > MAX_DIGITS
    if long and not (lenient and real):   # json reads a long real (as inf), not an integer
        raise Located(f"a number with {len(digits):,} digits: more than {what} can hold",
                      i, expected=f"a number of at most {MAX_DIGITS:,} digits")
    return (float(digits) if real else int(digits)), m.end()
