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
from typing import Any

from kvspec.errors import SourceError
from kvspec.jsonpos import Located, scan
from kvspec.source.document import MAX_DEPTH, Document

_EXPECTED = 'a JSON object, {"config": {...}, "layers": [...]}'
_HINT = "see tests/conformance/FORMAT.md for the dump format"


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
        data, pos, keys = scan(text, what="the dump", max_depth=MAX_DEPTH)
    except Located as exc:
        raise exc.error(text, file, _HINT) from None
    return Document(data, file, pos, keys)


def lenient_positions(text: str, file: str) -> Document | None:
    """Where each value and key of a JSON text that ``json`` read starts, as
    ``json`` reads it: NaN and Infinity are numbers, and of a key given twice the
    last counts; any depth. None when the text is no JSON ``json`` reads."""
    try:
        data, pos, keys = scan(text, lenient=True, what="the dump")
    except Located:
        return None
    return Document(data, file, pos, keys)


def unreadable_at(text: str, file: str, what: str, hint: str) -> SourceError | None:
    """Where in ``text``, JSON that ``json`` could not take (it recursed too
    deep, or met an integer too long for Python), it went past what ``what``
    may hold: nesting deeper than ``MAX_DEPTH``, or a number too long; None
    when neither (or the text is not JSON)."""
    try:
        scan(text, lenient=True, what=what, max_depth=MAX_DEPTH)
    except Located as exc:
        return exc.error(text, file, hint)
    return None


