"""The last planning pass: a plan (and its budget) -> the :class:`Layout` IR.

Everything an artifact states is computed here, once: each group's and
stage's figures for the final engine (``max_model_len`` fitted when auto),
block sizes, whether new blocks need zeroing, the budget, the early checks,
and each layer's quantization parts. Freezing is then pure serialisation.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvspec.artifact.format import Budget
from kvspec.errors import KvspecError
from kvspec.model import kinds
from kvspec.model.engine import Engine
from kvspec.model.plan import (
    Group,
    GroupFigures,
    LayerEntry,
    Layout,
    Plan,
    StageFigures,
)
from kvspec.model.quant import cell_parts, format_for
from kvspec.model.quant.cells import CellPart
from kvspec.model.specs import (
    Attention,
    LayerSpec,
    MambaState,
    UniformType,
    layer_specs,
)
from kvspec.planner.checks import early_checks
from kvspec.planner.resolve import Resolved, min_blocks_to_serve
from kvspec.planner.size import block_sizes, memory_usage


def _group_figures(gid: int, group: Group, engine: Engine, plan: Plan) -> GroupFigures:
    """A group's byte accounting is that of one block on stage 0 (the block a
    request holds in this group)."""
    st0 = plan.stages[0]
    local = st0.groups[gid] if gid < len(st0.groups) else None
    names = local.layer_names if local is not None else ()
    if isinstance(group.spec, UniformType):
        specs = group.spec.specs
        useful = sum(specs[n].unpadded_page_size_bytes for n in names)
    else:
        useful = group.spec.unpadded_page_size_bytes * len(names)
    allocated = local.page_bytes() if (local is not None and group.own_pool) \
        else st0.bytes_per_block
    try:
        width: int | None = group.spec.max_num_blocks_per_req(engine, engine.max_model_len)
    except ValueError:
        width = None
    return GroupFigures(useful, allocated - useful, group.spec.max_memory_usage_bytes(engine),
                        group.blocks_per_request(engine), width)


def needs_zeroing(groups: tuple[Group, ...]) -> bool:
    """State layers read before fully written, or mixed precision: zero new blocks."""
    specs = [s for g in groups for s in layer_specs(g.spec)]
    if any(isinstance(s, MambaState) for s in specs):
        return True
    return len({(s.dtype, s.kv_quant_mode) for s in specs if isinstance(s, Attention)}) > 1


def cells_of(spec: LayerSpec, kv_cache_dtype: str | None
             ) -> tuple[tuple[CellPart, ...] | None, bool]:
    """The addressable parts of a layer's cells and whether it has per-tensor scales."""
    if not isinstance(spec, Attention) or kv_cache_dtype is None:
        return None, False
    try:
        parts = cell_parts(kv_cache_dtype, kind="mla" if kinds.of(spec).latent else "attention",
                           dtype=spec.dtype, head_size=spec.head_size,
                           head_size_v=spec.head_size_v or 0,
                           cell_bytes=spec.state_content_size_bytes)
        return parts, format_for(kv_cache_dtype).per_tensor_scales
    except KvspecError:
        return None, False


def _finite(x: float) -> float | None:
    """A concurrency as the artifact writes it (None: unbounded)."""
    return None if x == float("inf") else x


def _budget(r: Resolved) -> Budget:
    return Budget(memory=r.available, num_blocks=r.num_blocks,
                  max_concurrency=_finite(r.max_concurrency),
                  kv_cache_size_tokens=r.kv_cache_size_tokens,
                  max_model_len=r.engine.max_model_len,
                  estimated_max_model_len=r.estimated_max_model_len)


def layout_of(name: str, model: str | None, plan: Plan, resolved: Resolved | None,
              kv_cache_dtypes: Mapping[str, str | None]) -> Layout:
    """The :class:`Layout` of ``plan``, sized by ``resolved`` when there is a budget."""
    engine = resolved.engine if resolved is not None else plan.engine
    group_of = plan.group_of()
    layers = {}
    cells: dict[tuple[int, str | None], tuple] = {}  # layers sharing a spec share their cells
    specs = plan.specs
    for st in plan.stages:
        for n in st.layer_names:
            spec, dtype = specs[n], kv_cache_dtypes.get(n)
            if not isinstance(spec, Attention) or dtype is None:
                layers[n] = LayerEntry(n, spec, st.index, group_of.get(n))
                continue
            key = (id(spec), dtype)
            found = cells.get(key)
            if found is None:
                found = cells[key] = cells_of(spec, dtype)
            layers[n] = LayerEntry(n, spec, st.index, group_of.get(n), dtype, *found)
    need = min_blocks_to_serve(engine, plan.stages)
    stage_figures = tuple(StageFigures(memory_usage(engine, st.groups) if st.groups else 0,
                                       need) for st in plan.stages)
    st0 = plan.stages[0]
    sched, hashed = block_sizes(engine, st0.groups) if st0.groups else (
        engine.block_size, engine.block_size)
    return Layout(
        name=name, model=model, plan=plan, engine=engine, layers=layers,
        group_figures=tuple(_group_figures(i, g, engine, plan)
                            for i, g in enumerate(plan.groups)),
        stage_figures=stage_figures, scheduler_block_size=sched, hash_block_size=hashed,
        needs_zeroing=needs_zeroing(plan.groups),
        budget=_budget(resolved) if resolved is not None else None,
        warnings=tuple(early_checks(plan, engine,
                                    resolved.num_blocks if resolved is not None else None)))
