"""Pictures of a report: one block as text (:func:`ascii_block`), and the
geometry of the HTML report's SVGs (:func:`block_picture`,
:func:`capacity_chart`); the HTML template draws them.

>>> from kvspec.reports.explain.report import explain
>>> rep = explain("layouts/llama-3.1-8b.yaml")
>>> ascii_block(rep, width=8)
[('group 0', '########')]
>>> pic = block_picture(rep)
>>> pic["width"], len(pic["rows"]), len(pic["ticks"]) > 1
(1000, 1, True)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

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
        cells = []
        for i in range(width):
            mid = (per * i / width + per * (i + 1) / width) / 2
            ch = "_" if mid >= bm.used else "."
            for seg in bm.of(g.id):
                if seg.start <= mid < seg.end:
                    ch = "#" if mid < seg.start + seg.useful else "+"
                    break
            cells.append(ch)
        rows.append((f"group {g.id}", "".join(cells)))
    return rows


# ---------------------------------------------------------------------------
# one block, as rectangles
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Frame:
    """The block picture's geometry: byte ``0`` to ``per_block`` over the bar."""

    width: int
    per_block: int
    label_w: int = 170
    row_h: int = 30
    gap: int = 8
    top: int = 40

    @property
    def bar_w(self) -> int:
        return self.width - self.label_w - 16

    def x(self, byte: float) -> float:
        return round(self.label_w + byte * self.bar_w / self.per_block, 2)

    def rect(self, x0: float, x1: float, y: float, fill: str, title: str, text: str = ""
             ) -> dict[str, Any]:
        return {"x": x0, "y": y, "w": round(max(x1 - x0, 0.6), 2), "h": self.row_h,
                "fill": fill, "title": title, "text": text}


def _group_rects(report: Report, f: _Frame, g: GroupRow, y: float) -> list[dict[str, Any]]:
    """One main-pool group's row: empty slots, its pages, the alignment tail."""
    bm = report.block
    x = f.x
    # what the group leaves empty shows through its pages
    rects = [f.rect(x(s), x(e), y, "url(#empty)",
                    f"group {g.id}: empty slot, {human_bytes(e - s)}") for s, e in bm.slots]
    for seg in bm.of(g.id):
        mid = seg.start + seg.useful
        num = _NUMBER.match(seg.layer)
        label = num.group(2) if num and x(mid) - x(seg.start) >= 18 else ""
        rects.append(f.rect(x(seg.start), x(mid), y, g.color,
                            f"{seg.layer}: {human_bytes(seg.useful)} of state at byte "
                            f"{seg.start:,} of the block", label))
        if seg.page > seg.useful:
            rects.append(f.rect(x(mid), x(seg.end), y, f"url(#pp{g.id})",
                                f"{seg.layer}: {human_bytes(seg.page - seg.useful)} of "
                                "page padding"))
    if bm.used < f.per_block:
        rects.append(f.rect(x(bm.used), x(f.per_block), y, "url(#align)",
                            f"alignment: {human_bytes(f.per_block - bm.used)} no group uses"))
    return rects


def _main_rows(report: Report, f: _Frame) -> tuple[list[dict], list[dict], float]:
    """The rows of the main-pool groups, their rectangles, and the next free y."""
    rows: list[dict[str, Any]] = []
    rects: list[dict[str, Any]] = []
    y: float = f.top
    for g in report.groups:
        if g.own_pool:
            continue
        rows.append({"y": y, "h": f.row_h, "label": f"group {g.id}", "sub": g.kind,
                     "color": g.color})
        rects += _group_rects(report, f, g, y)
        y += f.row_h + f.gap
    return rows, rects, y


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


def _marks_and_ticks(report: Report, f: _Frame, bottom: float
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
    marks = [{"x": x(b), "y1": f.top - 6, "y2": bottom + 6} for b in bounds]
    first, last = _tick(x(0), 0, "start"), _tick(x(per_block), per_block, "end")
    inner = [_tick(x(b), b, "middle") for b in bounds[1:-1]]
    step = max((t["right"] - t["left"] for t in inner), default=0) + TICK_GAP
    ticks = [first]
    for t in inner:
        if (t["x"] - ticks[-1]["x"] >= step and t["left"] >= ticks[-1]["right"] + TICK_GAP
                and t["right"] + TICK_GAP <= last["left"]):
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
        rows.append({"id": g.id, "y": y, "h": f.row_h, "label": f"group {g.id}",
                     "sub": g.kind, "color": g.color, "x": f.label_w, "w": round(w, 2),
                     "uw": round(uw, 2),
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
        legend.append({"fill": "url(#legendpad)", "text": "page padding (hatched in the "
                                                          "group's colour)"})
    if any(bm.waste(g.id).padding_slots for g in report.groups if not g.own_pool):
        legend.append({"fill": "url(#empty)", "text": "empty slot: bytes another group uses"})
    if bm.used < f.per_block:
        legend.append({"fill": "url(#align)", "text": "alignment: no group's bytes"})
    cols, col_w = 3, (f.width - 20) // 3
    items = [{**item, "x": 10 + (i % cols) * col_w, "y": y + 14 + (i // cols) * 22}
             for i, item in enumerate(legend)]
    return items, y + 14 + ((len(legend) + cols - 1) // cols) * 22 + 6


def block_picture(report: Report, width: int = 1000) -> dict[str, Any]:
    """Rectangles of one block's memory for the HTML report's SVG.

    A row per group over the same x axis (byte 0 to ``bytes_per_block``), so
    the same column is the same bytes in every row: slots alias across groups.
    Pages are filled in the group's colour (the unpadded part solid, page
    padding hatched in the colour), empty slots hatched grey, alignment dark.
    """
    f = _Frame(width, report.block.bytes_per_block or 1)
    rows, rects, y = _main_rows(report, f)
    bottom = y - f.gap
    marks, ticks = _marks_and_ticks(report, f, bottom)
    own_rows, own_title_y, y = _own_rows(report, f, y)
    items, height = _legend(report, f, y)
    return {"width": width, "height": height, "rows": rows, "rects": rects, "marks": marks,
            "ticks": ticks, "own": own_rows, "own_title_y": own_title_y, "legend": items,
            "label_w": f.label_w, "bar_w": f.bar_w, "top": f.top, "bottom": bottom,
            "tick_font": TICK_FONT,
            "groups": [{"id": g.id, "color": g.color} for g in report.groups]}


# ---------------------------------------------------------------------------
# capacity against memory
# ---------------------------------------------------------------------------


def _nice_ticks(hi: float, n: int = 5) -> list[float]:
    if hi <= 0:
        return [0.0]
    raw = hi / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    return [i * step for i in range(int(hi // step) + 1)]


def _short(n: float) -> str:
    """An axis label: ``1.5M``, ``300k``."""
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:g}{unit}"
    return f"{n:g}"


def _budget_mark(report: Report, px, py, top: float, ph: float) -> dict[str, Any] | None:
    if report.memory is None:
        return None
    cap = report.capacity
    fits = cap is not None and cap.fits
    mem = human_bytes(report.memory)
    return {"x": px(report.memory / 2**30), "y1": top, "y2": top + ph,
            "text": f"budget {mem}", "y": py(cap.kv_tokens) if fits else None,
            "title": f"{mem}: {cap.kv_tokens:,} tokens" if fits
            else f"{mem}: does not fit one request"}


def capacity_chart(report: Report, width: int = 560, height: int = 320) -> dict[str, Any]:
    """A line of KV tokens against memory over the sweep, the budget marked."""
    left, right, top, bottom = 70, 20, 20, 50
    pts = [c for c in report.sweep if c.fits]
    gib = 2**30
    xs_hi = max((c.memory for c in report.sweep), default=1) / gib
    ys_hi = max((c.kv_tokens for c in pts), default=1) * 1.08 or 1
    xt, yt = _nice_ticks(xs_hi * 1.02), _nice_ticks(ys_hi)
    x_max = max(xt[-1], xs_hi) or 1
    y_max = max(yt[-1], ys_hi) or 1
    pw, ph = width - left - right, height - top - bottom

    def px(mem_gib: float) -> float:
        return round(left + mem_gib / x_max * pw, 2)

    def py(tokens: float) -> float:
        return round(top + ph - tokens / y_max * ph, 2)

    points = [{"x": px(c.memory / gib), "y": py(c.kv_tokens),
               "title": f"{human_bytes(c.memory)}: {c.kv_tokens:,} tokens, "
                        f"{c.num_blocks:,} blocks, {c.max_concurrency:.2f}x"} for c in pts]
    return {
        "width": width, "height": height, "left": left, "top": top, "pw": pw, "ph": ph,
        "path": " ".join(f"{'M' if i == 0 else 'L'}{p['x']},{p['y']}"
                         for i, p in enumerate(points)),
        "points": points, "budget": _budget_mark(report, px, py, top, ph),
        "min": {"x": px(report.min_memory / gib),
                "text": f"one request: {human_bytes(report.min_memory)}"},
        "xticks": [{"x": px(t), "text": f"{t:g}"} for t in xt if t <= x_max],
        "yticks": [{"y": py(t), "text": _short(t)} for t in yt if t <= y_max],
    }
