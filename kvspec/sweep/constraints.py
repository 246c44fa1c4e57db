"""Constraints of a sweep grid: a tiny expression language over the axes, parsed
by hand (never ``eval``).

Grammar::

    constraint := either ("or" either)*
    either     := comparison ("and" comparison)*
    comparison := sum (("<=" | "<" | ">=" | ">" | "==" | "!=") sum)*
    sum        := term (("+" | "-") term)*
    term       := factor (("*" | "/" | "%") factor)*
    factor     := "-"* (NUMBER | SIZE | AXIS | "(" constraint ")")

``AXIS`` is a numeric axis of the grid (``tensor``, ``pipeline``, ``block_size``,
``max_num_seqs``, ``memory``, ``gpu_memory``: sizes in bytes); ``SIZE`` is a
number with a unit (``80GiB``). A chained comparison (``1 < tensor <= 8``) holds
when each link does. Parentheses group arithmetic or conditions
(``(tensor == 1 or pipeline == 1) and memory >= 40GiB``); a condition is never
an operand of arithmetic, nor arithmetic a condition. Arithmetic is in floating
point (exact for whole numbers up to 2**53); a point where a constraint divides
by zero does not meet it.

The text is scanned once (one compiled expression over the whole string), and
bounded: at most :data:`MAX_CHARS` characters and :data:`MAX_DEPTH` nested
parentheses, so no constraint recurses without end or scans for long. Sums,
products, chains and runs of minus signs are read in loops: a 1,000-term sum is
no deeper than one term.

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
import math
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kvspec.files import size_bytes, size_hint

__all__ = ["MAX_CHARS", "MAX_DEPTH", "NUMERIC_AXES", "Constraint", "ConstraintError",
           "parse_constraint"]

#: The axes a constraint may name (their values are numbers; sizes in bytes).
NUMERIC_AXES = ("memory", "gpu_memory", "tensor", "pipeline", "block_size", "max_num_seqs")
#: The longest constraint read, in characters (a real one is a line).
MAX_CHARS = 10_000
#: Parentheses nested deeper than this are refused (a real constraint nests two).
MAX_DEPTH = 32

#: One token at a time, over the whole text: blanks, a number with an optional
#: exponent or unit (its letters read whole, so ``80G`` and ``2tensor`` are one
#: token to refuse), a name, an operator, or any other character (refused).
_SCAN = re.compile(r"(?P<blank>\s+)"
                   r"|(?P<num>[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+(?![A-Za-z_]))?"
                   r"[A-Za-z_0-9.]*)"
                   r"|(?P<name>[A-Za-z_][A-Za-z_0-9.]*)"
                   r"|(?P<op><=|>=|==|!=|[-+*/%()<>])"
                   r"|(?P<bad>.)", re.DOTALL)
_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")
_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt,
    "==": operator.eq, "!=": operator.ne}
_ARITH: dict[str, Callable[[float, float], float]] = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
    "%": operator.mod}
_WORDS = ("and", "or")
_UNITS = ("b", "kib", "mib", "gib", "tib", "pib", "kb", "mb", "gb", "tb", "pb")


class ConstraintError(ValueError):
    """A constraint that does not parse: what is wrong, and the 0-based offset in
    its text."""

    def __init__(self, message: str, offset: int, hint: str | None = None) -> None:
        super().__init__(f"{message} at column {offset + 1}")
        self.message, self.offset, self.hint = message, offset, hint


#: A node: ("num", float), ("name", axis), ("neg", node), ("and" | "or", node, ...),
#: or (kind, first, ((op, node), ...)) for kind "arith" (a sum or a product, left to
#: right) and "cmp" (a chain of comparisons).
Node = tuple[Any, ...]


@dataclass(frozen=True)
class Constraint:
    """A parsed constraint: its text, the axes it reads, its tree and its size
    (the nodes a check evaluates)."""

    text: str
    names: frozenset[str]
    tree: Node
    size: int = 1

    def holds(self, values: Mapping[str, float]) -> bool:
        """Whether the point with these axis values meets it (a division by zero
        does not)."""
        try:
            return bool(_value(self.tree, {k: float(v) for k, v in values.items()
                                           if k in self.names}))
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
    if kind == "and":
        return all(_value(n, values) for n in node[1:])
    if kind == "or":
        return any(_value(n, values) for n in node[1:])
    left = _value(node[1], values)
    if kind == "cmp":
        for op, right_node in node[2]:
            right = _value(right_node, values)
            if not _COMPARE[op](left, right):
                return False
            left = right
        return True
    for op, right_node in node[2]:  # "arith": left to right, in a loop
        left = _ARITH[op](left, _value(right_node, values))
    return left


class _Parser:
    def __init__(self, text: str, axes: set[str]) -> None:
        self.text, self.axes = text, axes
        self.names: set[str] = set()
        self.size = 0
        self.depth = 0
        self.tokens: list[tuple[str, str, int]] = []
        for m in _SCAN.finditer(text):
            kind = m.lastgroup or ""
            if kind == "blank":
                continue
            if kind == "bad":
                raise ConstraintError(f"unexpected {m.group()!r}", m.start(),
                                      "use axis names, numbers, + - * / %, comparisons, "
                                      "and, or, parentheses")
            self.tokens.append((kind, m.group(), m.start()))
        self.i = 0

    def peek(self) -> tuple[str, str, int] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, *words: str) -> str | None:
        t = self.peek()
        if t is not None and t[1] in words and (t[0] == "op" or t[1] in _WORDS):
            self.i += 1
            return t[1]
        return None

    def where(self) -> int:
        t = self.peek()
        return t[2] if t is not None else len(self.text.rstrip())

    def node(self, node: Node) -> Node:
        self.size += 1
        return node

    def spaced_unit(self) -> str | None:
        """A hint for a unit written apart from its number (``80 GiB``)."""
        t, i = self.peek(), self.i
        if t is not None and t[1].lower() in _UNITS and i > 0 and \
                self.tokens[i - 1][0] == "num":
            return f"write a size without a space: {self.tokens[i - 1][1]}{t[1]}"
        return None

    def constraint(self) -> Node:
        if not self.tokens:
            raise ConstraintError("the constraint is empty", 0,
                                  "write a comparison, e.g. tensor * pipeline <= 8, or "
                                  "remove the entry")
        start = self.where()
        node, is_condition = self.either()
        if self.peek() is not None:
            word = self.peek()[1]  # type: ignore[index]
            raise ConstraintError(f"unexpected {_shown(word)!r}", self.where(),
                                  "close the parenthesis opened before it" if word == ")"
                                  else self.spaced_unit() or "join comparisons with and / or")
        if not is_condition:
            raise ConstraintError("a constraint compares", start,
                                  "write a comparison, e.g. tensor * pipeline <= 8")
        return node

    def either(self) -> tuple[Node, bool]:
        """An or of ands of comparisons; whether it is a condition (or arithmetic)."""
        return self.joined("or", self.both)

    def both(self) -> tuple[Node, bool]:
        return self.joined("and", self.comparison)

    def joined(self, word: str, inner: Callable[[], tuple[Node, bool]]) -> tuple[Node, bool]:
        start = self.where()
        first, is_condition = inner()
        parts = [first]
        while True:
            at = self.where()
            if not self.take(word):
                break
            if not is_condition:
                raise ConstraintError(f"{word} joins comparisons", start,
                                      "compare this with something, e.g. tensor <= 8")
            start = self.where()
            part, is_condition = inner()
            if not is_condition:
                raise ConstraintError(f"{word} joins comparisons", start,
                                      f"compare what follows {word!r} (column {at + 1})")
            parts.append(part)
        if len(parts) == 1:
            return first, is_condition
        return self.node((word, *parts)), True

    def comparison(self) -> tuple[Node, bool]:
        start = self.where()
        left, is_condition = self.arith(("+", "-"), self.term)
        links = []
        while (op := self.take(*_COMPARE)) is not None:
            if is_condition:
                raise ConstraintError(f"{op!r} compares numbers, not a condition", start,
                                      "compare an axis or an expression, e.g. "
                                      "tensor * pipeline <= 8")
            start = self.where()
            right, is_condition = self.arith(("+", "-"), self.term)
            links.append((op, right))
        if not links:
            return left, is_condition
        if is_condition:
            raise ConstraintError("a comparison compares numbers, not a condition", start,
                                  "compare an axis or an expression, e.g. tensor <= 8")
        return self.node(("cmp", left, tuple(links))), True

    def term(self) -> tuple[Node, bool]:
        return self.arith(("*", "/", "%"), self.factor)

    def arith(self, ops: tuple[str, ...], inner: Callable[[], tuple[Node, bool]]
              ) -> tuple[Node, bool]:
        start = self.where()
        first, is_condition = inner()
        links = []
        while (op := self.take(*ops)) is not None:
            at = self.where()
            right, right_condition = inner()
            if is_condition or right_condition:
                raise ConstraintError(f"{op!r} takes numbers, not a condition",
                                      start if is_condition else at,
                                      "arithmetic is over axes and numbers; join "
                                      "conditions with and / or")
            links.append((op, right))
        if not links:
            return first, is_condition
        return self.node(("arith", first, tuple(links))), False

    def factor(self) -> tuple[Node, bool]:
        minus, start = 0, self.where()
        while self.take("-"):
            minus += 1
        t = self.peek()
        if t is None:
            raise ConstraintError("the constraint ends too soon", self.where(),
                                  "finish the expression, e.g. tensor * pipeline <= 8")
        node, is_condition = self.primary(t)
        if minus % 2:
            if is_condition:
                raise ConstraintError("'-' takes a number, not a condition", start,
                                      "negate a number or an axis")
            node = self.node(("neg", node))
        return node, is_condition

    def primary(self, t: tuple[str, str, int]) -> tuple[Node, bool]:
        kind, word, at = t
        if self.take("("):
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise ConstraintError(f"parentheses nested more than {MAX_DEPTH} deep", at,
                                      "a constraint is a line: write it with fewer "
                                      "parentheses")
            node = self.either()
            if not self.take(")"):
                raise ConstraintError("expected ')'", self.where(),
                                      f"close the parenthesis opened at column {at + 1}")
            self.depth -= 1
            return node
        self.i += 1
        if kind == "num":
            return self.node(("num", _number(word, at, self.axes))), False
        if kind == "name" and word not in _WORDS:
            if word not in self.axes:
                close = difflib.get_close_matches(word, sorted(self.axes), n=1)
                raise ConstraintError(
                    f"unknown axis {_shown(word)!r}", at,
                    f"did you mean {close[0]!r}?" if close else
                    "a constraint names the grid's numeric axes: " +
                    (", ".join(sorted(self.axes)) or "none are swept"))
            self.names.add(word)
            return self.node(("name", word)), False
        raise ConstraintError(f"unexpected {_shown(word)!r}", at,
                              "expected a number, an axis or '('")


def _number(word: str, at: int, axes: set[str]) -> float:
    """A number token's value: a number, or a size in bytes; finite."""
    digits = _NUMBER.match(word)
    assert digits is not None
    rest = word[digits.end():]
    if not rest:
        value = float(word)
    else:
        try:
            n = size_bytes(word)
        except ValueError:  # more digits than Python reads as an integer
            n = None
        if n is None:
            if rest.lower() in axes or len(rest) > 3:
                raise ConstraintError(f"cannot read {_shown(word)!r} as a number or a size", at,
                                      f"write a number and an axis apart: "
                                      f"{digits.group()} * {rest}")
            raise ConstraintError(f"cannot read {_shown(word)!r} as a size", at,
                                  size_hint(word))
        try:
            value = float(n)
        except OverflowError:
            value = math.inf
    if not math.isfinite(value):
        raise ConstraintError(f"the number {_shown(word)} is too large", at,
                              "write a number a point's axes can reach")
    return value


def _shown(word: str) -> str:
    return word if len(word) <= 24 else word[:20] + "..."


def parse_constraint(text: str, axes: set[str]) -> Constraint:
    """The constraint ``text`` over ``axes``; raise :class:`ConstraintError`."""
    if len(text) > MAX_CHARS:
        raise ConstraintError(f"a constraint of {len(text):,} characters: at most "
                              f"{MAX_CHARS:,}", MAX_CHARS,
                              "write it as several shorter constraints (every one must hold)")
    parser = _Parser(text, axes)
    tree = parser.constraint()
    return Constraint(text, frozenset(parser.names), tree, max(parser.size, 1))
