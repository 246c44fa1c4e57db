"""Strategy ``uniform_type``: one type (same token slots), different pages -> one
``UniformType`` group whose block holds a page of every layer.

>>> from kvspec.model.engine import Engine
>>> from kvspec.model.specs import FullAttention
>>> a = FullAttention(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")
>>> b = FullAttention(block_size=16, num_kv_heads=2, head_size=128, dtype="bfloat16")
>>> [(g.strategy, g.spec.kind) for g in uniform_type(Engine(), {"a": a, "b": b})]
[('uniform_type', 'uniform_type')]
"""

from __future__ import annotations

from collections.abc import Mapping

from kvspec.model.engine import Engine
from kvspec.model.plan import Group
from kvspec.model.specs import LayerSpec, UniformType
from kvspec.planner.log import PlanLog


def uniform_type(engine: Engine, specs: Mapping[str, LayerSpec],
                 log: PlanLog | None = None) -> list[Group] | None:
    spec = UniformType.of(specs)
    if spec is None:
        return None
    return [Group(tuple(specs), spec, strategy="uniform_type")]
