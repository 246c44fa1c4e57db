"""What ``kvspec compile`` prints: groups, pages, bytes per block, capacity, read
from the frozen artifact (:class:`~kvspec.artifact.format.Layout`, planner-free).

The long reports (Markdown, HTML with pictures) are ``kvspec explain``'s; what
``kvspec plan`` prints for a budget is :mod:`kvspec.reports.plan`'s.

>>> from kvspec.artifact import Artifact
>>> print(summary(Artifact.read("layouts/llama-3.1-8b.kvlayout.json")).splitlines()[0])
llama-3.1-8b: 32 layers in 1 group(s), layout LBNHC, block_size 16, max_model_len 131072
"""

from __future__ import annotations

from kvspec.artifact import Artifact
from kvspec.artifact.format import Group, Layout
from kvspec.reports.format import compact_layers, count, human_bytes, layers_brief, table
from kvspec.reports.pooling import pooling_lines

__all__ = ["human_bytes", "page_sizes", "summary", "summary_data", "summary_warnings"]


def page_sizes(body: Layout, group: Group) -> list[int]:
    """The distinct per-layer page sizes of a group (its layers' specs as merged
    into the group's), in bytes."""
    spec = body.specs[group.spec]
    merged = getattr(spec, "kv_cache_specs", None)  # a group of several specs
    if merged is None:
        return [spec.page_size_bytes]
    return sorted({merged[n].page_size_bytes for n in group.layers}) or [spec.page_size_bytes]


def _pages(body: Layout, group: Group) -> str:
    return " / ".join(human_bytes(p) for p in page_sizes(body, group))


def summary_warnings(artifact: Artifact) -> list[str]:
    """The planner's warnings and the early checks, as the artifact records them."""
    body = artifact.body
    return list(dict.fromkeys([x.message for x in body.log if x.level == "WARNING"]
                              + body.warnings))


def _concurrency(body: Layout) -> str:
    b = body.budget
    assert b is not None, "a budget line needs a budget"
    return (f"max concurrency "
            f"{b.max_concurrency if b.max_concurrency is not None else float('inf'):.2f}x"
            f" at {b.max_model_len:,} tokens")


def summary(artifact: Artifact, *, warnings: bool = True) -> str:
    """What ``kvspec compile`` prints: groups, pages, bytes per block, capacity
    (and, with ``warnings``, the warnings as ``warning:`` lines)."""
    body = artifact.body
    out = _pooled_summary(body) if artifact.pooled else _summary(body)
    if body.pooling is not None:
        out += pooling_lines(body.pooling)
    if warnings:
        out += [f"warning: {w}" for w in summary_warnings(artifact)]
    return "\n".join(out)


def _summary(body: Layout) -> list[str]:
    eng, st0, b = body.engine, body.stages[0], body.budget
    rows = [[i, g.kind, len(g.layers), g.block_size, _pages(body, g), g.padding_slots,
             layers_brief(g.layers)] for i, g in enumerate(body.groups)]
    need = max(st.min_num_blocks for st in body.stages)
    per_block = st0.bytes_per_block
    return [(f"{body.name}: {len(body.layers)} layers in {len(body.groups)} group(s), "
             f"layout {eng.axis_order}, block_size {eng.block_size}, "
             f"max_model_len {eng.max_model_len}"),
            table(rows, ["group", "kind", "layers", "block", "layer page", "pad slots",
                         "members"]),
            f"bytes per block: {human_bytes(per_block)} ({per_block} B)"
            + (f" + fixed {human_bytes(st0.fixed_bytes)}" if st0.fixed_bytes else ""),
            (f"one request at max_model_len: {human_bytes(st0.memory_per_request)}, "
             f"needs at least {count(need, 'block')}"),
            f"for {human_bytes(b.memory)}: {count(b.num_blocks, 'block')}, "
            f"{count(b.kv_cache_size_tokens, 'token')}, {_concurrency(body)}"
            if b is not None else "no memory budget: the loader sizes the pool (engine.memory "
            "or --memory to plan one)"]


def pool_names(body: Layout) -> list[str]:
    """The pools of a separate plan (those sized by a share of the budget), in order."""
    return list(dict.fromkeys(p.name for st in body.stages for p in st.pools
                              if p.share is not None))


def _pooled_summary(body: Layout) -> list[str]:
    """The head of a separate plan's summary: its pools, each its class's groups."""
    eng = body.engine
    pools = pool_names(body)
    rows = [[g.id, g.kind, len(g.layers), g.block_size, human_bytes(g.page_size_bytes),
             pool, layers_brief(g.layers)]
            for pool in pools for g in body.groups if g.id in
            {x for st in body.stages for p in st.pools if p.name == pool for x in p.groups}]
    out = [(f"{body.name}: {len(body.layers)} layers in {len(pools)} pool(s), "
            f"layout {eng.axis_order}, max_model_len {eng.max_model_len}"),
           table(rows, ["group", "kind", "layers", "block", "layer page", "pool", "members"])]
    if body.budget is not None:
        out.append(f"for {human_bytes(body.budget.memory)}: {_concurrency(body)} "
                   "(the pool that runs out first)")
    else:
        out.append("no memory budget: the loader splits its memory between the pools")
    return out


def summary_data(artifact: Artifact) -> dict[str, object]:
    """The summary as data (``kvspec compile --format json``): the same figures
    (of a separate plan: its first pool's, each pool being a plan of its own).

    >>> d = summary_data(Artifact.read("layouts/llama-3.1-8b.kvlayout.json"))
    >>> d["layers"], d["bytes_per_block"], d["budget"]["num_blocks"], d["groups"][0]["members"]
    (32, 2097152, 20480, ['model.layers.{0..31}.self_attn.attn'])
    """
    body = artifact.body
    eng, st0 = body.engine, body.stages[0]
    groups, block_size, budget = body.groups, eng.block_size, body.budget
    per_block, fixed, per_request = st0.bytes_per_block, st0.fixed_bytes, st0.memory_per_request
    need = artifact.min_num_blocks()
    if artifact.pooled and body.pooling is not None:
        first = body.pooling.pools[0]
        pools = [p for st in body.stages for p in st.pools if p.name == first.name]
        groups = [g for g in body.groups if g.id in pools[0].groups]
        block_size = min(g.block_size for g in groups)
        need = max(p.min_num_blocks for p in pools)
        per_block, fixed, budget = pools[0].bytes_per_block, 0, first.budget
        per_request = per_block * (pools[0].min_num_blocks - 1)  # the null block aside
    return {
        "name": body.name, "model": body.model, "sha256": artifact.sha256,
        "layers": sum(len(g.layers) for g in groups) if artifact.pooled else len(body.layers),
        "axis_order": eng.axis_order, "block_size": block_size,
        "max_model_len": eng.max_model_len,
        "groups": [{"kind": g.kind, "layers": len(g.layers), "block_size": g.block_size,
                    "page_sizes": page_sizes(body, g), "padding_slots": g.padding_slots,
                    "members": list(compact_layers(g.layers))} for g in groups],
        "bytes_per_block": per_block, "fixed_bytes": fixed, "memory_per_request": per_request,
        "min_num_blocks": need,
        "budget": None if budget is None else {
            "memory": budget.memory, "num_blocks": budget.num_blocks,
            "kv_cache_size_tokens": budget.kv_cache_size_tokens,
            "max_concurrency": budget.max_concurrency, "max_model_len": budget.max_model_len},
        "warnings": summary_warnings(artifact)}
