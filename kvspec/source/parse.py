"""The parse pass: a YAML document -> the source model, every problem at once.

Pydantic validates the document against :class:`~kvspec.source.schema.Source`;
its errors become :class:`~kvspec.errors.SourceError` placed at the line and
column of the value (or key) they are about, in the user's words.
"""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import ValidationError

from kvspec.errors import ErrorList, SourceError
from kvspec.source import schema as m
from kvspec.source.document import Document, format_path

#: Location parts pydantic inserts that the user never wrote.
_TYPE_PARTS = ("int", "str", "literal['auto']", "function-after[validate(), str]")


def clean_loc(loc: tuple) -> tuple:
    """A pydantic error location without union tags and type names."""
    out: list = []
    for i, part in enumerate(loc):
        if isinstance(part, str) and i > 0 and isinstance(loc[i - 1], int) and \
                part in ("pattern", "layer") and len(loc) > i + 1:
            continue
        if isinstance(part, str) and part in _TYPE_PARTS and i > 0:
            continue
        out.append(part)
    return tuple(out)


def allowed_fields(parent: tuple) -> list[str]:
    """The fields the mapping at ``parent`` may have."""
    table = {(): m.Source, ("engine",): m.EnginePolicy, ("parallel",): m.Parallelism,
             ("quantization",): m.Quantization, ("defaults",): m.LayerFields,
             ("engine", "draft"): m.DraftPolicy}
    if parent in table:
        return list(table[parent].model_fields)
    if len(parent) == 2 and parent[0] == "layer_types":
        return list(m.LayerFields.model_fields)
    if len(parent) == 2 and parent[0] == "layers":
        return sorted(set(m.LayerEntry.model_fields) | set(m.PatternEntry.model_fields))
    return []


def schema_error(doc: Document, err: dict[str, Any]) -> SourceError:
    loc = clean_loc(err["loc"])
    kind = err["type"]
    found = err.get("input")
    found_s = None if isinstance(found, (dict, list)) else repr(found)
    if kind == "extra_forbidden":
        key = loc[-1]
        allowed = allowed_fields(loc[:-1])
        close = difflib.get_close_matches(str(key), allowed, n=1)
        return doc.error(f"unknown field {key!r}", loc, key=True,
                         expected="one of " + ", ".join(sorted(allowed)) if allowed else None,
                         hint=f"did you mean {close[0]!r}?" if close else
                         "remove it, or check the indentation")
    if kind == "missing":
        return doc.error(f"missing required field {loc[-1]!r}", loc[:-1],
                         expected=f"{loc[-1]}: ...", hint="see docs/format.md")
    if kind == "literal_error":
        return doc.error(f"invalid value for {loc[-1]!r}", loc,
                         expected=err.get("ctx", {}).get("expected"), found=found_s)
    return doc.error(f"invalid value for {format_path(loc)}: {err['msg']}", loc, found=found_s)


def parse_source(doc: Document) -> m.Source:
    """The source model of ``doc``; an :class:`ErrorList` of every schema problem."""
    if not isinstance(doc.data, dict):
        raise SourceError("a kvspec source must be a YAML mapping", file=doc.file, line=1,
                          column=1, expected="kvspec: 1, name: ..., engine: ..., layers: ...",
                          found=type(doc.data).__name__)
    try:
        return m.Source.model_validate(doc.data)
    except ValidationError as exc:
        raise ErrorList([schema_error(doc, e) for e in exc.errors(include_url=False)]) from None
