"""``resolve``: a plan settled for a budget, as the reference's ``get_kv_cache_configs``.

Auto-fit ``max_model_len``, the one-request check (the null block reserved),
blocks per stage, the smallest stage's count for every stage, capacity and
block sizes.

>>> from kvspec.model.engine import Engine
>>> from kvspec.model.specs import FullAttention
>>> from kvspec.planner.plan import plan_layers
>>> f = FullAttention(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")
>>> plan = plan_layers(Engine(max_model_len=32768), [{f"l{i}": f for i in range(4)}])
>>> r = resolve(plan, memory=8 * 2**30)
>>> r.num_blocks, r.max_concurrency, r.kv_cache_size_tokens
(32768, 16.0, 524288)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kvspec.errors import PlanError
from kvspec.model.engine import Engine
from kvspec.artifact.format import Budget
from kvspec.model.plan import Layout, Plan, Stage
from kvspec.planner.size import (
    block_sizes,
    blocks_per_request,
    check_fits,
    estimate_max_model_len,
    memory_usage,
)


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

    @property
    def estimated_max_model_len(self) -> int:
        return min(s.estimated_max_model_len for s in self.stages)


def min_blocks_to_serve(engine: Engine, stages: tuple[Stage, ...]) -> int:
    """The fewest blocks with which every stage serves one request at
    ``max_model_len`` (one block is the pool's null block)."""
    need = 1
    for st in stages:
        if st.groups:
            # a drafter's own pool is a fixed cost, outside the block-scaled pool
            usage = memory_usage(engine, st.groups) - st.fixed_bytes
            need = max(need, -(-usage // st.bytes_per_block) + 1)
    return need


def _fit_max_model_len(engine: Engine, stages: tuple[Stage, ...], check: list[int]) -> Engine:
    fit = engine.max_model_len
    for st, c in zip(stages, check):
        if st.groups:
            fit = min(fit, estimate_max_model_len(engine, st.groups, c))
    if fit <= 0:
        raise PlanError("cannot fit max_model_len: not even one token fits the memory",
                        path="engine.max_model_len", hint="give the KV cache more memory")
    return dataclasses.replace(engine, max_model_len=fit)


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
                        "or a block count", path="engine.memory", hint="e.g. --memory 40GiB")
    avail = [override * st.bytes_per_block if override is not None and st.groups
             else (memory if memory is not None else 0) for st in stages]
    check = [a - st.bytes_per_block if st.groups else a for st, a in zip(stages, avail)]
    if engine.auto_max_model_len:
        engine = _fit_max_model_len(engine, stages, check)
    for st, c in zip(stages, check):
        if st.groups:
            check_fits(engine, st.groups, c, stage=st.index, block_bytes=st.bytes_per_block)
    n_min = min(override if override is not None else st.blocks_for(a)
                for st, a in zip(stages, avail))
    results = tuple(StageResult(
        st.index, n_min, tuple(t.at(n_min) for t in st.tensors),
        memory_usage(engine, st.groups) if st.groups else 0,
        estimate_max_model_len(engine, st.groups, c) if st.groups else 0)
        for st, c in zip(stages, check))
    first = stages[0]
    per_req = blocks_per_request(engine, first.groups)
    concurrency = n_min / per_req if per_req else float("inf")
    tokens = int(concurrency * engine.max_model_len) if per_req else 0
    sched, hashed = block_sizes(engine, first.groups)
    if memory is None:  # what the fixed block count costs the rank that spends the most
        memory = max(st.memory_for(n_min) for st in stages)
    return Resolved(plan, engine, memory, n_min, results, concurrency, tokens, sched, hashed)


# ---------------------------------------------------------------------------
# a compiled layout, re-sized (its max_model_len stays as compiled)
# ---------------------------------------------------------------------------


def blocks_for(layout: Layout, *, memory: int | None = None,
               num_blocks: int | None = None) -> int:
    """The block count every stage of ``layout`` uses for a per-rank ``memory``
    budget (the smallest stage's count), or ``num_blocks`` checked; the
    source's own block count wins over a budget, as in the reference."""
    override = layout.engine.num_gpu_blocks_override
    if num_blocks is None and memory is None:
        num_blocks = override
    if num_blocks is None:
        if memory is None:
            raise PlanError("give num_blocks or a memory budget to size the pool",
                            hint="e.g. blocks_for(layout, memory=40 * 2**30)")
        counts = [st.blocks_for(memory) for st in layout.stages if st.bytes_per_block]
        num_blocks = override if override is not None else (min(counts) if counts else 1)
    need = layout.min_num_blocks()
    if num_blocks < need:
        budget = f" ({memory} bytes)" if memory is not None else ""
        raise PlanError(
            f"{num_blocks} blocks{budget} cannot serve one request at max_model_len "
            f"{layout.engine.max_model_len}: it needs {need} blocks (one of them the null "
            "block)", expected=f"num_blocks >= {need}", found=str(num_blocks),
            hint="give the KV cache more memory or compile with a shorter max_model_len")
    return num_blocks


def resize(layout: Layout, *, memory: int | None = None,
           num_blocks: int | None = None) -> Budget:
    """``layout``'s capacity for another budget (or block count)."""
    n = blocks_for(layout, memory=memory, num_blocks=num_blocks)
    engine = layout.engine
    st0 = layout.stage(0)
    per_req = blocks_per_request(engine, st0.groups)
    conc = n / per_req if per_req else float("inf")
    spent = memory if memory is not None else max(st.memory_for(n) for st in layout.stages)
    est = min((estimate_max_model_len(engine, st.groups, spent - st.bytes_per_block)
               for st in layout.stages if st.groups), default=0)
    return Budget(memory=spent, num_blocks=n,
                  max_concurrency=None if conc == float("inf") else conc,
                  kv_cache_size_tokens=int(conc * engine.max_model_len) if per_req else 0,
                  max_model_len=engine.max_model_len, estimated_max_model_len=est)
