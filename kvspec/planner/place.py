"""The place pass: groups + axis order -> tensors in one pool.

A tensor places same-shaped layers: layer ``layers[l]``'s page for block ``b``
starts ``offset + l * layer_stride + b * block_stride`` bytes into the pool.
Groups alias from byte 0, slot by slot: a block id belongs to one group at a
time, so slot *i* of every group can share the same bytes.

Layer-outermost (``LBNHC``; uniform pages or a single group)::

    group 0: | A [blk 0 | blk 1 | ...] | B [blk 0 | blk 1 | ...] |
    group 1: | C [blk 0 | blk 1 | ...] | D [blk 0 | blk 1 | ...] |

Block-outermost (``BLHNC``; pages of different sizes packed per block)::

    group 0: | blk 0 [ A | B | pad ] | blk 1 [ A | B | pad ] | ...
    group 1: | blk 0 [  C  |   D   ] | blk 1 [  C  |   D   ] | ...
             |<-- bytes_per_block -->|

Aliasing rests on one property: the bytes of block id *b* never overlap those
of another block id in any layer of any group. With heads outside blocks
(``LHBNC``) a page is one run per head slot, ``num_blocks`` runs apart, so two
layers sharing a slot keep that property only when they split their pages
alike; :func:`check_slot_aliasing` refuses the others at compile time.
Every quantity that depends on the block count is an :class:`~kvspec.model.affine.Affine`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from kvspec.errors import PLANNER_BUG, PlanError
from kvspec.model.affine import Affine
from kvspec.model.axes import DIM_B, DIM_H, DIM_L, AxisOrder
from kvspec.model.engine import Engine, SettingRef
from kvspec.model.geometry import spec_strides
from kvspec.model.plan import Group, Tensor
from kvspec.model.specs import LayerSpec, UniformType, round_up
from kvspec.model.specs.base import by_spec


def bytes_per_block(groups: Sequence[Group]) -> int:
    """Bytes one block costs in the pool: the widest group, aligned."""
    widest = max(g.page_bytes() for g in groups)
    if widest <= 0:
        raise PlanError("a KV cache group holds no bytes per block", hint=PLANNER_BUG)
    aligns = [s.block_stride_alignment or 1 for g in groups for s in g.layer_specs()]
    return round_up(widest, math.lcm(*aligns) if aligns else 1)


def validate_axis_order(order: AxisOrder, groups: Sequence[Group]) -> None:
    """Reject an axis order that cannot express mixed page sizes."""
    pages = {s.page_size_bytes for g in groups for s in g.layer_specs()}
    if len(pages) <= 1:
        return
    if not order.is_block_compact or (len(groups) > 1 and order.is_layer_compact):
        raise PlanError(
            f"layout {order.name} cannot express this model's mixed page sizes "
            f"({sorted(pages)})",
            ref=SettingRef("axis_order"), found=order.name,
            expected="a block-outermost layout",
            hint="set engine.layout to BLHNC (pages packed side by side in each block)")


def _buckets(group: Group) -> dict[LayerSpec, list[str]]:
    """This stage's layers of ``group`` by spec, in order."""
    if isinstance(group.spec, UniformType):
        # A stage that owns none of a group's layers keeps the global spec
        # (as the reference projects it); place only this stage's layers.
        owned = set(group.layer_names)
        return by_spec((name, spec) for name, spec in group.spec.members if name in owned)
    if group.layer_names:
        return {group.spec: list(group.layer_names)}
    return {}


def place(engine: Engine, groups: Sequence[Group], group_ids: Sequence[int]) -> list[Tensor]:
    """Tensors for ``groups`` (global ids ``group_ids``) in the engine's axis order."""
    order = engine.axis_order
    validate_axis_order(order, groups)
    per_block = bytes_per_block(groups)
    n = Affine(1, 0)
    packed_stride = Affine.of(per_block) if order.is_block_outermost else None
    size = n * per_block
    tensors: list[Tensor] = []
    for gid, g in zip(group_ids, groups):
        byte_offset = 0
        for spec, names in _buckets(g).items():
            strides = spec_strides(spec, n, len(names), order,
                                     fixed=(None, packed_stride, None, None, None))
            page = spec.page_size_bytes
            offset = (Affine.max(strides[DIM_L], page) * byte_offset).exact_div(page)
            tensors.append(Tensor(size=size, layers=tuple(names), layer_stride=strides[DIM_L],
                                  block_stride=strides[DIM_B], offset=offset, group=gid))
            byte_offset += len(names) * page
    if order.heads_outside_blocks:
        check_slot_aliasing(order, dict(zip(group_ids, groups)), tensors)
    return tensors


def _head_split(spec: LayerSpec, order: AxisOrder) -> tuple[int, Affine, Affine]:
    """``(head slots, head stride, block stride)`` of one layer's page."""
    strides = spec_strides(spec, Affine(1, 0), 1, order)
    return spec.num_heads, strides[DIM_H], strides[DIM_B]


#: A layer holding a slot: its name, its group and its page split (:func:`_head_split`).
_SlotOwner = tuple[str, int, tuple[int, Affine, Affine]]


def check_slot_aliasing(order: AxisOrder, groups: dict[int, Group],
                        tensors: Sequence[Tensor]) -> None:
    """Refuse layers of different groups that share a slot but split their
    pages differently when heads lie outside blocks: block *b* of one would
    write the bytes of other blocks of the other."""
    seen: dict[Affine, _SlotOwner] = {}
    for t in tensors:
        split = _head_split(groups[t.group].layer_spec(t.layers[0]), order)
        for i, name in enumerate(t.layers):
            other = seen.setdefault(t.offset + t.layer_stride * i, (name, t.group, split))
            if other[1] != t.group and other[2] != split and max(split[0], other[2][0]) > 1:
                raise _aliasing_error(order, other, (name, t.group, split))


def _aliasing_error(order: AxisOrder, a: _SlotOwner, b: _SlotOwner) -> PlanError:
    (na, ga, (ha, _, ba)), (nb, gb, (hb, _, bb)) = a, b
    return PlanError(
        f"layers {na} (group {ga}: {ha} head slot(s), {ba} bytes per block and head) and "
        f"{nb} (group {gb}: {hb} head slot(s), {bb} bytes per block and head) share a "
        f"slot under layout {order.name}, where head slots lie outside blocks: block ids "
        f"of one group would write the bytes of other block ids of the other",
        ref=SettingRef("axis_order"), found=order.name,
        expected="a layout with heads inside blocks, or aliased layers with the same "
                 "heads and page split",
        hint="use LBNHC or LBHNC (heads inside each block), or a block-outermost layout "
             "(BLHNC)")
