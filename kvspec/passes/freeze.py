"""The freeze pass: the planner's final :class:`~kvspec.model.plan.Layout` and the
source text -> the frozen, hashed artifact, as the format's records.

Every figure is already in the plan, so freezing maps it onto the artifact
format's records (:mod:`kvspec.artifact.format`) once, computing only each
tensor's view geometry, with the same :func:`~kvspec.model.geometry.axis_strides`
the reader checks the strides against. Layers alike share one record, and each
distinct spec and cell layout is written once, in the body's tables.

>>> import kvspec
>>> art = kvspec.compile("layouts/llama-3.1-8b.yaml")
>>> art.body.stages[0].tensors[0].view.heads, art.body.specs[0].num_kv_heads
(8, 8)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import msgspec

from kvspec.artifact import COMPILER, Artifact
from kvspec.artifact import format as fmt
from kvspec.artifact.text import canonical, sha256_of, sign
from kvspec.errors import PLANNER_BUG, PlanError
from kvspec.model import kinds
from kvspec.model.affine import Affine
from kvspec.model.axes import DIM_H, DIM_N, AxisOrder
from kvspec.model.dtypes import dtype_size
from kvspec.model.engine import artifact_values
from kvspec.model.geometry import spec_strides
from kvspec.model.plan import Layout, Stage, Tensor
from kvspec.model.quant.cells import CellPart
from kvspec.model.specs import Attention, LayerSpec
from kvspec.model.specs.base import once_per_object
from kvspec.passes.pool import Pooled, PoolLayout

__all__ = ["CompiledArtifact", "body_of", "engine_record", "freeze", "frozen"]


class CompiledArtifact(Artifact):
    """An artifact and the :class:`~kvspec.model.plan.Layout` it is the frozen
    form of (a separate plan's: the unified plan of the same layers, and the
    pools it keeps): what the compiler returns, and what re-planning proves."""

    def __init__(self, envelope: fmt.Envelope, layout: Layout, text: str | None = None,
                 source: str | bytes | None = None, pools: tuple[PoolLayout, ...] = ()):
        super().__init__(envelope, text, source)
        self._layout = layout
        self._pools = pools

    @property
    def layout(self) -> Layout:
        return self._layout

    @property
    def pools(self) -> tuple[PoolLayout, ...]:
        """The pools of a separate plan, each its class's layout (empty: unified)."""
        return self._pools


# ---------------------------------------------------------------------------
# freeze: Layout -> records
# ---------------------------------------------------------------------------


def engine_record(layout: Layout) -> fmt.Engine:
    """The engine record an artifact of ``layout`` holds: each declared setting
    under its artifact key (:func:`kvspec.model.engine.artifact_values`)."""
    return msgspec.convert(artifact_values(layout.plan.engine, layout.engine), fmt.Engine)


class _Tables:
    """The body's spec and cell tables: each distinct object written once."""

    def __init__(self) -> None:
        self.specs: list[fmt.Spec] = []
        self.cells: list[list[fmt.CellPart]] = []
        self._spec_of = once_per_object(self._add_spec)
        self._cells_of = once_per_object(self._add_cells)
        self._by_text: dict[bytes, int] = {}

    def _add_spec(self, spec: LayerSpec) -> int:
        record = msgspec.convert(kinds.describe(spec), fmt.Spec)
        key = canonical(record)
        index = self._by_text.get(key)
        if index is None:
            index = self._by_text[key] = len(self.specs)
            self.specs.append(record)
        return index

    def _add_cells(self, parts: tuple[CellPart, ...]) -> int:
        self.cells.append([fmt.CellPart(name=p.name, dtype=p.dtype, byte_offset=p.byte_offset,
                                        count=p.count) for p in parts])
        return len(self.cells) - 1

    def spec(self, spec: LayerSpec) -> int:
        return int(self._spec_of(spec))

    def cells_of(self, parts: tuple[CellPart, ...] | None) -> int | None:
        return int(self._cells_of(parts)) if parts else None


def _tokens_per_state(spec: LayerSpec) -> str | None:
    if kinds.of(spec).state:
        return None
    return str(Fraction(spec.tokens_per_state_value))


def _kv(spec: LayerSpec, cell_elems: int) -> list[int] | None:
    """K and V elements of the cell when it is K then V (dense attention)."""
    if not isinstance(spec, Attention) or kinds.of(spec).latent:
        return None
    if spec.state_content_bytes is not None or not spec.head_size_v:
        return None
    if spec.head_size + spec.head_size_v != cell_elems:
        return None
    return [spec.head_size, spec.head_size_v]


def _view(spec: LayerSpec, t: Tensor, order: AxisOrder, blocks: Affine) -> fmt.View:
    """The view geometry of ``t``'s layers, whose pool has ``blocks`` blocks."""
    strides = spec_strides(spec, blocks, len(t.layers), order,
                             fixed=(t.layer_stride, t.block_stride, None, None, None))
    dtype = getattr(spec, "dtype", None) or "int8"
    cell = spec.state_content_size_bytes
    return fmt.View(dtype=dtype, heads=spec.num_heads, states=spec.num_states,
                    cell_bytes=cell, head_stride=fmt.affine(strides[DIM_H]),
                    state_stride=fmt.affine(strides[DIM_N]),
                    page_padded=getattr(spec, "page_size_padded", None),
                    tokens_per_state=_tokens_per_state(spec),
                    kv=_kv(spec, cell // dtype_size(dtype)))


def _tensor(t: Tensor, st: Stage, order: AxisOrder) -> fmt.Tensor:
    spec = st.groups[t.group].layer_spec(t.layers[0])
    pool = "host" if t.host_resident else ("draft" if t.pool == "draft" else "device")
    return fmt.Tensor(
        layers=list(t.layers), group=t.group, pool=pool, role=t.role, kind=spec.kind,
        block_size=spec.block_size, sliding_window=getattr(spec, "sliding_window", None),
        attention_chunk_size=getattr(spec, "attention_chunk_size", None),
        layer_stride=fmt.affine(t.layer_stride), block_stride=fmt.affine(t.block_stride),
        offset=fmt.affine(t.offset),
        view=_view(spec, t, order, Affine(0, st.draft_num_blocks)
                   if pool == "draft" and st.draft_num_blocks else Affine(1, 0)))


def _memory(st: Stage, layout: Layout) -> tuple[list[fmt.Allocation], list[fmt.Pool]]:
    """The stage's allocations and pools: the device allocation holds the main
    pool and, beyond it, a drafter's own; host-resident tensors their own."""
    sizes: dict[str, Affine] = {}  # every tensor of an allocation declares its size
    for t in st.tensors:
        memory = "host" if t.host_resident else "device"
        if memory not in sizes or t.size.dominates(sizes[memory]):
            sizes[memory] = t.size
    allocations = [fmt.Allocation(name=m, memory=m, scales_with=m,  # type: ignore[arg-type]
                                  size=fmt.affine(sizes[m])) for m in sorted(sizes)]
    main = [gid for gid, g in enumerate(st.groups) if g.layer_names and not g.own_pool]
    own = [gid for gid, g in enumerate(st.groups) if g.layer_names and g.own_pool]
    need = layout.stage_figures[st.index].min_num_blocks
    pools = [fmt.Pool(name="device", allocation="device", offset=0,
                      bytes_per_block=max(st.bytes_per_block, 1), num_blocks=None, share=None,
                      min_num_blocks=need, groups=main)]
    drafts = [t for t in st.tensors if t.pool == "draft"]
    if drafts and st.draft_num_blocks:
        start = min((t.offset for t in drafts), key=lambda a: (a.a, a.b))
        pools.append(fmt.Pool(name="draft", allocation="device", offset=fmt.affine(start),
                              bytes_per_block=st.fixed_bytes // st.draft_num_blocks,
                              num_blocks=st.draft_num_blocks, share=None,
                              min_num_blocks=st.draft_num_blocks, groups=own))
    elif own:
        pools[0] = fmt.Pool(name="device", allocation="device", offset=0,
                            bytes_per_block=max(st.bytes_per_block, 1), num_blocks=None,
                            share=None, min_num_blocks=need, groups=main + own)
    if "host" in sizes:
        pools.append(fmt.Pool(name="host", allocation="host", offset=0,
                              bytes_per_block=max(st.bytes_per_block, 1), num_blocks=None,
                              share=None, min_num_blocks=need,
                              groups=sorted({t.group for t in st.tensors if t.host_resident})))
    return allocations, pools


def _stage(st: Stage, layout: Layout) -> fmt.Stage:
    fig = layout.stage_figures[st.index]
    order = layout.engine.axis_order
    allocations, pools = _memory(st, layout)
    return fmt.Stage(
        index=st.index, layers=list(st.layer_names), bytes_per_block=st.bytes_per_block,
        fixed_bytes=st.fixed_bytes, draft_num_blocks=st.draft_num_blocks,
        draft_layers=list(st.draft_layer_names), memory_per_request=fig.memory_per_request,
        min_num_blocks=fig.min_num_blocks, groups=[list(g.layer_names) for g in st.groups],
        allocations=allocations, pools=pools,
        tensors=[_tensor(t, st, order) for t in st.tensors])


def _group(gid: int, layout: Layout, tables: _Tables) -> fmt.Group:
    g, fig = layout.groups[gid], layout.group_figures[gid]
    spec = g.spec
    return fmt.Group(
        id=gid, kind=kinds.ref_kind_name(spec), class_=spec.ref_class, strategy=g.strategy,
        role=g.role, layers=list(g.layer_names), block_size=spec.block_size,
        page_size_bytes=spec.page_size_bytes,
        page_size_padded=getattr(spec, "page_size_padded", None),
        padding_slots=g.padding_slots, useful_bytes_per_block=fig.useful_bytes_per_block,
        padding_bytes_per_block=fig.padding_bytes_per_block, own_pool=g.own_pool,
        is_eagle=g.is_eagle, prefix_cacheable=spec.prefix_cacheable,
        max_memory_usage_bytes=fig.max_memory_usage_bytes,
        blocks_per_request=fig.blocks_per_request,
        max_num_blocks_per_req=fig.max_num_blocks_per_req, spec=tables.spec(spec))


def _layers(layout: Layout, tables: _Tables, group_offset: int = 0) -> dict[str, fmt.Layer]:
    layers: dict[str, fmt.Layer] = {}
    entries: dict[tuple[Any, ...], fmt.Layer] = {}  # layers alike share one record
    for name, e in layout.layers.items():
        key = (e.group, e.stage, id(e.spec), e.kv_cache_dtype, id(e.cell_parts),
               e.per_tensor_scales)
        entry = entries.get(key)
        if entry is None:
            entry = entries[key] = fmt.Layer(
                group=None if e.group is None else e.group + group_offset, stage=e.stage,
                spec=tables.spec(e.spec), kv_cache_dtype=e.kv_cache_dtype,
                cells=tables.cells_of(e.cell_parts), per_tensor_scales=e.per_tensor_scales)
        layers[name] = entry
    return layers


def body_of(layout: Layout, pools: Sequence[PoolLayout] = (),
            decision: fmt.PoolingRecord | None = None, memory: int | None = None
            ) -> fmt.Layout:
    """The artifact body of ``layout``, or of the pools of a separate plan (whose
    unified plan ``layout`` is), with the pooling policy's decision."""
    if pools:
        return pooled_body(layout.name, layout.model, engine_record(layout),
                           [list(st.layer_names) for st in layout.stages], list(layout.layers),
                           pools, decision, memory)
    tables = _Tables()
    layers = _layers(layout, tables)
    groups = [_group(i, layout, tables) for i in range(len(layout.groups))]
    return fmt.Layout(
        name=layout.name, model=layout.model, architecture=None,
        engine=engine_record(layout), specs=tables.specs, cells=tables.cells, layers=layers,
        groups=groups,
        stages=[_stage(st, layout) for st in layout.stages],
        scheduler_block_size=layout.scheduler_block_size,
        hash_block_size=layout.hash_block_size, needs_zeroing=layout.needs_zeroing,
        budget=layout.budget, pooling=decision,
        log=[fmt.LogLine(level=lv, message=m) for lv, m in layout.plan.log],
        warnings=list(layout.warnings))


def _pool_stage(st: Stage, layout: Layout, pool: PoolLayout, offset: int) -> fmt.Stage:
    """One pool's stage: its allocation and pool named after it, its share, its
    tensors and groups renumbered."""
    own = _stage(st, layout)
    share = [pool.share.numerator, pool.share.denominator]
    allocations = [msgspec.structs.replace(a, name=pool.name, scales_with=pool.name)
                   for a in own.allocations if a.name == "device"]
    pools = [msgspec.structs.replace(p, name=pool.name, allocation=pool.name, share=share,
                                     groups=[g + offset for g in p.groups])
             for p in own.pools if p.name == "device"]
    tensors = [msgspec.structs.replace(t, group=t.group + offset, pool=pool.name)
               for t in own.tensors]
    return msgspec.structs.replace(own, allocations=allocations, pools=pools, tensors=tensors)


def pooled_body(name: str, model: str | None, engine: fmt.Engine, stage_layers: list[list[str]],
                layer_order: list[str], pools: Sequence[PoolLayout],
                decision: fmt.PoolingRecord | None, memory: int | None) -> fmt.Layout:
    """The body of a separate plan: each pool's groups, layers and tensors, in an
    allocation of its own named after it, with its share of the budget."""
    tables = _Tables()
    layers: dict[str, fmt.Layer] = {}
    groups: list[fmt.Group] = []
    parts: list[list[fmt.Stage]] = [[] for _ in stage_layers]
    for pool in pools:
        x, offset = pool.layout, len(groups)
        if any(not g.layer_names for g in x.groups) or x.stages[0].fixed_bytes:
            raise PlanError(f"pool {pool.name} cannot be frozen", hint=PLANNER_BUG)
        layers.update(_layers(x, tables, offset))
        groups += [msgspec.structs.replace(_group(i, x, tables), id=i + offset)
                   for i in range(len(x.groups))]
        for st in x.stages:
            parts[st.index].append(_pool_stage(st, x, pool, offset))
    stages = [fmt.Stage(
        index=index, layers=names, bytes_per_block=0, fixed_bytes=0,
        draft_num_blocks=None, draft_layers=[],
        memory_per_request=sum(p.memory_per_request for p in part), min_num_blocks=1,
        groups=[g for p in part for g in p.groups],
        allocations=[a for p in part for a in p.allocations],
        pools=[q for p in part for q in p.pools],
        tensors=[t for p in part for t in p.tensors])
        for index, (names, part) in enumerate(zip(stage_layers, parts))]
    layouts = [p.layout for p in pools]
    return fmt.Layout(
        name=name, model=model, architecture=None, engine=engine, specs=tables.specs,
        cells=tables.cells,
        layers={n: layers[n] for n in layer_order if n in layers}, groups=groups,
        stages=stages, scheduler_block_size=math.lcm(*(x.scheduler_block_size for x in layouts)),
        hash_block_size=math.gcd(*(x.hash_block_size for x in layouts)),
        needs_zeroing=any(x.needs_zeroing for x in layouts),
        budget=_pooled_budget(layouts, memory),
        pooling=decision, log=[fmt.LogLine(level=lv, message=m) for x in layouts
                               for lv, m in x.plan.log],
        warnings=list(dict.fromkeys(w for x in layouts for w in x.warnings)))


def _pooled_budget(layouts: Sequence[Layout], memory: int | None) -> fmt.Budget | None:
    """The budget of a separate plan: the memory split between the pools; the
    concurrency, tokens and longest request of the pool that runs out first."""
    budgets = [x.budget for x in layouts]
    if memory is None or any(b is None for b in budgets):
        return None
    bs = [b for b in budgets if b is not None]
    conc = [b.max_concurrency for b in bs if b.max_concurrency is not None]
    low = min(conc) if conc else None
    return fmt.Budget(memory=memory, num_blocks=bs[0].num_blocks,
                      max_concurrency=low,
                      kv_cache_size_tokens=min(b.kv_cache_size_tokens for b in bs),
                      max_model_len=bs[0].max_model_len,
                      estimated_max_model_len=min(b.estimated_max_model_len for b in bs))


def freeze(pooled: Pooled) -> CompiledArtifact:
    """The pass: the plan the policy kept -> the artifact; the source's sha256 in its
    envelope."""
    return frozen(pooled.layout, pooled.text, pooled.pools, pooled.decision,
                  pooled.budget_bytes, architecture=pooled.source.architecture)


def frozen(layout: Layout, source_text: str, pools: Sequence[PoolLayout] = (),
           decision: fmt.PoolingRecord | None = None, memory: int | None = None, *,
           architecture: str | None = None) -> CompiledArtifact:
    """The frozen, hashed artifact of ``layout`` (or its pools) compiled from
    ``source_text``."""
    body = body_of(layout, pools, decision, memory)
    if architecture is not None:  # it names the model; the planner never sees it
        body = msgspec.structs.replace(body, architecture=architecture)
    envelope = sign(fmt.Unsigned(body=body, compiler=COMPILER, format=fmt.FORMAT,
                                 source_sha256=sha256_of(source_text)))
    return CompiledArtifact(envelope, pools[0].layout if pools else layout, pools=tuple(pools))
