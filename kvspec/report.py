"""Short text summaries for the terminal: ``compile`` and ``plan`` output.

The long reports (Markdown, HTML with pictures) are ``kvspec explain``'s.
"""

from __future__ import annotations

from typing import Any

from kvspec.artifact import Artifact
from kvspec.errors import KvspecError
from kvspec.planner.plan import Plan, Resolved
from kvspec.planner.size import group_blocks_per_request
from kvspec.spec import spec_kind_name


def human_bytes(n: float) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [headers] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    last = len(headers) - 1

    def cell(i: int, c: str, w: int) -> str:
        # the first column and a trailing text column read left to right; numbers align right
        left = i == 0 or (i == last and not c[:1].isdigit())
        return c.ljust(w) if left else c.rjust(w)

    lines = ["  ".join(cell(i, c, w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
             for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _layers_brief(names: list[str]) -> str:
    """``model.layers.{0..40 step 2}.self_attn.attn`` rather than 21 names."""
    from kvspec.explain import compact_layers
    return ", ".join(compact_layers(names))


def _layer_pages(group: dict[str, Any]) -> list[int]:
    """The distinct per-layer page sizes of an artifact group."""
    members = group["spec"].get("kv_cache_specs")
    if members:
        return sorted({m["page_size_bytes"] for m in members.values()})
    return [group["page_size_bytes"]]


def summary(artifact: Artifact) -> str:
    """What ``kvspec compile`` prints: groups, pages, bytes per block, capacity."""
    body = artifact.body
    eng = body["engine"]
    st0 = body["stages"][0]
    rows = [[g["id"], g["kind"], len(g["layers"]), g["block_size"],
             " / ".join(human_bytes(p) for p in _layer_pages(g)), g["padding_slots"],
             _layers_brief(g["layers"])] for g in body["groups"]]
    out = [f"{body['name']}: {len(body['layers'])} layers in {len(body['groups'])} group(s), "
           f"layout {eng['layout']}, block_size {eng['block_size']}, "
           f"max_model_len {eng['max_model_len']}",
           _table(["group", "kind", "layers", "block", "layer page", "pad slots", "members"],
                  rows),
           f"bytes per block: {human_bytes(st0['bytes_per_block'])} "
           f"({st0['bytes_per_block']} B)"
           + (f" + fixed {human_bytes(st0['fixed_bytes'])}" if st0["fixed_bytes"] else ""),
           f"one request at max_model_len: {human_bytes(st0['memory_per_request'])}, "
           f"needs at least {artifact.min_num_blocks():,} blocks"]
    budget = body.get("budget")
    if budget:
        out.append(f"for {human_bytes(budget['memory'])}: {budget['num_blocks']:,} blocks, "
                   f"{budget['kv_cache_size_tokens']:,} tokens, max concurrency "
                   f"{budget['max_concurrency']:.2f}x at {budget['max_model_len']:,} tokens")
    else:
        out.append("no memory budget: the loader sizes the pool (engine.memory or --memory "
                   "to plan one)")
    warnings = [e["message"] for e in body.get("log", []) if e["level"] == "WARNING"]
    warnings += body.get("warnings", [])
    out += [f"warning: {w}" for w in warnings]
    return "\n".join(out)


def plan_table(plan: Plan, resolved: Resolved) -> str:
    """What ``kvspec plan`` prints: per group and totals for one budget."""
    engine = resolved.engine
    st0 = plan.stages[0]
    rows = []
    for i, g in enumerate(plan.groups):
        spec = g.spec
        pages = sorted({g.layer_spec(n).page_size_bytes for n in g.layer_names}) or \
            [spec.page_size_bytes]
        rows.append([i, spec_kind_name(spec), len(g.layer_names), spec.block_size,
                     " / ".join(human_bytes(p) for p in pages), g.padding_slots,
                     f"{group_blocks_per_request(engine, g):,}"])
    lines = [
        f"{len(plan.specs)} layers, {len(plan.groups)} group(s), layout {engine.layout.name}, "
        f"{len(plan.stages)} pipeline stage(s)",
        _table(["group", "kind", "layers", "block", "layer page", "pad slots",
                "blocks/request"], rows),
        f"memory per rank:      {human_bytes(resolved.available)}",
        f"one request:          {human_bytes(resolved.stages[0].memory_usage)} at "
        f"{engine.max_model_len:,} tokens ("
        f"{sum(group_blocks_per_request(engine, g) for g in st0.groups if not g.own_pool):,} "
        "blocks + the null block)",
        f"bytes per block:      {human_bytes(st0.bytes_per_block)} ({st0.bytes_per_block} B)",
        f"blocks:               {resolved.num_blocks:,}"
        + (f" (+ drafter pool {st0.draft_num_blocks:,})" if st0.draft_num_blocks else ""),
        f"KV capacity:          {resolved.kv_cache_size_tokens:,} tokens",
        f"max concurrency:      {resolved.max_concurrency:.2f}x at "
        f"{engine.max_model_len:,} tokens",
        f"max_model_len:        {engine.max_model_len:,}"
        + (" (auto-fit)" if engine.auto_max_model_len else ""),
        f"longest that fits:    {min(s.estimated_max_model_len for s in resolved.stages):,}",
        f"block sizes:          scheduler {resolved.scheduler_block_size}, "
        f"prefix hash {resolved.hash_block_size}",
    ]
    if len(resolved.stages) > 1:
        lines.append("per stage:            " + ", ".join(
            f"stage {s.index}: {human_bytes(s.memory_usage)}/request" for s in resolved.stages))
    from kvspec.planner.checks import early_checks
    lines += [f"warning: {m}" for m in plan.log.messages("WARNING") + early_checks(plan, resolved)]
    return "\n".join(lines)


def sweep_table(plan: Plan, rows: list[tuple[int, Resolved | None, KvspecError | None]]) -> str:
    """Capacity against memory: one line per budget."""
    table = []
    for budget, r, err in rows:
        if r is None:
            reason = "does not fit one request" if err is not None else ""
            table.append([human_bytes(budget), "-", "-", "-", reason])
        else:
            table.append([human_bytes(budget), f"{r.num_blocks:,}",
                          f"{r.kv_cache_size_tokens:,}", f"{r.max_concurrency:.2f}x",
                          f"{r.engine.max_model_len:,}"])
    return _table(["memory", "blocks", "KV tokens", "concurrency", "max_model_len"], table)
