"""What a plan buys, statically: requests at ``max_model_len``, requests at the
workload's held length, the physical limit, and the bytes that hold nothing.

All per rank of pipeline stage 0 (every tensor-parallel rank of it is alike).

* **static requests** -- what the engine's own accounting promises: blocks over
  the blocks one request at ``max_model_len`` takes (vLLM's "maximum concurrency");
* **workload requests** -- the same at the tokens a running request holds on
  average (prompt, half its output, draft tokens), which is what traffic needs;
* **physical limit** -- the budget over the bytes those tokens and one running
  state per state layer take, nothing else: no block rounds up, no page is padded;
* the pool that runs out first, and the static waste kinds: padding slots and
  padded pages (block inflation and per-request constants are measured by the
  simulator).

>>> from kvspec.compiler import Sized, compile_until
>>> layout = compile_until("layouts/llama-3.1-8b.yaml", Sized).layout
>>> round(workload_requests(layout, 2048), 1), round(physical_limit(layout, 2048), 1)
(160.0, 160.0)
"""

from __future__ import annotations

import dataclasses

from kvspec.model.plan import Group, Layout
from kvspec.model.specs import MambaState
from kvspec.model.specs.base import cdiv

__all__ = ["block_padding", "live_bytes", "physical_limit", "request_blocks",
           "static_requests", "workload_requests"]


def _groups(layout: Layout) -> tuple[Group, ...]:
    return layout.stage(0).main_groups


def static_requests(layout: Layout) -> float | None:
    """Requests at ``max_model_len`` the budget's blocks hold (None: no budget)."""
    b = layout.budget
    if b is None:
        return None
    return b.max_concurrency


def request_blocks(layout: Layout, tokens: int) -> int:
    """Blocks of the main pool one request holding ``tokens`` tokens takes."""
    engine = dataclasses.replace(layout.engine, max_model_len=max(tokens, 1))
    return sum(cdiv(g.spec.max_memory_usage_bytes(engine), g.spec.page_size_bytes)
               for g in _groups(layout))


def workload_requests(layout: Layout, tokens: int) -> float | None:
    """Requests holding ``tokens`` tokens each that the budget's blocks hold (the
    null block aside), statically."""
    b = layout.budget
    if b is None:
        return None
    per = request_blocks(layout, tokens)
    return (b.num_blocks - 1) / per if per else None


def live_bytes(layout: Layout, tokens: int) -> int:
    """Bytes a request holding ``tokens`` tokens needs at the least, on stage 0:
    each attention layer's live tokens (a window's at most) at its unpadded bytes
    per token, and one state per state layer."""
    st = layout.stage(0)
    total = 0
    for g in st.groups:
        for name in g.layer_names:
            spec = g.layer_spec(name)
            if isinstance(spec, MambaState):
                total += spec.unpadded_page_size_bytes
                continue
            window = getattr(spec, "sliding_window", None) or \
                getattr(spec, "attention_chunk_size", None)
            live = min(tokens, window) if window else tokens
            total += cdiv(spec.unpadded_page_size_bytes * live, spec.block_size)
    return total


def physical_limit(layout: Layout, tokens: int, budget: int | None = None) -> float | None:
    """Requests holding ``tokens`` tokens whose live bytes alone fill ``budget``
    (default: the layout's)."""
    memory = budget if budget is not None else (
        layout.budget.memory if layout.budget is not None else None)
    per = live_bytes(layout, tokens)
    if memory is None or not per:
        return None
    return memory / per


def block_padding(layout: Layout) -> dict[int, tuple[int, int]]:
    """Per group id: ``(padding slots, padded pages)`` bytes of one block it holds,
    on stage 0 -- the slots it leaves empty so every group has the same layer
    count, and what its pages hold past their content."""
    st = layout.stage(0)
    out = {}
    for gid, g in enumerate(st.groups):
        if g.own_pool or not g.layer_names:
            continue
        pages = [g.layer_spec(n) for n in g.layer_names]
        slot = max(s.page_size_bytes for s in pages)
        padded = sum(s.page_size_bytes - s.unpadded_page_size_bytes for s in pages)
        out[gid] = (g.padding_slots * slot, padded)
    return out
