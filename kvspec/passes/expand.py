"""The expand pass: the source -> one layer spec per layer per rank (patterns,
defaults, tensor-parallel heads, quantization, pipeline stages)."""

from __future__ import annotations

from dataclasses import dataclass

from kvspec.passes.parse import Parsed
from kvspec.source.expand import Expansion, expand_source
from kvspec.source.where import SourceMap


@dataclass(frozen=True, slots=True, kw_only=True)
class Expanded(Parsed):
    """The engine and every rank's layer specs, each layer's entry and quantization."""

    expansion: Expansion

    @property
    def where(self) -> SourceMap:
        return SourceMap(self.file, self.doc, self.expansion.layer_paths, self.memory)


def expand(parsed: Parsed) -> Expanded:
    """Source -> one spec per layer per rank; all problems at once."""
    return Expanded(text=parsed.text, file=parsed.file, memory=parsed.memory, doc=parsed.doc,
                    source=parsed.source, expansion=expand_source(parsed.source, parsed.doc))
