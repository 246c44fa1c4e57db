"""Strategy ``hidden_state``: hidden-state caches appended to the other groups.

Hidden-state cache layers (``extract_hidden_states``) keep one hidden vector
per token in a page of the common page size; each gets the largest block size
that divides the others' and fits the page, the rest of the page padded.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from kvspec.errors import PlanError
from kvspec.model.dtypes import dtype_size
from kvspec.model.plan import Group
from kvspec.model.specs import HiddenState, cdiv, replace
from kvspec.planner.log import PlanLog


def _largest_divisor_at_most(value: int, limit: int) -> int:
    for d in range(min(value, limit), 0, -1):
        if value % d == 0:
            return d
    return 1


def _per_token(spec: HiddenState) -> int:
    return spec.num_kv_heads * spec.head_size * dtype_size(spec.dtype)


def _scaled(groups: list[Group], scale: int) -> list[Group]:
    """Every group with its block ``scale`` times larger (and its padded page)."""
    out = []
    for g in groups:
        changes: dict[str, int] = {"block_size": g.spec.block_size * scale}
        padded = getattr(g.spec, "page_size_padded", None)
        if padded is not None:
            changes["page_size_padded"] = padded * scale
        out.append(Group(g.layer_names, replace(g.spec, **changes), g.strategy, g.role,
                         g.is_eagle, g.padding_slots, g.own_pool))
    return out


def add_hidden_groups(groups: list[Group], hidden: Mapping[str, HiddenState],
                      log: PlanLog) -> list[Group]:
    pages = {g.spec.page_size_bytes for g in groups}
    if len(pages) != 1:
        raise PlanError("hidden-state caches need one common page size across groups",
                        hint="give the attention layers one page size (block_size, heads, "
                        "head_size, dtype), or drop the hidden-state layers")
    common = pages.pop()
    need = max(_per_token(s) for s in hidden.values())
    if need > common:
        # Tensor parallelism can shrink the page below one hidden state's bytes:
        # scale every group's block up until one token fits.
        scale = cdiv(need, common)
        common *= scale
        groups = _scaled(groups, scale)
    block_gcd = math.gcd(*(g.spec.block_size for g in groups))
    out = list(groups)
    for name, spec in hidden.items():
        per_token = _per_token(spec)
        block = _largest_divisor_at_most(block_gcd, max(common // per_token, 1))
        waste = common - block * per_token
        log.info(f"Using block size {block} for hidden-state cache layer {name}; "
                 f"page alignment wastes {waste} bytes ({waste / common * 100:.2f}%) "
                 "per block")
        out.append(Group((name,), replace(spec, block_size=block, page_size_padded=common),
                         strategy="hidden_state"))
    return out
