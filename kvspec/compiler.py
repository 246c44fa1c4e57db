"""``compile()``: the pipeline (:mod:`kvspec.passes.pipeline`, a fold over the
passes, its errors located once) from source text to artifact, with the pooling
driver (:func:`kvspec.pooling.decide`) in the pool pass's place: a policy that
weighs candidates compiles each through the same pipeline and simulates its
artifact (a search drives the pipeline from above; it is not a pass).

>>> from pathlib import Path
>>> art = compile_source(Path("layouts/llama-3.1-8b.yaml").read_text(), "llama.yaml")
>>> art.layout.groups[0].spec.kind, art.layout.stage(0).bytes_per_block
('full_attention', 2097152)
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TypeVar

from kvspec.files import parse_size, read_text, shown
from kvspec.passes import pipeline
from kvspec.passes.compose import Composed, SourceText
from kvspec.passes.expand import Expanded
from kvspec.passes.freeze import CompiledArtifact as Artifact
from kvspec.passes.parse import Parsed
from kvspec.passes.pipeline import Pass, Track, check_chain, run
from kvspec.passes.plan import Planned
from kvspec.passes.pool import Pooled
from kvspec.passes.size import Sized, unsized
from kvspec.passes.validate import Validated
from kvspec.pooling import decide
from kvspec.source.where import GivenMemory

__all__ = ["CHECK_PASSES", "PASSES", "PLAN_PASSES", "Expanded", "Composed", "Parsed", "Pass",
           "Planned", "Pooled", "Sized", "SourceText", "Validated", "check_chain", "compile",
           "compile_source", "compile_until", "pass_named", "read_source", "run", "run_until",
           "unsized"]

T = TypeVar("T")

#: The pipeline, the pooling driver in the pool pass's place.
PASSES: tuple[Pass, ...] = tuple(dataclasses.replace(p, fn=decide) if p.name == "pool" else p
                                 for p in pipeline.PASSES)
#: The passes that need no memory budget (``kvspec plan`` sizes the plan itself).
PLAN_PASSES: tuple[Pass, ...] = PASSES[:5]
#: Every pass that can fail (``kvspec validate``): freezing is pure serialisation.
CHECK_PASSES: tuple[Pass, ...] = PASSES[:-1]


def pass_named(name: str) -> Pass:
    """The pass called ``name`` (``"size"``, ...)."""
    return next(p for p in PASSES if p.name == name)


def run_until(start: SourceText, until: type[T], track: Track | None = None) -> T:
    """Run the pipeline from ``start`` up to the pass that gives ``until``, each
    pass's function wrapped by ``track`` when given."""
    return pipeline.run_until(start, until, track, PASSES)


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
