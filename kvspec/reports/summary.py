"""Short text summaries for the terminal: ``compile`` and ``plan`` output.

The long reports (Markdown, HTML with pictures) are ``kvspec explain``'s.

>>> from kvspec.compiler import compile
>>> print(summary(compile("layouts/llama-3.1-8b.yaml")).splitlines()[0])
llama-3.1-8b: 32 layers in 1 group(s), layout LBNHC, block_size 16, max_model_len 131072
"""

from __future__ import annotations

from collections.abc import Sequence

from kvspec.compiled import CompiledArtifact
from kvspec.errors import KvspecError
from kvspec.model.kinds import ref_kind_name
from kvspec.model.plan import Group, Layout, Plan
from kvspec.planner import Sizing
from kvspec.planner.checks import early_checks
from kvspec.planner.size import blocks_per_request
from kvspec.reports.format import compact_layers, count, human_bytes, layers_brief, table
from kvspec.reports.pooling import pooling_lines

__all__ = ["human_bytes", "plan_table", "plan_warnings", "summary", "summary_data",
           "summary_warnings", "sweep_table"]


def _page_sizes(group: Group) -> list[int]:
    """The distinct per-layer page sizes of a group, in bytes."""
    return sorted({group.layer_spec(n).page_size_bytes for n in group.layer_names}) \
        or [group.spec.page_size_bytes]


def _pages(group: Group) -> str:
    """The distinct per-layer page sizes of a group."""
    return " / ".join(human_bytes(p) for p in _page_sizes(group))


def summary_warnings(artifact: CompiledArtifact | Layout) -> list[str]:
    """The planner's warnings and the early checks of a compiled layout (of each
    pool of a separate plan)."""
    if isinstance(artifact, Layout):
        layouts: tuple[Layout, ...] = (artifact,)
    else:
        layouts = tuple(p.layout for p in artifact.pools) or (artifact.layout,)
    return list(dict.fromkeys(m for x in layouts for m in
                              [m for lv, m in x.plan.log if lv == "WARNING"] + list(x.warnings)))


def summary(artifact: CompiledArtifact, *, warnings: bool = True) -> str:
    """What ``kvspec compile`` prints: groups, pages, bytes per block, capacity
    (and, with ``warnings``, the warnings as ``warning:`` lines)."""
    layout = artifact.layout
    if artifact.pools:
        out = _pooled_summary(artifact)
        record = artifact.body.pooling
        if record is not None:
            out += pooling_lines(record)
        if warnings:
            out += [f"warning: {w}" for w in summary_warnings(artifact)]
        return "\n".join(out)
    eng, st0 = layout.engine, layout.stage(0)
    rows = [[i, ref_kind_name(g.spec), len(g.layer_names), g.spec.block_size, _pages(g),
             g.padding_slots, layers_brief(g.layer_names)] for i, g in enumerate(layout.groups)]
    per_block = st0.bytes_per_block
    out = [(f"{layout.name}: {len(layout.layers)} layers in {len(layout.groups)} group(s), "
            f"layout {eng.axis_order.name}, block_size {eng.block_size}, "
            f"max_model_len {eng.max_model_len}"),
           table(rows, ["group", "kind", "layers", "block", "layer page", "pad slots",
                        "members"]),
           f"bytes per block: {human_bytes(per_block)} ({per_block} B)"
           + (f" + fixed {human_bytes(st0.fixed_bytes)}" if st0.fixed_bytes else ""),
           (f"one request at max_model_len: "
            f"{human_bytes(layout.stage_figures[0].memory_per_request)}, "
            f"needs at least {count(layout.min_num_blocks(), 'block')}")]
    b = layout.budget
    if b is not None:
        out.append(f"for {human_bytes(b.memory)}: {count(b.num_blocks, 'block')}, "
                   f"{count(b.kv_cache_size_tokens, 'token')}, max concurrency "
                   f"{b.max_concurrency if b.max_concurrency is not None else float('inf'):.2f}x"
                   f" at {b.max_model_len:,} tokens")
    else:
        out.append("no memory budget: the loader sizes the pool (engine.memory or --memory "
                   "to plan one)")
    record = artifact.body.pooling
    if record is not None:
        out += pooling_lines(record)
    if warnings:
        out += [f"warning: {w}" for w in summary_warnings(artifact)]
    return "\n".join(out)


def _pooled_summary(artifact: CompiledArtifact) -> list[str]:
    """The head of a separate plan's summary: its pools, each its class's groups."""
    body = artifact.body
    eng = body.engine
    rows = [[g.id, g.kind, len(g.layers), g.block_size, human_bytes(g.page_size_bytes),
             pool.name, layers_brief(g.layers)]
            for pool in artifact.pools for g in body.groups if g.id in
            {x for st in body.stages for p in st.pools if p.name == pool.name for x in p.groups}]
    out = [(f"{body.name}: {len(body.layers)} layers in {len(artifact.pools)} pool(s), "
            f"layout {eng.axis_order}, max_model_len {eng.max_model_len}"),
           table(rows, ["group", "kind", "layers", "block", "layer page", "pool", "members"])]
    b = body.budget
    if b is not None:
        out.append(f"for {human_bytes(b.memory)}: max concurrency "
                   f"{b.max_concurrency if b.max_concurrency is not None else float('inf'):.2f}x"
                   f" at {b.max_model_len:,} tokens (the pool that runs out first)")
    else:
        out.append("no memory budget: the loader splits its memory between the pools")
    return out


def summary_data(artifact: CompiledArtifact) -> dict[str, object]:
    """The summary as data (``kvspec compile --format json``): the same figures.

    >>> from kvspec.compiler import compile
    >>> d = summary_data(compile("layouts/llama-3.1-8b.yaml"))
    >>> d["layers"], d["bytes_per_block"], d["budget"]["num_blocks"], d["groups"][0]["members"]
    (32, 2097152, 20480, ['model.layers.{0..31}.self_attn.attn'])
    """
    layout = artifact.layout
    eng, st0, b = layout.engine, layout.stage(0), layout.budget
    return {
        "name": layout.name, "model": layout.model, "sha256": artifact.sha256,
        "layers": len(layout.layers), "axis_order": eng.axis_order.name,
        "block_size": eng.block_size, "max_model_len": eng.max_model_len,
        "groups": [{"kind": ref_kind_name(g.spec), "layers": len(g.layer_names),
                    "block_size": g.spec.block_size, "page_sizes": _page_sizes(g),
                    "padding_slots": g.padding_slots,
                    "members": list(compact_layers(g.layer_names))}
                   for g in layout.groups],
        "bytes_per_block": st0.bytes_per_block, "fixed_bytes": st0.fixed_bytes,
        "memory_per_request": layout.stage_figures[0].memory_per_request,
        "min_num_blocks": layout.min_num_blocks(),
        "budget": None if b is None else {
            "memory": b.memory, "num_blocks": b.num_blocks,
            "kv_cache_size_tokens": b.kv_cache_size_tokens,
            "max_concurrency": b.max_concurrency, "max_model_len": b.max_model_len},
        "warnings": summary_warnings(artifact)}


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
