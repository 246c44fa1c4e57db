"""A frozen artifact body in the terms the vLLM plugin checks an engine with.

The plugin (:mod:`.guard`) runs in every engine process, so it reads an artifact
as ``kvspec.load`` does and never re-plans it (no planner, passes, pydantic,
PyYAML or simulator: ``tests/test_plugin_imports.py`` checks the imports, and
``tests/test_plugin_frozen.py`` that every figure below equals the re-made plan's,
for every committed artifact and conformance case). This module turns the
body's records into what the checks compare: the specs of its spec table, the
by-design rules' view of the plan, a stage's tensors as vLLM's ``KVCacheTensor``
fields, and an ``auto`` ``max_model_len`` fitted to another budget.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import msgspec

from kvspec.artifact import format as fmt
from kvspec.errors import PlanError
from kvspec.model import kinds
from kvspec.model.engine import Engine, engine_from_artifact
from kvspec.model.fit import longest_request
from kvspec.model.specs import LayerSpec, UniformType

__all__ = ["GroupFacts", "PlanFacts", "fitted", "groups_of", "plan_facts", "read_facts",
           "read_specs", "stage_tensors"]


@dataclass(frozen=True, slots=True)
class GroupFacts:
    """A body's group as the checks and the by-design rules read it: its layers
    (on a stage: those the stage holds) and its merged spec."""

    layer_names: tuple[str, ...]
    spec: LayerSpec
    strategy: str
    own_pool: bool

    def layer_spec(self, name: str) -> LayerSpec:
        return self.spec.specs[name] if isinstance(self.spec, UniformType) else self.spec

    def blocks_per_request(self, engine: Engine) -> int:
        """Blocks one request at ``engine.max_model_len`` takes in this group."""
        return self.spec.request_blocks(engine)


class StageFacts(NamedTuple):
    """What the by-design rules read of a stage (:func:`.by_design.applicable`)."""

    draft_num_blocks: int | None
    #: Each global group restricted to the stage's layers (same order and ids).
    groups: tuple[GroupFacts, ...]


class PlanFacts(NamedTuple):
    """The frozen body as the by-design rules read a plan: the engine it was planned
    for, each layer's spec, the groups and the stages (no re-planning)."""

    engine: Engine
    specs: Mapping[str, LayerSpec]
    groups: tuple[GroupFacts, ...]
    stages: tuple[StageFacts, ...]


def read_specs(body: fmt.Layout) -> list[LayerSpec]:
    """The body's spec table as kvspec specs (each kind's fields, read back); a
    ``ValueError`` naming the spec that cannot be."""
    out = []
    for i, record in enumerate(body.specs):
        try:
            out.append(kinds.spec_from_dict(msgspec.to_builtins(record)))
        except Exception as exc:  # noqa: BLE001 - whatever a malformed description raises
            raise ValueError(f"spec {i} cannot be read back: {type(exc).__name__}: {exc}"
                             ) from None
    return out


def groups_of(body: fmt.Layout, specs: list[LayerSpec]) -> tuple[GroupFacts, ...]:
    """The body's groups, each with its merged spec."""
    return tuple(GroupFacts(tuple(g.layers), specs[g.spec], g.strategy, g.own_pool)
                 for g in body.groups)


def plan_facts(engine: Engine, body: fmt.Layout, layer_specs: Mapping[str, LayerSpec],
               groups: tuple[GroupFacts, ...]) -> PlanFacts:
    stages = tuple(StageFacts(st.draft_num_blocks, tuple(
        dataclasses.replace(g, layer_names=tuple(names))
        for g, names in zip(groups, st.groups))) for st in body.stages)
    return PlanFacts(engine, layer_specs, groups, stages)


def read_facts(body: fmt.Layout) -> PlanFacts:
    """The body as the by-design rules read a plan: the engine it was planned for
    (``max_model_len`` before any fitting), each layer's spec, the groups, the
    stages; a ``ValueError`` naming a spec that cannot be read back."""
    specs = read_specs(body)
    engine = engine_from_artifact(msgspec.to_builtins(body.engine))
    return plan_facts(engine, body, {n: specs[e.spec] for n, e in body.layers.items()},
                      groups_of(body, specs))


def stage_tensors(stage: fmt.Stage, num_blocks: int) -> list[dict[str, Any]]:
    """A stage's tensors as vLLM's ``KVCacheTensor`` fields for ``num_blocks`` blocks:
    each tensor spans its pool's allocation (``size``), host-resident in the host pool."""
    sizes = {a.name: a.size for a in stage.allocations}
    allocation = {p.name: p.allocation for p in stage.pools}
    return [{"size": fmt.at(sizes[allocation[t.pool]], num_blocks), "layers": list(t.layers),
             "layer_stride": fmt.at(t.layer_stride, num_blocks),
             "block_stride": fmt.at(t.block_stride, num_blocks),
             "offset": fmt.at(t.offset, num_blocks), "host_resident": t.pool == "host"}
            for t in stage.tensors]


def fitted(engine: Engine, body: fmt.Layout, groups: tuple[GroupFacts, ...], memory: int
           ) -> tuple[int, int]:
    """An ``auto`` artifact's ``max_model_len`` for a budget other than its own, and
    the blocks one request then takes, the null block included: the planner's
    ``estimate_max_model_len`` and ``min_blocks_to_serve`` where a request costs
    whole blocks of one size (every layout but the state-slot one)."""
    if any(g.strategy == "state_slots" for g in groups):
        raise PlanError("its state-slot layout fits max_model_len: auto only at the budget "
                        "it was compiled for", hint="compile it for this budget "
                        "(engine.memory)")
    fit, need = engine.max_model_len, 1
    override = body.engine.num_blocks
    stages = [(st, tuple(dataclasses.replace(g, layer_names=tuple(names))
                         for g, names in zip(groups, st.groups))) for st in body.stages]

    def blocks(length: int, of: tuple[GroupFacts, ...]) -> int:
        at = dataclasses.replace(engine, max_model_len=length)
        return sum(g.blocks_per_request(at) for g in of)

    for st, of in stages:
        if not st.bytes_per_block:
            continue
        avail = override * st.bytes_per_block if override is not None else memory
        limit = (avail - st.bytes_per_block) // st.bytes_per_block
        best = longest_request(dataclasses.replace(engine, max_model_len=fit), of, limit)
        if best <= 0:
            raise PlanError("cannot fit max_model_len: not even one token fits the memory",
                            hint="give the KV cache more memory")
        fit = min(fit, best)
    for st, of in stages:
        if st.bytes_per_block:
            need = max(need, blocks(fit, of) - st.fixed_bytes // st.bytes_per_block + 1)
    return fit, need
