"""A brute-force oracle for the block-id property: every run of every page of a
stage at a small block count, sorted and swept. Slow and obviously right: the
tests compare :mod:`kvspec.artifact.structure`'s proof against it."""

from __future__ import annotations

from typing import Any

from kvspec.artifact.blocks import pool_blocks, tensor_runs
from kvspec.artifact.format import at


def memory_unsafe(body: Any, stage: int, num_blocks: int) -> list[str]:
    """What the pages of ``stage`` at ``num_blocks`` do wrong (empty: nothing):
    a run outside its pool or allocation, two pools or two block ids sharing a
    byte, a page overlapping itself, two layers of one group sharing a byte."""
    st = body.stages[stage]
    sizes = {a.name: at(a.size, num_blocks) for a in st.allocations}
    pools = {p.name: p for p in st.pools}
    draft = set(st.draft_layers)
    problems: list[str] = []
    runs = []
    for t in st.tensors:
        pool = pools.get(t.pool)
        if pool is None:
            problems.append(f"no pool {t.pool}")
            continue
        blocks = pool_blocks(pool, num_blocks)
        low = at(pool.offset, num_blocks)
        high = low + blocks * pool.bytes_per_block
        offsets, run, layer_stride, block_stride = tensor_runs(t, num_blocks)
        start = at(t.offset, num_blocks)
        for slot, name in enumerate(t.layers):
            for block in range(blocks):
                for offset in offsets:
                    s = start + slot * layer_stride + block * block_stride + offset
                    if s < low or s + run > high or s + run > sizes.get(pool.allocation, 0):
                        problems.append(f"{name} outside its pool")
                    runs.append((pool.allocation, s, s + run, pool.name, block, name, t.group))
    runs.sort()
    active: list[tuple] = []
    for r in runs:
        active = [a for a in active if a[0] == r[0] and a[2] > r[1]]
        for a in active:
            if a[3] != r[3]:
                problems.append(f"pools {a[3]} and {r[3]} share a byte")
            elif a[4] != r[4]:
                problems.append(f"blocks {a[4]} and {r[4]} share a byte")
            elif a[5] == r[5]:
                problems.append(f"{r[5]}'s page overlaps itself")
            elif a[6] == r[6]:
                problems.append(f"{a[5]} and {r[5]} of one group share a byte")
            elif a[5] in draft or r[5] in draft:
                problems.append("a drafter layer shares a byte")
        if len(problems) > 5:
            break
        active.append(r)
    return problems
