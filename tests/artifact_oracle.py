"""Brute-force oracles: for the block-id property, every run of every page of a
stage at a small block count, sorted and swept; for what connectors trust, each
spec's page size made anew and the budget's block count bisected. Slow and
obviously right: the tests compare :mod:`kvspec.artifact.structure`'s proof and
the reader's checks against them."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import msgspec

from kvspec.artifact.blocks import pool_blocks, tensor_runs
from kvspec.artifact.format import at
from kvspec.model import kinds


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


def untrusted_fields(body: Any) -> list[str]:
    """What connectors trust that ``body`` gets wrong (empty: nothing), worked out
    another way than the reader does: each spec made anew by its kind's class from
    its own fields (the model's page-size rule), and the budget's block count by
    bisection, the most blocks whose allocations fit the memory on every stage."""
    problems = []
    for i, record in enumerate(body.specs):
        data = msgspec.to_builtins(record)
        try:
            spec = kinds.spec_from_dict(data)
        except Exception as exc:  # noqa: BLE001 - a spec its class refuses is wrong
            problems.append(f"spec {i}: {exc}")
            continue
        natural = kinds.spec_from_dict({**data, "page_size_padded": None})
        if spec.page_size_bytes != data["page_size_bytes"] or \
                natural.page_size_bytes > data["page_size_bytes"]:
            problems.append(f"spec {i}: page size {data['page_size_bytes']}, its fields "
                            f"give {natural.page_size_bytes}")
    if body.budget is None:
        return problems
    want = _budget_counts(body, body.budget.memory)
    pools = body.pooling.pools if body.pooling is not None else []
    said = {p.name: p.budget.num_blocks for p in pools if p.budget is not None}
    first = next((p.name for p in body.stages[0].pools if p.num_blocks is None), None)
    if first is not None:
        said.setdefault(first, body.budget.num_blocks)
        if body.budget.num_blocks != said[first]:
            problems.append("the budget and its first pool disagree")
    problems += [f"pool {name}: {n} blocks, its memory gives {want.get(name)}"
                 for name, n in said.items() if want.get(name) != n]
    return problems


def _budget_counts(body: Any, memory: int) -> dict[str, int]:
    """Per budget-sized pool, the most blocks (bisected) whose allocation fits its
    memory on every stage: the whole budget for a unified plan's device allocation,
    ``memory * share`` for a separate pool; the source's override instead, if any."""
    out: dict[str, int] = {}
    for st in body.stages:
        for p in st.pools:
            if p.num_blocks is not None:
                continue
            if body.engine.num_blocks is not None:
                out[p.name] = body.engine.num_blocks
                continue
            share = Fraction(p.share[0], p.share[1]) if p.share else Fraction(1)
            room = int(memory * share)
            sized = [a for a in st.allocations if a.scales_with == p.name
                     and a.memory == "device"]

            def fits(n: int, sized: list = sized, room: int = room) -> bool:
                return sum(at(a.size, n) for a in sized) <= room

            low, high = 0, 1
            while fits(high):
                low, high = high, high * 2
            while high - low > 1:
                mid = (low + high) // 2
                low, high = (mid, high) if fits(mid) else (low, mid)
            out[p.name] = min(out.get(p.name, low), low)
    return out
