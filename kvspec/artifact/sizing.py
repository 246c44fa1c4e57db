"""How many blocks a compiled layout's pools get for a budget: one rule, used by
``load``, ``plan --memory`` and ``explain`` alike (no planner needed).

Every stage of a deployment uses one block count, the smallest any stage's
budget allows; the source's own ``num_blocks`` override wins over a budget (as
in the reference); a count that cannot serve one request at ``max_model_len``
(the null block included) is refused.

>>> blocks_for([(2 << 20, 0)], need=8193, override=None, max_model_len=131072,
...            memory=40 << 30)
20480
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

from kvspec.artifact.format import Pool
from kvspec.errors import PlanError

__all__ = ["blocks_for", "pool_counts"]


def blocks_for(stages: Sequence[tuple[int, int]], *, need: int, override: int | None,
               max_model_len: int, memory: int | None = None,
               num_blocks: int | None = None) -> int:
    """The block count for a per-rank ``memory`` budget, or ``num_blocks``
    checked. ``stages``: each stage's ``(bytes per block, fixed bytes)`` (a stage
    without groups has 0 bytes per block); ``need``: the fewest blocks that serve
    one request."""
    if num_blocks is None and memory is None:
        num_blocks = override
    if num_blocks is None:
        if memory is None:
            raise PlanError("give num_blocks or a memory budget to size the pool",
                            hint="e.g. num_blocks_for(memory=40 * 2**30)")
        counts = [(memory - fixed) // per_block for per_block, fixed in stages if per_block]
        num_blocks = override if override is not None else (min(counts) if counts else 1)
    if num_blocks < need:
        budget = f" ({memory} bytes)" if memory is not None else ""
        raise PlanError(
            f"{num_blocks} block{'s' if num_blocks != 1 else ''}{budget} cannot serve one "
            f"request at max_model_len {max_model_len}: it needs {need} blocks (one of them "
            "the null block)",
            expected=f"num_blocks >= {need}", found=str(num_blocks),
            hint="give the KV cache more memory or compile with a shorter max_model_len")
    return num_blocks


def pool_counts(pools: Sequence[Pool], memory: int) -> dict[str, int]:
    """Each pool's block count for ``memory`` bytes per rank, where a stage splits
    its budget between pools (the ``separate`` policy): a fixed pool its own count,
    a pool with a share ``floor(memory * share / bytes_per_block)``; a pool left
    with fewer blocks than one request at max_model_len takes is refused.

    >>> from kvspec.artifact.format import Pool
    >>> p = Pool(name="a", allocation="a", offset=0, bytes_per_block=1024, num_blocks=None,
    ...          min_num_blocks=5, share=[1, 4], groups=[0])
    >>> pool_counts([p], 1 << 20)
    {'a': 256}
    """
    out = {}
    for p in pools:
        if p.num_blocks is not None:
            out[p.name] = p.num_blocks
            continue
        share = Fraction(p.share[0], p.share[1]) if p.share else Fraction(1)
        n = int(memory * share) // p.bytes_per_block
        if n < p.min_num_blocks:
            raise PlanError(
                f"pool {p.name} gets {n} blocks of {memory:,} bytes ({float(share):.1%} of "
                f"them), fewer than one request at max_model_len takes ({p.min_num_blocks}, "
                "one of them the null block)", expected=f"num_blocks >= {p.min_num_blocks}",
                found=str(n), hint="give the KV cache more memory or compile with a shorter "
                "max_model_len")
        out[p.name] = n
    return out
