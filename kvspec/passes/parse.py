"""The parse pass: a YAML document -> the source model (schema version 1), every
problem at once."""

from __future__ import annotations

from dataclasses import dataclass

from kvspec.passes.load import Loaded
from kvspec.source.parse import parse_source
from kvspec.source.schema import Source


@dataclass(frozen=True, slots=True, kw_only=True)
class Parsed(Loaded):
    """The source model of the document."""

    source: Source


def parse(loaded: Loaded) -> Parsed:
    """YAML document -> the source model; all problems at once."""
    return Parsed(text=loaded.text, file=loaded.file, memory=loaded.memory, doc=loaded.doc,
                  source=parse_source(loaded.doc))
