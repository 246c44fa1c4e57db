"""Block sizes across a stage's groups: the scheduler's (the LCM every prefill
and prefix-cache hit aligns to) and the prefix hash's (the GCD of the
prefix-cacheable groups, or ``prefix_match_unit``), as the reference's
``resolve_kv_cache_block_sizes``. A rule of the engine over the groups' specs,
read alike by the planner's plan and an artifact's frozen groups; and the engine
one pool of a separate plan plans with (:func:`pool_engine`).

>>> from kvspec.model.engine import Engine
>>> from kvspec.model.specs import FullAttention
>>> full = FullAttention(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")
>>> class G:
...     def __init__(self, spec): self.spec = spec
>>> block_sizes(Engine(), [G(full)])
(16, 16)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Protocol

from kvspec.errors import PlanError
from kvspec.model.engine import Engine, SettingRef
from kvspec.model.specs import Attention, LayerSpec, MambaState, layer_specs

__all__ = ["Specced", "block_sizes", "pool_engine"]


class Specced(Protocol):
    """A group as the block-size rule reads it: its (merged) spec."""

    @property
    def spec(self) -> LayerSpec: ...


def _dcp_block(group: Specced, dcp: int) -> int:
    specs = layer_specs(group.spec)
    if specs and all(isinstance(s, Attention) for s in specs):
        return group.spec.block_size * dcp
    return group.spec.block_size


def _hash_block_size(engine: Engine, groups: Sequence[Specced], sizes: list[int]) -> int:
    hashing = [b for g, b in zip(groups, sizes) if g.spec.prefix_cacheable] or sizes
    unit = engine.prefix_match_unit
    hash_size = unit if unit is not None else math.gcd(*hashing)
    if any(b % hash_size for b in hashing):
        raise PlanError(
            f"prefix_match_unit {hash_size} must divide every prefix-cacheable group's "
            f"block size; group block sizes {sizes}, prefix-cacheable {hashing}",
            ref=SettingRef("prefix_match_unit"), found=str(hash_size),
            expected=f"a divisor of {math.gcd(*hashing)}",
            hint="leave prefix_match_unit out to take the groups' common divisor")
    return hash_size


def block_sizes(engine: Engine, groups: Sequence[Specced]) -> tuple[int, int]:
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
    per_state = ((s, getattr(s, "tokens_per_state", None)) for s, _ in specs)
    alignments = {n for s, n in per_state
                  if s.prefix_cacheable and isinstance(n, int) and n > 1}
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
            ref=SettingRef("prefix_match_unit"),
            expected=f"a prefix-cache unit that is a multiple of {math.lcm(*alignments)}",
            hint="set engine.prefix_match_unit to such a multiple (block sizes, "
                 "mamba_block_size included, set the default), or turn prefix caching off")
    return scheduler, hash_size


def pool_engine(engine: Engine, block_size: int, state_block_size: int | None,
                state: bool) -> Engine:
    """The engine one pool of a separate plan plans with: the pool's block size for
    every layer (``block_size`` tokens per attention block; a state pool's block
    as the engine sizes a state layer's for ``state_block_size``)."""
    if not state:
        return dataclasses.replace(engine, block_size=block_size)
    size = engine.layer_block_size(state_block_size, state=True)
    return dataclasses.replace(engine, block_size=size, mamba_block_size=size)
