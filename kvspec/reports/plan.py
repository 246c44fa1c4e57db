"""What ``kvspec plan`` prints for a budget: per group and totals, capacity
against a sweep of budgets, or each pool of a plan with a pooling decision.

A plan for another budget is the planner's (:func:`kvspec.planner.size_plan`:
``max_model_len: auto`` refits, the longest request that fits is searched, the
early checks run for the sized engine), so this report reads the compile path's
:class:`~kvspec.model.plan.Plan` and :class:`~kvspec.planner.Sizing`; what
``compile`` prints of a frozen artifact is :mod:`kvspec.reports.summary`'s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any, Protocol

import msgspec

from kvspec.artifact.format import PoolingRecord
from kvspec.artifact.sizing import share_of
from kvspec.compiled import read
from kvspec.compiler import Planned, Pooled, compile_until
from kvspec.errors import KvspecError
from kvspec.files import shown
from kvspec.model.checks import early_checks
from kvspec.model.kinds import ref_kind_name
from kvspec.model.plan import Group, Layout, Plan
from kvspec.passes.size import budget_of
from kvspec.planner import Sizing, size_plan
from kvspec.planner.size import blocks_per_request
from kvspec.reports.explain.subject import declares_pooling, is_artifact_path
from kvspec.reports.format import human_bytes, table
from kvspec.reports.pooling import pooling_lines
from kvspec.reports.refview import error_view, reference_view
from kvspec.source.where import SourceMap

__all__ = ["PoolLayout", "PooledPlan", "SweepRow", "layout_warnings", "plan_of", "plan_table",
           "plan_warnings", "pooled_of", "pooled_sizings", "pooled_table", "pooled_view",
           "sweep", "sweep_table", "sweep_view"]


class PoolLayout(Protocol):
    """A separate plan's pool as the compiler hands it over (kvspec.pooling)."""

    @property
    def name(self) -> str: ...
    @property
    def share(self) -> Fraction: ...
    @property
    def layout(self) -> Layout: ...


#: One budget of a sweep: the budget, and its sizing or why it has none.
SweepRow = tuple[int, Sizing | None, KvspecError | None]
#: A layout with a pooling decision: the unified plan it kept (None: separate pools),
#: the pools, the decision and the budget.
PooledPlan = tuple[Plan | None, tuple[PoolLayout, ...], PoolingRecord, int | None]
#: One pool's plan sized for its share (the pool None: the unified plan, all of it).
Part = tuple[PoolLayout | None, Plan, Sizing]


def _as_compiled(plan: Plan) -> Plan:
    """An artifact's plan, its ``max_model_len`` fixed as compiled (no refit)."""
    return dataclasses.replace(plan, engine=dataclasses.replace(
        plan.engine, original_max_model_len=None))


def plan_of(path: str | Path) -> tuple[Plan, int | None, SourceMap]:
    """A source's plan, or an artifact's (its max_model_len fixed as compiled), its
    budget, and where to locate errors about it."""
    if is_artifact_path(path):
        layout = read(path).layout
        budget = layout.budget.memory if layout.budget is not None else None
        return _as_compiled(layout.plan), budget, SourceMap(shown(path))
    planned = compile_until(path, Planned)
    return planned.plan, budget_of(planned), planned.where


def pooled_of(path: str | Path, memory: str | None) -> PooledPlan | None:
    """For a layout with a pooling decision: what :data:`PooledPlan` says; None for a
    plain layout. A source decides again at ``memory`` when it is one budget."""
    if is_artifact_path(path):
        art = read(path)
        record = art.body.pooling
        if record is None:
            return None
        budget = art.body.budget.memory if art.body.budget is not None else None
        if art.pools:
            return None, art.pools, record, budget
        return _as_compiled(art.layout.plan), (), record, budget
    if not declares_pooling(path):
        return None
    given = memory if memory and ".." not in memory else None
    pooled = compile_until(path, Pooled, memory=given, memory_name="--memory")
    if pooled.decision is None:
        return None
    if pooled.pools:
        return None, pooled.pools, pooled.decision, pooled.budget_bytes
    return pooled.plan, (), pooled.decision, pooled.budget_bytes


def sweep(plan: Plan, budgets: Iterable[int]) -> list[SweepRow]:
    """``plan`` sized for each budget; a budget that cannot serve one request keeps
    its error."""
    rows: list[SweepRow] = []
    for b in budgets:
        try:
            rows.append((b, size_plan(plan, memory=b), None))
        except KvspecError as err:
            rows.append((b, None, err))
    return rows


def sweep_view(plan: Plan, rows: Sequence[SweepRow]) -> list[dict[str, Any]]:
    """A sweep as reference views (a budget's error as an error view)."""
    out = []
    for b, r, e in rows:
        if r:
            out.append(reference_view(plan, r))
        elif e:
            out.append({"memory": b, **error_view(e)})
    return out


def pooled_sizings(plan: Plan | None, pools: Sequence[PoolLayout], memory: int | None,
                   num_blocks: int | None) -> list[Part]:
    """The unified plan sized for ``memory`` (or ``num_blocks``), or each pool for
    its share of ``memory``."""
    if plan is not None:
        return [(None, plan, size_plan(plan, memory=memory, num_blocks=num_blocks))]
    return [(p, p.layout.plan, size_plan(p.layout.plan, memory=None if memory is None
                                         else share_of(memory, p.share))) for p in pools]


def pooled_view(parts: Sequence[Part], record: PoolingRecord) -> dict[str, Any]:
    """Each part's reference view, with its pool's name and share, and the decision."""
    return {"pools": [{"name": p.name if p else None,
                       "share": [p.share.numerator, p.share.denominator] if p else None,
                       **reference_view(pl, sz)} for p, pl, sz in parts],
            "pooling": msgspec.to_builtins(record)}


def pooled_table(parts: Sequence[Part], record: PoolingRecord) -> str:
    """Each part's table (a pool's headed by its share), then the decision."""
    out = []
    for p, pl, sz in parts:
        if p is not None:
            out.append(f"pool {p.name} ({float(p.share):.1%} of the budget):")
        out.append(plan_table(pl, sz, warnings=False))
    return "\n".join(out + pooling_lines(record))


def _pages(group: Group) -> str:
    """The distinct per-layer page sizes of a group."""
    sizes = sorted({group.layer_spec(n).page_size_bytes for n in group.layer_names}) \
        or [group.spec.page_size_bytes]
    return " / ".join(human_bytes(p) for p in sizes)


def layout_warnings(layout: Layout) -> list[str]:
    """The planner's warnings and the early checks of a sized layout (``validate``'s)."""
    return list(dict.fromkeys([m for lv, m in layout.plan.log if lv == "WARNING"]
                              + list(layout.warnings)))


def plan_warnings(plan: Plan, sizing: Sizing) -> list[str]:
    """The planner's warnings and the early checks for the sized budget."""
    return [m for lv, m in plan.log if lv == "WARNING"] + early_checks(
        plan, sizing.engine, sizing.num_blocks)


def plan_table(plan: Plan, sizing: Sizing, *, warnings: bool = True) -> str:
    """What ``kvspec plan`` prints: per group and totals for one budget."""
    engine = sizing.engine
    st0 = plan.stages[0]
    rows = [[i, ref_kind_name(g.spec), len(g.layer_names), g.spec.block_size, _pages(g),
             g.padding_slots, f"{g.blocks_per_request(engine):,}"]
            for i, g in enumerate(plan.groups)]
    per_request = blocks_per_request(engine, st0.groups)
    lines = [
        (f"{len(plan.specs)} layers, {len(plan.groups)} group(s), layout "
         f"{engine.axis_order.name}, {len(plan.stages)} pipeline stage(s)"),
        table(rows, ["group", "kind", "layers", "block", "layer page", "pad slots",
                     "blocks/request"]),
        f"memory per rank:      {human_bytes(sizing.available)}",
        (f"one request:          {human_bytes(sizing.stages[0].memory_usage)} at "
         f"{engine.max_model_len:,} tokens ({per_request:,} blocks + the null block)"),
        f"bytes per block:      {human_bytes(st0.bytes_per_block)} ({st0.bytes_per_block} B)",
        f"blocks:               {sizing.num_blocks:,}"
        + (f" (+ drafter pool {st0.draft_num_blocks:,})" if st0.draft_num_blocks else ""),
        f"KV capacity:          {sizing.kv_cache_size_tokens:,} tokens",
        (f"max concurrency:      {sizing.max_concurrency:.2f}x at "
         f"{engine.max_model_len:,} tokens"),
        f"max_model_len:        {engine.max_model_len:,}"
        + (" (auto-fit)" if engine.auto_max_model_len else ""),
        f"longest that fits:    {sizing.estimated_max_model_len:,}",
        (f"block sizes:          scheduler {sizing.scheduler_block_size}, "
         f"prefix hash {sizing.hash_block_size}"),
    ]
    if len(sizing.stages) > 1:
        lines.append("per stage:            " + ", ".join(
            f"stage {s.index}: {human_bytes(s.memory_usage)}/request" for s in sizing.stages))
    if warnings:
        lines += [f"warning: {m}" for m in plan_warnings(plan, sizing)]
    return "\n".join(lines)


def sweep_table(rows: Sequence[tuple[int, Sizing | None, KvspecError | None]]) -> str:
    """Capacity against memory: one line per budget."""
    out = []
    for budget, r, err in rows:
        if r is None:
            out.append([human_bytes(budget), "-", "-", "-",
                        "does not fit one request" if err is not None else ""])
        else:
            out.append([human_bytes(budget), f"{r.num_blocks:,}", f"{r.kv_cache_size_tokens:,}",
                        f"{r.max_concurrency:.2f}x", f"{r.engine.max_model_len:,}"])
    return table(out, ["memory", "blocks", "KV tokens", "concurrency", "max_model_len"])
