"""A frozen artifact as the manager's plain data: the one place that reads it.

:func:`from_artifact` turns an artifact's body (groups, specs, stages, engine,
budget) and a block count into a :class:`ManagedLayout`. It is kept apart
because the artifact format changes: only this module follows it.

What it decides, as vLLM 0.33's engine does for the same plan:

* a group's manager kind is its kind's (:attr:`kvspec.model.kinds.Kind.manager`),
  the kind of its first layer's spec for a group of several specs (the
  scheduler's view of it); a ``full_allocation`` group is full attention;
  encoder-only groups hold nothing and are left out;
* a group's block size includes decode context parallelism when its spec is
  sharded across those ranks;
* prefix caching is off when a state group runs in mode ``none`` (vLLM turns
  caching off for such models); in mode ``all`` (no vLLM counterpart), hashes are
  taken at the largest size every caching group's block size is a multiple of;
* one pool, the stages' main pool (``bytes_per_block`` summed over stages), and a
  second one for a drafter that has its own (``own_pool`` groups); a separate
  plan's pools each with their groups and their count for the budget.

>>> from kvspec.artifact import Artifact
>>> layout = from_artifact(Artifact.read("layouts/gemma-2-9b-it.kvlayout.json"), 1000)
>>> [(g.kind, g.block_size, g.sliding_window) for g in layout.groups]
[('sliding', 16, 4096), ('full', 16, None)]
>>> layout.pools[0].num_blocks, layout.enable_caching
(1000, True)
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kvspec.artifact import Artifact
from kvspec.artifact import format as fmt
from kvspec.model import kinds
from kvspec.model.specs.attention import FullAttention
from kvspec.runtime.manager.spec import ManagedGroup, ManagedLayout, ManagedPool, ManagerError

__all__ = ["from_artifact"]


@dataclass(frozen=True, slots=True)
class _Read:
    """One group as this module reads it, from an artifact or a plan."""

    #: The spec record the scheduler sees (a group of several specs: its first).
    spec: Any
    #: Groups with equal keys have equal specs.
    key: Hashable
    strategy: str
    layers: Sequence[str]
    block_size: int
    prefix_cacheable: bool
    own_pool: bool
    useful_bytes: int


@dataclass(frozen=True, slots=True)
class _Part:
    """One pool's groups (a drafter's own pool beside it) and its figures."""

    pool: str
    groups: Sequence[_Read]
    num_blocks: int
    hash_block_size: int
    #: The bytes one block costs, summed over the stages.
    bytes_per_block: int
    #: A drafter's own pool: its blocks and its bytes, summed over the stages.
    draft: tuple[int, int]


class _Engine(Protocol):
    """The engine figures the manager reads: an artifact's record or a plan's engine."""

    @property
    def block_size(self) -> int: ...

    @property
    def decode_context_parallel_size(self) -> int: ...

    @property
    def enable_prefix_caching(self) -> bool: ...

    @property
    def max_model_len(self) -> int: ...

    @property
    def max_in_flight_tokens(self) -> int: ...


def _tag(spec: Any) -> str:
    """The kind a spec record is tagged with."""
    return str(type(spec).__struct_config__.tag)


def _kind(spec: Any, strategy: str) -> str | None:
    """The manager kind of a group (None: one the manager leaves out)."""
    kind = kinds.by_name(_tag(spec)).manager
    if kind is None or strategy != "full_allocation":
        return kind
    return "full"


def _fields(kind: str, spec: Any) -> dict[str, Any]:
    """What the manager reads of a group of ``kind`` beyond its blocks."""
    if kind == "sliding":
        return {"sliding_window": spec.sliding_window,
                "extra_retained_tokens": spec.extra_retained_tokens}
    if kind == "local":
        return {"attention_chunk_size": spec.attention_chunk_size}
    if kind == "rswa":
        return {"rswa_window": spec.rswa_window}
    if kind == "state":
        return {"state_mode": spec.mamba_cache_mode,
                "speculative_blocks": spec.num_speculative_blocks,
                "checkpoint_blocks": spec.num_prefill_checkpoint_blocks,
                "checkpoint_alignment": spec.prefill_checkpoint_alignment}
    return {}


def _group(read: _Read, kind: str, dcp: int, pool: str) -> ManagedGroup:
    spec = read.spec
    if _tag(spec) == "sliding_window_mla" and spec.bounded_replay:
        raise ManagerError("bounded prefix replay (DeepSeek-V4 sliding-window MLA) is not "
                           "modelled", hint="simulate a layout without it")
    full_like = issubclass(kinds.by_name(_tag(spec)).spec, FullAttention) \
        or read.strategy == "full_allocation"
    return ManagedGroup(
        name=",".join(read.layers[:1]) + ("..." if len(read.layers) > 1 else ""),
        kind=kind, block_size=read.block_size * (dcp if spec.dcp_sharded else 1), pool=pool,
        prefix_cacheable=read.prefix_cacheable, full_like=full_like, spec_key=read.key,
        useful_bytes_per_block=read.useful_bytes, **_fields(kind, spec))


def _layout(name: str, engine: _Engine, parts: Sequence[_Part], scheduler_block_size: int
            ) -> ManagedLayout:
    """The manager's layout of ``parts``."""
    groups: list[ManagedGroup] = []
    pools: list[ManagedPool] = []
    split: list[int] = []
    for part in parts:
        held = [(r, k) for r in part.groups if (k := _kind(r.spec, r.strategy)) is not None]
        mine = [_group(r, k, engine.decode_context_parallel_size,
                       "draft" if r.own_pool else part.pool) for r, k in held]
        hash_block = part.hash_block_size
        if any(g.prefix_cacheable and g.block_size % hash_block for g in mine):
            # only Mamba mode "all" (kvspec's model, no vLLM counterpart) hashes at the
            # scheduler block size above attention blocks: hash at what every group divides
            hash_block = math.gcd(*(g.block_size for g in mine if g.prefix_cacheable))
        pools.append(ManagedPool(part.pool, part.num_blocks, hash_block_size=hash_block,
                                 bytes_per_block=part.bytes_per_block))
        if any(g.pool == "draft" for g in mine):
            blocks, size = part.draft
            pools.append(ManagedPool("draft", blocks or 1, hash_block_size=hash_block,
                                     bytes_per_block=size // (blocks or 1)))
        split += [r.block_size for r, _ in held if r.prefix_cacheable] or \
            [r.block_size for r, _ in held] or [engine.block_size]
        groups += mine
    caching = engine.enable_prefix_caching and not any(
        g.kind == "state" and g.state_mode == "none" for g in groups)
    return ManagedLayout(
        name=name, groups=tuple(groups), pools=tuple(pools),
        scheduler_block_size=scheduler_block_size, max_model_len=engine.max_model_len,
        max_in_flight_tokens=engine.max_in_flight_tokens, enable_caching=caching,
        retention_interval=0, split_block_size=min(split))


# ---------------------------------------------------------------------------
# the frozen artifact
# ---------------------------------------------------------------------------


def _useful(body: fmt.Layout) -> dict[int, int]:
    """Each group's bytes of one block that hold data: its layers' pages without
    padding (``heads * states * cell``), on every stage."""
    out: dict[int, int] = {}
    for st in body.stages:
        for t in st.tensors:
            v = t.view
            out[t.group] = out.get(t.group, 0) + len(t.layers) * v.heads * v.states * v.cell_bytes
    return out


def _seen(body: fmt.Layout, group: fmt.Group) -> tuple[Any, int]:
    """The spec the scheduler sees of ``group`` (a group of several specs shows its
    first layer's), and its index in the spec table."""
    spec = body.specs[group.spec]
    if isinstance(spec, fmt.UniformTypeSpec):
        first = body.layers[group.layers[0]].spec
        return body.specs[first], first
    return spec, group.spec


def _reads(body: fmt.Layout) -> list[_Read]:
    useful = _useful(body)
    return [_Read(*_seen(body, g), strategy=g.strategy, layers=g.layers,
                  block_size=g.block_size, prefix_cacheable=g.prefix_cacheable,
                  own_pool=g.own_pool, useful_bytes=useful.get(g.id, 0)) for g in body.groups]


def _count(name: str, given: int | None, budget: fmt.Budget | None, fixed: int | None
           ) -> int:
    """``given`` blocks, else the layout's own for its budget, else its fixed count."""
    n = given if given is not None else (budget.num_blocks if budget else fixed)
    if n is None:
        raise ManagerError(f"layout {name!r} has no block count",
                           hint="give num_blocks, or compile the layout with a memory budget")
    return int(n)


def _separate(artifact: Artifact, reads: list[_Read], counts: Mapping[str, int] | None
              ) -> list[_Part]:
    """A separate plan's pools, each with its groups and its count (``counts``, else
    its own for the budget; its hashes at what its groups' blocks divide: one group
    per pool)."""
    body = artifact.body
    counts = {**artifact.counts_for(0), **(counts or {})}
    parts = []
    for pool in body.stages[0].pools:
        same = [p for st in body.stages for p in st.pools if p.name == pool.name]
        mine = [reads[i] for i in sorted({g for p in same for g in p.groups})]
        dcp = body.engine.decode_context_parallel_size
        sizes = [r.block_size * (dcp if r.spec.dcp_sharded else 1) for r in mine]
        parts.append(_Part(pool.name, mine, counts[pool.name], math.gcd(*sizes),
                           sum(p.bytes_per_block for p in same if p.groups), (0, 0)))
    return parts


def from_artifact(artifact: Artifact, num_blocks: int | Mapping[str, int] | None = None
                  ) -> ManagedLayout:
    """The manager's view of an artifact with ``num_blocks`` blocks (default: its
    own, for its budget), or with each pool's count by name (``{"device": n}``; a
    separate plan's pools: each its own count for the budget where not given)."""
    body = artifact.body
    reads = _reads(body)
    counts, given = ((num_blocks, num_blocks.get("device")) if isinstance(num_blocks, Mapping)
                     else (None, num_blocks))
    if artifact.pooled:
        parts = _separate(artifact, reads, counts)
    else:
        stages = body.stages
        count = _count(body.name, given, body.budget, body.engine.num_blocks)
        parts = [_Part("device", reads, count, body.hash_block_size,
                       sum(st.bytes_per_block for st in stages),
                       (stages[0].draft_num_blocks or 0, sum(st.fixed_bytes for st in stages)))]
    return _layout(body.name, body.engine, parts, body.scheduler_block_size)
