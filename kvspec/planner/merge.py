"""Merging layer specs into groups, with the planner's errors.

>>> from kvspec.model.specs import FullAttention, SlidingWindow
>>> f = FullAttention(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")
>>> w = SlidingWindow(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16",
...                   sliding_window=4096)
>>> is_uniform({"a": f, "b": f}), is_uniform({"a": f, "b": w}), is_uniform_type({"a": f, "b": w})
(True, False, False)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvspec.errors import PlanError
from kvspec.model.plan import Group
from kvspec.model.specs import LayerSpec, MergeConflict, MergeInvalid, UniformType


def names_brief(names: Sequence[str], limit: int = 4) -> str:
    return ", ".join(names[:limit]) + ("..." if len(names) > limit else "")


def merge_group(specs: Mapping[str, LayerSpec], names: Sequence[str], **group: object) -> Group:
    """One group of ``names``, their specs merged; PlanError when they cannot share it."""
    layer = [specs[n] for n in names]
    try:
        merged = type(layer[0]).merge(layer)
    except (MergeConflict, MergeInvalid) as exc:
        raise PlanError(f"layers {names_brief(names)} cannot share one block table: {exc}",
                        hint="give these layers the same kind, heads, head size and dtype"
                        ) from exc
    return Group(tuple(names), merged, **group)  # type: ignore[arg-type]


def is_uniform(specs: Mapping[str, LayerSpec]) -> bool:
    """Whether every layer can share one spec (sliding window as full attention)."""
    if not specs:
        return True
    values = list(specs.values())
    try:
        type(values[0]).merge(values)
    except MergeConflict:
        return False
    except MergeInvalid as exc:
        raise PlanError(str(exc), hint="layers of one kind must agree on their window") from exc
    return True


def is_uniform_type(specs: Mapping[str, LayerSpec] | Sequence[LayerSpec]) -> bool:
    try:
        return UniformType.is_uniform_type(specs)
    except MergeConflict as exc:
        raise PlanError(str(exc), hint="layers that share a group must agree in kind "
                        "and page shape; give the odd layer its own type") from exc
