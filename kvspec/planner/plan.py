"""The planner's entry points: layer specs -> a plan -> a plan for a budget.

``plan_layers`` does everything that needs no memory budget (groups, per-stage
projection, placement as affine forms of the block count, per-request needs);
``resolve`` settles a plan for a budget or a block count exactly as the
reference's ``get_kv_cache_configs`` does: auto-fit ``max_model_len``, the
one-request check (the null block reserved), blocks per stage, the smallest
stage's count for every stage, capacity and block sizes.

>>> from kvspec.engine import Engine
>>> from kvspec.spec import FullAttention
>>> f = FullAttention(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")
>>> plan = plan_layers(Engine(max_model_len=32768), [{f"l{i}": f for i in range(4)}])
>>> r = resolve(plan, memory=8 * 2**30)
>>> r.num_blocks, r.max_concurrency, r.kv_cache_size_tokens
(32768, 16.0, 524288)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from kvspec.engine import Engine
from kvspec.errors import PlanError
from kvspec.planner import glm5
from kvspec.planner.group import Group, group_layers, project_groups
from kvspec.planner.log import PlanLog
from kvspec.planner.place import Tensor, place
from kvspec.planner.size import (
    block_sizes,
    blocks_per_request,
    check_fits,
    estimate_max_model_len,
    fixed_pool_bytes,
    memory_usage,
    pool_bytes_per_block,
)
from kvspec.spec import LayerSpec, SlidingWindow, replace


@dataclass(frozen=True, slots=True)
class StagePlan:
    """One pipeline stage's share of the plan (every TP rank of it is alike)."""

    index: int
    layer_names: tuple[str, ...]
    groups: tuple[Group, ...]
    bytes_per_block: int
    #: Bytes outside the block-scaled pool (a drafter's own pool).
    fixed_bytes: int
    draft_num_blocks: int | None
    draft_layer_names: tuple[str, ...]
    tensors: tuple[Tensor, ...]

    def blocks_for(self, memory: int) -> int:
        if not self.groups:
            return 1
        return (memory - self.fixed_bytes) // self.bytes_per_block


@dataclass(frozen=True, slots=True)
class Plan:
    """A memory-independent plan of every stage."""

    engine: Engine
    specs: dict[str, LayerSpec]
    groups: tuple[Group, ...]
    stages: tuple[StagePlan, ...]
    log: PlanLog = field(default_factory=PlanLog)


def plan_layers(engine: Engine, stage_specs: list[dict[str, LayerSpec]],
                log: PlanLog | None = None) -> Plan:
    """Plan the layers of every pipeline stage (``stage_specs``, in order)."""
    log = log if log is not None else PlanLog()
    merged: dict[str, LayerSpec] = {}
    for stage in stage_specs:
        for name, spec in stage.items():
            if name in merged and merged[name] != spec:
                raise PlanError(f"layer {name} has different specs on different ranks")
            merged.setdefault(name, spec)
    # Multi-module speculation re-prefills trailing tokens: sliding windows keep them.
    retained = max(0, engine.num_prefill_lookahead_tokens - 1)
    if retained:
        merged = {n: replace(s, extra_retained_tokens=retained)
                  if isinstance(s, SlidingWindow) else s for n, s in merged.items()}

    groups = group_layers(engine, dict(merged), log)
    for g in groups:
        try:
            g.spec.max_memory_usage_bytes(engine)
        except ValueError as exc:  # e.g. sliding windows under decode-context parallelism
            raise PlanError(f"group of {g.layer_names[0]}...: {exc}",
                            path="parallel.decode_context",
                            hint="decode-context parallelism shards full attention only; "
                                 "set parallel.decode_context: 1 for this model") from exc
    stages = []
    for index, stage in enumerate(stage_specs):
        projected = project_groups(groups, stage) if len(stage_specs) > 1 else list(groups)
        if sum(len(g.layer_names) for g in projected) != len(stage):
            raise PlanError("some layers are not assigned to any group")
        stages.append(_plan_stage(engine, index, tuple(stage), projected))
    return Plan(engine, merged, tuple(groups), tuple(stages), log)


def _plan_stage(engine: Engine, index: int, names: tuple[str, ...],
                groups: list[Group]) -> StagePlan:
    if not groups:
        return StagePlan(index, names, (), 0, 0, None, (), ())
    alias = glm5.recognise(groups)
    if alias is not None:
        tensors = glm5.place(engine, alias, groups)
        draft_blocks = glm5.draft_pool_blocks(engine, alias)
        draft_names = tuple(n for g in alias.drafts for n in g.layer_names) if draft_blocks else ()
    else:
        tensors = place(engine, groups)
        draft_blocks, draft_names = None, ()
    return StagePlan(index, names, tuple(groups), pool_bytes_per_block(engine, groups),
                     fixed_pool_bytes(engine, groups), draft_blocks, draft_names,
                     tuple(tensors))


@dataclass(frozen=True, slots=True)
class StageResult:
    index: int
    num_blocks: int
    tensors: tuple[dict, ...]
    memory_usage: int
    estimated_max_model_len: int


@dataclass(frozen=True, slots=True)
class Resolved:
    """A plan settled for one budget: what the engine would allocate."""

    plan: Plan
    engine: Engine
    available: int
    num_blocks: int
    stages: tuple[StageResult, ...]
    max_concurrency: float
    kv_cache_size_tokens: int
    scheduler_block_size: int
    hash_block_size: int

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def draft_num_blocks(self) -> int | None:
        return self.plan.stages[0].draft_num_blocks if self.plan.stages else None


def min_blocks_to_serve(plan: Plan) -> int:
    """The fewest blocks with which every stage serves one request at
    ``max_model_len`` (one block is the pool's null block)."""
    need = 1
    for st in plan.stages:
        if st.groups:
            # a drafter's own pool is a fixed cost, outside the block-scaled pool
            usage = memory_usage(plan.engine, list(st.groups)) - st.fixed_bytes
            need = max(need, -(-usage // st.bytes_per_block) + 1)
    return need


def resolve(plan: Plan, *, memory: int | None = None, num_blocks: int | None = None) -> Resolved:
    """Settle ``plan`` for ``memory`` bytes per rank, or for ``num_blocks``.

    ``num_blocks`` (or the source's ``num_blocks`` override) fixes the block
    count; the budget is then what those blocks cost, as in the reference.
    """
    engine = plan.engine
    override = num_blocks if num_blocks is not None else engine.num_gpu_blocks_override
    stages = plan.stages
    if memory is None and override is None:
        raise PlanError("no memory budget: give engine.memory in the source, --memory, "
                        "or a block count", path="engine.memory",
                        hint="e.g. --memory 40GiB")
    avail = []
    for st in stages:
        if override is not None and st.groups:
            avail.append(override * st.bytes_per_block)
        else:
            avail.append(memory if memory is not None else 0)
    check = [a - st.bytes_per_block if st.groups else a for st, a in zip(stages, avail)]

    if engine.auto_max_model_len:
        fit = engine.max_model_len
        for st, c in zip(stages, check):
            if st.groups:
                fit = min(fit, estimate_max_model_len(engine, list(st.groups), c))
        if fit <= 0:
            raise PlanError("cannot fit max_model_len: not even one token fits the memory",
                            path="engine.max_model_len",
                            hint="give the KV cache more memory")
        engine = dataclasses.replace(engine, max_model_len=fit)

    for st, c in zip(stages, check):
        if st.groups:
            check_fits(engine, list(st.groups), c, stage=st.index)

    per_stage = []
    for st, a in zip(stages, avail):
        n = st.blocks_for(a)
        if override is not None:
            n = override
        per_stage.append(n)
    n_min = min(per_stage)

    results = []
    for st, c in zip(stages, check):
        usage = memory_usage(engine, list(st.groups)) if st.groups else 0
        est = estimate_max_model_len(engine, list(st.groups), c) if st.groups else 0
        results.append(StageResult(st.index, n_min, tuple(t.at(n_min) for t in st.tensors),
                                   usage, est))

    first = stages[0]
    per_req = blocks_per_request(engine, list(first.groups), frozenset(first.draft_layer_names))
    concurrency = n_min / per_req if per_req else float("inf")
    tokens = int(concurrency * engine.max_model_len) if per_req else 0
    sched, hashed = block_sizes(engine, list(first.groups))
    return Resolved(plan, engine, memory if memory is not None else avail[0], n_min,
                    tuple(results), concurrency, tokens, sched, hashed)
