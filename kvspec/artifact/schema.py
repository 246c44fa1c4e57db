"""The artifact format as pydantic models: the schema an artifact must match.

``artifact.schema.json`` is generated from :class:`LayoutArtifact`; the reader
(:mod:`kvspec.artifact.verify`) uses :func:`schema_problems` to say precisely
what is malformed in an artifact it cannot read back. The models build on
first use, so importing kvspec costs nothing for them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvspec.artifact import FORMAT
from kvspec.model.axes import AxisOrderName
from kvspec.model.engine import MambaCacheMode
from kvspec.model.plan import STRATEGIES
from kvspec.model.quant.formats import KV_CACHE_DTYPES

# ---------------------------------------------------------------------------
# the artifact format, as a pydantic model
# ---------------------------------------------------------------------------


class _Closed(BaseModel):
    """An object with exactly these fields (the compiler writes every one)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True,
                              populate_by_name=True, defer_build=True)


class AffineBytes(_Closed):
    """A byte quantity that scales with the pool: ``per_block * num_blocks + fixed``.

    Written as a plain integer when ``per_block`` is 0.
    """

    per_block: NonNeg = Field(description="Bytes per block of the pool (the coefficient of "
                              "num_blocks).")
    fixed: NonNeg = Field(description="Bytes independent of num_blocks.")


Pos = Annotated[int, Field(ge=1)]
NonNeg = Annotated[int, Field(ge=0)]
#: A kv_cache_dtype the compiler accepts (kvspec.model.quant.formats.KV_CACHE_DTYPES).
CacheDtype = Literal[KV_CACHE_DTYPES]  # type: ignore[valid-type]

Bytes = Annotated[NonNeg | AffineBytes, Field(
    description="Bytes: an integer, or {per_block, fixed} when it depends on num_blocks.")]
Sha256 = Annotated[str, Field(pattern="^[0-9a-f]{64}$")]


class SpecDescription(BaseModel):
    """A layer spec as the planner sees it (``LayerSpec.describe()``).

    The fields common to every kind are listed; each kind adds its own
    (``num_kv_heads``, ``head_size``, ``sliding_window``, ``shapes``, ...).
    """

    model_config = ConfigDict(extra="allow", frozen=True, strict=True,
                              populate_by_name=True, defer_build=True)

    kind: str = Field(description="The layer kind, e.g. full_attention, sliding_window, mamba.")
    class_: str = Field(alias="class", description="The reference planner's spec class.")
    block_size: int = Field(description="Tokens per block.")
    page_size_bytes: int = Field(description="Bytes of one page (padded where padding applies).")
    prefix_cacheable: bool
    kv_cache_specs: dict[str, SpecDescription] = Field(
        default_factory=dict, description="A group of several kinds: the spec of each member "
        "layer (UniformTypeKVCacheSpecs).")


class EngineSettings(_Closed):
    """The engine policy the plan was made for, with derived values resolved."""

    async_scheduling: bool
    block_size: Pos
    decode_context_parallel_size: Pos
    draft_block_size: Pos | None
    draft_pool: bool
    draft_pool_blocks: Pos | None
    enable_prefix_caching: bool
    hybrid: bool
    kv_cache_dtype: CacheDtype
    layout: AxisOrderName
    mamba_block_size: Pos | None
    mamba_cache_mode: MambaCacheMode
    max_in_flight_tokens: Pos
    max_model_len: Pos = Field(description="After fitting to the budget when the source "
                               "says max_model_len: auto.")
    max_num_batched_tokens: Pos
    max_num_encoder_input_tokens: NonNeg | None
    max_num_seqs: Pos
    model_max_len: Pos
    num_blocks: Pos | None = Field(description="A fixed block count from the source, if any.")
    num_prefill_lookahead_tokens: NonNeg
    original_max_model_len: Annotated[int, Field(ge=-1)] | None = Field(
        description="-1 when the source says auto.")
    pipeline_parallel_size: Pos
    pp_layer_partition: list[NonNeg] | None
    prefix_match_unit: Pos | None
    speculative_method: str | None
    tensor_parallel_size: Pos
    total_num_hidden_layers: Pos | None


class CellPartEntry(_Closed):
    """One addressable run inside a layer's cell (a view the loader exposes)."""

    name: str
    dtype: str
    byte_offset: int
    count: int


class LayerPlacement(_Closed):
    """Where one layer lives: its group (None: not grouped) and pipeline stage."""

    group: int | None
    stage: int
    spec: SpecDescription
    kv_cache_dtype: str | None = Field(
        None, description="The layer's quantization mode (None for state layers).")
    cell_parts: list[CellPartEntry] | None = Field(
        None, description="Addressable parts of a cell (K, V, scales, ...); None: opaque.")
    per_tensor_scales: bool = Field(
        False, description="The layer has per-tensor k/v scale constants outside the cache.")


class GroupEntry(_Closed):
    """One group: layers sharing one block table."""

    id: int
    kind: str
    class_: str = Field(alias="class")
    strategy: Literal[STRATEGIES] = Field(  # type: ignore[valid-type]
        description="The grouping strategy that made the group.")
    role: str = Field(description="The group's role in its strategy (state slots: "
                      "attention, tail, state, draft; else empty).")
    layers: list[str]
    block_size: int
    page_size_bytes: int
    page_size_padded: int | None
    padding_slots: int = Field(description="Slots of this group no layer uses (aliasing "
                               "layouts pad smaller groups to the largest).")
    useful_bytes_per_block: int
    padding_bytes_per_block: int
    own_pool: bool
    is_eagle: bool
    prefix_cacheable: bool
    max_memory_usage_bytes: int
    blocks_per_request: int
    max_num_blocks_per_req: int | None
    spec: SpecDescription


class TensorEntry(_Closed):
    """Placement of same-shaped layers in a pool:
    ``offset + l * layer_stride + b * block_stride`` (bytes)."""

    layers: list[str]
    size: Bytes
    layer_stride: Bytes
    block_stride: Bytes
    offset: Bytes
    host_resident: bool
    pool: str = Field(description="'device' (the main pool) or 'draft' (a drafter's own pool).")
    role: str
    group: int
    spec: SpecDescription


class StageEntry(_Closed):
    """One pipeline stage: its layers, bytes per block and tensors."""

    index: int
    layers: list[str]
    bytes_per_block: int
    fixed_bytes: int
    draft_num_blocks: int | None
    draft_layers: list[str]
    memory_per_request: int
    min_num_blocks: int
    groups: list[list[str]]
    tensors: list[TensorEntry]


class BudgetEntry(_Closed):
    """Capacity for the memory budget the artifact was compiled with."""

    memory: int
    num_blocks: int
    max_concurrency: float
    kv_cache_size_tokens: int
    max_model_len: int
    estimated_max_model_len: int


class LogEntry(_Closed):
    level: Literal["INFO", "WARNING"]
    message: str


class LayoutBody(_Closed):
    """The plan; ``body_sha256`` is the sha256 of its canonical JSON."""

    name: str
    model: str | None
    engine: EngineSettings
    layers: dict[str, LayerPlacement]
    groups: list[GroupEntry]
    stages: list[StageEntry]
    scheduler_block_size: int
    hash_block_size: int
    needs_zeroing: bool
    budget: BudgetEntry | None = Field(description="Present when compiled with a memory "
                                       "budget (engine.memory or --memory).")
    log: list[LogEntry]
    warnings: list[str] = Field(description="Early checks: what would go wrong or waste "
                                "memory in the engine (kvspec.planner.checks).")


class LayoutArtifact(_Closed):
    """A frozen kvspec layout artifact (``*.kvlayout.json``)."""

    format: Literal["kvspec.layout/2"] = Field(description="Artifact format version.")
    compiler: str = Field(pattern=r"^kvspec \S+$", description="The compiler that wrote it.")
    source_sha256: Sha256 = Field(description="sha256 of the source text.")
    sha256: Sha256 = Field(description="sha256 of the canonical compact JSON of every other "
                           "field (format, compiler, source_sha256 and body).")
    body: LayoutBody


assert FORMAT == "kvspec.layout/2", "update LayoutArtifact.format with the artifact format"


class _InputsBody(BaseModel):
    """The parts of a body the planner reads as they are (not re-derived)."""

    model_config = ConfigDict(extra="allow", frozen=True, strict=True, defer_build=True)

    name: str
    model: str | None
    engine: EngineSettings
    layers: dict[str, Any]
    stages: list[Any]
    budget: BudgetEntry | None


class _InputsEnvelope(_Closed):
    format: Literal["kvspec.layout/2"]
    compiler: str = Field(pattern=r"^kvspec \S+$")
    source_sha256: Sha256
    sha256: Sha256
    body: _InputsBody


def _problems(model: type[BaseModel], data: Any) -> list[str]:
    """Each way ``data`` does not match ``model``, as ``path: message``."""
    try:
        model.model_validate(data)
    except ValidationError as exc:
        return [f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}"
                for e in exc.errors(include_url=False)]
    return []


def input_problems(data: Any) -> list[str]:
    """What in ``data``'s envelope and planning inputs (engine, budget, names) does
    not match the schema: the cheap check made on every read. What the planner
    derives is checked by planning again, so the full schema
    (:func:`schema_problems`) is needed only to explain a failure."""
    return _problems(_InputsEnvelope, data)


def schema_problems(data: Any) -> list[str]:
    """What in ``data`` (a parsed artifact) does not match the schema (empty: it does)."""
    return _problems(LayoutArtifact, data)
