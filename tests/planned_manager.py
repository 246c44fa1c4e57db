"""The manager's view of the planner's layouts: the oracle ``from_artifact`` is
checked against (tests/test_manager.py). kvspec reads only frozen artifacts; this
reads the plan they were frozen from, so the two readings must agree."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import msgspec

from kvspec.artifact import format as fmt
from kvspec.model import kinds
from kvspec.model.specs.base import LayerSpec
from kvspec.model.specs.uniform import UniformType
from kvspec.runtime.manager.adapter import _count, _layout, _Part, _Read
from kvspec.runtime.manager.spec import ManagedLayout


class _Planned(Protocol):
    """A planner's group (:class:`kvspec.model.plan.Group`)."""

    spec: LayerSpec
    strategy: str
    layer_names: tuple[str, ...]
    own_pool: bool

    def layer_spec(self, name: str) -> LayerSpec: ...


def _representative(spec: LayerSpec) -> LayerSpec:
    """The spec the scheduler sees: a group of several specs shows its first."""
    return spec.members[0][1] if isinstance(spec, UniformType) else spec


def manager_kind(group: _Planned) -> str | None:
    """The manager kind of a planner's group (None: a group the manager leaves out)."""
    kind = kinds.of(_representative(group.spec)).manager
    return "full" if kind is not None and group.strategy == "full_allocation" else kind


def _planned(group: _Planned) -> _Read:
    spec = _representative(group.spec)
    return _Read(spec=msgspec.convert(kinds.describe(spec), fmt.Spec), key=spec,
                 strategy=group.strategy, layers=group.layer_names,
                 block_size=group.spec.block_size,
                 prefix_cacheable=group.spec.prefix_cacheable, own_pool=group.own_pool,
                 useful_bytes=sum(group.layer_spec(n).unpadded_page_size_bytes
                                  for n in group.layer_names))


def from_layouts(layouts: Sequence[tuple[str, Any]], counts: Mapping[str, int] | None = None
                 ) -> ManagedLayout:
    """The manager's view of one or several planner's layouts, each a pool of its
    own (the ``separate`` policy's pools), each with the count ``counts`` gives it
    (default: its own, for its budget)."""
    parts = []
    for name, x in layouts:
        n = _count(x.name, (counts or {}).get(name), x.budget,
                   x.engine.num_gpu_blocks_override)
        parts.append(_Part(name, [_planned(g) for g in x.groups], n, x.hash_block_size,
                           sum(s.bytes_per_block for s in x.stages),
                           (x.stages[0].draft_num_blocks or 0,
                            sum(s.fixed_bytes for s in x.stages))))
    first = layouts[0][1]
    return _layout(first.name, first.engine, parts,
                   math.lcm(*(x.scheduler_block_size for _, x in layouts)))
