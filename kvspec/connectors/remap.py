"""The bytes of one layer's page on one side that hold what another layout's page holds.

A page is ``(H, N, C)`` cells at ``offset + h * head_stride + n * state_stride`` (a
:class:`~kvspec.connectors.descriptor.Layer`). Moving ``heads`` heads and ``states``
states from one page to another is a strided copy of ``heads x states`` cells of ``C``
bytes; :func:`page_runs` finds its fewest contiguous runs by folding an axis into the
run while its stride continues the run on *both* sides (the cell first, then whichever
of N and H continues it, again), and lists the runs of the axes left::

    LBNHC -> LBNHC   whole page: H folds (stride C), then N (stride H*C)    1 run
    LBNHC -> LBHNC   N is H*C apart on one side, C on the other: no fold    H*N runs of C
    TP 2 -> 1        2 of 4 heads: H folds, N does not (4*C apart there)    N runs of 2*C

A run is ``(source offset, destination offset, length)`` from the pages' starts; the
folding depends on the strides and counts only, so it is computed once per geometry
(:func:`relative_runs`, cached) and shifted per layer.

>>> relative_runs((256, 32), (32, 64), 32, 2, 3)   # 2 heads, 3 states: (H, N) vs (N, H)
(32, ((0, 0), (32, 64), (64, 128), (256, 32), (288, 96), (320, 160)))
>>> relative_runs((32, 64), (32, 128), 32, 2, 3)   # 2 of 2 heads into 2 of 4: H folds
(64, ((0, 0), (64, 128), (128, 256)))
>>> page_runs(0, (32, 256), 1000, (32, 64), 32, 2, 4)[:2]
[(0, 1000, 64), (256, 1064, 64)]
"""

from __future__ import annotations

from functools import lru_cache

__all__ = ["merge", "page_runs", "relative_runs"]

#: ``(head stride, state stride)`` of a page, in bytes.
Strides = tuple[int, int]


@lru_cache(maxsize=4096)
def relative_runs(src: Strides, dst: Strides, cell: int, heads: int, states: int
                  ) -> tuple[int, tuple[tuple[int, int], ...]]:
    """``(run length, ((src_offset, dst_offset), ...))``, cached: the runs moving
    ``heads x states`` cells of ``cell`` bytes between pages of strides ``src`` and
    ``dst`` (offsets from the first cell)."""
    dims = [(count, s, d) for count, s, d in ((heads, src[0], dst[0]), (states, src[1], dst[1]))
            if count > 1]
    run, folded = cell, True
    while folded:
        folded = False
        for dim in dims:
            count, s, d = dim
            if s == run and d == run:  # the next cell of this axis continues the run
                run *= count
                dims.remove(dim)
                folded = True
                break
    starts = [(0, 0)]
    for count, s, d in dims:
        starts = [(a + i * s, b + i * d) for a, b in starts for i in range(count)]
    return run, tuple(starts)


def page_runs(src_offset: int, src: Strides, dst_offset: int, dst: Strides, cell: int,
              heads: int, states: int) -> list[tuple[int, int, int]]:
    """``(src, dst, length)`` runs moving ``heads x states`` cells starting at byte
    ``src_offset`` of one side and ``dst_offset`` of the other."""
    length, starts = relative_runs(src, dst, cell, heads, states)
    return [(src_offset + a, dst_offset + b, length) for a, b in starts]


def merge(runs: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """Plan runs (:class:`~kvspec.connectors.plan.Run` fields) sorted, each merged with
    the next where it continues on both sides with the same regions and strides.

    >>> merge([(0, 64, 128, 0, 0, 256, 64, 0, 0), (0, 0, 128, 0, 192, 256, 64, 0, 0)])
    [(0, 0, 128, 0, 192, 256, 64, 0, 0), (0, 64, 128, 0, 0, 256, 64, 0, 0)]
    >>> merge([(0, 0, 128, 0, 0, 256, 64, 0, 0), (0, 64, 128, 0, 64, 256, 64, 0, 0)])
    [(0, 0, 128, 0, 0, 256, 128, 0, 0)]
    """
    def key(r: tuple[int, ...]) -> tuple[int, ...]:
        # region, strides and sub-strides of both sides, then the source offset
        return (r[0], r[2], r[3], r[5], r[7], r[8], r[1])

    out: list[tuple[int, ...]] = []
    for run in sorted(runs, key=key):
        last = out[-1] if out else None
        if last is not None and key(last)[:-1] == key(run)[:-1] \
                and last[1] + last[6] == run[1] and last[4] + last[6] == run[4]:
            out[-1] = (*last[:6], last[6] + run[6], *last[7:])
        else:
            out.append(run)
    return out
