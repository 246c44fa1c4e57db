"""``plan_layers``: layer specs of every stage -> a memory-independent plan.

Groups, per-stage projection, placement as affine forms of the block count,
and each stage's bytes per block and fixed pools. Sizing for a budget is
:func:`kvspec.planner.size.size_plan`.

>>> from kvspec.model.engine import Engine
>>> from kvspec.model.specs import FullAttention
>>> f = FullAttention(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")
>>> plan = plan_layers(Engine(max_model_len=32768), [{f"l{i}": f for i in range(4)}])
>>> plan.stages[0].bytes_per_block, plan.groups[0].strategy
(262144, 'uniform')
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvspec.errors import PLANNER_BUG, LayerRef, PlanError
from kvspec.model.engine import Engine, SettingRef
from kvspec.model.plan import Group, Plan, Stage
from kvspec.model.specs import LayerSpec, SlidingWindow, replace
from kvspec.planner.group import group_layers, project_groups
from kvspec.planner.log import PlanLog
from kvspec.planner.place import place
from kvspec.planner.size import fixed_pool_bytes, pool_bytes_per_block
from kvspec.planner.strategies import state_slots_pool as slots


def _merged_specs(engine: Engine, stage_specs: Sequence[Mapping[str, LayerSpec]]
                  ) -> dict[str, LayerSpec]:
    merged: dict[str, LayerSpec] = {}
    for stage in stage_specs:
        for name, spec in stage.items():
            known = merged.setdefault(name, spec)
            if known is not spec and known != spec:
                raise PlanError(f"layer {name} has different specs on different ranks",
                                ref=LayerRef(name), hint="a layer's spec must be the same on "
                                "every rank that holds it; check the per-stage specs given")
    # Multi-module speculation re-prefills trailing tokens: sliding windows keep them.
    retained = max(0, engine.num_prefill_lookahead_tokens - 1)
    if retained:
        merged = {n: replace(s, extra_retained_tokens=retained)
                  if isinstance(s, SlidingWindow) else s for n, s in merged.items()}
    return merged


def _check_usage(engine: Engine, groups: Sequence[Group]) -> None:
    for g in groups:
        try:
            g.spec.max_memory_usage_bytes(engine)
        except ValueError as exc:  # e.g. sliding windows under decode-context parallelism
            raise PlanError(f"group of {g.layer_names[0]}...: {exc}",
                            ref=SettingRef("decode_context_parallel_size"),
                            hint="decode-context parallelism shards full attention only; "
                                 "set parallel.decode_context: 1 for this model") from exc


def plan_stage(engine: Engine, index: int, names: Sequence[str],
               groups: Sequence[Group]) -> Stage:
    """One stage: its groups (global order and ids), pools and tensors."""
    if not groups:
        return Stage(index, tuple(names), tuple(groups), 0, 0, None, (), ())
    arrangement = slots.arrangement_of(groups)
    if arrangement is not None:
        tensors = slots.place(engine, arrangement)
        draft_blocks = slots.draft_pool_blocks(engine, arrangement)
        draft_names = tuple(n for _, g in arrangement.drafts for n in g.layer_names) \
            if draft_blocks else ()
    else:
        tensors = place(engine, groups, range(len(groups)))
        draft_blocks, draft_names = None, ()
    return Stage(index, tuple(names), tuple(groups), pool_bytes_per_block(engine, groups),
                 fixed_pool_bytes(engine, groups), draft_blocks, draft_names, tuple(tensors))


def plan_layers(engine: Engine, stage_specs: Sequence[Mapping[str, LayerSpec]],
                log: PlanLog | None = None) -> Plan:
    """Plan the layers of every pipeline stage (``stage_specs``, in order)."""
    log = log if log is not None else PlanLog()
    merged = _merged_specs(engine, stage_specs)
    groups = group_layers(engine, merged, log)
    _check_usage(engine, groups)
    stages = []
    for index, stage in enumerate(stage_specs):
        projected = project_groups(groups, list(stage)) if len(stage_specs) > 1 else groups
        if sum(len(g.layer_names) for g in projected) != len(stage):
            raise PlanError("some layers are not assigned to any group", hint=PLANNER_BUG)
        stages.append(plan_stage(engine, index, tuple(stage), projected))
    return Plan(engine, merged, tuple(groups), tuple(stages), tuple(log.entries))
