"""What an artifact's structure proves, checked without the planner.

``load`` trusts an artifact only as far as these checks reach (docs/artifact.md,
"The trust model"); with the block-id proof (:mod:`.blocks`) they refuse every
memory-unsafe edit, a recomputed hash included. This module holds what does not
depend on the block count: every layer placed exactly once in a tensor of its
own stage and group; every tensor in a pool of an allocation of its stage; a
known dtype that tiles the cell, offsets and strides whole elements of it; the
H and N strides exactly those the axis order gives
(:func:`kvspec.model.geometry.axis_strides`); each group's bytes accounted
(useful + padding = the block's bytes); each spec's page size the one its own
fields give (kind, heads, head size, block size, dtype: the model's rule,
:func:`kvspec.model.kinds.spec_from_dict`, checked once per spec), and each
group's page size its spec's.

Each problem carries the path of what it is about in the artifact's JSON, so the
reader can name its line and column.

>>> import kvspec
>>> shape_problems(kvspec.compile("layouts/gemma-2-9b-it.yaml").body)
[]
"""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec

from kvspec.artifact.format import Affine, Layout, Stage, Tensor
from kvspec.model import kinds
from kvspec.model.affine import Affine as Form
from kvspec.model.axes import DIM_H, DIM_N, AxisOrder
from kvspec.model.dtypes import DTYPE_SIZES, canonical_dtype
from kvspec.model.geometry import axis_strides

__all__ = ["Problem", "expected_strides", "shape_problems", "tensor_path"]

#: Problems reported at most (the first ones say what is wrong).
LIMIT = 20

Path = tuple[str | int, ...]


class Problem(NamedTuple):
    """One violation, and the path in the artifact's JSON of what it is about."""

    path: Path
    message: str

    def __str__(self) -> str:
        return self.message


def tensor_path(stage: int, tensor: int, *more: str | int) -> Path:
    return ("body", "stages", stage, "tensors", tensor, *more)


def _form(value: int | Affine) -> Form:
    return Form(0, value) if type(value) is int else Form(value.per_block, value.fixed)  # type: ignore[union-attr]


# ---------------------------------------------------------------------------
# independent of the block count
# ---------------------------------------------------------------------------


def _placement(body: Layout, si: int, st: Stage) -> list[Problem]:
    out: list[Problem] = []
    layers = body.layers
    on_stage = set(st.layers)
    placed: dict[str, int] = {}
    for ti, t in enumerate(st.tensors):
        if t.group >= len(body.groups):
            out.append(Problem(tensor_path(si, ti, "group"), f"stage {si}: a tensor of "
                               f"{t.layers[:1]} names group {t.group}, of {len(body.groups)}"))
        for n in t.layers:
            placed[n] = placed.get(n, 0) + 1
            entry = layers.get(n)
            if entry is None:
                out.append(Problem(tensor_path(si, ti, "layers"),
                                   f"stage {si}: tensor layer {n} has no layer entry"))
            elif entry.group != t.group or entry.stage != si:
                out.append(Problem(("body", "layers", n), f"stage {si}: layer {n} is placed "
                                   f"in group {t.group}, its entry says group {entry.group} "
                                   f"on stage {entry.stage}"))
    out += [Problem(("body", "stages", si, "layers"),
                    f"stage {si}: layer {n} placed {placed.get(n, 0)} times")
            for n in st.layers if placed.get(n, 0) != 1 and layers.get(n) is not None
            and layers[n].group is not None]
    out += [Problem(("body", "stages", si, "tensors"),
                    f"stage {si}: layer {n} placed but not on this stage")
            for n in placed if n not in on_stage]
    return out


def _groups(body: Layout) -> list[Problem]:
    out: list[Problem] = []
    seen: dict[str, int] = {}
    for i, g in enumerate(body.groups):
        if g.id != i:
            out.append(Problem(("body", "groups", i, "id"), f"group {i} says it is group {g.id}"))
        for n in g.layers:
            if n in seen:
                out.append(Problem(("body", "groups", i, "layers"),
                                   f"layer {n} is in groups {seen[n]} and {i}"))
            seen[n] = i
    for n, entry in body.layers.items():
        where = ("body", "layers", n)
        if entry.group is not None and seen.get(n) != entry.group:
            out.append(Problem((*where, "group"),
                               f"layer {n} says group {entry.group}, groups say {seen.get(n)}"))
        if entry.spec >= len(body.specs):
            out.append(Problem((*where, "spec"),
                               f"layer {n} names spec {entry.spec}, of {len(body.specs)}"))
        if entry.cells is not None and entry.cells >= len(body.cells):
            out.append(Problem((*where, "cells"), f"layer {n} names cell layout "
                               f"{entry.cells}, of {len(body.cells)}"))
        if entry.stage >= len(body.stages):
            out.append(Problem((*where, "stage"),
                               f"layer {n} names stage {entry.stage}, of {len(body.stages)}"))
    return out


def _pools(si: int, st: Stage, groups: int) -> list[Problem]:
    out: list[Problem] = []
    here = ("body", "stages", si)
    allocations = {a.name for a in st.allocations}
    if len(allocations) != len(st.allocations):
        out.append(Problem((*here, "allocations"), f"stage {si}: two allocations share a name"))
    names = {p.name: p for p in st.pools}
    if len(names) != len(st.pools):
        out.append(Problem((*here, "pools"), f"stage {si}: two pools share a name"))
    for pi, p in enumerate(st.pools):
        if p.allocation not in allocations:
            out.append(Problem((*here, "pools", pi, "allocation"),
                               f"stage {si}: pool {p.name} is in no allocation ({p.allocation})"))
        out += [Problem((*here, "pools", pi, "groups"),
                        f"stage {si}: pool {p.name} names group {g}, of {groups}")
                for g in p.groups if g >= groups]
    for ti, t in enumerate(st.tensors):
        pool = names.get(t.pool)
        if pool is None:
            out.append(Problem(tensor_path(si, ti, "pool"),
                               f"stage {si}: tensor of {t.layers[:1]} is in no pool ({t.pool})"))
        elif t.group not in pool.groups:
            out.append(Problem(tensor_path(si, ti, "pool"), f"stage {si}: group {t.group} "
                               f"draws from pool {t.pool}, which does not list it"))
    return out


def expected_strides(order: AxisOrder, t: Tensor, blocks: int | None) -> list[Form] | None:
    """The ``[L, B, H, N, C]`` byte strides the axis order gives ``t``'s view in a
    pool of ``blocks`` blocks (None: the stage's count ``N``)."""
    v = t.view
    count = Form(1, 0) if blocks is None else Form(0, blocks)
    shape = (len(t.layers), count, v.heads, v.states, v.cell_bytes)
    return axis_strides(order, shape, v.page_padded,
                        (_form(t.layer_stride), _form(t.block_stride), None, None, None))


def _view(order: AxisOrder, si: int, ti: int, t: Tensor, blocks: int | None
          ) -> list[Problem]:
    v = t.view
    where = f"stage {si}: layer {t.layers[0]}"
    try:
        item = DTYPE_SIZES[canonical_dtype(v.dtype)]
    except KeyError:
        return [Problem(tensor_path(si, ti, "view", "dtype"),
                        f"{where}: unknown dtype {v.dtype!r}")]
    out = []
    if v.cell_bytes % item:
        out.append(Problem(tensor_path(si, ti, "view", "cell_bytes"), f"{where}: a {v.dtype} "
                           f"view does not tile its {v.cell_bytes}-byte cells"))
    forms = (t.offset, t.layer_stride, t.block_stride, v.head_stride, v.state_stride)
    if any(f.a % item or f.b % item for f in map(_form, forms)):
        out.append(Problem(tensor_path(si, ti), f"{where}: its offsets and strides are not "
                           f"whole {v.dtype} elements"))
    unpadded = v.heads * v.states * v.cell_bytes
    if v.page_padded is not None and v.page_padded < unpadded:
        out.append(Problem(tensor_path(si, ti, "view", "page_padded"), f"{where}: a padded "
                           f"page of {v.page_padded} bytes under its {unpadded} bytes of cells"))
    want = expected_strides(order, t, blocks)
    if want is None or (want[DIM_H], want[DIM_N]) != (_form(v.head_stride),
                                                      _form(v.state_stride)):
        shown = "none" if want is None else f"H {want[DIM_H]}, N {want[DIM_N]}"
        out.append(Problem(tensor_path(si, ti, "view"), f"{where}: strides H "
                           f"{_form(v.head_stride)}, N {_form(v.state_stride)} are not those of "
                           f"axis order {order.name} ({shown})"))
    return out


def _accounting(body: Layout) -> list[Problem]:
    out = []
    if not body.stages:
        return [Problem(("body", "stages"), "the artifact has no stage")]
    # a group's figures are those of a block on stage 0 (the planner's accounting):
    # of the stage-0 pool that lists it, else the stage-0 main pool, else its own
    pool_of = {gid: p for st in reversed(body.stages) for p in st.pools for gid in p.groups}
    first = body.stages[0].pools
    main = next((p for p in first if p.name == "device"), None)
    pool_of.update({gid: p for p in first for gid in p.groups})
    for g in body.groups:
        pool = pool_of.get(g.id)
        if main is not None and all(g.id not in p.groups for p in first):
            pool = main
        if g.own_pool or pool is None:
            continue
        per_block = pool.bytes_per_block  # the block of the pool the group draws from
        if g.padding_bytes_per_block < 0 or \
                g.useful_bytes_per_block + g.padding_bytes_per_block != per_block:
            out.append(Problem(("body", "groups", g.id, "padding_bytes_per_block"),
                               f"group {g.id}: useful {g.useful_bytes_per_block} + padding "
                               f"{g.padding_bytes_per_block} != {per_block} allocated"))
    return out


def _differs(record: dict[str, Any], made: dict[str, Any], path: Path
             ) -> tuple[Path, Any, Any] | None:
    """The first field where a spec as written and as its fields make it differ."""
    for key, value in record.items():
        if isinstance(value, dict) and isinstance(made.get(key), dict):
            for name in value:
                inner = _differs(value[name], made[key].get(name, {}), (*path, key, name))
                if inner is not None:
                    return inner
        elif made.get(key) != value:
            return (*path, key), value, made.get(key)
    return None


def _specs(body: Layout) -> list[Problem]:
    """Each spec is what the model makes of its own fields (its page size from its
    kind, heads, head size, block size and dtype), once per spec; each group's page
    size is its spec's."""
    out = []
    for i, spec in enumerate(body.specs):
        where: Path = ("body", "specs", i)
        record = msgspec.to_builtins(spec)
        try:
            spec_ = kinds.spec_from_dict(record)
            made = kinds.describe(spec_)
            unpadded = getattr(spec_, "unpadded_page_size_bytes", 0)
        except Exception as exc:  # noqa: BLE001 - whatever a malformed spec raises
            out.append(Problem(where, f"spec {i} is not one its kind makes: "
                               f"{type(exc).__name__}: {exc}"))
            continue
        diff = _differs(record, made, where)
        if diff is None and unpadded > spec_.page_size_bytes:
            out.append(Problem((*where, "page_size_padded"), f"spec {i}: a padded page of "
                               f"{spec_.page_size_bytes} bytes under the {unpadded} bytes "
                               "its kind, heads, head size, shapes and dtypes give"))
        if diff is not None:
            path, written, given = diff
            out.append(Problem(path, f"spec {i}: {path[-1]} {written!r}, where its kind, "
                               f"heads, head size, block size and dtype give {given!r}"))
    for g in body.groups:
        if g.spec < len(body.specs) and \
                g.page_size_bytes != body.specs[g.spec].page_size_bytes:
            out.append(Problem(("body", "groups", g.id, "page_size_bytes"),
                               f"group {g.id}: page_size_bytes {g.page_size_bytes}, its spec "
                               f"{g.spec}'s {body.specs[g.spec].page_size_bytes}"))
    return out


def shape_problems(body: Layout) -> list[Problem]:
    """Violations that do not depend on the block count (empty: none)."""
    try:
        order = AxisOrder.parse(body.engine.axis_order)
    except KeyError:
        return [Problem(("body", "engine", "axis_order"),
                        f"unknown axis order {body.engine.axis_order!r}")]
    out = _groups(body)
    if not out:
        out += _specs(body)
    for si, st in enumerate(body.stages):
        if st.index != si:
            out.append(Problem(("body", "stages", si, "index"),
                               f"stage {si} says it is stage {st.index}"))
        out += _placement(body, si, st)
        out += _pools(si, st, len(body.groups))
        pools = {p.name: p for p in st.pools}
        for ti, t in enumerate(st.tensors):
            if not t.layers:
                out.append(Problem(tensor_path(si, ti, "layers"),
                                   f"stage {si}: a tensor without layers"))
            elif t.pool in pools:
                out += _view(order, si, ti, t, pools[t.pool].num_blocks)
        if len(out) >= LIMIT:
            break
    return (out + _accounting(body))[:LIMIT]


