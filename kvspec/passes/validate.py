"""The validate pass: checks across fields and layers the schema cannot make
(:mod:`kvspec.source.validate`), all problems at once."""

from __future__ import annotations

from dataclasses import dataclass

from kvspec.passes.expand import Expanded
from kvspec.source.validate import validate_source


@dataclass(frozen=True, slots=True, kw_only=True)
class Validated(Expanded):
    """An expanded source that passed every check across fields and layers."""


def validate(expanded: Expanded) -> Validated:
    """Raise every problem the checks find; the same source, validated."""
    validate_source(expanded.source, expanded.doc, expanded.expansion)
    return Validated(text=expanded.text, file=expanded.file, memory=expanded.memory,
                     doc=expanded.doc, source=expanded.source, expansion=expanded.expansion)
