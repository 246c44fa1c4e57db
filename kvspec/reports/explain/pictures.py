"""Pictures of a report: one block as text (:func:`ascii_block`), and the
geometry of the HTML report's SVGs (:func:`block_picture`; the capacity chart,
:func:`capacity_chart`, is :mod:`.chart`'s); the HTML template draws them.

>>> from kvspec.reports.explain.report import explain
>>> rep = explain("layouts/llama-3.1-8b.yaml")
>>> ascii_block(rep, width=8)
[('group 0', '########')]
>>> pic = block_picture(rep)
>>> pic["width"], len(pic["rows"]), len(pic["ticks"]) > 1
(1000, 1, True)
"""

from __future__ import annotations

import bisect
import re
import textwrap
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from kvspec.reports.explain.chart import capacity_chart  # the chart, re-exported
from kvspec.reports.explain.report import GroupRow, Report
from kvspec.reports.format import human_bytes, short_bytes

__all__ = ["TICK_FONT", "TICK_GAP", "ascii_block", "block_picture", "capacity_chart",
           "text_width"]

_NUMBER = re.compile(r"^(.*?)(\d+)(.*)$")


# ---------------------------------------------------------------------------
# one block, as text
# ---------------------------------------------------------------------------


def ascii_block(report: Report, width: int = 56) -> list[tuple[str, str]]:
    """One block as a row of characters per group: ``#`` state, ``+`` page
    padding, ``.`` an empty slot, ``_`` alignment; the same column is the same bytes."""
    bm = report.block
    per = bm.bytes_per_block or 1
    rows = []
    for g in report.groups:
        if g.own_pool:
            continue
        segs = bm.of(g.id)
        starts = [s.start for s in segs]
        cells = []
        for i in range(width):
            mid = (per * i / width + per * (i + 1) / width) / 2
            ch = "_" if mid >= bm.used else "."
            # the page holding ``mid``: the last one starting at or before it (pages of
            # one group do not overlap)
            k = bisect.bisect_right(starts, mid) - 1
            if k >= 0 and segs[k].start <= mid < segs[k].end:
                ch = "#" if mid < segs[k].start + segs[k].useful else "+"
            cells.append(ch)
        rows.append((f"group {g.id}", "".join(cells)))
    return rows


# ---------------------------------------------------------------------------
# one block, as rectangles
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Frame:
    """The block picture's geometry: byte ``0`` to ``per_block`` over the bar.

    Wide (a laptop's window): each row's label left of its bar. Narrow (a phone's):
    the label above its bar, which takes the whole width. ``prefix`` keeps the SVG's
    pattern ids apart from another picture's in the same page."""

    width: int
    per_block: int
    narrow: bool = False
    prefix: str = ""
    row_h: int = 30
    gap: int = 8
    top: int = 40

    @property
    def label_w(self) -> int:
        return 8 if self.narrow else 170

    @property
    def label_h(self) -> int:
        """Room above a row's bar for its label (narrow only)."""
        return 18 if self.narrow else 0

    @property
    def bar_w(self) -> int:
        return self.width - self.label_w - (8 if self.narrow else 16)

    def x(self, byte: float) -> float:
        return round(self.label_w + byte * self.scale, 2)

    @cached_property
    def scale(self) -> float:
        """Pixels per byte."""
        return self.bar_w / self.per_block

    def url(self, name: str) -> str:
        return f"url(#{self.prefix}{name})"

    def rect(self, x0: float, x1: float, y: float, fill: str, title: str, text: str = ""
             ) -> dict[str, Any]:
        return {"x": x0, "y": y, "w": round(max(x1 - x0, 0.6), 2), "h": self.row_h,
                "fill": fill, "title": title, "text": text}


#: Pages narrower than this (px) are drawn together, one rectangle per run of them.
_THIN = 1.5


class _Runs:
    """Rectangles of one row, in x order: a run of adjacent thin ones of one fill is
    drawn as one (a block of thousands of slots draws in a few rectangles, not one per
    page). A rectangle's title is made only when it is drawn."""

    def __init__(self, f: _Frame, y: float) -> None:
        self.f, self.y = f, y
        self.out: list[dict[str, Any]] = []
        self._run: list[Any] | None = None   # [x0, x1, fill, title(), count, text]

    def add(self, x0: float, x1: float, fill: str, title: Any, text: str = "") -> None:
        run = self._run
        if (run is not None and fill == run[2] and x1 - x0 < _THIN and abs(run[1] - x0) < 0.7
                and run[1] - run[0] < _THIN * run[4]):
            run[1], run[4], run[5] = x1, run[4] + 1, ""
            return
        self.flush()
        self._run = [x0, x1, fill, title, 1, text]

    def flush(self) -> None:
        if self._run is None:
            return
        x0, x1, fill, title, count, text = self._run
        more = f" and {count - 1} more like it" if count > 1 else ""
        self.out.append(self.f.rect(x0, x1, self.y, fill, title() + more, text))
        self._run = None


def _group_rects(report: Report, f: _Frame, g: GroupRow, y: float) -> list[dict[str, Any]]:
    """One main-pool group's row: empty slots, its pages, the alignment tail."""
    bm = report.block
    x = f.x
    # what the group leaves empty shows through its pages
    empty = _Runs(f, y)
    for s, e in bm.slots:
        empty.add(x(s), x(e), f.url("empty"),
                  lambda s=s, e=e: f"group {g.id}: empty slot, {human_bytes(e - s)}")
    empty.flush()
    pages = _Runs(f, y)
    padding = f.url(f"pp{g.id}")
    for seg in bm.of(g.id):
        mid = seg.start + seg.useful
        x0, xm = x(seg.start), x(mid)
        num = _NUMBER.match(seg.layer) if xm - x0 >= 18 else None
        pages.add(x0, xm, g.color, lambda seg=seg: f"{seg.layer}: {human_bytes(seg.useful)} "
                  f"of state at byte {seg.start:,} of the block", num.group(2) if num else "")
        if seg.page > seg.useful:
            pages.add(xm, x(seg.end), padding, lambda seg=seg: f"{seg.layer}: "
                      f"{human_bytes(seg.page - seg.useful)} of page padding")
    pages.flush()
    rects = empty.out + pages.out
    if bm.used < f.per_block:
        rects.append(f.rect(x(bm.used), x(f.per_block), y, f.url("align"),
                            f"alignment: {human_bytes(f.per_block - bm.used)} no group uses"))
    return rects


def _row(f: _Frame, y: float, label: str, sub: str, color: str) -> dict[str, Any]:
    """A row's label: left of its bar (wide), or above it on one line (narrow)."""
    if f.narrow:
        sub_x = 20 + text_width(label, 12.5)
        return {"y": y, "h": f.row_h, "label": label, "sub": sub, "color": color,
                "swatch": {"x": 8, "y": y - f.label_h + 3, "w": 8, "h": 10},
                "label_xy": (20, y - 6), "sub_xy": (round(sub_x, 1), y - 6)}
    return {"y": y, "h": f.row_h, "label": label, "sub": sub, "color": color,
            "swatch": {"x": 4, "y": y + 6, "w": 6, "h": f.row_h - 12},
            "label_xy": (16, y + 13), "sub_xy": (16, y + 26)}


def _main_rows(report: Report, f: _Frame) -> tuple[list[dict], list[dict], float]:
    """The rows of the main-pool groups, their rectangles, and the next free y."""
    rows: list[dict[str, Any]] = []
    rects: list[dict[str, Any]] = []
    y: float = f.top + f.label_h
    for g in report.groups:
        if g.own_pool:
            continue
        rows.append(_row(f, y, f"group {g.id}", g.kind, g.color))
        rects += _group_rects(report, f, g, y)
        y += f.row_h + f.gap + f.label_h
    return rows, rects, y - f.label_h


#: How many slot boundaries at most are measured for the ruler's spacing.
_SAMPLE = 512
#: The ruler's font size, and the least gap between two of its labels.
TICK_FONT, TICK_GAP = 11, 8
#: Advance widths in em, rounded up over the sans-serif fonts a browser picks for
#: the SVG (DejaVu Sans, the widest, Liberation Sans/Arial, Helvetica, Segoe UI).
_EM = {**dict.fromkeys("0123456789", 0.64), ".": 0.32, " ": 0.32, "B": 0.69, "i": 0.28,
       "K": 0.66, "M": 0.87, "G": 0.78, "T": 0.62}


def text_width(text: str, size: float = TICK_FONT) -> float:
    """How wide ``text`` draws at ``size`` px, at most (unknown characters 1 em).

    >>> text_width("2.06 MiB")
    48.4
    """
    return round(sum(_EM.get(c, 1.0) for c in text) * size, 1)


def _tick(x: float, b: int, anchor: str) -> dict[str, Any]:
    text = short_bytes(b) if b else "0"
    w = text_width(text)
    left = {"start": x, "middle": x - w / 2, "end": x - w}[anchor]
    return {"x": x, "text": text, "anchor": anchor, "left": round(left, 1),
            "right": round(left + w, 1)}


def _marks_and_ticks(report: Report, f: _Frame, bottom: float, rows: list[dict]
                     ) -> tuple[list[dict], list[dict]]:
    """Dashed lines at every slot boundary; byte labels where they do not crowd.

    The first (``0``) and last (the block's size) boundaries are always
    labelled. Between them a boundary is labelled when it lies at least the
    widest label plus ``TICK_GAP`` past the last one labelled (so regular slots
    get evenly spaced labels) and its label, as wide as :func:`text_width` says,
    keeps ``TICK_GAP`` from both neighbours.
    """
    bm, x, per_block = report.block, f.x, f.per_block
    bounds = sorted({s for s, _ in bm.slots} | {e for _, e in bm.slots} | {0, per_block})
    lines = [x(b) for b in bounds]
    lines = [v for i, v in enumerate(lines) if i == 0 or v - lines[i - 1] >= 2 or
             i == len(lines) - 1]   # a mark every 2 px at most
    spans = [(f.top - 6, bottom + 6)] if not f.narrow else [
        (r["y"] - 3, r["y"] + f.row_h + 3) for r in rows]
    marks = [{"x": v, "y1": y1, "y2": y2} for y1, y2 in spans for v in lines]
    first, last = _tick(x(0), 0, "start"), _tick(x(per_block), per_block, "end")
    inner = bounds[1:-1]
    # the widest label sets the spacing; past _SAMPLE boundaries, a sample of them
    # (a block of thousands of slots gets a dozen labels whichever are measured)
    sample = inner if len(inner) <= _SAMPLE else inner[:: len(inner) // _SAMPLE] + inner[-1:]
    step = max((_tick(0, b, "middle")["right"] * 2 for b in sample), default=0) + TICK_GAP
    ticks = [first]
    for b in inner:
        if x(b) - ticks[-1]["x"] < step:
            continue
        t = _tick(x(b), b, "middle")
        if t["left"] >= ticks[-1]["right"] + TICK_GAP and t["right"] + TICK_GAP <= last["left"]:
            ticks.append(t)
    return marks, ticks + [last]


def _own_rows(report: Report, f: _Frame, y: float) -> tuple[list[dict], float | None, float]:
    """Own-pool groups below the block, one page each on the same byte scale."""
    own = [g for g in report.groups if g.own_pool]
    if not own:
        return [], None, y
    title_y = y + 14
    y += 24
    rows = []
    for g in own:
        page, useful = g.pages[0] if g.pages else (0, 0)
        w = f.bar_w * min(1.0, page / f.per_block) if page else 0
        uw = w * useful / page if page else 0
        y += f.label_h
        rows.append({**_row(f, y, f"group {g.id}", g.kind, g.color), "id": g.id,
                     "x": f.label_w, "w": round(w, 2), "uw": round(uw, 2),
                     "title": f"{', '.join(g.layers)}: one page of {human_bytes(page)} "
                              "per block of its own pool"})
        y += f.row_h + f.gap
    return rows, title_y, y


def _legend(report: Report, f: _Frame, y: float) -> tuple[list[dict], float]:
    """The legend's items laid out in three columns, and the picture's height."""
    bm = report.block
    legend = [{"fill": g.color, "text": f"group {g.id}: {g.kind}, {g.num_layers} layers"}
              for g in report.groups]
    if any(g.padded for g in report.groups):
        legend.append({"fill": f.url("legendpad"), "text": "page padding (hatched in the "
                                                            "group's colour)"})
    if any(bm.waste(g.id).padding_slots for g in report.groups if not g.own_pool):
        legend.append({"fill": f.url("empty"), "text": "empty slot: bytes another group uses"})
    if bm.used < f.per_block:
        legend.append({"fill": f.url("align"), "text": "alignment: no group's bytes"})
    if f.narrow:  # one column, the text wrapped into it
        items, y = [], y + 14
        for item in legend:
            lines = textwrap.wrap(item["text"], int((f.width - 40) / (0.62 * 12))) \
                or [item["text"]]
            items += [{**item, "x": 10, "y": y, "text": lines[0]}]
            items += [{"fill": None, "x": 10, "y": y + 15 * (i + 1), "text": more}
                      for i, more in enumerate(lines[1:])]
            y += 15 * len(lines) + 7
        return items, y
    cols, col_w = 3, (f.width - 20) // 3
    items = [{**item, "x": 10 + (i % cols) * col_w, "y": y + 14 + (i // cols) * 22}
             for i, item in enumerate(legend)]
    return items, y + 14 + ((len(legend) + cols - 1) // cols) * 22 + 6


def block_picture(report: Report, width: int = 1000, *, narrow: bool = False,
                  prefix: str = "") -> dict[str, Any]:
    """Rectangles of one block's memory for the HTML report's SVG.

    A row per group over the same x axis (byte 0 to ``bytes_per_block``), so
    the same column is the same bytes in every row: slots alias across groups.
    Pages are filled in the group's colour (the unpadded part solid, page
    padding hatched in the colour), empty slots hatched grey, alignment dark.
    ``narrow`` lays it out for a phone (labels above the bars, a one-column
    legend); ``prefix`` starts its pattern ids.
    """
    f = _Frame(width, report.block.bytes_per_block or 1, narrow, prefix)
    rows, rects, y = _main_rows(report, f)
    bottom = y - f.gap
    marks, ticks = _marks_and_ticks(report, f, bottom, rows)
    own_rows, own_title_y, y = _own_rows(report, f, y)
    items, height = _legend(report, f, y)
    return {"width": width, "height": height, "rows": rows, "rects": rects, "marks": marks,
            "ticks": ticks, "own": own_rows, "own_title_y": own_title_y, "legend": items,
            "label_w": f.label_w, "bar_w": f.bar_w, "top": f.top, "bottom": bottom,
            "tick_font": TICK_FONT, "narrow": narrow, "prefix": prefix,
            "own_title": "a pool of its own (same byte scale):" if narrow else
            "a pool of its own (one page per block of that pool, same byte scale):",
            "bars": [{"y": r["y"], "h": f.row_h} for r in rows] if narrow else
            [{"y": f.top, "h": bottom - f.top}],
            "groups": [{"id": g.id, "color": g.color} for g in report.groups]}
