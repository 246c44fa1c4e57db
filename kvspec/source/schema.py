"""The source schema (format version 1): what a ``layouts/*.yaml`` file may say.

The JSON Schema in ``schemas/source.schema.json`` is generated from these
models (``kvspec schema``); editors use it to complete and check fields.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PlainValidator,
    Tag,
    WithJsonSchema,
    field_validator,
)
from pydantic_core import PydanticCustomError

from kvspec.files import MAX_MEMORY, SIZE_EXPECTED, SIZE_PATTERN, size_bytes
from kvspec.model.axes import DEFAULT_AXIS_ORDER, AxisOrderName
from kvspec.model.engine import MambaCacheMode
from kvspec.model.kinds import SOURCE_KIND_NAMES
from kvspec.model.pooling import Policy, Pooling, Runtime, TimeUnit, Workload, declared
from kvspec.model.specs.state import MAMBA_TYPES
from kvspec.model.workloads import PRESETS, TraceFormat

#: Largest values the format takes: far above any deployment, small enough that
#: nothing is ever built from a typo's size (a list of 10^9 pipeline stages).
MAX_TOKENS = 2**31
MAX_RANKS = 4096
#: Requests a workload summary draws for ``auto`` to simulate: each candidate replays
#: them all, so a typo's million would run for many minutes.
MAX_REQUESTS = 100_000
#: Bins of a workload histogram.
MAX_BINS = 10_000

#: A positive integer (booleans and strings are not), at most ``MAX_TOKENS``.
PositiveInt = Annotated[int, Field(gt=0, le=MAX_TOKENS)]
Ranks = Annotated[int, Field(gt=0, le=MAX_RANKS)]


def _size(value: Any) -> int:
    n = size_bytes(value)
    if n is None:
        raise PydanticCustomError("size", SIZE_EXPECTED)
    if n > MAX_MEMORY:
        raise PydanticCustomError("memory_max", "at most 256TiB per rank")
    return n


def _max_len(value: Any) -> int | str:
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool)
                           and 0 < value <= MAX_TOKENS):
        return value
    raise PydanticCustomError("max_len", "a positive number of tokens, or auto")


def _tokens_per_state(value: Any) -> int | str:
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_TOKENS:
        return value
    if isinstance(value, str) and re.fullmatch(r"\s*[0-9]+\s*(/\s*[0-9]+\s*)?", value):
        try:
            frac = Fraction(re.sub(r"\s+", "", value))
        except (ValueError, ZeroDivisionError):
            frac = None
        if frac is not None and 0 < frac <= MAX_TOKENS:
            return value
    raise PydanticCustomError("tokens_per_state",
                              "a positive integer, or a fraction such as '1/2'")


#: Tokens one stored state covers: a positive integer or a positive fraction ("1/2").
TokensPerState = Annotated[int | str, PlainValidator(_tokens_per_state), WithJsonSchema(
    {"anyOf": [{"type": "integer", "minimum": 1, "maximum": MAX_TOKENS},
               {"type": "string", "pattern": r"^\s*0*[1-9][0-9]*\s*(/\s*0*[1-9][0-9]*\s*)?$"}]})]

#: Bytes, or a size such as ``40GiB`` (one grammar everywhere: :mod:`kvspec.files`).
Size = Annotated[int, PlainValidator(_size), WithJsonSchema(
    {"anyOf": [{"type": "integer", "minimum": 0, "maximum": MAX_MEMORY},
               {"type": "string", "pattern": SIZE_PATTERN}]})]
#: A positive number of tokens, or ``auto``.
MaxLen = Annotated[int | str, PlainValidator(_max_len), WithJsonSchema(
    {"anyOf": [{"type": "integer", "minimum": 1, "maximum": MAX_TOKENS}, {"const": "auto"}]})]

#: The ``kind`` a source may give a layer: every declarable kind of the registry.
LayerKind = Literal[SOURCE_KIND_NAMES]  # type: ignore[valid-type]

_MAMBA_TYPE_NAMES = tuple(MAMBA_TYPES)
MambaType = Literal[_MAMBA_TYPE_NAMES]  # type: ignore[valid-type]



def _declared(cls: type, name: str, **bounds: Any) -> Any:
    """The field ``name`` of the model's ``cls`` (:mod:`kvspec.model.pooling`, where
    pooling is declared once) as a source field: its default and description, with
    the ``bounds`` the source checks."""
    f = declared(cls, name)
    return Field(f.default, description=f.metadata["doc"], **bounds)


class _Strict(BaseModel):
    # strict: YAML's types are the values' types (true is not 1, '8' is not 8); no
    # .inf or .nan: no field of the format is infinite, and NaN compares to nothing
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class LayerFields(_Strict):
    """Fields a layer may set; defaults < layer type < layer entry."""

    kind: LayerKind | None = Field(None, description="The layer's KV cache kind.")
    layer_name: str | None = Field(
        None, description="Name template for layers of this type, e.g. "
        "'model.layers.{index}.mixer'; overrides the top-level layer_name.")
    num_kv_heads: PositiveInt | None = Field(
        None, description="KV heads of the whole model (split across tensor-parallel ranks).")
    head_size: PositiveInt | None = None
    head_size_v: int | None = Field(None, ge=0, description="V head size when it differs from K.")
    dtype: str | None = Field(None, description="Model (activation) dtype, e.g. bfloat16.")
    kv_cache_dtype: str | None = Field(
        None, description="Quantization mode of this layer's cache (overrides "
        "quantization.kv_cache_dtype); 'auto' stores it in the model dtype.")
    block_size: PositiveInt | None = Field(None, description="This layer's own block size.")
    sliding_window: PositiveInt | None = None
    attention_chunk_size: PositiveInt | None = None
    sink_len: int | None = Field(None, ge=0)
    rswa_window: PositiveInt | None = None
    tokens_per_state: TokensPerState | None = Field(
        None, description="Tokens one stored state covers (4 for a 4:1 compressed "
        "indexer; a fraction like '1/2' stores several states per token).")
    state_content_bytes: PositiveInt | None = Field(
        None, description="Bytes per (head slot, state) cell when the backend packs it.")
    num_head_slots: PositiveInt | None = None
    block_stride_alignment: PositiveInt | None = None
    alignment: PositiveInt | None = Field(None, description="MLA page row alignment.")
    page_size_padded: PositiveInt | None = None
    model_version: str | None = None
    bounded_replay: bool | None = None
    non_causal: bool | None = None
    # state layers
    shapes: list[list[PositiveInt]] | None = Field(
        None, description="State shapes of one rank, conv state first (as the engine "
        "reports them).")
    dtypes: list[str] | None = None
    mamba_type: MambaType | None = None
    num_speculative_blocks: int | None = Field(None, ge=0)
    num_prefill_checkpoint_blocks: int | None = Field(None, ge=0)
    prefill_checkpoint_alignment: PositiveInt | None = None
    tp_replicated: bool | None = None


class LayerEntry(LayerFields):
    """One layer: of a named type, or spelled out in full."""

    type: str | None = Field(None, description="A name from layer_types.")
    name: str | None = Field(None, description="Explicit layer name (no index is consumed).")
    index: int | None = Field(None, ge=0, description="Decoder-layer index to continue from.")
    repeat: Annotated[int, Field(gt=0)] = Field(1, description="Repeat this layer this many times.")


class PatternEntry(_Strict):
    """``repeat`` times the decoder layers of ``pattern``.

    Each pattern item is a layer type name, several joined by ``+`` for one
    decoder layer that owns several caches (e.g. ``mla+indexer``), or ``-`` for a
    decoder layer without a cache (it only takes an index).
    """

    pattern: list[str] = Field(min_length=1)
    repeat: Annotated[int, Field(gt=0)] = 1
    index: int | None = Field(None, ge=0)


def _entry_tag(value: Any) -> str:
    if isinstance(value, dict):
        return "pattern" if "pattern" in value else "layer"
    return "pattern" if hasattr(value, "pattern") else "layer"


Entry = Annotated[
    Annotated[PatternEntry, Tag("pattern")] | Annotated[LayerEntry, Tag("layer")],
    Discriminator(_entry_tag)]


class DraftPolicy(_Strict):
    """A GLM-5-Next-style drafter's own pool (the reference's VLLM_GLM5NEXT_DRAFT_*)."""

    pool: bool = Field(True, description="Give drafter layers a pool of their own.")
    block_size: PositiveInt | None = Field(None, description="Drafter block size (multiple of 64).")
    pool_blocks: PositiveInt | None = Field(None, description="Blocks in the drafter's pool.")


class EnginePolicy(_Strict):
    """Pooling policy: the engine settings that shape the plan."""

    block_size: PositiveInt = 16
    max_model_len: MaxLen = Field(
        description="Longest request, or 'auto' to fit it to memory (up to model_max_len).")
    model_max_len: PositiveInt | None = Field(
        None, description="The model's own maximum length; needed when max_model_len is auto.")
    max_num_batched_tokens: PositiveInt = 8192
    max_num_seqs: PositiveInt = 256
    max_num_encoder_input_tokens: PositiveInt | None = None
    async_scheduling: bool | None = Field(
        None, description="Default: on for one pipeline stage (doubles in-flight tokens).")
    layout: AxisOrderName = DEFAULT_AXIS_ORDER.name
    hybrid: bool = Field(True, description="false: allocate local attention as full attention "
                         "(vLLM's --disable-hybrid-kv-cache-manager).")
    prefix_caching: bool = True
    prefix_match_unit: PositiveInt | None = None
    memory: Size | None = Field(
        None, description="KV cache memory per rank: bytes or '40GiB'. Optional: the loader "
        "can decide it.")
    num_blocks: PositiveInt | None = Field(
        None, description="Fix the block count (vLLM's num_gpu_blocks_override).")
    mamba_cache_mode: MambaCacheMode = "none"
    mamba_block_size: PositiveInt | None = None
    prefill_lookahead_tokens: int = Field(0, ge=0)
    speculative_method: str | None = None
    draft: DraftPolicy = DraftPolicy()


class Parallelism(_Strict):
    tensor: Ranks = 1
    pipeline: Ranks = 1
    decode_context: Ranks = 1
    pipeline_partition: list[PositiveInt] | None = Field(
        None, description="Decoder layers per pipeline stage (VLLM_PP_LAYER_PARTITION).")
    num_hidden_layers: PositiveInt | None = Field(
        None, description="Decoder layers of the model (default: the highest index + 1).")


class Quantization(_Strict):
    kv_cache_dtype: str = Field("auto", description="auto, fp8, fp8_e5m2, int8_per_token_head, ...")
    skip_layers: list[int] = Field(
        default_factory=list, description="Decoder-layer indices kept in the model dtype.")


class Distribution(_Strict):
    """Token counts of requests: lognormal around ``mean`` (``spread``: the standard
    deviation of their logarithm), or a histogram of ``[tokens, weight]`` bins."""

    mean: PositiveInt | None = None
    spread: Annotated[float, Field(ge=0, le=4)] = 0.5
    histogram: list[list[float]] | None = Field(
        None, min_length=1, max_length=MAX_BINS,
        description="[[tokens, weight], ...]: bins instead of a mean.",
        json_schema_extra={"items": {  # what _bins checks, for editors
            "type": "array", "minItems": 2, "maxItems": 2, "prefixItems": [
                {"type": "number", "multipleOf": 1, "minimum": 1, "maximum": MAX_TOKENS},
                {"type": "number", "exclusiveMinimum": 0, "maximum": 1e12}]}})

    @field_validator("histogram")
    @classmethod
    def _bins(cls, bins: list[list[float]] | None) -> list[list[float]] | None:
        for b in bins or ():  # finite (allow_inf_nan), so int() and the bounds hold
            if len(b) != 2 or b[0] != int(b[0]) or not 1 <= b[0] <= MAX_TOKENS or b[1] <= 0 \
                    or b[1] > 1e12:
                raise PydanticCustomError(
                    "histogram_bin", "each bin is [tokens, weight]: a whole number of "
                    "tokens from 1 to 2^31 and a positive weight up to 1e12, not {bin}", {"bin": b})
        return bins


def _tokens_kind(value: Any) -> str:
    return "distribution" if isinstance(value, (dict, Distribution)) \
        else "mean"


#: Tokens per request: a mean (a number), or a distribution. Tagged by the input's
#: shape, so an error speaks of the one it was meant as, not both.
Tokens = Annotated[
    Annotated[PositiveInt, Tag("mean")] | Annotated[Distribution, Tag("distribution")],
    Discriminator(_tokens_kind)]


class ColumnMap(_Strict):
    """Where a ``lengths`` trace keeps each figure (docs/traces.md)."""

    prompt: str = Field(min_length=1, description="The prompt length's column (or key).")
    output: str = Field(min_length=1, description="The output length's column (or key).")
    time: str | None = Field(None, min_length=1, description="The arrival time's column "
                             "(or key); without one every request arrives at step 0.")
    time_unit: TimeUnit = Field("s", description="The unit of the times.")


class WorkloadSpec(_Strict):
    """The traffic the pools must serve: a summary, a ``preset`` fitted to a published
    trace, or ``trace`` (a request trace, its path relative to the source)."""

    trace: str | None = _declared(Workload, "trace", min_length=1)
    format: TraceFormat | None = _declared(Workload, "trace_format")
    columns: ColumnMap | None = _declared(Workload, "columns")
    step_ms: Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False)] = _declared(
        Workload, "step_ms")
    preset: Literal[tuple(PRESETS)] | None = _declared(  # type: ignore[valid-type]
        Workload, "preset")
    context_tokens: Tokens | None = Field(None, description="Prompt tokens per request.")
    output_tokens: Tokens | None = Field(None, description="Generated tokens per request.")
    concurrency: PositiveInt | None = _declared(Workload, "concurrency")
    draft_tokens: int = _declared(Workload, "draft_tokens", ge=0, le=64)
    prefix_sharing: Annotated[float, Field(ge=0, le=1)] = _declared(Workload, "prefix_sharing")
    prefix_tokens: PositiveInt = _declared(Workload, "prefix_tokens")
    requests: Annotated[int, Field(gt=0, le=MAX_REQUESTS)] = _declared(Workload, "requests")
    seed: int = _declared(Workload, "seed", ge=0)


_TRIED = ", ".join(map(str, Pooling().block_sizes))


class StepTimeSpec(_Strict):
    """The step-time model ``auto`` times its candidates on."""

    profile: str = Field(min_length=1, description="A step-time profile (docs/latency.md), "
                         "its path relative to the source.")


class PoolingPolicy(_Strict):
    """How memory is pooled: unified (vLLM's plan), separate pools per layer class,
    or auto (the candidate with the highest capacity at the workload)."""

    policy: Policy = _declared(Pooling, "policy")
    serve_with: Runtime = _declared(Pooling, "serve_with")
    workload: WorkloadSpec | None = _declared(Pooling, "workload")
    split: dict[str, Annotated[float, Field(gt=0, le=1)]] | None = _declared(Pooling, "split")
    max_groups: PositiveInt | None = _declared(Pooling, "max_groups")
    state_block_size: PositiveInt | None = _declared(Pooling, "state_block_size")
    block_size: PositiveInt = _declared(Pooling, "block_size")
    block_sizes: list[PositiveInt] | None = Field(
        None, min_length=1, description="auto: the attention block sizes its unified "
        f"candidates try (default {_TRIED}); name those the serving engine's attention "
        "kernels take (vLLM's CPU backend: multiples of 32).")
    slo: dict[str, str | int | float] | None = Field(
        None, min_length=1, description="auto: limits per request, METRIC_pNN: TIME "
        "(ttft_p99: 2s, tpot_p50: 50ms; metrics queue, ttft, tpot, e2e): the candidate "
        "with the highest goodput wins.", json_schema_extra={"propertyNames": {
            "pattern": r"^[a-z0-9]+_p[0-9]+(\.[0-9]+)?$"}})
    step_time: StepTimeSpec | None = Field(
        None, description="auto: time the candidates on a step-time profile: the highest "
        "goodput (with slo) or throughput wins.")


def version_not_a_bool(value: Any) -> Any:
    """A format version (a source's ``kvspec``, a grid's ``kvspec_sweep``) as given,
    unless it is a boolean: ``Literal[1]`` takes True even when strict (True == 1 and
    hashes alike), and YAML's true is not a format version."""
    if isinstance(value, bool):
        raise PydanticCustomError("literal_error", "Input should be 1", {"expected": "1"})
    return value


class Source(_Strict):
    """A kvspec layout source, format version 1."""

    kvspec: Literal[1] = Field(description="Source format version.")
    name: str = Field(min_length=1)
    model: str | None = Field(None, description="Where the model comes from, e.g. a HF id.")
    architecture: str | None = Field(
        None, description="The model's architecture as its config names it, e.g. "
        "LlamaForCausalLM (recorded in the artifact; plans nothing).")
    description: str | None = None
    layer_name: str = "model.layers.{index}.self_attn.attn"
    engine: EnginePolicy
    parallel: Parallelism = Parallelism()
    defaults: LayerFields = LayerFields()
    quantization: Quantization = Quantization()
    pooling: PoolingPolicy = PoolingPolicy()
    layer_types: dict[str, LayerFields] = Field(
        default_factory=dict,  # names as _type_names takes them, for editors
        json_schema_extra={"propertyNames": {"pattern": r"^(?!\s*-?\s*$)[^+]*$"}})
    layers: list[Entry] = Field(default_factory=list)

    @field_validator("kvspec", mode="before")
    @classmethod
    def _version_is_not_a_bool(cls, value: Any) -> Any:
        return version_not_a_bool(value)

    @field_validator("layer_types")
    @classmethod
    def _type_names(cls, value: dict[str, LayerFields]) -> dict[str, LayerFields]:
        for name in value:
            if "+" in name or not name.strip() or name.strip() == "-":
                raise ValueError(f"layer type name {name!r} must be non-empty, not '-' and "
                                 "not contain '+'")
        return value
