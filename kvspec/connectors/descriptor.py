"""The connector descriptor, declared once: ``kvspec.descriptor/1``.

One rank's KV cache as a connector reads it (NIXL, LMCache, Dynamo KVBM, an
offload tier): its memory regions, and for every group and layer where one
block's bytes lie. Every record is one :class:`msgspec.Struct` below; from this
one declaration come the JSON ``kvspec descriptor`` prints, its validation
(``msgspec.json.decode(..., type=Descriptor)``) and the JSON Schema in
``schemas/descriptor.schema.json``. It is torch-free: the runtime
(``LoadedCache.descriptor()``, real base addresses) and the CLI (``kvspec
descriptor``, base addresses 0) both make it with :func:`kvspec.connectors.describe.describe`.

Byte positions: a region is one allocation (``LoadedCache.buffers[name]``); an
offset is bytes from the region's ``base``; block ``b`` of a run
``[region, offset, stride, length]`` is ``length`` bytes at
``base + offset + b * stride``. A group's ``runs`` are every byte one block of
it holds on this rank, merged where contiguous: a connector moving block ``b``
posts one descriptor per run.

The **identity digest** names the geometry, not the deployment's size or
schedule: ``sha256:`` and the SHA-256 of the canonical JSON (sorted keys,
compact) of an :class:`Identity` record: this format, the artifact format, the
model, the deployment's ``kv_cache_dtype``, axis order, parallel sizes and
prefix-hash block size, each group's kind, block size, page sizes and layers,
each layer's record and spec and cell parts, and each stage's allocations, pools
(without their budget share) and tensors as the artifact declares them (affine
in the block count). Every rank of a deployment has the same digest; block
counts, budgets, ``max_model_len`` and ``max_num_seqs`` are not part of it (a
transfer plan checks region lengths on its own).

>>> import msgspec
>>> msgspec.json.decode(b'[0, 4096, 65536, 4096]', type=Run)
Run(region=0, offset=4096, stride=65536, length=4096)
"""

# one idea: the descriptor format is one declaration, like the artifact's; its records
# change together.

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

import msgspec
from msgspec import Meta

from kvspec.artifact import format as fmt
from kvspec.artifact.text import canonical, sha256_of
from kvspec.errors import KvspecError

__all__ = ["FORMAT", "FORMAT_VERSION", "Descriptor", "DescriptorError", "ExportError", "Group",
           "Identity",
           "Layer", "Parallel", "Part", "Pool", "Region", "Retention", "Run",
           "identity_digest", "identity_of", "json_schema"]

FORMAT_VERSION = 1
#: Spelled out (FORMAT_VERSION's): Descriptor.descriptor is this Literal.
FORMAT: Final = "kvspec.descriptor/1"

NonNeg = Annotated[int, Meta(ge=0)]
Pos = Annotated[int, Meta(ge=1)]
Digest = Annotated[str, Meta(pattern="^sha256:[0-9a-f]{64}$")]
#: How a group's memory grows with a request (what an offload tier keeps of it).
Retention = Literal["grows_with_tokens", "bounded_window", "constant_per_request"]


class DescriptorError(KvspecError):
    """A descriptor cannot be made (a rank or block count the artifact does not have),
    or one read from JSON is not valid."""


class ExportError(KvspecError):
    """An exporter's target format cannot express this cache (the field and why named)."""


# Every subclass repeats frozen=True: msgspec inherits it, but type checkers read
# dataclass_transform (PEP 681) class by class and would take a subclass as mutable.
class Record(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A closed record: exactly these fields, each one written."""


class Run(msgspec.Struct, frozen=True, array_like=True):
    """``length`` bytes at ``offset + b * stride`` of region ``region``, for block ``b``
    (written as ``[region, offset, stride, length]``)."""

    region: NonNeg
    offset: NonNeg
    stride: NonNeg
    length: Pos


class Region(Record, frozen=True):
    """One allocation of this rank: what a connector registers (NIXL ``(addr, len, devId)``)."""

    id: NonNeg
    #: The allocation's name (``LoadedCache.buffers[name]``).
    name: str
    memory: Literal["device", "host"]
    #: ``cpu``, ``cuda:0``, ``meta``; None from an artifact (not loaded).
    device: str | None
    device_id: NonNeg
    #: The address of byte 0 (0 from an artifact: offsets are then addresses).
    base: NonNeg
    length: NonNeg


class Pool(Record, frozen=True):
    """Blocks with ids of their own: ``num_blocks`` blocks of ``bytes_per_block`` from
    ``offset`` of region ``region``; block 0 is the null block."""

    name: str
    region: NonNeg
    offset: NonNeg
    bytes_per_block: Pos
    num_blocks: Pos
    groups: list[NonNeg]


class Part(Record, frozen=True):
    """One addressable part of a layer's cell: K, V, an in-cell scale, MLA NoPE/RoPE,
    a state tensor (``shape`` then given): ``count`` elements of ``dtype`` from byte
    ``offset`` of the cell."""

    name: str
    dtype: str
    offset: NonNeg
    count: Pos
    bytes: Pos
    shape: list[Pos] | None


class Layer(Record, frozen=True):
    """One layer of this rank: its page of block ``b`` is ``(H, N, C)`` at
    ``offset + b * block_stride + h * head_stride + n * state_stride`` of its region,
    ``C`` = ``cell_bytes`` contiguous bytes holding ``parts``."""

    name: str
    group: NonNeg
    #: kvspec's kind (``full_attention``, ``sliding_window``, ``mla``, ``mamba``, ...).
    kind: str
    pool: str
    region: NonNeg
    #: The layer's position among the layers of its artifact tensor.
    slot: NonNeg
    dtype: str
    #: The layer's quantization mode (None for state layers).
    kv_cache_dtype: str | None
    offset: NonNeg
    block_stride: NonNeg
    head_stride: NonNeg
    state_stride: NonNeg
    #: Head slots on this rank (``H``), states per block (``N``), bytes per cell (``C``).
    heads: Pos
    states: Pos
    cell_bytes: Pos
    #: ``heads * states * cell_bytes``; the page with its padding (None: unpadded).
    page_bytes: Pos
    page_bytes_padded: Pos | None
    #: This rank's first head of ``heads_total`` (the model's KV heads); None where the
    #: artifact cannot tell (one head per rank: split or replicated).
    head_start: NonNeg | None
    heads_total: Pos | None
    #: Every rank holds the same heads (MLA latents, fewer KV heads than ranks).
    replicated: bool | None
    parts: list[Part]
    #: A state layer's type as vLLM names it (``MAMBA1``, ``MAMBA2``, ``GDN_ATTN``, ...).
    state_type: str | None
    #: fp8 per-tensor modes: one K and one V scale per layer, outside the blocks
    #: (``LoadedCache.scales``).
    per_tensor_scales: bool
    #: The page's contiguous runs of one block (one when the page is contiguous).
    runs: list[Run]


class Group(Record, frozen=True):
    """Layers sharing one block table, and the bytes one of its blocks holds here."""

    id: NonNeg
    #: kvspec's kind of its layers (``mixed`` when they differ).
    kind: str
    #: The reference's ``KVCacheSpecKind`` value and spec class.
    ref_kind: str
    spec_class: str
    pool: str
    num_blocks: Pos
    layers: list[str]
    sliding_window: Pos | None
    attention_chunk_size: Pos | None
    #: Tokens per block as the block table counts them (logical), and per block of
    #: the kernel's views (physical: smaller when loaded with ``kernel_block_size``).
    block_size: Pos
    physical_block_size: Pos
    #: Tokens per prefix-cache hash (None: the group is not prefix-cacheable).
    hash_block_size: Pos | None
    #: Tokens one state covers (``"1"``, ``"4"``, ``"1/2"``); None: a state layer's one
    #: state covers the request.
    tokens_per_state: str | None
    #: One layer's page without and with padding (None when the layers differ).
    page_bytes: Pos | None
    page_bytes_padded: Pos | None
    #: The bytes one block holds on this rank (the runs' lengths summed).
    bytes_per_block: NonNeg
    #: Bytes from one block to the next (None when the layers differ: see ``runs``).
    block_stride: NonNeg | None
    retention: Retention
    prefix_cacheable: bool
    #: A drafter's group with a pool of its own.
    own_pool: bool
    runs: list[Run]


class Parallel(Record, frozen=True):
    """Where this rank sits: ``rank = pipeline_stage * tensor_parallel_size + tensor_rank``
    (tensor-parallel innermost, vLLM's order)."""

    rank: NonNeg
    world_size: Pos
    tensor_parallel_size: Pos
    tensor_rank: NonNeg
    pipeline_parallel_size: Pos
    pipeline_stage: NonNeg
    decode_context_parallel_size: Pos
    decode_context_rank: NonNeg
    #: The layers of this pipeline stage, in model order.
    layers: list[str]


class Descriptor(Record, frozen=True):
    """One rank's KV cache geometry, for connectors."""

    descriptor: Literal["kvspec.descriptor/1"]
    identity: Digest
    name: str
    model: str | None
    artifact_sha256: Annotated[str, Meta(pattern="^[0-9a-f]{64}$")]
    artifact_format: str
    compiler: str
    axis_order: str
    kv_cache_dtype: str
    scheduler_block_size: Pos
    hash_block_size: Pos
    parallel: Parallel
    regions: list[Region]
    pools: list[Pool]
    groups: list[Group]
    layers: list[Layer]

    def to_json(self, *, indent: int = 1) -> str:
        """Sorted keys, ``indent`` spaces a level (0: compact), a final newline."""
        raw = canonical(self)
        return (msgspec.json.format(raw, indent=indent) if indent else raw).decode() + "\n"

    @classmethod
    def from_json(cls, text: str | bytes, *, file: str | None = None) -> Descriptor:
        try:
            return msgspec.json.decode(text, type=cls)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise DescriptorError(f"not a kvspec descriptor: {exc}", file=file,
                                  hint="print one with `kvspec descriptor ARTIFACT "
                                       "--format json`") from None

    def region(self, name: str) -> Region:
        return next(r for r in self.regions if r.name == name)

    def layer(self, name: str) -> Layer:
        return next(x for x in self.layers if x.name == name)


# ---------------------------------------------------------------------------
# identity
# ---------------------------------------------------------------------------


class IdentityGroup(Record, frozen=True):
    id: NonNeg
    kind: str
    block_size: Pos
    page_size_bytes: NonNeg
    page_size_padded: Pos | None
    prefix_cacheable: bool
    own_pool: bool
    layers: list[str]


class IdentityPool(Record, frozen=True):
    name: str
    allocation: str
    offset: fmt.Bytes
    bytes_per_block: Pos
    num_blocks: Pos | None
    groups: list[NonNeg]


class IdentityStage(Record, frozen=True):
    index: NonNeg
    layers: list[str]
    allocations: list[fmt.Allocation]
    pools: list[IdentityPool]
    tensors: list[fmt.Tensor]


class Identity(Record, frozen=True):
    """What the identity digest covers (see the module's docstring)."""

    descriptor: str
    artifact_format: str
    model: str
    kv_cache_dtype: str
    axis_order: str
    tensor_parallel_size: Pos
    pipeline_parallel_size: Pos
    decode_context_parallel_size: Pos
    hash_block_size: Pos
    groups: list[IdentityGroup]
    layers: dict[str, fmt.Layer]
    specs: list[fmt.Spec]
    cells: list[list[fmt.CellPart]]
    stages: list[IdentityStage]


def identity_of(body: fmt.Layout, artifact_format: str = fmt.FORMAT, *,
                named: bool = True) -> Identity:
    """The :class:`Identity` of an artifact's body (``named=False``: its geometry
    alone, the model's name left out, as ``kvspec transfer`` compares two sides)."""
    e = body.engine
    return Identity(
        descriptor=FORMAT, artifact_format=artifact_format,
        model=(body.model or body.name) if named else "",
        kv_cache_dtype=e.kv_cache_dtype, axis_order=e.axis_order,
        tensor_parallel_size=e.tensor_parallel_size,
        pipeline_parallel_size=e.pipeline_parallel_size,
        decode_context_parallel_size=e.decode_context_parallel_size,
        hash_block_size=body.hash_block_size,
        groups=[IdentityGroup(id=g.id, kind=g.kind, block_size=g.block_size,
                              page_size_bytes=g.page_size_bytes,
                              page_size_padded=g.page_size_padded,
                              prefix_cacheable=g.prefix_cacheable, own_pool=g.own_pool,
                              layers=list(g.layers)) for g in body.groups],
        layers=dict(body.layers), specs=list(body.specs), cells=list(body.cells),
        stages=[IdentityStage(index=st.index, layers=list(st.layers),
                              allocations=list(st.allocations),
                              pools=[IdentityPool(name=p.name, allocation=p.allocation,
                                                  offset=p.offset,
                                                  bytes_per_block=p.bytes_per_block,
                                                  num_blocks=p.num_blocks, groups=p.groups)
                                     for p in st.pools],
                              tensors=list(st.tensors)) for st in body.stages])


def identity_digest(body: fmt.Layout, artifact_format: str = fmt.FORMAT, *,
                    named: bool = True) -> str:
    """``sha256:`` and the SHA-256 of the canonical JSON of ``body``'s :class:`Identity`
    (``named=False``: of its geometry alone).

    >>> from kvspec.artifact import Artifact
    >>> art = Artifact.read("layouts/llama-3.1-8b.kvlayout.json")
    >>> identity_digest(art.body).startswith("sha256:")
    True
    """
    return "sha256:" + sha256_of(canonical(identity_of(body, artifact_format, named=named)))


def json_schema() -> dict[str, Any]:
    """The descriptor format's JSON Schema (``schemas/descriptor.schema.json``)."""
    schema: dict[str, Any] = msgspec.json.schema(Descriptor)
    return schema
