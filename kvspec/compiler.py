"""``compile()``: a fold over the compiler passes, source text -> artifact.

The pipeline is data: :data:`PASSES` is an ordered tuple of :class:`Pass`
records, each a pure function from its own frozen type to the next
(:mod:`kvspec.passes`)::

    SourceText -compose-> Composed -parse-> Parsed -expand-> Expanded -validate-> Validated
      -plan-> Planned -size-> Sized -freeze-> Artifact

Each pass declares the type it takes and the type it gives (its annotations),
and :func:`run` checks that a sequence of passes chains before folding over it,
so a test can run any prefix and look at the value it ends in. The fold is
also where errors are located: a pass's error that refers to a layer, an engine
setting or the budget (:class:`~kvspec.errors.Ref`) is located once, at the
file, line and column the pass's input knows (its
:class:`~kvspec.source.where.SourceMap`).

>>> from pathlib import Path
>>> art = compile_source(Path("layouts/llama-3.1-8b.yaml").read_text(), "llama.yaml")
>>> art.layout.groups[0].spec.kind, art.layout.stage(0).bytes_per_block
('full_attention', 2097152)
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
from pathlib import Path
from typing import Any, TypeVar

from kvspec.collector import paused
from kvspec.errors import KvspecError
from kvspec.files import parse_size, read_text, shown
from kvspec.passes.compose import Composed, SourceText, compose
from kvspec.passes.expand import Expanded, expand
from kvspec.passes.freeze import CompiledArtifact as Artifact
from kvspec.passes.freeze import freeze
from kvspec.passes.parse import Parsed, parse
from kvspec.passes.plan import Planned, plan
from kvspec.passes.pool import Pooled, pool
from kvspec.passes.size import Sized, size, unsized
from kvspec.passes.validate import Validated, validate
from kvspec.source.where import GivenMemory

__all__ = ["CHECK_PASSES", "PASSES", "PLAN_PASSES", "Expanded", "Composed", "Parsed", "Pass",
           "Planned", "Pooled", "Sized", "SourceText", "Validated", "compile", "compile_source",
           "compile_until", "pass_named", "read_source", "run", "run_until", "unsized"]

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
#: The passes that need no memory budget (``kvspec plan`` sizes the plan itself).
PLAN_PASSES: tuple[Pass, ...] = PASSES[:5]
#: Every pass that can fail (``kvspec validate``): freezing is pure serialisation.
CHECK_PASSES: tuple[Pass, ...] = PASSES[:-1]


def pass_named(name: str) -> Pass:
    """The pass called ``name`` (``"size"``, ...)."""
    return next(p for p in PASSES if p.name == name)


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


def run_until(start: SourceText, until: type[T], track: Track | None = None) -> T:
    """Run the pipeline from ``start`` up to the pass that gives ``until``, each
    pass's function wrapped by ``track`` when given."""
    end = next(i for i, p in enumerate(PASSES) if issubclass(p.gives, until))
    passes = PASSES[:end + 1]
    if track is not None:
        passes = tuple(dataclasses.replace(p, fn=track(p.fn, p.name)) for p in passes)
    out = run(start, passes)
    assert isinstance(out, until)
    return out


def _given(memory: int | str | None, name: str = "memory") -> GivenMemory | None:
    if memory is None:
        return None
    return GivenMemory(parse_size(memory, what="memory"), name)


def compile_source(text: str, file: str = "<input>", *, memory: int | str | None = None
                   ) -> Artifact:
    """Compile source text; raise :class:`KvspecError` on bad input."""
    return run_until(SourceText(text=text, file=file, memory=_given(memory)), Artifact)


def read_source(path: str | Path) -> str:
    return read_text(path, what="the source",
                     hint="give the path of a layout source, e.g. layouts/llama-3.1-8b.yaml")


def compile_until(path: str | Path, until: type[T], *, memory: int | str | None = None,
                  memory_name: str = "memory", track: Track | None = None) -> T:
    """Compile the source file at ``path`` up to ``until`` (``Planned``, ``Sized``,
    ``Artifact``, ...); ``memory`` is the caller's budget per rank, errors about it
    naming it ``memory_name`` (``--memory`` on the command line)."""
    start = SourceText(text=read_source(path), file=shown(path),
                       memory=_given(memory, memory_name))
    return run_until(start, until, track)


def compile(path: str | Path, *, memory: int | str | None = None) -> Artifact:  # noqa: A001
    """Compile the source file at ``path`` into a verified artifact.

    ``memory`` is the budget per rank, in bytes or as a size (``"40GiB"``).
    """
    return compile_until(path, Artifact, memory=memory)
