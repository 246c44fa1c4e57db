"""The pipeline as data: :data:`PASSES`, an ordered tuple of :class:`Pass` records,
and :func:`run`, the fold over any sequence of them that chains.

Each pass declares the type it takes and the type it gives (its annotations), and
:func:`run` checks that a sequence of passes chains before folding over it, so a
test can run any prefix and look at the value it ends in. The fold is also where
errors are located: a pass's error that refers to a layer, an engine setting, the
budget or the pooling section (:class:`~kvspec.errors.Ref`) is located once, at the
file, line and column the pass's input knows (its
:class:`~kvspec.source.where.SourceMap`).

Here the ``pool`` pass is the one that simulates nothing; :mod:`kvspec.compiler`
runs this pipeline with the pooling driver (:mod:`kvspec.pooling`) in its place.

>>> from pathlib import Path
>>> planned = run(SourceText(text=Path("layouts/llama-3.1-8b.yaml").read_text(),
...                          file="llama.yaml"), PASSES[:5])
>>> type(planned).__name__, len(planned.plan.groups)
('Planned', 1)
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from kvspec.collector import paused
from kvspec.errors import KvspecError
from kvspec.passes.compose import Composed, SourceText, compose
from kvspec.passes.expand import expand
from kvspec.passes.freeze import freeze
from kvspec.passes.parse import parse
from kvspec.passes.plan import plan
from kvspec.passes.pool import pool
from kvspec.passes.size import size
from kvspec.passes.validate import validate

__all__ = ["PASSES", "Pass", "SourceText", "Track", "check_chain", "run", "run_until"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Pass:
    """One pass: its function, the type it takes and the type it gives."""

    name: str
    fn: Callable[[Any], Any]
    takes: type
    gives: type

    @classmethod
    def of(cls, fn: Callable[[Any], Any]) -> Pass:
        """The pass ``fn``, its types read from its annotations."""
        hints = typing.get_type_hints(fn)
        gives = hints.pop("return")
        (takes,) = hints.values()
        return cls(fn.__name__, fn, takes, gives)


PASSES: tuple[Pass, ...] = tuple(Pass.of(fn) for fn in (
    compose, parse, expand, validate, plan, size, pool, freeze))


def check_chain(start: object, passes: Sequence[Pass]) -> None:
    """Raise TypeError unless ``passes`` can run in order from ``start``."""
    have = type(start)
    for p in passes:
        if not issubclass(have, p.takes):
            raise TypeError(f"pass {p.name} takes {p.takes.__name__}, not {have.__name__}")
        have = p.gives


def run(start: object, passes: Sequence[Pass] = PASSES) -> Any:
    """Fold ``passes`` over ``start``; a pass's error is located at its position in
    the source (once, here) and raised."""
    check_chain(start, passes)
    value = start
    with paused():  # large inputs: see kvspec.collector
        for p in passes:
            try:
                value = p.fn(value)
            except KvspecError as err:
                if isinstance(value, Composed):
                    raise value.where.locate(err) from None
                raise
    return value


#: Wraps each pass's function (a progress bar's ``track``): ``(fn, name) -> fn``.
Track = Callable[[Callable[[Any], Any], str], Callable[[Any], Any]]


def run_until(start: object, until: type[T], track: Track | None = None,
              passes: Sequence[Pass] = PASSES) -> T:
    """Run ``passes`` from the one that takes ``start`` (each stage's type extends
    the one before: the last that takes it) up to the one that gives ``until``, each
    pass's function wrapped by ``track`` when given."""
    first = max(i for i, p in enumerate(passes) if isinstance(start, p.takes))
    end = next(i for i, p in enumerate(passes) if issubclass(p.gives, until))
    chosen = tuple(passes[first:end + 1])
    if track is not None:
        chosen = tuple(dataclasses.replace(p, fn=track(p.fn, p.name)) for p in chosen)
    out = run(start, chosen)
    assert isinstance(out, until)
    return out
