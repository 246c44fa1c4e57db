"""The size pass: what one request costs, what fits a budget, block sizes.

Per-request memory is counted in whole blocks of the shared pool: a request at
``max_model_len`` takes ``cdiv(per-request bytes, page)`` blocks from every
group's table, and all groups draw ids from one pool, so the bytes it needs
are ``bytes_per_block * sum(blocks per group)``. The state-slot layout sizes
its own pools (:mod:`.strategies.state_slots_pool`), read from the groups'
recorded strategy.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from kvspec.errors import NotEnoughMemoryError, PlanError
from kvspec.model.engine import Engine
from kvspec.model.plan import Group
from kvspec.model.specs import Attention, MambaState, layer_specs
from kvspec.planner.place import bytes_per_block
from kvspec.planner.strategies import state_slots_pool as slots


def pool_bytes_per_block(engine: Engine, groups: Sequence[Group]) -> int:
    """Bytes one block of the main pool costs."""
    layout = slots.layout_of(groups)
    if layout is not None:
        return slots.bytes_per_block(engine, layout)
    return bytes_per_block(groups)


def fixed_pool_bytes(engine: Engine, groups: Sequence[Group]) -> int:
    """Bytes that do not scale with the block count (a drafter's own pool)."""
    layout = slots.layout_of(groups)
    return slots.draft_pool_bytes(engine, layout) if layout is not None else 0


def _unsizable(exc: ValueError) -> PlanError:
    """A layer's figures refused while sizing a request (a spec made through the
    Python API; sources are checked before planning)."""
    return PlanError(str(exc), hint="check the layer's fields against docs/format.md")


def memory_usage(engine: Engine, groups: Sequence[Group]) -> int:
    """Bytes one request at ``engine.max_model_len`` needs, padding included."""
    if not groups:
        return 0
    layout = slots.layout_of(groups)
    if layout is not None:
        return slots.memory_usage(engine, layout)
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
    if slots.layout_of(groups) is None:
        per_block = bytes_per_block(groups)
        limit = available // per_block

        def fits(length: int) -> bool:
            at = engine if length == engine.max_model_len else \
                dataclasses.replace(engine, max_model_len=length)
            try:
                return sum(g.blocks_per_request(at) for g in groups) <= limit
            except ValueError as exc:
                raise _unsizable(exc) from exc
    else:
        def fits(length: int) -> bool:
            at = engine if length == engine.max_model_len else \
                dataclasses.replace(engine, max_model_len=length)
            return memory_usage(at, groups) <= available

    lo, hi = 1, engine.max_model_len
    if fits(hi):  # the common case: the configured length fits
        return hi
    if not fits(lo):
        return 0
    best = 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if fits(mid):
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


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
            path="engine.memory",
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
        path="engine.max_model_len",
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


def _dcp_block(group: Group, dcp: int) -> int:
    specs = layer_specs(group.spec)
    if specs and all(isinstance(s, Attention) for s in specs):
        return group.spec.block_size * dcp
    return group.spec.block_size


def _hash_block_size(engine: Engine, groups: Sequence[Group], sizes: list[int]) -> int:
    hashing = [b for g, b in zip(groups, sizes) if g.spec.prefix_cacheable] or sizes
    unit = engine.prefix_match_unit
    hash_size = unit if unit is not None else math.gcd(*hashing)
    if any(b % hash_size for b in hashing):
        raise PlanError(
            f"prefix_match_unit {hash_size} must divide every prefix-cacheable group's "
            f"block size; group block sizes {sizes}, prefix-cacheable {hashing}",
            path="engine.prefix_match_unit", found=str(hash_size),
            expected=f"a divisor of {math.gcd(*hashing)}",
            hint="leave prefix_match_unit out to take the groups' common divisor")
    return hash_size


def block_sizes(engine: Engine, groups: Sequence[Group]) -> tuple[int, int]:
    """``(scheduler_block_size, hash_block_size)``.

    The scheduler aligns to the LCM of the groups' block sizes (attention
    groups span ``dcp`` times their tokens); prefix hashes use the GCD of the
    prefix-cacheable groups, or ``prefix_match_unit``.
    """
    dcp = engine.decode_context_parallel_size
    if len(groups) <= 1:
        size = engine.block_size * dcp
        return size, size
    sizes = [_dcp_block(g, dcp) for g in groups]
    scheduler = math.lcm(*sizes)
    if not engine.enable_prefix_caching:
        return scheduler, scheduler
    specs = [(s, b) for g, b in zip(groups, sizes) for s in layer_specs(g.spec)]
    if any(isinstance(s, MambaState) and s.mamba_cache_mode != "align" for s, _ in specs):
        return scheduler, scheduler
    hash_size = _hash_block_size(engine, groups, sizes)
    alignments = {s.tokens_per_state for s, _ in specs
                  if s.prefix_cacheable and isinstance(getattr(s, "tokens_per_state", None), int)
                  and s.tokens_per_state > 1}  # type: ignore[attr-defined]
    partial_state = any(
        isinstance(s, MambaState) and s.mamba_cache_mode == "align"
        and ((dcp == 1 and b > hash_size) or (dcp > 1 and b >= hash_size)) for s, b in specs)
    hit_alignment = hash_size if partial_state else scheduler
    if any(hit_alignment % a for a in alignments):
        raise PlanError(
            f"prefix-cache unit {hash_size} ("
            + ("engine.prefix_match_unit" if engine.prefix_match_unit is not None else
               f"the GCD of the groups' block sizes {sorted(set(sizes))}")
            + f"): prefix-cache boundaries must align with each layer's per-state "
            f"compression {sorted(alignments)}",
            path="engine.prefix_match_unit",
            expected=f"a prefix-cache unit that is a multiple of {math.lcm(*alignments)}",
            hint="set engine.prefix_match_unit to such a multiple (block sizes, "
                 "mamba_block_size included, set the default), or turn prefix caching off")
    return scheduler, hash_size
