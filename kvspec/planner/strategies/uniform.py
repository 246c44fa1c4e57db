"""Strategy ``uniform``: every layer has one spec -> one group.

>>> from kvspec.model.engine import Engine
>>> from kvspec.model.specs import FullAttention
>>> f = FullAttention(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")
>>> [g.layer_names for g in uniform(Engine(), {"a": f, "b": f})]
[('a', 'b')]
"""

from __future__ import annotations

from collections.abc import Mapping

from kvspec.model.engine import Engine
from kvspec.model.plan import Group
from kvspec.model.specs import LayerSpec
from kvspec.planner.log import PlanLog
from kvspec.planner.merge import is_uniform, merge_group


def uniform(engine: Engine, specs: Mapping[str, LayerSpec],
            log: PlanLog | None = None) -> list[Group] | None:
    """One group of every layer, or None when the specs cannot merge."""
    if not is_uniform(specs):
        return None
    return [merge_group(specs, list(specs), strategy="uniform")]
