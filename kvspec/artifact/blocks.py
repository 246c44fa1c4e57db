"""The block-id proof: no two block ids of a pool share a byte, for a block count.

A page's bytes in block ``b`` are runs at ``start + b * d`` (``d`` the block
stride). Cut the pool into rows of ``d`` bytes: a run of block ``b`` lies at a
fixed *phase* (its offset within a row) in row ``label + b``. Two runs share a
byte only where their phases overlap and their rows meet, and they are then
the same block id exactly when their labels are equal. So every run is a
rectangle (phase interval x row interval) and the proof is a sweep over the
rectangles: ``O(R log R)`` for ``R`` runs, whatever the block count (one run
per page in block-compact axis orders, one per head slot where heads lie
outside blocks). Within one block id, two layers may share bytes only when they
are in different groups (slot aliasing), never two of one group or a
drafter's layer.

>>> import kvspec
>>> memory_problems(kvspec.compile("layouts/jamba-v0.1.yaml").body, 0, 5000)
[]
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from kvspec.artifact.format import Layout, Pool, Stage, Tensor, View, at
from kvspec.artifact.structure import LIMIT, Path, Problem, tensor_path
from kvspec.model.geometry import page_runs

__all__ = ["allocation_blocks", "memory_problems", "pool_blocks", "stage_counts",
           "tensor_runs"]


def pool_blocks(pool: Pool, num_blocks: int) -> int:
    """Blocks of ``pool`` when the stage's main pools have ``num_blocks``."""
    return pool.num_blocks if pool.num_blocks is not None else num_blocks


def stage_counts(st: Stage, num_blocks: int | Mapping[str, int]) -> dict[str, int]:
    """Each pool's block count: ``num_blocks`` for every pool sized from the budget
    (one count: the unified policy's main pool), or the counts given, with the
    fixed pools' own."""
    if isinstance(num_blocks, int):
        return {p.name: pool_blocks(p, num_blocks) for p in st.pools}
    return {p.name: p.num_blocks if p.num_blocks is not None else num_blocks[p.name]
            for p in st.pools}


def allocation_blocks(st: Stage, counts: Mapping[str, int]) -> dict[str, int]:
    """The block count ``N`` each allocation's affine quantities are in: that of
    the pool it scales with (0 when it does not scale)."""
    return {a.name: counts.get(a.scales_with, 0) if a.scales_with else 0
            for a in st.allocations}


def tensor_runs(t: Tensor, num_blocks: int) -> tuple[list[int], int, int, int]:
    """``(run offsets, run length, layer stride, block stride)`` in bytes of
    ``t``'s pages at ``num_blocks``: a page of layer ``l``, block ``b`` is the
    runs at ``offset + l * layer_stride + b * block_stride + run offset``
    (:func:`kvspec.model.geometry.page_runs`)."""
    v: View = t.view
    sh, sn = at(v.head_stride, num_blocks), at(v.state_stride, num_blocks)
    offsets, run = page_runs(v.cell_bytes, ((sn, v.states), (sh, v.heads)))
    return offsets, run, at(t.layer_stride, num_blocks), at(t.block_stride, num_blocks)




@dataclass(slots=True)
class _Rect:
    """One run of one layer's page over all its blocks: phases ``[p0, p1)`` of
    rows ``[r0, r1)``; block id ``row - label``; ``where``: its tensor."""

    p0: int
    p1: int
    r0: int
    r1: int
    label: int
    layer: str
    group: int
    where: Path


#: A run of a page in block 0: (start, length, layer, group, its tensor's path).
Run = tuple[int, int, str, int, Path]


def _rects(runs: Sequence[Run], d: int, n: int) -> Iterator[_Rect]:
    """Rectangles of ``runs`` over ``n`` blocks ``d`` bytes apart; a run that
    crosses a row boundary is two."""
    for start, length, layer, group, where in runs:
        row, phase = divmod(start, d)
        end = phase + length
        yield _Rect(phase, min(end, d), row, row + n, row, layer, group, where)
        if end > d:  # the rest lies at the start of the next row
            yield _Rect(0, end - d, row + 1, row + 1 + n, row, layer, group, where)


def _clash(a: _Rect, b: _Rect, draft: frozenset[str]) -> Problem | None:
    """What is wrong when ``a`` and ``b`` share a byte (None: aliasing, allowed)."""
    if a.label != b.label:
        row = max(a.r0, b.r0)
        message = (f"block ids {row - a.label} and {row - b.label} share bytes "
                   f"(layers {a.layer} and {b.layer})")
    elif a.layer == b.layer:
        message = f"layer {a.layer}: two parts of one page overlap"
    elif a.group == b.group:
        message = f"layers {a.layer} and {b.layer} of group {a.group} share bytes"
    elif a.layer in draft or b.layer in draft:
        message = f"drafter layer {a.layer if a.layer in draft else b.layer} shares bytes"
    else:
        return None
    return Problem(b.where, message)


def _sweep_rows(rects: list[_Rect], draft: frozenset[str], out: list[Problem]) -> None:
    """Clashes among rectangles whose phases all overlap: a sweep over rows."""
    rects.sort(key=lambda r: (r.r0, r.label))
    open_: list[_Rect] = []
    for r in rects:
        open_ = [o for o in open_ if o.r1 > r.r0]
        for o in open_:
            problem = _clash(o, r, draft)
            if problem:
                out.append(problem)
                if len(out) >= LIMIT:
                    return
        open_.append(r)


def _same_stride(rects: list[_Rect], draft: frozenset[str], out: list[Problem]) -> None:
    """Clashes among the rectangles of runs that share one block stride: per phase
    interval, then between phase intervals that overlap."""
    buckets: dict[tuple[int, int], list[_Rect]] = defaultdict(list)
    for r in rects:
        buckets[r.p0, r.p1].append(r)
    spans = sorted(buckets)
    for i, span in enumerate(spans):
        _sweep_rows(list(buckets[span]), draft, out)
        for other in spans[i + 1:]:
            if other[0] >= span[1] or len(out) >= LIMIT:
                break
            found: list[Problem] = []
            _sweep_rows(buckets[span] + buckets[other], draft, found)
            out += [p for p in found if p not in out]  # inside one bucket: reported above


@dataclass(slots=True)
class _Geometry:
    """One tensor's pages at a block count: layer ``l``'s page of block ``b`` is the
    runs at ``offset + l * layer_stride + b * block_stride + run``."""

    index: int
    tensor: Tensor
    runs: list[int]
    run: int
    layer_stride: int
    block_stride: int
    offset: int
    blocks: int

    @property
    def width(self) -> int:
        """Bytes from a layer's first to one past its last, over all its blocks."""
        return max(self.runs) + self.run + (self.blocks - 1) * self.block_stride - min(self.runs)

    def hull(self) -> tuple[int, int]:
        last = self.offset + (len(self.tensor.layers) - 1) * self.layer_stride
        return self.offset + min(self.runs), last + min(self.runs) + self.width

    @property
    def compact(self) -> bool:
        """Layers one after another, none reaching into the next (layer-compact
        axis orders): then no two layers of the tensor can meet."""
        return len(self.tensor.layers) == 1 or self.layer_stride >= self.width

    def key(self) -> tuple[int, ...]:
        """Equal for tensors whose layer ``l`` lies on the same bytes, block for
        block (slot aliasing across groups)."""
        return (self.offset, self.layer_stride, self.block_stride, self.run, self.blocks,
                *self.runs)

    def layer_runs(self, si: int, slots: range) -> list[Run]:
        t, where = self.tensor, tensor_path(si, self.index)
        return [(self.offset + slot * self.layer_stride + r, self.run, t.layers[slot], t.group,
                 where) for slot in slots for r in self.runs]


def _geometries(si: int, st: Stage, pool: Pool, num_blocks: int, blocks: int, limit: int,
                out: list[Problem]) -> list[_Geometry]:
    """The pool's tensors, ``num_blocks`` the ``N`` of its allocation; a tensor
    whose views leave the pool (``[pool offset, + blocks * per block)``) is
    reported instead."""
    base = at(pool.offset, num_blocks)
    end = base + blocks * pool.bytes_per_block
    found = []
    for ti, t in enumerate(st.tensors):
        if t.pool != pool.name:
            continue
        runs, run, ls, d = tensor_runs(t, num_blocks)
        g = _Geometry(ti, t, runs, run, ls, d, at(t.offset, num_blocks), blocks)
        lo, hi = g.hull()
        if lo < base or hi > end or hi > limit:
            out.append(Problem(tensor_path(si, ti), f"stage {si}: layer {t.layers[0]}'s tensor "
                               f"spans bytes [{lo}, {hi}), outside pool {pool.name} "
                               f"[{base}, {end}) at {blocks} blocks"))
        elif d <= 0 and blocks > 1:
            out.append(Problem(tensor_path(si, ti, "block_stride"),
                               f"stage {si}: layer {t.layers[0]} has block stride {d}"))
        elif ls < 0 or (ls == 0 and len(t.layers) > 1 and blocks > 0):
            out.append(Problem(tensor_path(si, ti, "layer_stride"), f"stage {si}: layers "
                               f"{t.layers[0]} and {t.layers[1]} of one tensor start together"))
        else:
            found.append(g)
    return found


def _aliases(si: int, alike: list[_Geometry], draft: frozenset[str], out: list[Problem]) -> None:
    """Tensors on the same bytes block for block: allowed for different groups
    (slot aliasing), never two of one group or a drafter's layer."""
    groups = [g.tensor.group for g in alike]
    for g in alike[1:]:
        where = tensor_path(si, g.index)
        if groups.count(g.tensor.group) > 1:
            first = next(a for a in alike if a.tensor.group == g.tensor.group)
            out.append(Problem(where, f"layers {first.tensor.layers[0]} and "
                               f"{g.tensor.layers[0]} of group {g.tensor.group} share bytes"))
            return
        if any(n in draft for n in g.tensor.layers) or \
                any(n in draft for n in alike[0].tensor.layers):
            out.append(Problem(where, f"drafter layer {g.tensor.layers[0]} shares bytes"))
            return


def _check_pool(si: int, st: Stage, pool: Pool, num_blocks: int, blocks: int, limit: int,
                out: list[Problem]) -> None:
    """The block-id property in one pool. Compact tensors on bytes of their own
    are proved whole (their layers cannot meet: one layer's pages suffice); tensors
    on the same bytes block for block are aliases; the rest, where tensors
    interleave (block-outermost orders, packing), page by page with rectangles."""
    draft = frozenset(st.draft_layers)
    found = _geometries(si, st, pool, num_blocks, blocks, limit, out)
    sets: dict[tuple[int, ...], list[_Geometry]] = defaultdict(list)
    for g in found:
        sets[g.key() if g.compact else (-1 - g.index,)].append(g)
    for alike in sets.values():
        if len(alike) > 1:
            _aliases(si, alike, draft, out)
    # one representative per alias set: the one with the most layers
    reps = [max(alike, key=lambda g: len(g.tensor.layers)) for alike in sets.values()]
    hulls = sorted((*g.hull(), i) for i, g in enumerate(reps))
    general: set[int] = set()
    reach: tuple[int, int] | None = None  # (end, index) of the furthest-reaching hull
    for lo, hi, i in hulls:
        if reach is not None and lo < reach[0]:
            general.update((i, reach[1]))
        if reach is None or hi > reach[0]:
            reach = (hi, i)
    runs: dict[int, list[Run]] = defaultdict(list)
    for i, g in enumerate(reps):
        if not g.compact:
            general.add(i)
        slots = range(len(g.tensor.layers)) if i in general else range(1)
        runs[g.block_stride].extend(g.layer_runs(si, slots))
    mixed = _strides_meet([(lo, hi, reps[i].block_stride, reps[i].tensor.layers[0])
                           for lo, hi, i in hulls if i in general])
    if mixed:
        out.append(Problem(("body", "stages", si, "tensors"),
                           f"stage {si}: pool {pool.name}: layers {mixed[0]} and {mixed[1]} "
                           "interleave pages of different block strides, which kvspec never "
                           "plans and this check cannot prove apart"))
        return
    for d, each in runs.items():
        _same_stride(list(_rects(each, d, blocks)), draft, out)


def _pool_regions(si: int, st: Stage, counts: Mapping[str, int], n: Mapping[str, int],
                  sizes: Mapping[str, int]) -> list[Problem]:
    out = []
    here = ("body", "stages", si)
    regions: dict[str, list[tuple[int, int, str, int]]] = defaultdict(list)
    for pi, p in enumerate(st.pools):
        lo = at(p.offset, n.get(p.allocation, 0))
        hi = lo + counts[p.name] * p.bytes_per_block
        if hi > sizes.get(p.allocation, 0):
            out.append(Problem((*here, "pools", pi), f"stage {si}: pool {p.name} ends at byte "
                               f"{hi}, past its allocation {p.allocation} of "
                               f"{sizes.get(p.allocation, 0)} bytes"))
        regions[p.allocation].append((lo, hi, p.name, pi))
    for spans in regions.values():
        spans.sort()
        for (_, hi, a, _), (lo, _, b, pi) in itertools.pairwise(spans):
            if lo < hi:
                out.append(Problem((*here, "pools", pi, "offset"),
                                   f"stage {si}: pools {a} and {b} share bytes"))
    if st.pools and st.bytes_per_block and st.pools[0].bytes_per_block != st.bytes_per_block:
        out.append(Problem((*here, "pools", 0, "bytes_per_block"), f"stage {si}: its main "
                           f"pool's blocks are {st.pools[0].bytes_per_block} bytes, the stage "
                           f"says {st.bytes_per_block}"))
    return out


def memory_problems(body: Layout, stage: int, num_blocks: int | Mapping[str, int]
                    ) -> list[Problem]:
    """Violations on ``stage`` when its budget-sized pools have ``num_blocks`` blocks
    (or each pool the count ``num_blocks`` maps it to); empty: none."""
    st = body.stages[stage]
    counts = stage_counts(st, num_blocks)
    n = allocation_blocks(st, counts)
    sizes = {a.name: at(a.size, n[a.name]) for a in st.allocations}
    out = _pool_regions(stage, st, counts, n, sizes)
    for pool in st.pools:
        _check_pool(stage, st, pool, n.get(pool.allocation, 0), counts[pool.name],
                    sizes.get(pool.allocation, 0), out)
        if len(out) >= LIMIT:
            break
    return out[:LIMIT]


def _strides_meet(hulls: list[tuple[int, int, int, str]]) -> tuple[str, str] | None:
    """Two views of different block strides whose byte ranges meet (the
    rectangle proof covers one stride at a time), or None."""
    hulls.sort()
    reach: tuple[int, int, str] | None = None  # the furthest-reaching view so far
    for lo, hi, d, name in hulls:
        if reach is not None and lo < reach[0] and d != reach[1]:
            return reach[2], name
        if reach is None or hi > reach[0]:
            reach = (hi, d, name)
    return None
