"""The last planning step: a plan (and its sizing) -> the :class:`Layout` IR.

Everything an artifact states is computed here, once: each group's and
stage's figures for the final engine (``max_model_len`` fitted when auto),
block sizes, whether new blocks need zeroing, the budget and the early checks;
each layer's quantization comes as the expand pass decided it. Freezing is
then pure serialisation.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvspec.artifact.format import Budget
from kvspec.model.blocks import block_sizes
from kvspec.model.checks import early_checks
from kvspec.model.engine import Engine
from kvspec.model.plan import (
    Group,
    GroupFigures,
    LayerEntry,
    Layout,
    Plan,
    StageFigures,
)
from kvspec.model.quant.cells import Quantized
from kvspec.model.specs import Attention, MambaState, UniformType, layer_specs
from kvspec.planner.size import Sizing, finite, memory_usage, min_blocks_to_serve


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


def _budget(s: Sizing) -> Budget:
    return Budget(memory=s.available, num_blocks=s.num_blocks,
                  max_concurrency=finite(s.max_concurrency),
                  kv_cache_size_tokens=s.kv_cache_size_tokens,
                  max_model_len=s.engine.max_model_len,
                  estimated_max_model_len=s.estimated_max_model_len)


def _entries(plan: Plan, quantization: Mapping[str, Quantized | None]
             ) -> dict[str, LayerEntry]:
    group_of = plan.group_of()
    specs = plan.specs
    out = {}
    for st in plan.stages:
        for n in st.layer_names:
            q = quantization.get(n)
            out[n] = LayerEntry(n, specs[n], st.index, group_of.get(n)) if q is None else \
                LayerEntry(n, specs[n], st.index, group_of.get(n), *q)
    return out


def build_layout(name: str, model: str | None, plan: Plan, sizing: Sizing | None,
                 quantization: Mapping[str, Quantized | None]) -> Layout:
    """The :class:`Layout` of ``plan``, sized by ``sizing`` when there is a budget;
    ``quantization`` is each layer's, as the expand pass decided it."""
    engine = sizing.engine if sizing is not None else plan.engine
    need = min_blocks_to_serve(engine, plan.stages)
    stage_figures = tuple(StageFigures(memory_usage(engine, st.groups) if st.groups else 0,
                                       need) for st in plan.stages)
    st0 = plan.stages[0]
    sched, hashed = block_sizes(engine, st0.groups) if st0.groups else (
        engine.block_size, engine.block_size)
    return Layout(
        name=name, model=model, plan=plan, engine=engine, layers=_entries(plan, quantization),
        group_figures=tuple(_group_figures(i, g, engine, plan)
                            for i, g in enumerate(plan.groups)),
        stage_figures=stage_figures, scheduler_block_size=sched, hash_block_size=hashed,
        needs_zeroing=needs_zeroing(plan.groups),
        budget=_budget(sizing) if sizing is not None else None,
        warnings=tuple(early_checks(plan, engine,
                                    sizing.num_blocks if sizing is not None else None)))
