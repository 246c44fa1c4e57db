"""What ``kvspec plan`` prints for a budget: per group and totals, or capacity
against a sweep of budgets.

A plan for another budget is the planner's (:func:`kvspec.planner.size_plan`:
``max_model_len: auto`` refits, the longest request that fits is searched, the
early checks run for the sized engine), so this report reads the compile path's
:class:`~kvspec.model.plan.Plan` and :class:`~kvspec.planner.Sizing`; what
``compile`` prints of a frozen artifact is :mod:`kvspec.reports.summary`'s.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvspec.errors import KvspecError
from kvspec.model.kinds import ref_kind_name
from kvspec.model.plan import Group, Layout, Plan
from kvspec.planner import Sizing
from kvspec.planner.checks import early_checks
from kvspec.planner.size import blocks_per_request
from kvspec.reports.format import human_bytes, table

__all__ = ["layout_warnings", "plan_table", "plan_warnings", "sweep_table"]


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
