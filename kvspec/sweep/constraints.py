"""Constraints of a sweep grid: a tiny expression language over the axes, parsed
by hand (never ``eval``).

Grammar::

    constraint := either ("or" either)*
    either     := comparison ("and" comparison)*
    comparison := sum (("<=" | "<" | ">=" | ">" | "==" | "!=") sum)+
    sum        := term (("+" | "-") term)*
    term       := factor (("*" | "/" | "%") factor)*
    factor     := NUMBER | SIZE | AXIS | "(" sum ")" | "-" factor

``AXIS`` is a numeric axis of the grid (``tensor``, ``pipeline``, ``block_size``,
``max_num_seqs``, ``memory``, ``gpu_memory``: sizes in bytes); ``SIZE`` is a
number with a unit (``80GiB``). A chained comparison (``1 < tensor <= 8``) holds
when each link does.

>>> c = parse_constraint("tensor * pipeline <= 8", {"tensor", "pipeline"})
>>> c.holds({"tensor": 4, "pipeline": 2}), c.holds({"tensor": 8, "pipeline": 2})
(True, False)
>>> parse_constraint("tensr <= 8", {"tensor"})
Traceback (most recent call last):
...
kvspec.sweep.constraints.ConstraintError: unknown axis 'tensr' at column 1
"""

from __future__ import annotations

import difflib
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kvspec.files import size_bytes

__all__ = ["NUMERIC_AXES", "Constraint", "ConstraintError", "parse_constraint"]

#: The axes a constraint may name (their values are numbers; sizes in bytes).
NUMERIC_AXES = ("memory", "gpu_memory", "tensor", "pipeline", "block_size", "max_num_seqs")

_TOKEN = re.compile(r"\s*(?:(?P<num>[0-9]+(?:\.[0-9]+)?(?:[KMGTP]i?B|[KMGTP]|B)?)"
                    r"|(?P<name>[A-Za-z_][A-Za-z_0-9.]*)|(?P<op><=|>=|==|!=|[-+*/%()<>]))")
_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt,
    "==": operator.eq, "!=": operator.ne}
_ARITH: dict[str, Callable[[Any, Any], Any]] = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
    "%": operator.mod}


class ConstraintError(ValueError):
    """A constraint that does not parse: what is wrong, and the 0-based offset in
    its text."""

    def __init__(self, message: str, offset: int, hint: str | None = None) -> None:
        super().__init__(f"{message} at column {offset + 1}")
        self.message, self.offset, self.hint = message, offset, hint


#: A node: a number, an axis name, or an operator with its operands.
Node = tuple[Any, ...]


@dataclass(frozen=True)
class Constraint:
    """A parsed constraint: its text, the axes it reads, and its tree."""

    text: str
    names: frozenset[str]
    tree: Node

    def holds(self, values: Mapping[str, float]) -> bool:
        """Whether the point with these axis values meets it (a division by zero
        does not)."""
        try:
            return bool(_value(self.tree, values))
        except ZeroDivisionError:
            return False


def _value(node: Node, values: Mapping[str, float]) -> Any:
    kind = node[0]
    if kind == "num":
        return node[1]
    if kind == "name":
        return values[node[1]]
    if kind == "neg":
        return -_value(node[1], values)
    if kind in ("and", "or"):
        parts = (_value(n, values) for n in node[1:])
        return all(parts) if kind == "and" else any(parts)
    if kind == "cmp":
        left = _value(node[1], values)
        for op, right_node in node[2]:
            right = _value(right_node, values)
            if not _COMPARE[op](left, right):
                return False
            left = right
        return True
    return _ARITH[kind](_value(node[1], values), _value(node[2], values))


class _Parser:
    def __init__(self, text: str, axes: set[str]) -> None:
        self.text, self.axes = text, axes
        self.tokens: list[tuple[str, str, int]] = []
        pos = 0
        while pos < len(text):
            if not text[pos:].strip():
                break
            m = _TOKEN.match(text, pos)
            if m is None or m.end() == pos:
                at = len(text) - len(text[pos:].lstrip())
                raise ConstraintError(f"unexpected {text[at]!r}", at,
                                      "use axis names, numbers, + - * / %, comparisons, "
                                      "and, or, parentheses")
            kind = m.lastgroup or ""
            self.tokens.append((kind, m.group(kind), m.start(kind)))
            pos = m.end()
        self.i = 0

    def peek(self) -> tuple[str, str, int] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, *words: str) -> str | None:
        t = self.peek()
        if t is not None and t[1] in words and (t[0] == "op" or t[1] in ("and", "or")):
            self.i += 1
            return t[1]
        return None

    def where(self) -> int:
        t = self.peek()
        return t[2] if t is not None else len(self.text.rstrip())

    def either(self, word: str, inner: Callable[[], Node]) -> Node:
        parts = [inner()]
        while self.take(word):
            parts.append(inner())
        return parts[0] if len(parts) == 1 else (word, *parts)

    def constraint(self) -> Node:
        node = self.either("or", lambda: self.either("and", self.comparison))
        if self.peek() is not None:
            raise ConstraintError(f"unexpected {self.peek()[1]!r}",  # type: ignore[index]
                                  self.where(), "join comparisons with and / or")
        return node

    def comparison(self) -> Node:
        left, links = self.sum(), []
        while (op := self.take(*_COMPARE)) is not None:
            links.append((op, self.sum()))
        if not links:
            raise ConstraintError("a constraint compares", self.where(),
                                  "write a comparison, e.g. tensor * pipeline <= 8")
        return ("cmp", left, tuple(links))

    def sum(self) -> Node:
        node = self.term()
        while (op := self.take("+", "-")) is not None:
            node = (op, node, self.term())
        return node

    def term(self) -> Node:
        node = self.factor()
        while (op := self.take("*", "/", "%")) is not None:
            node = (op, node, self.factor())
        return node

    def factor(self) -> Node:
        t = self.peek()
        if t is None:
            raise ConstraintError("the constraint ends too soon", self.where(),
                                  "finish the expression, e.g. tensor * pipeline <= 8")
        if self.take("-"):
            return ("neg", self.factor())
        if self.take("("):
            node = self.sum()
            if not self.take(")"):
                raise ConstraintError("expected ')'", self.where(), "close the parenthesis")
            return node
        self.i += 1
        kind, word, at = t
        if kind == "num":
            n = size_bytes(word) if word[-1].isalpha() else float(word)
            return ("num", n)
        if kind == "name" and word not in ("and", "or"):
            if word not in self.axes:
                close = difflib.get_close_matches(word, sorted(self.axes), n=1)
                raise ConstraintError(
                    f"unknown axis {word!r}", at,
                    f"did you mean {close[0]!r}?" if close else
                    "a constraint names the grid's numeric axes: " +
                    (", ".join(sorted(self.axes)) or "none are swept"))
            return ("name", word)
        raise ConstraintError(f"unexpected {word!r}", at,
                              "expected a number, an axis or '('")


def _names(node: Node) -> set[str]:
    if node[0] == "name":
        return {node[1]}
    out: set[str] = set()
    for part in node[1:]:
        if isinstance(part, tuple) and part and isinstance(part[0], str):
            out |= _names(part)
        elif isinstance(part, tuple):
            for _, sub in part:
                out |= _names(sub)
    return out


def parse_constraint(text: str, axes: set[str]) -> Constraint:
    """The constraint ``text`` over ``axes``; raise :class:`ConstraintError`."""
    tree = _Parser(text, axes).constraint()
    return Constraint(text, frozenset(_names(tree)), tree)
