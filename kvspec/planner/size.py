"""The size pass: what one request costs, what fits a budget, block sizes.

Per-request memory is counted in whole blocks of the shared pool: a request at
``max_model_len`` takes ``cdiv(per-request bytes, page)`` blocks from every
group's table, and all groups draw ids from one pool, so the bytes it needs
are ``bytes_per_block * sum(blocks per group)``. The state-slot arrangement
sizes its own pools (:mod:`.strategies.state_slots_pool`), read from the
groups' recorded strategy.

:func:`size_plan` sizes a plan for a budget, as the reference's
``get_kv_cache_configs``: auto-fit ``max_model_len``, the one-request check
(the null block reserved), blocks per stage, the smallest stage's count for
every stage, capacity and block sizes. :func:`blocks_for` and :func:`resize`
size a compiled layout for another budget (its ``max_model_len`` as compiled).

>>> from kvspec.model.engine import Engine
>>> from kvspec.model.specs import FullAttention
>>> from kvspec.planner.plan import plan_layers
>>> f = FullAttention(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")
>>> plan = plan_layers(Engine(max_model_len=32768), [{f"l{i}": f for i in range(4)}])
>>> s = size_plan(plan, memory=8 * 2**30)
>>> s.num_blocks, s.max_concurrency, s.kv_cache_size_tokens
(32768, 16.0, 524288)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvspec.artifact.format import Budget
from kvspec.artifact.sizing import blocks_for as sized_blocks
from kvspec.errors import NotEnoughMemoryError, PlanError
from kvspec.model.blocks import block_sizes
from kvspec.model.engine import BudgetRef, Engine, SettingRef
from kvspec.model.fit import longest_fitting, longest_request
from kvspec.model.plan import Group, Layout, Plan, Stage
from kvspec.planner.place import bytes_per_block
from kvspec.planner.strategies import state_slots_pool as slots

#: Most blocks a pool may have: vLLM's block tables hold 32-bit ids (int32 tensors).
MAX_BLOCKS = 2**31 - 1


def pool_bytes_per_block(engine: Engine, groups: Sequence[Group]) -> int:
    """Bytes one block of the main pool costs."""
    arrangement = slots.arrangement_of(groups)
    if arrangement is not None:
        return slots.bytes_per_block(engine, arrangement)
    return bytes_per_block(groups)


def fixed_pool_bytes(engine: Engine, groups: Sequence[Group]) -> int:
    """Bytes that do not scale with the block count (a drafter's own pool)."""
    arrangement = slots.arrangement_of(groups)
    return slots.draft_pool_bytes(engine, arrangement) if arrangement is not None else 0


def _unsizable(exc: ValueError) -> PlanError:
    """A layer's figures refused while sizing a request (a spec made through the
    Python API; sources are checked before planning)."""
    return PlanError(str(exc), hint="check the layer's fields against docs/format.md")


def memory_usage(engine: Engine, groups: Sequence[Group]) -> int:
    """Bytes one request at ``engine.max_model_len`` needs, padding included."""
    if not groups:
        return 0
    arrangement = slots.arrangement_of(groups)
    if arrangement is not None:
        return slots.memory_usage(engine, arrangement)
    try:
        blocks = sum(g.blocks_per_request(engine) for g in groups)
    except ValueError as exc:
        raise _unsizable(exc) from exc
    return bytes_per_block(groups) * blocks


def estimate_max_model_len(engine: Engine, groups: Sequence[Group], available: int) -> int:
    """The longest ``max_model_len`` (up to the configured one) whose request
    fits ``available`` bytes; 0 when not even one token fits (binary search).

    Outside the state-slot layout a request costs whole blocks of one size, so
    the search compares block counts, with each group's figures taken once."""
    if slots.arrangement_of(groups) is None:
        limit = available // bytes_per_block(groups)
        try:
            return longest_request(engine, groups, limit)
        except ValueError as exc:
            raise _unsizable(exc) from exc

    def fits(length: int) -> bool:
        at = engine if length == engine.max_model_len else \
            dataclasses.replace(engine, max_model_len=length)
        return memory_usage(at, groups) <= available

    return longest_fitting(engine.max_model_len, fits)


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f}"


def _largest_page(groups: Sequence[Group]) -> str:
    """``; the largest page: LAYER's, N bytes`` for a message about a block's size."""
    group = max((g for g in groups if g.layer_names), default=None,
                key=lambda g: g.spec.page_size_bytes)
    if group is None:
        return ""
    layers = len(group.layer_names)
    return (f"; the largest page is {group.layer_names[0]}'s, "
            f"{group.spec.page_size_bytes:,} bytes"
            + (f", in a group of {layers} layers" if layers > 1 else ""))


def check_fits(engine: Engine, groups: Sequence[Group], available: int, *,
               stage: int = 0, block_bytes: int = 0) -> None:
    """Raise when one request at ``max_model_len`` does not fit ``available``
    (the pool less its null block of ``block_bytes``), with the reference's numbers."""
    if available <= 0:
        budget = available + block_bytes
        raise NotEnoughMemoryError(
            "no memory is left for KV cache blocks" + (
                f": {budget:,} bytes do not hold the null block and one more block "
                f"({block_bytes:,} bytes each{_largest_page(groups)})" if block_bytes else ""),
            needed_bytes=memory_usage(engine, groups), available_bytes=available,
            max_model_len=engine.max_model_len, estimated_max_model_len=0,
            ref=BudgetRef(),
            hint="give the KV cache more memory (engine.memory / --memory)")
    needed = memory_usage(engine, groups)
    if needed <= available:
        return
    estimate = estimate_max_model_len(engine, groups, available)
    est = (f" Based on the available memory, the estimated maximum model length is "
           f"{estimate}." if estimate > 0 else "")
    where = f" on pipeline stage {stage}" if stage else ""
    raise NotEnoughMemoryError(
        f"To serve at least one request with the model's max seq len "
        f"({engine.max_model_len}), {_gib(needed)} GiB KV cache is needed, which is "
        f"larger than the available KV cache memory ({_gib(available)} GiB){where}."
        f"{est}",
        needed_bytes=needed, available_bytes=available,
        max_model_len=engine.max_model_len, estimated_max_model_len=estimate,
        ref=SettingRef("max_model_len"),
        expected=f"one request within {available} bytes (the budget less the null block)",
        found=f"{needed} bytes for one request of {engine.max_model_len} tokens",
        hint=(f"set engine.max_model_len to {estimate} or less, or give the KV cache more "
              "memory" if estimate > 0 else "give the KV cache more memory"))


def blocks_per_request(engine: Engine, groups: Sequence[Group]) -> int:
    """Main-pool blocks one request at ``max_model_len`` takes.

    A drafter with a pool of its own draws its blocks from that pool, so its
    groups are left out on every stage -- also on a pipeline stage that holds
    none of its layers, where the reference counts them (docs/deviations.md).
    """
    return sum(g.blocks_per_request(engine) for g in groups if not g.own_pool)


# ---------------------------------------------------------------------------
# a plan sized for a budget
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StageSizing:
    """One stage's share of a :class:`Sizing`: its tensors at the block count."""

    index: int
    num_blocks: int
    tensors: tuple[dict[str, Any], ...]
    memory_usage: int
    estimated_max_model_len: int


@dataclass(frozen=True, slots=True)
class Sizing:
    """A plan sized for one budget: what the engine would allocate."""

    plan: Plan
    engine: Engine
    available: int
    num_blocks: int
    stages: tuple[StageSizing, ...]
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
                        ref=SettingRef("max_model_len"), hint="give the KV cache more memory")
    return dataclasses.replace(engine, max_model_len=fit)


def size_plan(plan: Plan, *, memory: int | None = None,
              num_blocks: int | None = None) -> Sizing:
    """Size ``plan`` for ``memory`` bytes per rank, or for ``num_blocks``.

    ``num_blocks`` (or the source's ``num_blocks`` override) fixes the block
    count; the budget is then what those blocks cost, as in the reference.
    """
    engine = plan.engine
    override = num_blocks if num_blocks is not None else engine.num_gpu_blocks_override
    stages = plan.stages
    if memory is None and override is None:
        raise PlanError("no memory budget: give engine.memory in the source, --memory, "
                        "or a block count", ref=BudgetRef(), hint="e.g. --memory 40GiB")
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
    if n_min > MAX_BLOCKS:
        raise PlanError(f"the budget gives {n_min:,} blocks: more than the {MAX_BLOCKS:,} "
                        "that 32-bit block ids (vLLM's block tables) can number",
                        ref=BudgetRef(), found=f"{n_min:,} blocks",
                        hint="the budget is per rank: check its unit (40GiB, not 40TiB)")
    results = tuple(StageSizing(
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
    return Sizing(plan, engine, memory, n_min, results, concurrency, tokens, sched, hashed)


# ---------------------------------------------------------------------------
# a compiled layout, re-sized (its max_model_len stays as compiled)
# ---------------------------------------------------------------------------


def blocks_for(layout: Layout, *, memory: int | None = None,
               num_blocks: int | None = None) -> int:
    """The block count every stage of ``layout`` uses for a per-rank ``memory``
    budget (the smallest stage's count), or ``num_blocks`` checked; the
    source's own block count wins over a budget, as in the reference."""
    return sized_blocks([(st.bytes_per_block if st.groups else 0, st.fixed_bytes)
                         for st in layout.stages], need=layout.min_num_blocks(),
                        override=layout.engine.num_gpu_blocks_override,
                        max_model_len=layout.engine.max_model_len, memory=memory,
                        num_blocks=num_blocks)


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
    return Budget(memory=spent, num_blocks=n, max_concurrency=finite(conc),
                  kv_cache_size_tokens=int(conc * engine.max_model_len) if per_req else 0,
                  max_model_len=engine.max_model_len, estimated_max_model_len=est)


def finite(x: float) -> float | None:
    """A concurrency as the artifact writes it (None: unbounded, no group takes
    blocks per request)."""
    return None if x == float("inf") else x
