"""An artifact's frozen body as the report reads it: its engine, its groups with
their merged specs, its stages, and each pool of a separate plan on its own.

The early checks (:func:`kvspec.model.checks.early_checks`) read a plan through
a Protocol that these groups and stages satisfy, as the planner's do: the report
makes the very same checks from the body, without re-planning it.

>>> from kvspec.artifact import Artifact
>>> view = frozen(Artifact.read("layouts/llama-3.1-8b.kvlayout.json").body)
>>> len(view.groups), view.groups[0].blocks, view.min_memory == 8193 * 2 * 2**20
(1, 8192, True)
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from kvspec.artifact import format as fmt
from kvspec.model import kinds
from kvspec.model.blocks import block_sizes, pool_engine
from kvspec.model.engine import Engine, engine_from_artifact
from kvspec.model.specs import LayerSpec, UniformType

__all__ = ["FrozenGroup", "FrozenLayout", "FrozenStage", "frozen", "pool_of"]


@dataclass(frozen=True, slots=True)
class FrozenGroup:
    """A body's group (on a stage: the layers the stage holds), its merged spec."""

    layer_names: tuple[str, ...]
    spec: LayerSpec
    own_pool: bool
    padding_slots: int
    #: Blocks one request at ``max_model_len`` takes (the body's figure).
    blocks: int

    def layer_spec(self, name: str) -> LayerSpec:
        return self.spec.specs[name] if isinstance(self.spec, UniformType) else self.spec

    def blocks_per_request(self, engine: Engine) -> int:
        return self.spec.request_blocks(engine)


@dataclass(frozen=True, slots=True)
class FrozenStage:
    """A body's stage, its groups restricted to its layers (same order and ids)."""

    record: fmt.Stage
    groups: tuple[FrozenGroup, ...]
    #: Bytes one block of the stage's (one) block-scaled pool costs.
    bytes_per_block: int
    min_num_blocks: int
    memory_per_request: int

    def memory_for(self, num_blocks: int) -> int:
        """What ``num_blocks`` blocks cost one rank of this stage: the pool, and a
        drafter's own."""
        return num_blocks * self.bytes_per_block + self.record.fixed_bytes


@dataclass(frozen=True, slots=True)
class FrozenLayout:
    """The body, or one pool of a separate plan, as the report reads it."""

    body: fmt.Layout
    engine: Engine
    groups: tuple[FrozenGroup, ...]
    stages: tuple[FrozenStage, ...]
    scheduler_block_size: int
    hash_block_size: int
    budget: fmt.Budget | None

    @property
    def min_num_blocks(self) -> int:
        return max(st.min_num_blocks for st in self.stages)

    @property
    def min_memory(self) -> int:
        """The smallest per-rank budget that serves one request at ``max_model_len``:
        the fewest blocks, and a drafter's fixed pool, on the costliest stage."""
        return max(st.memory_for(st.min_num_blocks) for st in self.stages)


def _groups(body: fmt.Layout, specs: list[LayerSpec]) -> tuple[FrozenGroup, ...]:
    return tuple(FrozenGroup(tuple(g.layers), specs[g.spec], g.own_pool, g.padding_slots,
                             g.blocks_per_request) for g in body.groups)


def _stage(st: fmt.Stage, groups: tuple[FrozenGroup, ...]) -> FrozenStage:
    mine = tuple(_on(g, names) for g, names in zip(groups, st.groups))
    return FrozenStage(st, mine, st.bytes_per_block, st.min_num_blocks, st.memory_per_request)


def _on(group: FrozenGroup, names: list[str]) -> FrozenGroup:
    return FrozenGroup(tuple(names), group.spec, group.own_pool, group.padding_slots,
                       group.blocks)


def _specs(body: fmt.Layout) -> list[LayerSpec]:
    return [kinds.spec_from_dict(msgspec.to_builtins(s)) for s in body.specs]


def frozen(body: fmt.Layout, engine: Engine | None = None) -> FrozenLayout:
    """``body`` as the report reads it (``engine``: the settings as the source gave
    them, where the body resolves some, e.g. ``async_scheduling``)."""
    groups = _groups(body, _specs(body))
    if engine is None:
        engine = engine_from_artifact(msgspec.to_builtins(body.engine))
    return FrozenLayout(body, engine, groups,
                        tuple(_stage(st, groups) for st in body.stages),
                        body.scheduler_block_size, body.hash_block_size, body.budget)


def pool_of(body: fmt.Layout, name: str, engine: Engine | None = None) -> FrozenLayout:
    """Pool ``name`` of a separate plan's body, as a layout of its own: its groups
    (numbered from 0), its tensors in its one block-scaled pool, its budget, and the
    engine it plans with (``engine``: as the source gave it)."""
    whole = frozen(body)
    ids = next(p.groups for p in body.stages[0].pools if p.name == name)
    base = min(ids, default=0)
    stages = tuple(_pool_stage(st, fst, name, ids, base)
                   for st, fst in zip(body.stages, whole.stages))
    groups = tuple(whole.groups[i] for i in ids)
    record = body.pooling
    assert record is not None, "a separate plan's body holds its pooling record"
    share = next(p for p in record.pools if p.name == name)
    if engine is None:
        engine = pool_engine(whole.engine, record.block_size, record.state_block_size,
                             share.state)
    st0 = stages[0].groups
    sched, hashed = block_sizes(engine, st0) if st0 else (engine.block_size, engine.block_size)
    return FrozenLayout(body, engine, groups, stages, sched, hashed, share.budget)


def _pool_stage(st: fmt.Stage, whole: FrozenStage, name: str, ids: list[int], base: int
                ) -> FrozenStage:
    pool = next(p for p in st.pools if p.name == name)
    tensors = [msgspec.structs.replace(t, group=t.group - base, pool="device")
               for t in st.tensors if t.pool == name]
    groups = tuple(whole.groups[i] for i in ids)
    record = msgspec.structs.replace(
        st, layers=[n for g in groups for n in g.layer_names], fixed_bytes=0,
        bytes_per_block=pool.bytes_per_block, draft_num_blocks=None, draft_layers=[],
        min_num_blocks=pool.min_num_blocks, groups=[list(g.layer_names) for g in groups],
        pools=[msgspec.structs.replace(pool, name="device")], tensors=tensors)
    usage = pool.bytes_per_block * sum(g.blocks for g in groups if not g.own_pool)
    return FrozenStage(record, groups, pool.bytes_per_block, pool.min_num_blocks, usage)
