"""Reading a dump: through the source ``kvspec import`` makes of it.

A dump is planned exactly as a source is: imported (:mod:`.importer`), then
parsed and expanded like any ``layouts/*.yaml``, so a dump and the source
written from it cannot plan differently.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvspec.files import read_text, shown
from kvspec.integrations.dump.importer import import_dump
from kvspec.integrations.dump.jsontext import read_json
from kvspec.model.engine import Engine
from kvspec.model.specs import LayerSpec
from kvspec.source.document import Document
from kvspec.source.expand import Expansion, expand_source
from kvspec.source.parse import parse_source


def expand_dump(data: dict[str, Any], file: str = "<dump>") -> Expansion:
    """The expanded source of a dump."""
    doc = Document(import_dump(data), file)
    return expand_source(parse_source(doc), doc)


def read_dump(data: dict[str, Any]) -> tuple[Engine, list[dict[str, LayerSpec]]]:
    """A dump as the engine settings and the layer specs of every pipeline stage."""
    ex = expand_dump(data)
    return ex.engine, list(ex.stage_specs)


def read_dump_file(path: str | Path) -> tuple[Any, str]:
    """A dump file: its parsed JSON and its text (for error positions)."""
    text = read_text(path, what="the dump", hint="give the path of a per-layer spec dump "
                     "(JSON)")
    return read_json(text, shown(path)), text
