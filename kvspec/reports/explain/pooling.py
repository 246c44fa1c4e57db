"""The report's pooling section: the policy's decision, every candidate's capacity at
the workload, capacity against context (a table, and in HTML a chart with one line
per candidate), and where the kept plan's bytes go while requests wait.

>>> from kvspec.compiled import read
>>> view = pooling_view(read("layouts/pooling-auto.kvlayout.json").body.pooling)
>>> view.decision
'separate (asked auto, served by kvspec)'
>>> [w.kind for w in view.waste][:3]
['live tokens and states', 'padding slots', 'padded pages']
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvspec.artifact.format import PoolingRecord
from kvspec.reports.format import count
from kvspec.reports.pooling import compact_rows, compact_table, live_share, utilization

__all__ = ["CandidateRow", "CurveRow", "PoolingView", "WasteKind", "pooling_chart", "pooling_view"]


@dataclass(frozen=True)
class WasteKind:
    kind: str
    bytes: int
    share: float
    explanation: str


@dataclass(frozen=True)
class CurveRow:
    name: str
    chosen: bool
    #: Static requests at each of the view's ``tokens``.
    requests: tuple[float | None, ...]
    #: The simulated mean running requests at the workload, if simulated.
    simulated: float | None


@dataclass(frozen=True)
class CandidateRow:
    """One candidate's figures, as numbers (None: not computed)."""

    name: str
    kept: bool
    note: str | None
    static_requests: float | None
    workload_requests: float | None
    simulated_mean: float | None
    simulated_peak: int | None
    utilization_while_waiting: float | None
    #: The physical limit, priced at the workload's average request (the simulated peak,
    #: of shorter requests, may pass it).
    limit_at_average_request: float | None


#: Fields of the view only its text renderings read (``--format json`` leaves them out).
TEXT_ONLY = {"text_only": True}


@dataclass(frozen=True)
class PoolingView:
    decision: str
    workload: str | None
    #: The candidates' table, as text (``kvspec.reports.pooling.compact_table``).
    candidates: str = field(metadata=TEXT_ONLY)
    #: The same as text cells (``kvspec.reports.pooling.COMPACT``), and its footnotes.
    cells: tuple[tuple[str, ...], ...] = field(metadata=TEXT_ONLY)
    #: The same as numbers, one row per candidate.
    rows: tuple[CandidateRow, ...]
    notes: tuple[str, ...]
    #: Context lengths of the curve (tokens a running request holds).
    tokens: tuple[int, ...]
    held_tokens: int | None
    curve: tuple[CurveRow, ...]
    #: The kept candidate's name and where its bytes go while requests wait.
    kept: str | None
    waste: tuple[WasteKind, ...]


_KINDS = (
    ("padding slots", "padding_slots",
     "slots a group leaves empty so every group has the same layer count"),
    ("padded pages", "padded_pages", "pages padded past their content to one page size"),
    ("block inflation", "block_inflation",
     "token slots of held blocks beyond their requests' tokens"),
    ("per-request constants", "per_request",
     "state blocks beyond the one live state, window blocks beyond the window"),
    ("idle", "idle", ("blocks no running request holds: free, cached, or in a pool that is "
                     "not the one running out")),
)


def _waste(record: PoolingRecord) -> tuple[str | None, tuple[WasteKind, ...]]:
    if record.chosen is None:
        return None, ()
    c = record.candidates[record.chosen]
    w = c.waste
    if w is None or not w.pool_bytes:
        return c.name, ()
    rows = [WasteKind(label, getattr(w, attr), getattr(w, attr) / w.pool_bytes, why)
            for label, attr, why in _KINDS]
    share = live_share(w) or 0.0
    return c.name, (WasteKind("live tokens and states", round(share * w.pool_bytes), share,
                              "what the running requests need"), *rows)


def pooling_view(record: PoolingRecord) -> PoolingView:
    """The section's data, from the artifact's pooling record."""
    w = record.workload
    workload = None
    if w is not None:
        workload = (f"trace {w.trace} ({count(w.requests, 'request')})" if w.trace else
                    f"{count(w.requests, 'request')}, prompts ~{w.context_tokens:,.0f} tokens, "
                    f"outputs ~{w.output_tokens:,.0f}, seed {w.seed}")
    tokens = tuple(sorted({t for c in record.candidates for t, _ in c.curve}))
    rows = []
    for i, c in enumerate(record.candidates):
        at = dict(c.curve)
        rows.append(CurveRow(c.name, i == record.chosen, tuple(at.get(t) for t in tokens),
                             c.simulated.mean_running if c.simulated else None))
    kept, waste = _waste(record)
    cells, notes = compact_rows(record.candidates, record.chosen)
    numbers = tuple(CandidateRow(
        c.name, i == record.chosen, c.note, c.static_requests, c.workload_requests,
        c.simulated.mean_running if c.simulated else None,
        c.simulated.peak_running if c.simulated else None,
        utilization(c), c.physical_limit)
        for i, c in enumerate(record.candidates))
    return PoolingView(
        decision=f"{record.policy} (asked {record.asked}, served by {record.serve_with})",
        workload=workload, candidates=compact_table(record.candidates, record.chosen),
        cells=tuple(tuple(r) for r in cells), rows=numbers, notes=tuple(notes),
        tokens=tokens, held_tokens=w.held_tokens if w is not None else None,
        curve=tuple(rows), kept=kept, waste=waste)


#: Line colours of the chart's candidates (the kept one is drawn thicker).
COLORS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1")


def pooling_chart(view: PoolingView, width: int = 560, height: int = 320) -> dict[str, Any]:
    """Requests against context, one polyline per candidate; the workload's held
    tokens marked, and each simulated mean as a dot there."""
    left, right, top, bottom = 60, 20, 20, 50
    pw, ph = width - left - right, height - top - bottom
    xs = view.tokens or (1,)
    ys = [v for r in view.curve for v in (*r.requests, r.simulated) if v is not None]
    x_hi, y_hi = max(xs), (max(ys, default=1.0) * 1.08) or 1.0

    def px(t: float) -> float:
        return round(left + t / x_hi * pw, 2)

    def py(v: float) -> float:
        return round(top + ph - v / y_hi * ph, 2)

    lines = []
    for i, r in enumerate(view.curve):
        pts = [(px(t), py(v)) for t, v in zip(xs, r.requests) if v is not None]
        dot = None
        if r.simulated is not None and view.held_tokens is not None:
            dot = {"x": px(view.held_tokens), "y": py(r.simulated),
                   "title": f"{r.name}: {r.simulated:.1f} running (simulated)"}
        lines.append({"name": r.name, "color": COLORS[i % len(COLORS)], "chosen": r.chosen,
                      "path": " ".join(f"{'M' if j == 0 else 'L'}{x},{y}"
                                       for j, (x, y) in enumerate(pts)), "dot": dot})
    mark = None if view.held_tokens is None else {"x": px(view.held_tokens)}
    return {"width": width, "height": height, "left": left, "top": top, "pw": pw, "ph": ph,
            "lines": lines, "mark": mark,
            "xticks": [{"x": px(t), "text": f"{t:,}"} for t in xs],
            "yticks": [{"y": py(v), "text": f"{v:g}"} for v in _ticks(y_hi)]}


def _ticks(hi: float, n: int = 5) -> list[float]:
    step = max(round(hi / n), 1)
    return [float(i * step) for i in range(int(hi // step) + 1)]
