"""Today's artifact as the manager's plain data: the one place that reads the plan.

:func:`from_artifact` turns ``artifact.layout`` (groups, stages, engine) and a
block count into a :class:`ManagedLayout`. It is kept apart because the
artifact format changes: only this module follows it.

What it decides, as vLLM 0.33's engine does for the same plan:

* a group's manager kind comes from its spec, or from its first layer's spec for
  a group of several specs (the scheduler's view of it); a ``full_allocation``
  group is full attention; encoder-only groups hold nothing and are left out;
* a group's block size includes decode context parallelism when its spec is
  sharded across those ranks;
* prefix caching is off when a state group runs in mode ``none`` (vLLM turns
  caching off for such models); in mode ``all`` (no vLLM counterpart), hashes are
  taken at the largest size every caching group's block size is a multiple of;
* one pool, the stages' main pool (``bytes_per_block`` summed over stages), and a
  second one for a drafter that has its own (``own_pool`` groups).

>>> from kvspec.compiled import read as read_artifact
>>> layout = from_artifact(read_artifact("layouts/gemma-2-9b-it.kvlayout.json"), 1000)
>>> [(g.kind, g.block_size, g.sliding_window) for g in layout.groups]
[('sliding', 16, 4096), ('full', 16, None)]
>>> layout.pools[0].num_blocks, layout.enable_caching
(1000, True)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from kvspec.model.plan import Group
from kvspec.model.specs import attention as a
from kvspec.model.specs import mla as m
from kvspec.model.specs.base import LayerSpec
from kvspec.model.specs.state import MambaState
from kvspec.model.specs.uniform import UniformType
from kvspec.runtime.manager.spec import ManagedGroup, ManagedLayout, ManagedPool, ManagerError

__all__ = ["from_artifact", "from_layouts"]

#: Manager kinds by spec class, most specific first.
_KIND_OF: tuple[tuple[type, str], ...] = (
    (a.KpoolTail, "ring"), (a.CircularBuffer, "ring"), (a.SlidingWindow, "sliding"),
    (a.ChunkedLocal, "local"), (a.RSWA, "rswa"), (MambaState, "state"),
    (a.CrossAttention, "cross"), (a.FullAttention, "full"),
)


def _representative(spec: LayerSpec) -> LayerSpec:
    """The spec the scheduler sees: a group of several specs shows its first."""
    return spec.members[0][1] if isinstance(spec, UniformType) else spec


def manager_kind(group: Group) -> str | None:
    """The manager kind of a group (None: a group the manager leaves out)."""
    return _kind(group)


def _kind(group: Group) -> str | None:
    spec = _representative(group.spec)
    if isinstance(spec, a.EncoderOnly):
        return None
    if group.strategy == "full_allocation":
        return "full"
    for cls, kind in _KIND_OF:
        if isinstance(spec, cls):
            return kind
    raise ManagerError(f"no request-level manager for {type(spec).__name__} layers",
                       hint="simulate a layout of attention and state layers")


def _useful_bytes(group: Group) -> int:
    """The group's layers' pages without padding, on one rank."""
    total = 0
    for name in group.layer_names:
        spec = group.layer_spec(name)
        total += getattr(spec, "unpadded_page_size_bytes", spec.page_size_bytes)
    return total


def _group(group: Group, kind: str, engine: Any, pool: str) -> ManagedGroup:
    spec = _representative(group.spec)
    if getattr(spec, "prefix_replay_tokens", 0):
        raise ManagerError("bounded prefix replay (DeepSeek-V4 sliding-window MLA) is not "
                           "modelled", hint="simulate a layout without it")
    dcp = engine.decode_context_parallel_size if getattr(spec, "dcp_sharded", False) else 1
    full_like = isinstance(spec, (a.FullAttention, m.MLA)) or group.strategy == "full_allocation"
    return ManagedGroup(
        name=",".join(group.layer_names[:1]) + ("..." if len(group.layer_names) > 1 else ""),
        kind=kind, block_size=group.spec.block_size * dcp, pool=pool,
        sliding_window=getattr(spec, "sliding_window", None) if kind == "sliding" else None,
        extra_retained_tokens=getattr(spec, "extra_retained_tokens", 0),
        attention_chunk_size=getattr(spec, "attention_chunk_size", None),
        rswa_window=getattr(spec, "rswa_window", None),
        state_mode=getattr(spec, "mamba_cache_mode", "none"),
        speculative_blocks=getattr(spec, "num_speculative_blocks", 0),
        checkpoint_blocks=getattr(spec, "num_prefill_checkpoint_blocks", 0),
        checkpoint_alignment=getattr(spec, "prefill_checkpoint_alignment", None),
        prefix_cacheable=group.spec.prefix_cacheable, full_like=full_like, spec_key=spec,
        useful_bytes_per_block=_useful_bytes(group),
        encoder_tokens=0)


def _parts(layout: Any, num_blocks: int, pool: str
           ) -> tuple[list[ManagedGroup], list[ManagedPool], bool, list[int]]:
    """One layout's groups and pools (its main pool named ``pool``), whether it
    caches, and its block sizes that split Mamba chunks."""
    engine = layout.engine
    groups = []
    for group in layout.groups:
        kind = _kind(group)
        if kind is not None:
            groups.append(_group(group, kind, engine, "draft" if group.own_pool else pool))
    caching = engine.enable_prefix_caching and not any(
        g.kind == "state" and g.state_mode == "none" for g in groups)
    hash_block = layout.hash_block_size
    if any(g.prefix_cacheable and g.block_size % hash_block for g in groups):
        # only Mamba mode "all" (kvspec's model, no vLLM counterpart) hashes at the
        # scheduler block size above attention blocks: hash at what every group divides
        hash_block = math.gcd(*(g.block_size for g in groups if g.prefix_cacheable))
    pools = [ManagedPool(pool, num_blocks, hash_block_size=hash_block,
                         bytes_per_block=sum(s.bytes_per_block for s in layout.stages))]
    if any(g.pool == "draft" for g in groups):
        draft = layout.stages[0].draft_num_blocks or 1
        pools.append(ManagedPool("draft", draft, hash_block_size=hash_block,
                                 bytes_per_block=sum(s.fixed_bytes for s in layout.stages)
                                 // draft))
    planned = [g for g in layout.groups if _kind(g) is not None]
    cacheable = [g.spec.block_size for g in planned if g.spec.prefix_cacheable] or \
        [g.spec.block_size for g in planned] or [engine.block_size]
    return groups, pools, caching, cacheable


def _count(layout: Any, num_blocks: int | None) -> int:
    if num_blocks is None:
        num_blocks = layout.budget.num_blocks if layout.budget else \
            layout.engine.num_gpu_blocks_override
    if num_blocks is None:
        raise ManagerError(f"layout {layout.name!r} has no block count",
                           hint="give num_blocks, or compile the layout with a memory budget")
    return int(num_blocks)


def from_artifact(artifact: Any, num_blocks: int | None = None) -> ManagedLayout:
    """The manager's view of a compiled layout with ``num_blocks`` blocks (default:
    the layout's own, for its budget); a separate plan's pools each with their own
    count for the budget (``num_blocks`` does not apply to them)."""
    pools = getattr(artifact, "pools", ())
    if pools:
        return from_layouts([(p.name, p.layout) for p in pools])
    return from_layouts([("device", artifact.layout)], {"device": num_blocks}
                        if num_blocks is not None else None)


def from_layouts(layouts: Sequence[tuple[str, Any]], counts: Mapping[str, int] | None = None
                 ) -> ManagedLayout:
    """The manager's view of one or several layouts, each a pool of its own (the
    ``separate`` policy's pools), each with the count ``counts`` gives it (default:
    its own, for its budget)."""
    groups: list[ManagedGroup] = []
    pools: list[ManagedPool] = []
    caching, cacheable = True, []
    for name, layout in layouts:
        g, p, c, sizes = _parts(layout, _count(layout, (counts or {}).get(name)), name)
        groups += g
        pools += p
        caching = caching and c
        cacheable += sizes
    first = layouts[0][1]
    engine = first.engine
    return ManagedLayout(
        name=first.name, groups=tuple(groups), pools=tuple(pools),
        scheduler_block_size=math.lcm(*(x.scheduler_block_size for _, x in layouts)),
        max_model_len=engine.max_model_len, max_in_flight_tokens=engine.max_in_flight_tokens,
        enable_caching=caching, retention_interval=0, split_block_size=min(cacheable))
