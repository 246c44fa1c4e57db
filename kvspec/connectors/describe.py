"""Making a :class:`~kvspec.connectors.descriptor.Descriptor` from an artifact (torch-free).

``describe(artifact, rank=R, num_blocks=N)`` evaluates every affine offset and stride
of rank ``R``'s stage at its pools' block counts (each pool its own: a drafter's own
pool, the ``separate`` policy's pools), and lays out each layer's page runs
(:func:`kvspec.artifact.blocks.tensor_runs`) and each group's runs of one block,
merged where contiguous. ``bases`` gives each region's base address and device (a
loaded cache's, :meth:`kvspec.runtime.loader.LoadedCache.descriptor`); without it every
base is 0, so offsets are the addresses.

>>> from kvspec.artifact import Artifact
>>> d = describe(Artifact.read("layouts/gpt-oss-120b.kvlayout.json"), rank=1)
>>> d.parallel.tensor_rank, [(g.id, g.kind, len(g.runs)) for g in d.groups]
(1, [(0, 'sliding_window', 18), (1, 'full_attention', 18)])
>>> d.layers[0].head_start, d.layers[0].heads, d.layers[0].heads_total
(4, 4, 8)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Any, NamedTuple

from kvspec.artifact import Artifact
from kvspec.artifact import format as fmt
from kvspec.artifact.blocks import allocation_blocks, stage_counts, tensor_runs
from kvspec.connectors.descriptor import (
    FORMAT,
    Descriptor,
    DescriptorError,
    Group,
    Layer,
    Parallel,
    Part,
    Pool,
    Region,
    Retention,
    Run,
    identity_digest,
)
from kvspec.errors import KvspecError
from kvspec.model import kinds
from kvspec.model.dtypes import dtype_size

__all__ = ["Base", "check_num_blocks", "describe", "describe_loaded", "head_range",
           "merge_runs", "retention_of"]

#: A group's retention: the first of these any of its layers has.
_RETENTIONS: tuple[Retention, ...] = ("grows_with_tokens", "bounded_window",
                                      "constant_per_request")


class Base(NamedTuple):
    """Where a region lies once loaded: its address, torch device and device index."""

    addr: int
    device: str
    device_id: int


def retention_of(kind: str) -> Retention:
    """How a layer kind's memory grows with a request: state layers and cross-attention
    (the encoder's keys) hold a constant amount, kinds that need a window or chunk (and
    ring buffers) a bounded one, the rest grow with its tokens.

    >>> retention_of("sliding_window"), retention_of("mamba"), retention_of("mla")
    ('bounded_window', 'constant_per_request', 'grows_with_tokens')
    """
    k = kinds.by_name(kind)
    if k.state or k.ref_kind == "cross_attention":
        return "constant_per_request"
    if {"sliding_window", "attention_chunk_size"} & set(k.required) or \
            kind == "circular_buffer":
        return "bounded_window"
    return "grows_with_tokens"


def head_range(kind: str, heads: int, tp: int, tensor_rank: int
               ) -> tuple[int | None, int | None, bool | None]:
    """``(head_start, heads_total, replicated)`` of a rank's heads: latent (MLA) layers
    are replicated; ``heads`` > 1 per rank are a split of ``heads * tp``; one head per
    rank is a split or a replication the artifact cannot tell apart (None, None, None).

    >>> head_range("full_attention", 4, 2, 1), head_range("mla", 1, 8, 3)
    ((4, 8, False), (0, 1, True))
    >>> head_range("full_attention", 1, 4, 2)
    (None, None, None)
    """
    kind_ = kinds.by_name(kind)
    if kind_.latent:
        return 0, heads, True
    if kind_.state:
        return None, None, None
    if tp == 1:
        return 0, heads, False
    if heads > 1:
        return tensor_rank * heads, heads * tp, False
    return None, None, None


def merge_runs(runs: Iterable[Run]) -> list[Run]:
    """``runs`` sorted by region, stride and offset, each merged with the next where
    that one starts where it ends (same region, same stride).

    >>> merge_runs([Run(0, 64, 128, 64), Run(0, 0, 128, 64), Run(0, 0, 256, 8)])
    [Run(region=0, offset=0, stride=128, length=128), Run(region=0, offset=0, stride=256, length=8)]
    """
    out: list[Run] = []
    for run in sorted(runs, key=lambda r: (r.region, r.stride, r.offset)):
        last = out[-1] if out else None
        if last is not None and (last.region, last.stride) == (run.region, run.stride) \
                and last.offset + last.length == run.offset:
            out[-1] = Run(last.region, last.offset, last.stride, last.length + run.length)
        else:
            out.append(run)
    return out


def check_num_blocks(art: Artifact, num_blocks: int | None, option: str) -> None:
    """Refuse a block count no stage of ``art`` can take (too few for one request,
    too many for an address space), naming the ``option`` that gave it.

    >>> art = Artifact.read("layouts/llama-3.1-8b.kvlayout.json")
    >>> check_num_blocks(art, 10**23, "--num-blocks")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    kvspec.connectors.descriptor.DescriptorError: ...--num-blocks: a pool of 100,000,...
    """
    if num_blocks is None:
        return
    for stage in range(len(art.body.stages)):
        try:
            _counts(art, stage, num_blocks)
        except KvspecError as err:
            raise err.replace(message=f"{option}: {err.message}",
                              hint=f"give {option} at least the blocks one request needs, "
                                   "and no more than a 64-bit address space holds") from None


def _counts(art: Artifact, stage: int, num_blocks: int | Mapping[str, int] | None
            ) -> dict[str, int]:
    """Each pool's count on ``stage``: the counts given (a loaded cache's), else the
    artifact's one sizing rule (:meth:`~kvspec.artifact.Artifact.counts_for`, what
    ``load`` uses) for ``num_blocks``, else for its override or budget, else the fewest
    blocks that serve one request."""
    if isinstance(num_blocks, Mapping):
        return stage_counts(art.body.stages[stage], num_blocks)
    if num_blocks is not None and (isinstance(num_blocks, bool)
                                   or not isinstance(num_blocks, int) or num_blocks < 1):
        raise DescriptorError("the block count must be a positive integer",
                              found=repr(num_blocks), hint="give at least the blocks one "
                              "request needs (--num-blocks)")
    try:
        return art.counts_for(stage, num_blocks=num_blocks, fewest=True)
    except KvspecError as err:
        raise err.as_type(DescriptorError).replace(
            hint="give at least the blocks one request needs, and no more than an "
                 "address space holds (--num-blocks)") from None


def describe(art: Artifact, *, rank: int = 0, num_blocks: int | Mapping[str, int] | None = None,
             bases: Mapping[str, Base] | None = None,
             kernel_block_sizes: Mapping[int, int] | None = None) -> Descriptor:
    """Rank ``rank``'s descriptor (``rank = stage * tensor_parallel_size + tensor_rank``),
    its pools sized for ``num_blocks`` (one count for the budget-sized pools, or a count
    per pool name; default: the artifact's override or budget, as ``load`` sizes it, else
    the fewest blocks that serve one request)."""
    body, e = art.body, art.body.engine
    tp, pp = e.tensor_parallel_size, e.pipeline_parallel_size
    world = tp * pp
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world \
            or rank // tp >= len(body.stages):
        raise DescriptorError(f"the deployment has {world} rank(s) (tensor {tp} x pipeline "
                              f"{pp}), not rank {rank!r}", expected=f"0..{world - 1}",
                              found=repr(rank), hint="rank = pipeline stage * tensor "
                              "parallel size + tensor-parallel rank")
    stage, tensor_rank = divmod(rank, tp)
    st = body.stages[stage]
    counts = _counts(art, stage, num_blocks)
    n = allocation_blocks(st, counts)
    bases = bases or {}
    region_ids = {a.name: i for i, a in enumerate(st.allocations)}
    regions = [Region(id=i, name=a.name, memory=a.memory,
                      device=bases[a.name].device if a.name in bases else None,
                      device_id=bases[a.name].device_id if a.name in bases else 0,
                      base=bases[a.name].addr if a.name in bases else 0,
                      length=at_n(a.size, n[a.name])) for i, a in enumerate(st.allocations)]
    pools = [Pool(name=p.name, region=region_ids[p.allocation],
                  offset=at_n(p.offset, n[p.allocation]), bytes_per_block=p.bytes_per_block,
                  num_blocks=counts[p.name], groups=list(p.groups)) for p in st.pools]
    alloc_of = {p.name: p.allocation for p in st.pools}
    layers = [_layer(body, t, slot, region_ids[alloc_of[t.pool]], n[alloc_of[t.pool]], tp,
                     tensor_rank) for t in st.tensors for slot in range(len(t.layers))]
    order = {name: i for i, name in enumerate(st.layers)}
    layers.sort(key=lambda x: (order.get(x.name, len(order)), x.name))
    groups = [_group(body, g, st, layers, counts, kernel_block_sizes or {})
              for g in body.groups if st.groups[g.id]]
    return Descriptor(
        descriptor=FORMAT, identity=identity_digest(body, art.envelope.format), name=body.name,
        model=body.model, artifact_sha256=art.sha256, artifact_format=art.envelope.format,
        compiler=art.compiler, axis_order=e.axis_order, kv_cache_dtype=e.kv_cache_dtype,
        scheduler_block_size=body.scheduler_block_size, hash_block_size=body.hash_block_size,
        parallel=Parallel(rank=rank, world_size=world, tensor_parallel_size=tp,
                          tensor_rank=tensor_rank, pipeline_parallel_size=pp,
                          pipeline_stage=stage,
                          decode_context_parallel_size=e.decode_context_parallel_size,
                          decode_context_rank=tensor_rank % e.decode_context_parallel_size,
                          layers=list(st.layers)),
        regions=regions, pools=pools, groups=groups, layers=layers)


def at_n(value: int | fmt.Affine, num_blocks: int) -> int:
    return fmt.at(value, num_blocks)


def _layer(body: fmt.Layout, t: fmt.Tensor, slot: int, region: int, n: int, tp: int,
           tensor_rank: int) -> Layer:
    """Layer ``slot`` of tensor ``t``, its allocation's affine quantities at ``n``."""
    name, v = t.layers[slot], t.view
    offsets, length, layer_stride, block_stride = tensor_runs(t, n)
    start = fmt.at(t.offset, n) + slot * layer_stride
    record = body.layers.get(name)
    head_start, total, replicated = head_range(t.kind, v.heads, tp, tensor_rank)
    spec = body.specs[record.spec] if record is not None else None
    if kinds.by_name(t.kind).state and spec is not None:
        replicated = bool(getattr(spec, "tp_replicated", False))
    dense = v.heads * v.states * v.cell_bytes
    return Layer(
        name=name, group=t.group, kind=t.kind, pool=t.pool, region=region, slot=slot,
        dtype=v.dtype, kv_cache_dtype=record.kv_cache_dtype if record else None, offset=start,
        block_stride=block_stride, head_stride=fmt.at(v.head_stride, n),
        state_stride=fmt.at(v.state_stride, n), heads=v.heads, states=v.states,
        cell_bytes=v.cell_bytes, page_bytes=dense,
        page_bytes_padded=v.page_padded if v.page_padded not in (None, dense) else None,
        head_start=head_start, heads_total=total, replicated=replicated,
        parts=_parts(body, record, spec, v), state_type=getattr(spec, "mamba_type", None),
        per_tensor_scales=bool(record and record.per_tensor_scales),
        runs=[Run(region, start + o, block_stride, length) for o in offsets])


def _parts(body: fmt.Layout, record: fmt.Layer | None, spec: object, v: fmt.View) -> list[Part]:
    """The cell's parts: the artifact's cell layout, else K then V, else a state's
    tensors, else the whole cell in the view's dtype."""
    if record is not None and record.cells is not None:
        return [Part(name=p.name, dtype=p.dtype, offset=p.byte_offset, count=p.count,
                     bytes=p.count * dtype_size(p.dtype), shape=None)
                for p in body.cells[record.cells]]
    item = dtype_size(v.dtype)
    if v.kv is not None:
        k, val = v.kv
        return [Part(name="k", dtype=v.dtype, offset=0, count=k, bytes=k * item, shape=None),
                Part(name="v", dtype=v.dtype, offset=k * item, count=val, bytes=val * item,
                     shape=None)]
    shapes, dtypes = getattr(spec, "shapes", None), getattr(spec, "dtypes", None)
    if shapes and dtypes:
        out, offset = [], 0
        for i, (shape, dtype) in enumerate(zip(shapes, dtypes, strict=True)):
            count = 1
            for d in shape:
                count *= d
            size = count * dtype_size(dtype)
            out.append(Part(name=f"state{i}", dtype=dtype, offset=offset, count=count,
                            bytes=size, shape=list(shape)))
            offset += size
        return out
    return [Part(name="cell", dtype=v.dtype, offset=0, count=v.cell_bytes // item,
                 bytes=v.cell_bytes, shape=None)]


def _common(values: Iterable[object]) -> object:
    """The one value all of ``values`` have, else None."""
    found = set(values)
    return found.pop() if len(found) == 1 else None


def _group(body: fmt.Layout, g: fmt.Group, st: fmt.Stage, layers: list[Layer],
           counts: Mapping[str, int], kernel: Mapping[int, int]) -> Group:
    mine = [x for x in layers if x.group == g.id]
    tensors = [t for t in st.tensors if t.group == g.id]
    pool = next(p.name for p in st.pools if g.id in p.groups)
    kind = _common(x.kind for x in mine) or "mixed"
    found = {retention_of(x.kind) for x in mine}
    retention: Retention = next((r for r in _RETENTIONS if r in found), "grows_with_tokens")
    tps = _common(t.view.tokens_per_state for t in tensors)
    runs = merge_runs(r for x in mine for r in x.runs)
    return Group(
        id=g.id, kind=str(kind), ref_kind=g.kind, spec_class=g.class_, pool=pool,
        num_blocks=counts[pool], layers=[x.name for x in mine],
        sliding_window=_common(t.sliding_window for t in tensors),  # type: ignore[arg-type]
        attention_chunk_size=_common(t.attention_chunk_size for t in tensors),  # type: ignore[arg-type]
        block_size=g.block_size, physical_block_size=kernel.get(g.id, g.block_size),
        hash_block_size=body.hash_block_size if g.prefix_cacheable else None,
        tokens_per_state=str(Fraction(tps)) if isinstance(tps, str) else None,
        page_bytes=_common(x.page_bytes for x in mine),  # type: ignore[arg-type]
        page_bytes_padded=_common(x.page_bytes_padded for x in mine),  # type: ignore[arg-type]
        bytes_per_block=sum(r.length for r in runs),
        block_stride=_common(r.stride for r in runs),  # type: ignore[arg-type]
        retention=retention, prefix_cacheable=g.prefix_cacheable, own_pool=g.own_pool,
        runs=runs)


def describe_loaded(cache: Any, rank: int) -> Descriptor:
    """The descriptor of a :class:`~kvspec.runtime.loader.LoadedCache` (read by its
    attributes: this module imports no torch): its stage's rank ``rank``, each
    allocation's real base address and device, each pool's block count, and the
    kernel block size of each group it split."""
    art = cache.artifact
    tp = art.body.engine.tensor_parallel_size
    if rank // tp != cache.stage:
        raise DescriptorError(f"rank {rank} is on pipeline stage {rank // tp}, and this cache "
                              f"holds stage {cache.stage}", found=str(rank),
                              expected=f"{cache.stage * tp}..{cache.stage * tp + tp - 1}",
                              hint="give the rank this cache was loaded for, or leave it out")
    st = art.body.stages[cache.stage]
    bases = {}
    for a in st.allocations:
        buf = cache.buffers[a.name]
        dev = buf.device
        bases[a.name] = Base(buf.data_ptr(), str(dev), dev.index or 0)
    kernel = {m.group: m.kernel_block_size for m in cache.metadata.values()
              if m.kernel_block_size != m.block_size}
    return describe(art, rank=rank, num_blocks=dict(cache.pool_blocks), bases=bases,
                    kernel_block_sizes=kernel)
