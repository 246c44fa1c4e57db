"""Locating errors in the source: a typed reference -> file, line, column and path.

Code below the source (the planner, the domain model) says what an error is
about in its own words: a layer by name (:class:`~kvspec.errors.LayerRef`), an
engine setting by its :class:`~kvspec.model.engine.Engine` field
(:class:`~kvspec.model.engine.SettingRef`), the memory budget
(:class:`~kvspec.model.engine.BudgetRef`). A :class:`SourceMap` knows where each
of those was written -- the setting's source key from the one declaration of
engine settings, the layer's entry from the expansion -- and locates the error
once. A budget the caller gave (``memory=``, ``--memory``) is located at that
argument, not in the file.

>>> from kvspec.errors import PlanError
>>> from kvspec.model.engine import SettingRef
>>> from kvspec.source.document import parse_yaml
>>> where = SourceMap("m.yaml", parse_yaml("engine:\\n  layout: LHBNC\\n", "m.yaml"))
>>> err = where.locate(PlanError("no", ref=SettingRef("axis_order"), hint="..."))
>>> err.line, err.column, err.path
(2, 11, 'engine.layout')
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kvspec.errors import KvspecError, LayerRef, Location, format_path
from kvspec.model.engine import BudgetRef, SettingRef
from kvspec.model.pooling import PoolingRef
from kvspec.source.document import Document

Path = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class GivenMemory:
    """A memory budget the caller gave, and the name it was given under
    (``memory`` for the library's ``memory=``, ``--memory`` on the command line)."""

    bytes: int
    name: str = "memory"


@dataclass(frozen=True, slots=True)
class SourceMap:
    """Where the elements of one source were written: locates errors there."""

    file: str
    #: The parsed document (None: no positions, e.g. an artifact's inputs).
    doc: Document | None = None
    #: Each layer's entry in the source (from the expand pass on).
    layer_paths: Mapping[str, Path] = field(default_factory=dict)
    #: The budget the caller gave, if any.
    memory: GivenMemory | None = None

    def locate(self, err: KvspecError) -> KvspecError:
        """``err`` at the file, line and column of what it refers to; an error that
        already has a file is returned as it is."""
        if err.file:
            return err
        ref = err.ref
        if isinstance(ref, BudgetRef) and self.memory is not None:
            name = self.memory.name
            return err.replace(location=Location(self.file, None, None, name),
                               found=f"{self.memory.bytes:,} bytes",
                               hint=f"give the KV cache more memory ({name})")
        if isinstance(ref, LayerRef) and ref.name in self.layer_paths:
            path: Path | None = self.layer_paths[ref.name]
        elif isinstance(ref, (SettingRef, BudgetRef, PoolingRef)):
            path = ref.path
        else:  # about the model as a whole: its layers, where there is a document
            path = ("layers",) if self.doc is not None else None
        return err.at(self.location(path))

    def location(self, path: Path | None) -> Location:
        """The location of the value at ``path`` (or of its nearest parent)."""
        if path is None:
            return Location(self.file)
        pos = self.doc.position(path) if self.doc is not None else None
        line, column = pos or (None, None)
        return Location(self.file, line, column, format_path(path))
