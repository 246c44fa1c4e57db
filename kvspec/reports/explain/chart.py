"""The HTML report's capacity chart: KV tokens against memory over the sweep of
budgets, the budget and the least budget that serves one request marked.

>>> from kvspec.reports.explain.report import explain
>>> c = capacity_chart(explain("layouts/llama-3.1-8b.yaml"))
>>> c["width"], len(c["points"]) > 1, c["budget"]["text"]
(560, True, 'budget 40.00 GiB')
"""

from __future__ import annotations

import math
from typing import Any

from kvspec.reports.explain.report import Report
from kvspec.reports.format import human_bytes

__all__ = ["capacity_chart"]


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
    cap = report.capacity if report.capacity is not None and report.capacity.fits else None
    mem = human_bytes(report.memory)
    return {"x": px(report.memory / 2**30), "y1": top, "y2": top + ph,
            "text": f"budget {mem}", "y": py(cap.kv_tokens) if cap is not None else None,
            "title": f"{mem}: {cap.kv_tokens:,} tokens" if cap is not None
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
