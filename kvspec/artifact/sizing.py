"""How many blocks a compiled layout's pools get for a budget, and how many
requests they hold: one rule, read from the frozen body (no planner needed), used
by ``load``, ``descriptor``, ``transfer``, ``plan``, ``simulate`` and ``explain``
alike; a separate plan's pool gets its share of the budget (:func:`share_of`).

Every stage of a deployment uses one block count per pool, the smallest any
stage's budget allows (a block id valid on one stage is valid on all); the
source's own ``num_blocks`` override wins over a budget (as in the reference),
for every budget-sized pool of every policy; a count that cannot serve one
request at ``max_model_len`` (the null block included) is refused, and so is
one whose allocation could not be addressed (:data:`MAX_BYTES`).

>>> blocks_for([(2 << 20, 0)], need=8193, override=None, max_model_len=131072,
...            memory=40 << 30)
20480
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

from kvspec.artifact.format import Layout, at
from kvspec.errors import PlanError

__all__ = ["MAX_BYTES", "blocks_for", "capacity_for", "counts_for", "share_of"]

#: The most bytes one allocation may have: what a signed 64-bit size (torch's, a
#: connector's registered length) holds.
MAX_BYTES = 2**63 - 1


def share_of(memory: int, share: Fraction | Sequence[int] | None) -> int:
    """The bytes per rank a pool gets of a ``memory`` budget: its ``share`` of it
    (a :class:`~fractions.Fraction`, or a separate plan's ``[numerator,
    denominator]``; None: all of it), floored. The one rule that compiling,
    ``load``, ``plan`` and ``simulate`` size a pool of a separate plan by.

    >>> share_of(40 << 30, [9697, 16704]), share_of(100, Fraction(1, 3)), share_of(7, None)
    (24933128513, 33, 7)
    """
    return int(memory * _fraction(share))


def _fraction(share: Fraction | Sequence[int] | None) -> Fraction:
    if isinstance(share, Fraction):
        return share
    return Fraction(share[0], share[1]) if share else Fraction(1)


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


def counts_for(body: Layout, stage: int, *, memory: int | None = None,
               num_blocks: int | None = None, fewest: bool = False) -> dict[str, int]:
    """Each pool's block count on ``stage``, whatever the policy: for ``num_blocks``
    (every budget-sized pool), else a per-rank ``memory`` budget, else the
    artifact's own budget (``fewest``: else the fewest blocks that serve one
    request). The source's ``num_blocks`` override wins over a budget. A pool
    sized by ``share`` gets, on every stage, the least any stage affords it.

    >>> from kvspec.artifact import Artifact
    >>> art = Artifact.read("layouts/pooling-separate.kvlayout.json")
    >>> counts_for(art.body, 0)
    {'sliding_window_1024': 5286, 'full_attention': 38044}
    """
    pooled = any(p.share is not None for st in body.stages for p in st.pools)
    override = body.engine.num_blocks
    if num_blocks is None and memory is None and override is None:
        if body.budget is not None:
            memory = body.budget.memory
        elif not fewest:
            raise PlanError("the artifact has no memory budget of its own",
                            hint="give num_blocks=..., memory=... or memory_fraction=...")
    st = body.stages[stage]
    if not pooled:
        need = max((s.min_num_blocks for s in body.stages), default=1)
        n = need if memory is None and num_blocks is None and override is None else blocks_for(
            [(s.bytes_per_block, s.fixed_bytes) for s in body.stages], need=need,
            override=override, max_model_len=body.engine.max_model_len, memory=memory,
            num_blocks=num_blocks)
        counts = {p.name: p.num_blocks if p.num_blocks is not None else n for p in st.pools}
    else:
        counts = _pooled_counts(body, stage, memory, num_blocks if num_blocks is not None
                                else override)
    _addressable(body, counts)
    return counts


def capacity_for(body: Layout, memory: int, pool: str | None = None) -> tuple[int, float]:
    """The blocks a per-rank ``memory`` budget gives the main pool (or ``pool`` of a
    separate plan, all of ``memory`` its own), and how many requests at
    ``max_model_len`` they hold (inf: no group takes blocks per request). A
    :class:`PlanError` when they cannot serve one.

    >>> from kvspec.artifact import Artifact
    >>> capacity_for(Artifact.read("layouts/llama-3.1-8b.kvlayout.json").body, 80 << 30)
    (40960, 5.0)
    """
    if pool is None:
        stages = [(st.bytes_per_block, st.fixed_bytes) for st in body.stages]
        need = max(st.min_num_blocks for st in body.stages)
        ids = {g.id for g in body.groups}
    else:
        pools = [p for st in body.stages for p in st.pools if p.name == pool]
        stages = [(p.bytes_per_block, 0) for p in pools]
        need = max(p.min_num_blocks for p in pools)
        ids = set(pools[0].groups)
    n = blocks_for(stages, need=need, override=body.engine.num_blocks,
                   max_model_len=body.engine.max_model_len, memory=memory)
    per_request = sum(g.blocks_per_request for g in body.groups if g.id in ids and not g.own_pool)
    return n, n / per_request if per_request else float("inf")


def _pooled_counts(body: Layout, stage: int, memory: int | None, fixed: int | None
                   ) -> dict[str, int]:
    """A separate plan's pools on ``stage``: ``fixed`` blocks each, else each pool's
    share of ``memory`` on the stage that affords the fewest (None: the fewest that
    serve one request)."""
    least: dict[str, int] = {}
    afford: dict[str, int] = {}
    for s in body.stages:
        for p in s.pools:
            least[p.name] = max(least.get(p.name, 1), p.min_num_blocks)
            if p.num_blocks is None and memory is not None:
                n = share_of(memory, p.share) // p.bytes_per_block
                afford[p.name] = min(afford.get(p.name, n), n)
    out = {}
    for p in body.stages[stage].pools:
        if p.num_blocks is not None:
            out[p.name] = p.num_blocks
            continue
        n = fixed if fixed is not None else afford.get(p.name, least[p.name])
        if n < least[p.name]:
            if fixed is not None:
                raise PlanError(
                    f"{n} blocks cannot serve one request at max_model_len "
                    f"{body.engine.max_model_len} in pool {p.name}: it needs {least[p.name]} "
                    "blocks (one of them the null block)",
                    expected=f"num_blocks >= {least[p.name]}", found=str(n),
                    hint="give more blocks, or compile with a shorter max_model_len")
            raise PlanError(
                f"pool {p.name} gets {n} blocks of {memory:,} bytes "
                f"({float(_fraction(p.share)):.1%} of "
                f"them), fewer than one request at max_model_len takes ({least[p.name]}, "
                "one of them the null block)", expected=f"num_blocks >= {least[p.name]}",
                found=str(n), hint="give the KV cache more memory or compile with a shorter "
                "max_model_len")
        out[p.name] = n
    return out


def _addressable(body: Layout, counts: dict[str, int]) -> None:
    """Refuse counts whose allocation on some stage would pass :data:`MAX_BYTES`."""
    for s in body.stages:
        for a in s.allocations:
            n = counts.get(a.scales_with, 0) if a.scales_with else 0
            size = at(a.size, n)
            if size > MAX_BYTES:
                raise PlanError(
                    f"a pool of {n:,} blocks would be {size:,} bytes (allocation {a.name}), "
                    f"more than a 64-bit address space holds", found=f"{n:,} blocks",
                    expected=f"an allocation of at most {MAX_BYTES:,} bytes",
                    hint="give fewer blocks, or a memory budget")
