"""The artifact format, declared once: ``kvspec.layout/3``.

Every record of a frozen layout is one :class:`msgspec.Struct` below. From this
one declaration come

* the artifact's canonical JSON (:func:`kvspec.artifact.text.canonical`:
  ``msgspec.json.encode`` with sorted keys),
* the validation of untrusted JSON (``msgspec.json.decode(..., type=Envelope)``:
  every field present, of its type and range, nothing unknown),
* the JSON Schema in ``schemas/artifact.schema.json`` (``msgspec.json.schema``),
* and the typed records the runtime, the reports and the connectors read.

The compiler's planner works on richer objects (:mod:`kvspec.model.plan`: layer
specs with their page arithmetic, affine forms with operators); freezing maps
them onto these records once (:mod:`kvspec.compiled`), and nothing reads a plan
back from untyped dicts.

Byte quantities that depend on the pool's block count ``N`` are *affine*:
written as a plain integer when they do not depend on it, else as
``{"per_block": a, "fixed": b}`` meaning ``a * N + b``.

>>> import msgspec
>>> msgspec.json.decode(b'{"per_block": 4096, "fixed": 0}', type=Bytes)
Affine(per_block=4096, fixed=0)
>>> at(Affine(per_block=4096, fixed=8), 10), at(12, 10)
(40968, 12)
"""

# one idea: the artifact format is one declaration; split, its records would be
# declared in pieces that must change together.

from __future__ import annotations

import dataclasses
import typing
from fractions import Fraction
from typing import Annotated, Any, Literal, Union, cast

import msgspec
from msgspec import Meta

from kvspec.model import kinds
from kvspec.model.axes import AxisOrderName
from kvspec.model.budget import Budget
from kvspec.model.pooling import PlanPolicy, Policy, Runtime
from kvspec.model.quant.formats import KV_CACHE_DTYPES
from kvspec.model.specs.uniform import UniformType

__all__ = [
    "FORMAT", "FORMAT_VERSION", "Affine", "Allocation", "Budget", "Bytes", "Candidate",
    "CellPart", "Envelope", "Engine", "Group", "Layer", "Layout", "LogLine", "Pool",
    "PoolShare", "PoolingRecord", "Simulated", "Spec", "Stage", "Tensor", "Unsigned", "View",
    "WaitingSteps", "Waste", "WorkloadRecord", "at",
]

FORMAT_VERSION = 3
FORMAT = f"kvspec.layout/{FORMAT_VERSION}"

NonNeg = Annotated[int, Meta(ge=0)]
Pos = Annotated[int, Meta(ge=1)]
Sha256 = Annotated[str, Meta(pattern="^[0-9a-f]{64}$")]
#: A quantization mode the compiler accepts (kvspec.model.quant.formats).
CacheDtype = Literal[KV_CACHE_DTYPES]  # type: ignore[valid-type]


# Every subclass repeats frozen=True: msgspec inherits it, but type checkers read
# dataclass_transform (PEP 681) class by class and would take a subclass as mutable.
class Record(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A closed record: exactly these fields, each one written (no defaults
    left out), so decoding and encoding again gives the same text."""


class Affine(Record, frozen=True):
    """``per_block * N + fixed`` bytes, ``N`` the pool's block count."""

    per_block: NonNeg
    fixed: NonNeg


#: Bytes: an integer, or an :class:`Affine` form when it depends on ``N``.
Bytes = NonNeg | Affine


def at(value: int | Affine, num_blocks: int) -> int:
    """The bytes ``value`` stands for when the pool has ``num_blocks`` blocks."""
    if type(value) is int:
        return value
    return value.per_block * num_blocks + value.fixed  # type: ignore[union-attr]


def affine(value: Any) -> int | Affine:
    """An affine form with ``.a`` and ``.b`` (:class:`kvspec.model.affine.Affine`)
    as it is written: a plain integer when it does not depend on ``N``."""
    if value.a == 0:
        return int(value.b)
    return Affine(per_block=int(value.a), fixed=int(value.b))


# ---------------------------------------------------------------------------
# the engine the plan was made for
# ---------------------------------------------------------------------------


class Engine(Record, frozen=True):
    """The engine settings the plan was made for, derived values resolved."""

    async_scheduling: bool
    axis_order: AxisOrderName
    block_size: Pos
    decode_context_parallel_size: Pos
    draft_block_size: Pos | None
    draft_pool: bool
    draft_pool_blocks: Pos | None
    enable_prefix_caching: bool
    hybrid: bool
    #: The deployment's default mode, as given (each layer's own is in ``layers``).
    kv_cache_dtype: str
    mamba_block_size: Pos | None
    mamba_cache_mode: Literal["none", "align", "all"]
    max_in_flight_tokens: Pos
    #: After fitting to the budget when the source says ``max_model_len: auto``.
    max_model_len: Pos
    max_num_batched_tokens: Pos
    max_num_encoder_input_tokens: NonNeg | None
    max_num_seqs: Pos
    #: The ``max_model_len`` the plan was made for (before any fitting).
    model_max_len: Pos
    #: A fixed block count from the source (vLLM's ``num_gpu_blocks_override``).
    num_blocks: Pos | None
    num_prefill_lookahead_tokens: NonNeg
    #: -1 when the source says ``max_model_len: auto``.
    original_max_model_len: Annotated[int, Meta(ge=-1)] | None
    pipeline_parallel_size: Pos
    pp_layer_partition: list[NonNeg] | None
    prefix_match_unit: Pos | None
    speculative_method: str | None
    tensor_parallel_size: Pos
    total_num_hidden_layers: Pos | None


# ---------------------------------------------------------------------------
# layer specs: one record per kind, derived from the kinds registry
# ---------------------------------------------------------------------------

#: How a spec field's Python type is written in JSON (fractions as text, "1/2").
_JSON_TYPES: dict[Any, Any] = {
    int: int, bool: bool, str: str, int | None: int | None, str | None: str | None,
    int | Fraction: int | str, tuple[str, ...]: list[str],
    tuple[tuple[int, ...], ...]: list[list[int]],
}


class SpecRecord(Record, frozen=True, tag_field="kind", rename={"class_": "class"}):
    """A layer spec as the planner describes it (:func:`kvspec.model.kinds.describe`):
    every field of its kind, the reference's class name and the derived page size."""

    class_: str
    page_size_bytes: NonNeg
    prefix_cacheable: bool


def _spec_record(kind: kinds.Kind) -> type[SpecRecord]:
    """The record of one kind's spec: its dataclass's init fields, typed."""
    hints = typing.get_type_hints(kind.spec)
    fields: list[tuple[str, Any]] = []
    for f in dataclasses.fields(kind.spec):
        if f.init:
            name = "num_heads" if f.name == "num_heads_" else f.name
            fields.append((name, _JSON_TYPES[hints[f.name]]))
    if kind.state:  # -1: one state covers the whole request
        fields.append(("tokens_per_state", int))
    return cast("type[SpecRecord]", msgspec.defstruct(  # a subclass of its one base
        "".join(w.title() for w in kind.name.split("_")) + "Spec", dict(fields).items(),
        bases=(SpecRecord,), tag=kind.name, module=__name__))


_LEAF_SPECS = tuple(_spec_record(k) for k in kinds.KINDS if k.spec is not UniformType)


class UniformTypeSpec(SpecRecord, frozen=True, tag="uniform_type"):
    """Layers of several specs in one group (the reference's UniformTypeKVCacheSpecs)."""

    block_size: Pos
    # a union built from KINDS at import: no `X | Y` spelling, and no static type for mypy
    kv_cache_specs: dict[str, Union[_LEAF_SPECS]]  # type: ignore[valid-type]  # noqa: UP007


#: Any layer spec: tagged by ``kind``.
Spec = Union[(*_LEAF_SPECS, UniformTypeSpec)]  # type: ignore[valid-type]


# ---------------------------------------------------------------------------
# layers and groups
# ---------------------------------------------------------------------------


class CellPart(Record, frozen=True):
    """``count`` elements of ``dtype`` starting ``byte_offset`` bytes into a
    cell: one addressable part (K, V, an in-cell scale, MLA NoPE/RoPE, ...)."""

    name: str
    dtype: str
    byte_offset: NonNeg
    count: Pos


class Layer(Record, frozen=True):
    """One layer: its stage and group, its spec and how it is quantized."""

    #: The group it belongs to (None: a layer no group holds, e.g. encoder-only).
    group: NonNeg | None
    stage: NonNeg
    #: Index into :attr:`Layout.specs`.
    spec: NonNeg
    #: The layer's quantization mode (None for state layers).
    kv_cache_dtype: CacheDtype | None
    #: Index into :attr:`Layout.cells`: the addressable parts of its cells.
    cells: NonNeg | None
    #: fp8 per-tensor modes: one K and one V scale constant per layer.
    per_tensor_scales: bool


class Group(Record, frozen=True, rename={"class_": "class"}):
    """Layers sharing one block table, and what one block of it costs."""

    id: NonNeg
    #: The reference's ``KVCacheSpecKind`` value.
    kind: str
    #: The reference's spec class (``FullAttentionSpec``, ``MambaSpec``, ...).
    class_: str
    #: The grouping strategy that made it, and its role in that strategy.
    strategy: str
    role: str
    layers: list[str]
    block_size: Pos
    page_size_bytes: NonNeg
    page_size_padded: Pos | None
    padding_slots: NonNeg
    useful_bytes_per_block: NonNeg
    padding_bytes_per_block: int
    #: Drafter layers with a pool of their own (the state-slot layout).
    own_pool: bool
    is_eagle: bool
    prefix_cacheable: bool
    max_memory_usage_bytes: NonNeg
    blocks_per_request: NonNeg
    max_num_blocks_per_req: NonNeg | None
    #: Index into :attr:`Layout.specs`: the group's merged spec.
    spec: NonNeg


# ---------------------------------------------------------------------------
# memory: allocations, pools, tensors, views
# ---------------------------------------------------------------------------


class Allocation(Record, frozen=True):
    """One allocation of a stage's rank: ``device`` memory or pinned ``host``.

    Its affine quantities, and those of the pools and tensors in it, are in the
    block count of the pool it ``scales_with`` (None: it does not scale)."""

    name: str
    memory: Literal["device", "host"]
    scales_with: str | None
    size: Bytes


class Pool(Record, frozen=True):
    """Blocks with ids of their own: ``num_blocks`` blocks of ``bytes_per_block``
    starting at ``offset`` in an allocation. Block 0 is the null block."""

    name: str
    allocation: str
    offset: Bytes
    bytes_per_block: Pos
    #: A fixed count (a drafter's own pool, per-request state slots), or None: sized
    #: from the budget (the stage's block count ``N``, or by ``share``).
    num_blocks: Pos | None
    #: The fewest blocks with which the pool serves one request at max_model_len.
    min_num_blocks: Pos
    #: ``[numerator, denominator]``: the pool's share of the budget left after the
    #: fixed pools, where a stage splits it between several pools (the ``separate``
    #: policy); None: the stage's one block-scaled pool takes all of it.
    share: list[Pos] | None
    #: The groups whose block tables index this pool.
    groups: list[NonNeg]


class View(Record, frozen=True):
    """One layer's page geometry: a view ``(B, H, N, C)`` in ``dtype``.

    ``C`` is ``cell_bytes / itemsize`` elements, contiguous; ``head_stride`` and
    ``state_stride`` are the byte strides of ``H`` and ``N`` (affine in the pool's
    ``N`` where heads lie outside blocks); the block stride is the tensor's.
    """

    dtype: str
    heads: Pos
    states: Pos
    cell_bytes: Pos
    head_stride: Bytes
    state_stride: Bytes
    #: Bytes one page takes with its padding (None: unpadded, ``heads * states * cell``).
    page_padded: Pos | None
    #: Tokens one state covers, as a fraction (``"1"``, ``"4"``, ``"1/2"``); None
    #: for a state layer, whose one state per block covers the whole request.
    tokens_per_state: str | None
    #: ``[K, V]``: C's elements when the cell is K then V (dense attention), else None.
    kv: list[Pos] | None


class Tensor(Record, frozen=True):
    """Same-shaped layers in one pool: layer ``layers[l]``'s page of block ``b``
    starts ``offset + l * layer_stride + b * block_stride`` bytes into the pool's
    allocation."""

    layers: list[str]
    group: NonNeg
    pool: str
    role: str
    #: The layers' kind (kvspec's name: ``full_attention``, ``mamba``, ...).
    kind: str
    block_size: Pos
    sliding_window: Pos | None
    attention_chunk_size: Pos | None
    layer_stride: Bytes
    block_stride: Bytes
    offset: Bytes
    view: View


class Stage(Record, frozen=True):
    """One pipeline stage (every tensor-parallel rank of it is alike)."""

    index: NonNeg
    layers: list[str]
    #: Bytes one block of the main pool costs on this stage, across its groups.
    bytes_per_block: NonNeg
    #: Bytes outside the block-scaled pool (a drafter's own pool).
    fixed_bytes: NonNeg
    draft_num_blocks: Pos | None
    draft_layers: list[str]
    memory_per_request: NonNeg
    #: The fewest blocks that serve one request at ``max_model_len``.
    min_num_blocks: Pos
    #: Each global group restricted to this stage's layers (same order and ids).
    groups: list[list[str]]
    allocations: list[Allocation]
    pools: list[Pool]
    tensors: list[Tensor]


# ---------------------------------------------------------------------------
# the pooling policy's decision
# ---------------------------------------------------------------------------


class PoolShare(Record, frozen=True):
    """One pool of a ``separate`` plan: its share of the budget and what it holds."""

    name: str
    #: ``[numerator, denominator]`` of the budget per rank.
    share: list[Pos]
    #: A pool of per-request state slots (state layers), not of token blocks.
    state: bool
    #: The pool sized for the layout's budget (None: no budget).
    budget: Budget | None


class WorkloadRecord(Record, frozen=True):
    """The workload the policy was chosen for (a summary, or a trace and its hash)."""

    context_tokens: float
    output_tokens: float
    #: Tokens a running request holds on average (prompt, half its output, drafts).
    held_tokens: NonNeg
    concurrency: Pos | None
    draft_tokens: NonNeg
    prefix_sharing: float
    requests: Pos
    seed: NonNeg
    trace: str | None
    trace_sha256: Sha256 | None


class Waste(Record, frozen=True):
    """Where a plan's bytes go that hold no live token or state, averaged over the
    steps where memory keeps requests waiting (bytes of one rank; shares of the
    pool's bytes): with the live bytes they add up to ``pool_bytes``."""

    pool_bytes: NonNeg
    #: Slots left empty in each block so every group has the same layer count.
    padding_slots: NonNeg
    #: Bytes each page holds past its content (page unification, alignment).
    padded_pages: NonNeg
    #: Token slots allocated blocks hold beyond the tokens of their requests.
    block_inflation: NonNeg
    #: State slots and window rings held per request, whatever its length.
    per_request: NonNeg
    #: Bytes no running request holds while memory binds: free or cached blocks,
    #: too few for the next request, or in a pool that is not the one running out.
    idle: NonNeg


class WaitingSteps(Record, frozen=True):
    """Steps where requests wait, by the limit that kept them waiting."""

    #: The next request's blocks did not fit (or a running request was preempted).
    memory: NonNeg
    #: ``max_num_seqs`` requests were running.
    max_num_seqs: NonNeg
    #: The step's token budget (``max_num_batched_tokens``) was spent.
    max_num_batched_tokens: NonNeg


class Simulated(Record, frozen=True, omit_defaults=True):
    """A simulation's summary: ``kvspec simulate``'s keys (docs/simulate.md)."""

    steps: NonNeg
    mean_running: float
    peak_running: NonNeg
    preemptions: NonNeg
    hit_tokens: NonNeg
    mean_utilization: float
    peak_utilization: float
    #: Utilisation averaged over every step where a request waits, whatever it waits
    #: for; None when no request ever waited.
    utilization_while_waiting: float | None
    #: (Omitted when None: artifacts from before these three keys read, and hash, as
    #: they were written.)
    waiting_steps_by_reason: WaitingSteps | None = None
    #: Utilisation averaged over the steps where memory keeps requests waiting; None
    #: when it never does.
    utilization_while_memory_bound: float | None = None
    #: Padding slots, padded pages, block inflation and per-request constants, as a
    #: share of the pool while memory keeps requests waiting (:class:`Waste`).
    layout_waste: float | None = None
    #: A timed run's (``auto`` judged in time, :class:`Judged`): finished requests and
    #: their output tokens a second, and with an SLO the requests meeting it a second.
    requests_per_s: float | None = None
    output_tokens_per_s: float | None = None
    goodput_requests_per_s: float | None = None


class Candidate(Record, frozen=True):
    """One plan the policy considered, and what it buys at the workload."""

    name: str
    #: A :data:`~kvspec.model.pooling.PlanPolicy` (its schema says only: a string).
    policy: str
    #: Tokens per attention block.
    block_size: Pos
    groups: NonNeg
    #: Requests at ``max_model_len`` the blocks hold (the engine's worst case).
    static_requests: float | None
    #: Requests holding the workload's ``held_tokens`` the blocks hold, statically.
    workload_requests: float | None
    #: Requests whose live tokens and states alone would fill the budget.
    physical_limit: float | None
    #: The simulation's summary (``kvspec simulate``'s keys), None when not simulated.
    simulated: Simulated | None
    #: Mean tokens the running requests hold while requests wait (simulated).
    tokens_held: float | None
    waste: Waste | None
    #: The pool that runs out first at the workload.
    binding_pool: str | None
    #: Static requests against context: ``[tokens a request holds, requests]`` at
    #: fractions and multiples of the workload's held tokens (``explain``'s chart).
    curve: list[tuple[Pos, float]]
    #: Why this candidate cannot be served or was not simulated, if so.
    note: str | None


class Judged(Record, frozen=True):
    """What ``auto`` judged its candidates by, when in time (docs/pooling.md): the
    highest ``goodput`` at the SLO or ``throughput`` (requests/s) wins, each candidate
    simulated on the profile's clock (named, with its file's sha256) or the constant
    model at ``step_ms`` a step."""

    metric: Literal["goodput", "throughput"]
    #: The SLO's limits, METRIC_pNN=TIME (empty for throughput).
    slo: list[str]
    profile: str | None
    profile_sha256: Sha256 | None
    step_ms: float | None


class PoolingRecord(Record, frozen=True, omit_defaults=True):
    """How memory is pooled, and why: the policy asked, the plan's, the workload,
    every candidate considered and the one chosen."""

    asked: Policy
    policy: PlanPolicy
    serve_with: Runtime
    #: ``separate``: tokens per attention block and per state block.
    block_size: Pos
    state_block_size: Pos | None
    #: ``separate``: one entry per pool (empty for a unified plan).
    pools: list[PoolShare]
    workload: WorkloadRecord | None
    candidates: list[Candidate]
    #: Index into ``candidates`` of the plan this artifact holds (None: none evaluated).
    chosen: NonNeg | None
    #: ``auto`` judged in time: by what, on which clock (omitted when it judged by mean
    #: running: artifacts from before it read, and hash, as they were written).
    judged_by: Judged | None = None


class LogLine(Record, frozen=True):
    level: str
    message: str


class Layout(Record, frozen=True):
    """The artifact's body: a memory plan, sized for its engine (and budget)."""

    name: str
    model: str | None
    #: The model's architecture as its config names it (``architectures[0]``, e.g.
    #: ``LlamaForCausalLM``); None where the source does not say. Like ``model``, it
    #: names the model and plans nothing.
    architecture: str | None
    engine: Engine
    #: The distinct layer specs, each of its kind's record.
    specs: list[Spec]
    #: The distinct cell layouts of quantized layers.
    cells: list[list[CellPart]]
    layers: dict[str, Layer]
    groups: list[Group]
    stages: list[Stage]
    scheduler_block_size: Pos
    hash_block_size: Pos
    #: New blocks must be zeroed (state layers read before written, mixed precision).
    needs_zeroing: bool
    budget: Budget | None
    #: The pooling policy's decision (None: the unified plan, no workload declared).
    pooling: PoolingRecord | None
    log: list[LogLine]
    warnings: list[str]


class Unsigned(Record, frozen=True):
    """Everything the artifact's ``sha256`` covers."""

    body: Layout
    compiler: str
    format: str
    source_sha256: Sha256


class Envelope(Unsigned, frozen=True):
    """A whole artifact: the format, the compiler, the source's hash, the body,
    and ``sha256`` over the canonical text of the rest."""

    sha256: Sha256

    def unsigned(self) -> Unsigned:
        return Unsigned(body=self.body, compiler=self.compiler, format=self.format,
                        source_sha256=self.source_sha256)

