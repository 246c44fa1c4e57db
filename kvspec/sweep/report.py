"""What a sweep's rows say: the best point per workload, the Pareto front, the CSV
export and the HTML report (docs/sweep.md, "The report").

* **Best point per workload** -- the fewest GPUs for the target rate; of those,
  the most requests per second per GPU, then the fewest ranks per replica, then
  the id (so the choice never depends on the rows' order).
* **Pareto front** -- per workload, the points no other point beats on both
  requests per second per GPU (higher) and GPU memory per rank (lower: the
  ``gpu_memory`` axis, else the KV cache's memory): what each step up in memory
  buys.

>>> rows = [{"id": "a", "ok": True, "point": {"workload": "w", "memory": 2}, "gpus": 4,
...          "requests_per_gpu": 5.0, "ranks": 2},
...         {"id": "b", "ok": True, "point": {"workload": "w", "memory": 1}, "gpus": 4,
...          "requests_per_gpu": 5.0, "ranks": 1}]
>>> [r["id"] for r in best_rows(rows)], [r["id"] for r in pareto(rows)]
(['b'], ['b'])
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvspec._version import __version__
from kvspec.files import write_atomic
from kvspec.reports.format import human_bytes
from kvspec.sweep.grid import AXES

__all__ = ["CSV_COLUMNS", "UNSATURATED", "best_rows", "csv_text", "pareto", "point_text",
           "render_report", "write_csv"]


#: What a best point's flag means when its run never saturated (docs/sweep.md,
#: "Saturation").
UNSATURATED = ("not saturated: the workload never kept a replica busy (fewer than 50 "
               "requests finished while others waited), so its req/s per GPU is a lower "
               "bound and its GPUs an upper bound; give the workload more requests "
               "(docs/sweep.md, \"Saturation\")")


def _key(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row["gpus"], -(row.get("requests_per_gpu") or 0.0), row.get("ranks") or 0,
            row["id"])


def _servable(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r.get("ok") and r.get("gpus") is not None]


def _workloads(rows: Sequence[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(r["point"]["workload"] for r in rows))


def best_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The best point of each workload (in the order workloads first appear)."""
    ok = _servable(rows)
    return [min((r for r in ok if r["point"]["workload"] == w), key=_key)
            for w in _workloads(ok)]


def memory_of(row: dict[str, Any]) -> int:
    """GPU memory per rank of a row: its ``gpu_memory``, else its KV cache memory."""
    p = row["point"]
    return int(p.get("gpu_memory") or p.get("memory") or row.get("kv_cache_memory") or 0)


def pareto(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per workload, the points not beaten on both requests per GPU and memory per
    rank; ordered by workload, then memory."""
    out = []
    ok = _servable(rows)
    for w in _workloads(ok):
        mine = sorted((r for r in ok if r["point"]["workload"] == w),
                      key=lambda r: (memory_of(r), -r["requests_per_gpu"], _key(r)))
        top = -math.inf
        for r in mine:
            if r["requests_per_gpu"] > top:
                out.append(r)
                top = r["requests_per_gpu"]
    return out


#: The CSV's columns after the point's parameters.
CSV_COLUMNS = ("ok", "gpus", "replicas", "ranks", "requests_per_gpu", "throughput",
               "static_requests", "workload_requests", "physical_limit", "kv_cache_memory",
               "mean_running", "peak_running", "preemptions", "steps", "refused",
               "layout_waste", "waiting_steps_by_reason", "sha256", "error")


def csv_text(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as CSV: the id, each parameter, then :data:`CSV_COLUMNS`
    (nested values as JSON, an error as its one-line message)."""
    seen = {k for r in rows for k in r["point"]}
    params = [k for k in ("model", *AXES) if k in seen]
    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\n")
    out.writerow(["id", *params, *CSV_COLUMNS])
    for r in rows:
        sim = r.get("simulated") or {}
        cells = []
        for c in CSV_COLUMNS:
            v = sim.get(c) if c in ("mean_running", "peak_running", "preemptions", "steps",
                                    "refused") else r.get(c)
            if c == "error" and v:
                v = ":".join(str(v.get(k) or "") for k in ("file", "line", "column")) + \
                    f": {v.get('message')}"
            cells.append(json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else
                         "" if v is None else v)
        out.writerow([r["id"], *(r["point"].get(k, "") for k in params), *cells])
    return buf.getvalue()


def write_csv(rows: Sequence[dict[str, Any]], path: Path) -> None:
    write_atomic(path, csv_text(rows))


def point_text(row: dict[str, Any]) -> str:
    """A row's parameters but model and workload, sizes in binary units."""
    out = []
    for k in AXES:
        if k not in row["point"] or k == "workload":
            continue
        v = row["point"][k]
        out.append(f"{k} {human_bytes(v) if k in ('memory', 'gpu_memory') else v}")
    return ", ".join(out) or "the source's own settings"


def _chart(rows: list[dict[str, Any]], front: list[dict[str, Any]], width: int,
           height: int) -> dict[str, Any]:
    """A scatter of requests per GPU against memory per rank, the front joined."""
    left, right, top, bottom = 52, 16, 14, 44
    pw, ph = width - left - right, height - top - bottom
    xs = [memory_of(r) / 2**30 for r in rows] or [1.0]
    ys = [r["requests_per_gpu"] for r in rows] or [1.0]
    x0, x1 = min(xs), max(xs)
    x0, x1 = (x0 - 1, x1 + 1) if x0 == x1 else (x0, x1)
    y1 = max(ys) * 1.1 or 1.0

    def at(r: dict[str, Any]) -> tuple[float, float]:
        return (round(left + (memory_of(r) / 2**30 - x0) / (x1 - x0) * pw, 1),
                round(top + ph - r["requests_per_gpu"] / y1 * ph, 1))

    ids = {r["id"] for r in front}
    dots = [{"x": at(r)[0], "y": at(r)[1], "id": r["id"], "front": r["id"] in ids,
             "title": f"{r['point']['model']}: {point_text(r)}; {r['gpus']} GPUs, "
                      f"{r['requests_per_gpu']:.2f} req/s per GPU"} for r in rows]
    line = " ".join(f"{x},{y}" for x, y in (at(r) for r in front))
    nx = 5 if width > 400 else 3
    xticks = [{"x": round(left + i / (nx - 1) * pw, 1),
               "text": f"{x0 + i / (nx - 1) * (x1 - x0):.3g}"} for i in range(nx)]
    yticks = [{"y": round(top + ph - i / 4 * ph, 1), "text": f"{i / 4 * y1:.2g}"}
              for i in range(5)]
    return {"width": width, "height": height, "left": left, "top": top, "pw": pw, "ph": ph,
            "dots": dots, "line": line, "xticks": xticks, "yticks": yticks}


def render_report(sweep: Any, rows: Sequence[dict[str, Any]], *, grid: str, output: str
                  ) -> str:
    """The sweep's HTML report: one self-contained page."""
    # deferred: Jinja2, only when a report is rendered
    from kvspec.reports.explain.render import environment

    front = pareto(rows)
    sections = []
    for w in _workloads(_servable(rows)):
        mine = [r for r in _servable(rows) if r["point"]["workload"] == w]
        wf = [r for r in front if r["point"]["workload"] == w]
        sections.append({"workload": w, "front": wf, "points": len(mine),
                         "wide": _chart(mine, wf, 640, 300),
                         "narrow": _chart(mine, wf, 340, 240)})
    errors = [r for r in rows if not r.get("ok")]
    kinds: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in errors:
        e = r["error"]
        key = (e.get("file"), e.get("line"), e.get("column"), e.get("message"))
        kinds.setdefault(key, {"error": e, "points": 0, "first": r})["points"] += 1
    target = sweep.grid.model.target
    return environment().get_template("sweep.html.j2").render(
        grid=grid, output=output, version=__version__, rows=rows, best=best_rows(rows),
        sections=sections, errors=list(kinds.values()),
        error_count=len(errors), target=target, params=point_text,
        step_text=", ".join(f"{v:g} ms at tensor {k}" for k, v in sorted(target.step_ms.items()))
        if isinstance(target.step_ms, dict) else f"{target.step_ms:g} ms",
        command=lambda r: f"kvspec sweep {grid} --point {r['id']}",
        unserved=sum(1 for r in rows if r.get("ok") and r.get("gpus") is None),
        unsaturated=UNSATURATED)
