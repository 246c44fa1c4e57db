"""The parse pass: a YAML document -> the source model (schema version 1), every
problem at once."""

from __future__ import annotations

from dataclasses import dataclass

from kvspec.passes.compose import Composed
from kvspec.source.parse import parse_source
from kvspec.source.schema import Source


@dataclass(frozen=True, slots=True, kw_only=True)
class Parsed(Composed):
    """The source model of the document."""

    source: Source


def parse(composed: Composed) -> Parsed:
    """YAML document -> the source model; all problems at once."""
    return Parsed(text=composed.text, file=composed.file, memory=composed.memory,
                  doc=composed.doc, source=parse_source(composed.doc))
