"""Reading a dump's JSON: fast when it is fine, precise when it is not.

:func:`read_json` parses with ``json`` (C) and checks what ``json`` lets
through or crashes on: a key twice in one object, nesting deeper than a source
may be (``MAX_DEPTH``), and numbers too long to read (Python refuses integers
of more than 4,300 digits; ``json`` recurses once per nesting level). Each is a
:class:`~kvspec.errors.SourceError` at its line and column.

:func:`positions` finds where every value and key of a JSON text starts, with
an explicit stack (no recursion, any depth): the error paths of a dump that
parses but does not validate point at its lines through it.

>>> doc = positions('{"config": {"block_size": 16},\\n "layers": [{"name": "a"}]}', "d.json")
>>> doc.position(("layers", 0, "name")), doc.key_position(("config", "block_size"))
((2, 22), (1, 13))
"""

from __future__ import annotations

import json
import re
from json.decoder import scanstring
from typing import Any

from kvspec.errors import SourceError
from kvspec.source.document import MAX_DEPTH, Document

_WS = re.compile(r"[ \t\n\r]*")
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?")
_LITERALS = {"true": True, "false": False, "null": None}
#: What Python's ``json`` reads but JSON does not have.
_NON_JSON = ("NaN", "Infinity", "-Infinity")
#: Longest integer Python reads (``sys.get_int_max_str_digits``'s default).
MAX_DIGITS = 4300

_EXPECTED = 'a JSON object, {"config": {...}, "layers": [...]}'
_HINT = "see tests/conformance/FORMAT.md for the dump format"


class _Located(Exception):
    def __init__(self, message: str, pos: int, **kw: Any) -> None:
        super().__init__(message)
        self.message, self.pos, self.kw = message, pos, kw

    def error(self, text: str, file: str, hint: str) -> SourceError:
        """This problem as a :class:`SourceError` at its line and column of ``text``
        (``hint`` unless the problem has its own)."""
        line, col = _line_col(text, self.pos)
        return SourceError(self.message, file=file, line=line, column=col,
                           **{"hint": hint, **self.kw})


def _line_col(text: str, pos: int) -> tuple[int, int]:
    line = text.count("\n", 0, pos) + 1
    return line, pos - (text.rfind("\n", 0, pos) + 1) + 1


def read_json(text: str, file: str) -> Any:
    """The parsed dump; a :class:`SourceError` at its position for any problem."""
    dupes: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out = dict(items)
        if len(out) != len(items) and not dupes:
            seen: set[str] = set()
            dupes.extend(k for k, _ in items if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        return out

    def constant(word: str) -> Any:
        raise ValueError(word)  # NaN, Infinity: not JSON; positions() says where

    try:
        data = json.loads(text, object_pairs_hook=pairs, parse_constant=constant)
    except json.JSONDecodeError as exc:
        raise SourceError(f"not valid JSON: {exc.msg}", file=file, line=exc.lineno,
                          column=exc.colno, expected=_EXPECTED,
                          hint="an empty or truncated file? " + _HINT if not text.strip()
                          or exc.pos >= len(text.rstrip()) else _HINT) from None
    except (RecursionError, ValueError):  # nesting, NaN, or a number json cannot take
        positions(text, file)  # raises at the spot
        raise SourceError("not valid JSON", file=file, expected=_EXPECTED,
                          hint=_HINT) from None
    if dupes or _depth(data) > MAX_DEPTH:
        positions(text, file)  # the first duplicate key or too-deep value, at its spot
    return data


def _depth(data: Any) -> int:
    deepest, stack = 0, [(data, 0)]
    while stack:
        value, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > MAX_DEPTH:
            return deepest
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)
    return deepest


def positions(text: str, file: str) -> Document:
    """Where each value and key of ``text`` starts; a :class:`SourceError` at the
    first duplicate key, value nested more than ``MAX_DEPTH`` deep, or number
    too long to read (what :func:`read_json` refuses)."""
    try:
        data, pos, keys = _scan(text)
    except _Located as exc:
        raise exc.error(text, file, _HINT) from None
    return Document(data, file, pos, keys)


def lenient_positions(text: str, file: str) -> Document | None:
    """Where each value and key of a JSON text that ``json`` read starts, as
    ``json`` reads it: NaN and Infinity are numbers, and of a key given twice the
    last counts; any depth. None when the text is no JSON ``json`` reads."""
    try:
        data, pos, keys = _scan(text, lenient=True, max_depth=None)
    except _Located:
        return None
    return Document(data, file, pos, keys)


def unreadable_at(text: str, file: str, what: str, hint: str) -> SourceError | None:
    """Where in ``text``, JSON that ``json`` could not take (it recursed too
    deep, or met an integer too long for Python), it went past what ``what``
    may hold: nesting deeper than ``MAX_DEPTH``, or a number too long; None
    when neither (or the text is not JSON)."""
    try:
        _scan(text, lenient=True, what=what)
    except _Located as exc:
        return exc.error(text, file, hint)
    return None


def _scan(text: str, lenient: bool = False, what: str = "the dump",
          max_depth: int | None = MAX_DEPTH) -> tuple[Any, dict, dict]:
    """Parse ``text`` (a JSON document) iteratively, recording positions;
    ``lenient``: as ``json`` reads it (see :func:`lenient_positions`); ``what``
    names the document in messages."""
    pos: dict[tuple, tuple[int, int]] = {}
    keys: dict[tuple, tuple[int, int]] = {}
    marks = _Marks(text)
    stack: list[tuple[Any, tuple]] = []  # (container, its path)
    root: list[Any] = []
    i = _WS.match(text, 0).end()
    key: str | int | None = None
    while True:
        path = stack[-1][1] + (key,) if stack else ()
        if max_depth is not None and len(path) > max_depth:
            raise _Located(f"{what} is nested more than {max_depth} levels deep", i,
                           expected="a few levels of nesting")
        if i >= len(text):
            raise _Located("not valid JSON: the document ends early", i)
        pos[path] = marks.at(i)
        ch = text[i]
        if ch in "{[":
            value: Any = {} if ch == "{" else []
            _attach(stack, root, key, value)
            stack.append((value, path))
            i = _WS.match(text, i + 1).end()
            if text.startswith("}" if ch == "{" else "]", i):
                i += 1
                stack.pop()
            elif ch == "{":
                key, i = _key(text, i, stack[-1], keys, marks, lenient)
                continue
            else:
                key = 0
                continue
        else:
            value, i = _scalar(text, i, lenient, what)
            _attach(stack, root, key, value)
        while True:  # after a value: a comma, or the end of containers
            i = _WS.match(text, i).end()
            if not stack:
                if i != len(text):
                    raise _Located("not valid JSON: extra data after the document", i)
                return root[0], pos, keys
            container, _ = stack[-1]
            ch = text[i:i + 1]
            if ch == ",":
                i = _WS.match(text, i + 1).end()
                if isinstance(container, dict):
                    key, i = _key(text, i, stack[-1], keys, marks, lenient)
                else:
                    key = len(container)
                break
            if ch == ("}" if isinstance(container, dict) else "]"):
                i += 1
                stack.pop()
                continue
            raise _Located("not valid JSON: expected ',' or a closing bracket", i)


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
         lenient: bool = False) -> tuple[str, int]:
    if not text.startswith('"', i):
        raise _Located("not valid JSON: expected a key in double quotes", i)
    start = i
    key, i = _string(text, i)
    container, path = top
    if key in container and not lenient:
        raise _Located(f"the dump has the key {key!r} twice in one object", start,
                       expected="each key once", hint="keep one of them")
    keys[path + (key,)] = marks.at(start)
    i = _WS.match(text, i).end()
    if not text.startswith(":", i):
        raise _Located("not valid JSON: expected ':' after a key", i)
    container[key] = None  # taken, for the duplicate check
    return key, _WS.match(text, i + 1).end()


def _string(text: str, i: int) -> tuple[str, int]:
    try:
        return scanstring(text, i + 1)
    except json.JSONDecodeError as exc:
        raise _Located(f"not valid JSON: {exc.msg}", exc.pos) from None


def _scalar(text: str, i: int, lenient: bool = False, what: str = "the dump"
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
            raise _Located(f"not valid JSON: {word} is not a JSON number", i,
                           expected="a finite number, or null")
    m = _NUMBER.match(text, i)
    if not m:
        raise _Located("not valid JSON: expected a value", i)
    digits = m.group()
    real = any(c in digits for c in ".eE")
    long = len(digits.lstrip("-").split(".")[0].split("e")[0].split("E")[0]) > MAX_DIGITS
    if long and not (lenient and real):   # json reads a long real (as inf), not an integer
        raise _Located(f"a number with {len(digits):,} digits: more than {what} can hold",
                       i, expected=f"a number of at most {MAX_DIGITS:,} digits")
    return (float(digits) if real else int(digits)), m.end()
