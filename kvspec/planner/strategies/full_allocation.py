"""Strategy ``full_allocation``: MLA + sliding-window models whose pages cannot
be unified fall back to allocating the sliding-window layers as full attention
(one uniform-type group); their attention compute is unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvspec.errors import PlanError
from kvspec.model.plan import Group
from kvspec.model.specs import (
    MLA,
    ChunkedLocal,
    HiddenState,
    LayerSpec,
    SlidingWindow,
    SlidingWindowMLA,
    UniformType,
)
from kvspec.planner.log import PlanLog
from kvspec.planner.strategies.promote import promote_local_specs


def full_allocation(specs: Mapping[str, LayerSpec], log: PlanLog) -> list[Group] | None:
    values = list(specs.values())
    if any(isinstance(s, (HiddenState, SlidingWindowMLA, ChunkedLocal)) for s in values):
        return None
    has_mla = any(isinstance(s, MLA) for s in values)
    has_swa = any(isinstance(s, SlidingWindow) for s in values)
    if not (has_mla and has_swa):
        return None
    try:
        promoted = promote_local_specs(specs)
    except PlanError:
        return None
    uniform = UniformType.of(promoted)
    if uniform is None:
        return None
    log.warning("KV cache page sizes cannot be unified; treating sliding-window layers "
                "as full attention for cache allocation. Sliding-window attention "
                "compute is unchanged.")
    return [Group(tuple(promoted), uniform, strategy="full_allocation")]
