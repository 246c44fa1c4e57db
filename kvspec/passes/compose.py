"""The compose pass: source text -> a YAML document with positions (YAML's own word
for building the node tree from text).

>>> composed = compose(SourceText(text="kvspec: 1\\nname: x\\n", file="x.yaml"))
>>> composed.doc.data, composed.where.file
({'kvspec': 1, 'name': 'x'}, 'x.yaml')
"""

from __future__ import annotations

from dataclasses import dataclass

from kvspec.source.document import Document, parse_yaml
from kvspec.source.where import GivenMemory, SourceMap


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceText:
    """What the compiler starts from: a source's text, the name its file is shown
    under, and the memory budget the caller gave (None: the source's own)."""

    text: str
    file: str
    memory: GivenMemory | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Composed(SourceText):
    """The source's YAML document, every value's position kept."""

    doc: Document

    @property
    def where(self) -> SourceMap:
        """Where this source's elements are written (for locating errors)."""
        return SourceMap(self.file, self.doc, {}, self.memory)


def compose(start: SourceText) -> Composed:
    """Text -> YAML document with positions."""
    return Composed(text=start.text, file=start.file, memory=start.memory,
                  doc=parse_yaml(start.text, start.file))
