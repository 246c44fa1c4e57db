"""The parse pass: a YAML document -> the source model, every problem at once.

Pydantic validates the document against :class:`~kvspec.source.schema.Source`;
its errors become :class:`~kvspec.errors.SourceError` placed at the line and
column of the value (or key) they are about, in the user's words.
"""

from __future__ import annotations

import datetime
import difflib
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from kvspec.errors import ErrorList, SourceError
from kvspec.files import MEMORY_HINT, size_hint
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
        if part in ("mean", "distribution") and i > 0 and \
                loc[i - 1] in ("context_tokens", "output_tokens"):
            continue  # the tag of a token count's union (schema.Tokens)
        out.append(part)
    return tuple(out)


def allowed_fields(parent: tuple) -> list[str]:
    """The fields the mapping at ``parent`` may have."""
    table: dict[tuple[str, ...], type[BaseModel]] = {
        (): m.Source, ("engine",): m.EnginePolicy, ("parallel",): m.Parallelism,
        ("quantization",): m.Quantization, ("defaults",): m.LayerFields,
        ("engine", "draft"): m.DraftPolicy, ("pooling",): m.PoolingPolicy,
        ("pooling", "workload"): m.WorkloadSpec}
    if parent in table:
        return list(table[parent].model_fields)
    if len(parent) == 2 and parent[0] == "layer_types":
        return list(m.LayerFields.model_fields)
    if len(parent) == 3 and parent[:2] == ("pooling", "workload") and \
            parent[2] in ("context_tokens", "output_tokens"):
        return list(m.Distribution.model_fields)
    if len(parent) == 2 and parent[0] == "layers":
        return sorted(set(m.LayerEntry.model_fields) | set(m.PatternEntry.model_fields))
    return []


def schema_error(doc: Document, err: Mapping[str, Any]) -> SourceError:
    loc = clean_loc(err["loc"])
    kind = err["type"]
    found = err.get("input")
    found_s = yaml_repr(found)
    if kind == "extra_forbidden":
        key = loc[-1]
        allowed = allowed_fields(loc[:-1])
        close = [FIELD_SYNONYMS[key]] if FIELD_SYNONYMS.get(key) in allowed else \
            difflib.get_close_matches(str(key), allowed, n=1)
        return doc.error(f"unknown field {key!r}", loc, key=True,
                         expected="one of " + ", ".join(sorted(allowed)) if allowed else None,
                         hint=f"did you mean {close[0]!r}?" if close else
                         "remove it, or check the indentation")
    if kind == "missing":
        return doc.error(f"missing required field {loc[-1]!r}", loc[:-1],
                         expected=f"{loc[-1]}: ...", hint="see docs/format.md")
    if kind == "literal_error":
        return _literal_error(doc, loc, err, found, found_s)
    return doc.error(f"invalid value for {format_path(loc)}", loc,
                     expected=expected_of(err), found=found_s,
                     hint=_type_hint(kind, found, err.get("ctx") or {}))


def yaml_repr(value: Any) -> str:
    """A value as the user wrote it in YAML: ``true``, ``null``, ``'8'``, ``16``; a
    mapping or list by what it is, a date or binary data by what YAML made of it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return f"a list of {len(value):,} item{'s' if len(value) != 1 else ''}"
    if isinstance(value, (bytes, bytearray)):
        return "binary data (!!binary)"
    if isinstance(value, (datetime.date, datetime.datetime)):
        return f"a date ({value.isoformat()})"
    return repr(value)


def _type_hint(kind: str, found: Any, ctx: dict[str, Any]) -> str:
    """How to write a value of the wrong type or out of range, from what was found
    (and the bound it missed, in ``ctx``)."""
    if kind == "size":
        return size_hint(found)
    if kind == "memory_max":
        return MEMORY_HINT
    absent = "null is no value: give one, or leave the field out where it is optional"
    if kind.startswith(("int_", "float_")):
        if isinstance(found, bool):
            return "true and false are not numbers here; write the number"
        if isinstance(found, str) and found.strip().isdigit():
            return f"write {found.strip()} without quotes: a quoted value is a string"
        if found is None:
            return absent
        if isinstance(found, (dict, list)):
            return "give one number here, not a list or a mapping"
        if isinstance(found, float):
            return "write a whole number, without a decimal point"
        return "write a whole number such as 16, with no quotes, units or other characters"
    if kind == "finite_number":
        return ".inf and .nan are not numbers here: write a finite number"
    if kind == "greater_than":
        return f"write a number above {ctx.get('gt', 0)}"
    if kind == "greater_than_equal":
        return f"write {ctx.get('ge', 0)} or more"
    if kind == "less_than_equal":
        le = ctx.get("le")
        if isinstance(le, (int, float)) and not isinstance(le, bool) and le <= 1:
            return f"write a fraction from 0 to {le:g}"
        return "that is far beyond any deployment: check the number for a typo"
    if kind == "string_type":
        if found is None:
            return absent
        if isinstance(found, (dict, list)):
            return "give one string here, not a list or a mapping"
        return "quote it to make it a string, e.g. '...'"
    if kind.startswith("bool_"):
        return absent if found is None else "write true or false, without quotes"
    if kind == "list_type":
        return ("give a list, [] for none: null is no value" if found is None else
                "write a YAML list: [a, b], or one '- item' per line")
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return ("give its fields indented under it: null is no value" if found is None
                else "write its fields indented under it (key: value), or as {key: value}")
    if kind == "too_short":
        return "give at least one item"
    if kind == "max_len":
        return "write a whole number of tokens, such as 32768, or auto"
    if kind == "tokens_per_state":
        return "write a whole number such as 4, or a fraction in quotes such as '1/2'"
    return "see docs/format.md for what this field takes"


#: What a value of each pydantic error type should have been, in the user's words.
EXPECTED = {"int_type": "an integer", "int_parsing": "an integer",
            "finite_number": "a finite number",
            "int_from_float": "an integer", "string_type": "a string",
            "bool_type": "true or false", "bool_parsing": "true or false",
            "list_type": "a list", "dict_type": "a mapping", "model_type": "a mapping",
            "model_attributes_type": "a mapping", "float_type": "a number"}


def expected_of(err: Mapping[str, Any]) -> str:
    """What the value should have been (custom types carry it as their message)."""
    kind, ctx = err["type"], err.get("ctx") or {}
    if kind in EXPECTED:
        return EXPECTED[kind]
    if kind == "greater_than":
        return "a positive integer" if ctx.get("gt") == 0 else f"a number above {ctx['gt']}"
    if kind == "greater_than_equal":
        return "an integer >= 0" if ctx.get("ge") == 0 else f"a number >= {ctx['ge']}"
    if kind == "less_than_equal":
        le = ctx.get("le")
        return f"at most {le:,}" if isinstance(le, int) else f"a number at most {le:g}"
    if kind == "less_than":
        return f"a number below {ctx.get('lt')}"
    if kind == "too_short":
        return f"at least {ctx.get('min_length', 1)} item(s)"
    # pydantic's own sentence, without its "Input should be" (the user wrote no input)
    msg = str(err["msg"])
    return msg.removeprefix("Input should be ").removeprefix("Value error, ")


#: Field names users write (often vLLM's or Hugging Face's), and the field they mean.
FIELD_SYNONYMS = {"window": "sliding_window", "window_size": "sliding_window",
                  "chunk": "attention_chunk_size", "chunk_size": "attention_chunk_size",
                  "heads": "num_kv_heads", "kv_heads": "num_kv_heads",
                  "num_heads": "num_kv_heads", "num_key_value_heads": "num_kv_heads",
                  "head_dim": "head_size", "max_len": "max_model_len",
                  "max_seq_len": "max_model_len", "tp": "tensor", "pp": "pipeline",
                  "dcp": "decode_context", "kv_cache_layout": "layout",
                  "enable_prefix_caching": "prefix_caching", "torch_dtype": "dtype",
                  "cache_dtype": "kv_cache_dtype", "repeats": "repeat"}

#: Words users write for a layer kind, and the kind they mean.
KIND_SYNONYMS = {"full": "full_attention", "attention": "full_attention",
                 "sliding": "sliding_window", "swa": "sliding_window",
                 "local": "chunked_local", "chunked": "chunked_local",
                 "mamba2": "mamba", "mamba1": "mamba", "gdn": "mamba", "linear": "mamba",
                 "ssm": "mamba", "cross": "cross_attention", "encoder": "encoder_only"}


def _literal_error(doc: Document, loc: tuple, err: Mapping[str, Any], found: Any,
                   found_s: str | None) -> SourceError:
    expected = (err.get("ctx") or {}).get("expected")
    hint = None
    if isinstance(found, str) and found.strip() in _bare_options(expected):
        # `kvspec: '1'`: the value is right but quoted, so YAML made it a string
        hint = f"write {found.strip()} without quotes: YAML reads {found_s} as a string"
    elif isinstance(found, str):
        options = [o.strip().strip("'") for o in str(expected).replace(" or ", ", ").split(",")]
        guess = KIND_SYNONYMS.get(found) if loc[-1] == "kind" else None
        close = [guess] if guess else difflib.get_close_matches(found, options, n=1, cutoff=0.5)
        close = close or [o for o in options if o.startswith(found)][:1]
        hint = f"did you mean {close[0]!r}?" if close else None
    elif isinstance(found, bool) and str(expected).isdigit():
        hint = f"true and false are not numbers here; write {expected}"
    hint = hint or "write one of the values above, spelled as shown"
    return doc.error(f"invalid value for {loc[-1]!r}", loc, expected=expected, found=found_s,
                     hint=hint)


def _bare_options(expected: Any) -> list[str]:
    """The options of a literal that are written unquoted (numbers, not strings)."""
    return [o.strip() for o in str(expected).replace(" or ", ", ").split(",")
            if o.strip() and not o.strip().startswith("'")]


def parse_source(doc: Document) -> m.Source:
    """The source model of ``doc``; an :class:`ErrorList` of every schema problem."""
    if not isinstance(doc.data, dict):
        raise SourceError("a kvspec source must be a YAML mapping", file=doc.file, line=1,
                          column=1, expected="kvspec: 1, name: ..., engine: ..., layers: ...",
                          found=yaml_repr(doc.data)[:80],
                          hint="a source is fields at the top level, from kvspec: 1 on; "
                               "see layouts/ for examples")
    try:
        return m.Source.model_validate(doc.data)
    except ValidationError as exc:
        raise ErrorList([schema_error(doc, e) for e in exc.errors(include_url=False)]) from None
