"""The per-layer spec dump format, as pydantic models (``tests/conformance/FORMAT.md``).

A dump that does not match is refused with every problem at once, each placed
at its line and column in the dump's JSON (the JSON text is read again with
YAML's composer, which keeps positions, only when there is an error).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveInt,
    ValidationError,
)

from kvspec.errors import ErrorList, SourceError
from kvspec.integrations.dump.jsontext import positions
from kvspec.model.axes import AxisOrderName
from kvspec.model.engine import MambaCacheMode
from kvspec.model.kinds import SOURCE_KIND_NAMES
from kvspec.model.specs.state import MAMBA_TYPES
from kvspec.source.document import Document, format_path

Kind = Literal[SOURCE_KIND_NAMES]  # type: ignore[valid-type]
Dim = Annotated[int, Field(gt=0, strict=True)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class DumpConfig(BaseModel):
    """The engine settings of a dump (other keys a dump carries are ignored)."""

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)

    block_size: PositiveInt
    max_model_len: PositiveInt
    original_max_model_len: int | None = None
    available_memory_bytes: NonNegativeInt | None = None
    kv_cache_dtype: str = "auto"
    enable_prefix_caching: bool | None = None
    disable_hybrid_kv_cache_manager: bool = False
    tensor_parallel_size: PositiveInt = 1
    pipeline_parallel_size: PositiveInt = 1
    decode_context_parallel_size: PositiveInt = 1
    num_gpu_blocks_override: PositiveInt | None = None
    max_num_batched_tokens: PositiveInt | None = None
    max_num_seqs: PositiveInt | None = None
    max_num_encoder_input_tokens: PositiveInt | None = None
    kv_cache_layout: AxisOrderName | None = None
    mamba_cache_mode: MambaCacheMode | None = None
    mamba_block_size: PositiveInt | None = None
    prefix_match_unit: PositiveInt | None = None
    async_scheduling: bool | None = None
    speculative_method: str | None = None
    num_prefill_lookahead_tokens: NonNegativeInt | None = None
    num_hidden_layers: PositiveInt | None = None


class DumpLayer(_Strict):
    """One layer of one rank, as the engine reports its spec."""

    name: str = Field(min_length=1)
    kind: Kind
    num_kv_heads: PositiveInt | None = None
    head_size: PositiveInt | None = None
    head_size_v: NonNegativeInt | None = None
    dtype: str | None = None
    cache_dtype_str: str | None = None
    sliding_window: PositiveInt | None = None
    attention_chunk_size: PositiveInt | None = None
    sink_len: NonNegativeInt | None = None
    rswa_window: PositiveInt | None = None
    tokens_per_state: PositiveInt | str | None = None
    state_content_bytes: PositiveInt | None = None
    num_head_slots: PositiveInt | None = None
    block_stride_alignment: PositiveInt | None = None
    alignment: PositiveInt | None = None
    page_size_padded: PositiveInt | None = None
    block_size: PositiveInt | None = None
    model_version: str | None = None
    bounded_replay: bool | None = None
    max_tp_shards: PositiveInt | None = None
    shapes: list[list[Dim]] | None = None
    dtypes: list[str] | None = None
    mamba_type: Literal[tuple(MAMBA_TYPES)] | None = None  # type: ignore[valid-type]
    num_speculative_blocks: NonNegativeInt | None = None
    num_prefill_checkpoint_blocks: NonNegativeInt | None = None
    prefill_checkpoint_alignment: PositiveInt | None = None
    tp_replicated: bool | None = None

    def fields(self) -> dict[str, Any]:
        """The fields a source's layer type takes (all but name and cache mode)."""
        return self.model_dump(exclude_none=True, exclude={"name", "cache_dtype_str",
                                                           "max_tp_shards"})


class Dump(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)

    name: str | None = None
    model: str | None = None
    facts: str | None = None
    config: DumpConfig
    layers: list[DumpLayer] = Field(min_length=1)


_FORMAT = "see tests/conformance/FORMAT.md for the dump format"


def _message(err: Mapping[str, Any]) -> tuple[str, str | None, str]:
    """``(message, expected, hint)`` of one pydantic error."""
    kind, loc = err["type"], err["loc"]
    if kind == "missing":
        return f"missing required field {loc[-1]!r}", f"{loc[-1]}: ...", _FORMAT
    if kind == "extra_forbidden":
        return f"unknown field {loc[-1]!r} in a dump layer", "a field of FORMAT.md", _FORMAT
    if kind == "literal_error" and loc[-1] == "kind":
        return (f"kind {err.get('input')!r} is not supported yet",
                "one of " + ", ".join(SOURCE_KIND_NAMES),
                "open an issue with the layer's spec")
    if kind == "literal_error":
        return f"invalid value for {loc[-1]!r}", err.get("ctx", {}).get("expected"), _FORMAT
    if kind == "too_short" and loc == ("layers",):
        return "a dump needs at least one layer", "a non-empty 'layers' list", _FORMAT
    where = format_path(loc)
    expected = _EXPECTED.get(kind)
    if expected is None and kind.startswith(("greater_than", "too_")):
        expected = err["msg"].removeprefix("Input should be ").removeprefix("Value should have ")
    return f"invalid value for {where}", expected or err["msg"], _FORMAT


#: What a value of each pydantic error type should have been, in the user's words.
_EXPECTED = {"int_type": "an integer", "int_parsing": "an integer",
             "int_from_float": "an integer", "string_type": "a string",
             "bool_type": "true or false", "list_type": "a list",
             "dict_type": "a JSON object", "model_type": "a JSON object",
             "model_attributes_type": "a JSON object"}


def validated(data: Any, file: str = "<dump>", text: str | None = None) -> Dump:
    """``data`` checked against the dump format; every problem at its position."""
    if not isinstance(data, dict):
        raise SourceError("a spec dump must be a JSON object", file=file, line=1, column=1,
                          expected='{"config": {...}, "layers": [...]}',
                          found=_kind_of(data),
                          hint="a dump is one JSON object: its format is "
                               "tests/conformance/FORMAT.md")
    try:
        return Dump.model_validate(data)
    except ValidationError as exc:
        doc = Document(data, file)
        if text is not None:
            with contextlib.suppress(SourceError):
                doc = positions(text, file)
        errors = []
        for e in exc.errors(include_url=False):
            message, expected, hint = _message(e)
            found = e.get("input")
            errors.append(doc.error(message, tuple(e["loc"]), expected=expected,
                                    found=None if isinstance(found, (dict, list))
                                    else repr(found), hint=hint))
        raise ErrorList(errors) from None


def _kind_of(value: Any) -> str:
    """What a JSON value is, in the user's words."""
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
             int: "a number", float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)
