"""One point of a sweep: its source compiled, its workload simulated, its row.

A row (docs/sweep.md, "Rows") holds the point's id and parameters, and either its
figures or its error:

* ``static_requests`` -- requests at ``max_model_len`` the blocks hold (vLLM's
  maximum concurrency), ``workload_requests`` -- at the workload's held tokens,
  and ``physical_limit`` -- the live bytes alone at those tokens
  (:mod:`kvspec.pooling.figures`, per rank of stage 0, the pool that binds);
* ``simulated`` -- what ``kvspec simulate --format json`` prints for the point
  (steps, mean and peak running, preemptions, ...), with ``refused``;
  ``waiting_steps_by_reason`` and ``layout_waste`` are the simulator's when it
  gives them, else null;
* ``requests_per_step`` -- requests one replica finishes per engine step while
  requests wait for it (:func:`per_step`; ``saturated`` false: nothing waited,
  and the figure is a lower bound); ``throughput`` -- the same per second, an
  engine step lasting the target's ``step_ms``; ``replicas`` --
  ``ceil(rate / throughput)``; ``gpus`` -- the replicas times the ranks of one
  (tensor x pipeline); ``requests_per_gpu`` -- the throughput over the ranks;
* ``sha256`` -- the compiled artifact's.

The row is a function of the point alone (no times, no host): the same point gives
the same row on any worker, in any process, locally or on Ray.
"""

from __future__ import annotations

import bisect
import math
from functools import lru_cache
from typing import Any

from kvspec.compiler import Pooled, SourceText, run_until
from kvspec.errors import ErrorList, KvspecError
from kvspec.passes.freeze import freeze
from kvspec.pooling.figures import Figures
from kvspec.runtime.manager import from_artifact
from kvspec.sim import SimResult, TraceRequest, engine_settings, simulate

__all__ = ["ROW_KEYS", "evaluate_point", "row_of_error"]

#: Requests that must finish while others wait for a throughput to be measured.
MIN_FINISHED = 50
#: Figures ``simulate`` may give beside its summary (issue 39), copied when present.
OPTIONAL = ("waiting_steps_by_reason", "utilization_while_memory_bound", "layout_waste")
#: Every key a row may have (a figures row's, an error row's): how the results
#: file tells a row, or the start of one a kill cut short, from other JSON.
ROW_KEYS = frozenset({
    "id", "point", "ok", "error", "ranks", "kv_cache_memory", "static_requests",
    "workload_requests", "binding_pool", "physical_limit", "blocks", "held_tokens",
    "simulated", *OPTIONAL, "throughput", "replicas", "gpus", "requests_per_gpu",
    "saturated", "requests_per_step", "sha256"})


@lru_cache(maxsize=8)
def _compiled(text: str, file: str) -> Any:
    """A point's source compiled (its pools' plans sized): the artifact. Points
    that differ only in workload share it."""
    pooled = run_until(SourceText(text=text, file=file), Pooled)
    return freeze(pooled)


def row_of_error(pid: str, params: dict[str, Any], err: dict[str, Any]) -> dict[str, Any]:
    """The row of a point that failed: its error in place of figures."""
    return {"id": pid, "point": params, "ok": False, "error": err}


def _static(art: Any, tokens: int) -> dict[str, Any]:
    figures = Figures(art.body)
    static = figures.static_requests()
    at_tokens = figures.workload_requests(tokens)
    # the pools' budgets over the live bytes of one request across them
    memory, live = figures.memory(), figures.live_bytes(tokens)
    ok = [v for v, _ in at_tokens if v is not None]
    return {"static_requests": _r(static) if static is not None else None,
            "workload_requests": _r(min(ok)) if ok else None,
            "binding_pool": min(at_tokens)[1] if len(ok) == len(at_tokens) else None,
            "physical_limit": _r(memory / live) if live and memory is not None else None,
            "blocks": {p.name: p.num_blocks for p in figures.pools}}


def _r(x: float) -> float:
    return round(x, 4)


def _simulated(art: Any, trace: tuple[TraceRequest, ...]) -> tuple[SimResult, int]:
    engine = art.body.engine
    result = simulate(from_artifact(art), trace, **engine_settings(engine))
    return result, engine.max_model_len


def per_step(result: SimResult, trace: tuple[TraceRequest, ...], max_model_len: int
             ) -> tuple[float, bool]:
    """Requests one replica finishes per engine step, and whether the trace kept it
    busy. Saturated: over the steps where requests wait (the queue is never empty,
    so the replica runs as fast as it can) once a first request has finished, the
    requests finished in that window over its steps -- a finished count being the
    requests arrived less those running or waiting -- when at least
    :data:`MIN_FINISHED` finish in it. Otherwise (the trace is too light to keep
    the replica busy past its first wave): the served requests over all the steps,
    a lower bound."""
    arrivals = sorted(r.arrival for r in trace if r.prompt_tokens < max_model_len)
    served = len(arrivals)

    def finished(rec: Any) -> int:
        return bisect.bisect_right(arrivals, rec.step) - rec.running - rec.waiting
    # the window opens when the first request has finished (the first wave's
    # prefills are behind it) and closes with the last step a request waits
    window = [r for r in result.steps if r.waiting and finished(r) > 0]
    if len(window) >= 2:
        first, last = window[0], window[-1]
        done = finished(last) - finished(first)
        if done >= MIN_FINISHED and last.step > first.step:
            return done / (last.step - first.step), True
    return (served / result.num_steps if result.num_steps else 0.0), False


def _gpus(per_step: float, ranks: int, rate: float, step_ms: float) -> dict[str, Any]:
    if per_step <= 0:
        return {"throughput": 0.0, "replicas": None, "gpus": None, "requests_per_gpu": 0.0}
    throughput = per_step * 1000 / step_ms
    replicas = math.ceil(rate / throughput - 1e-9)
    return {"throughput": _r(throughput), "replicas": replicas, "gpus": replicas * ranks,
            "requests_per_gpu": _r(throughput / ranks)}


def evaluate_point(pid: str, params: dict[str, Any], source: str, file: str,
                   trace: tuple[TraceRequest, ...], rate: float, step_ms: float
                   ) -> dict[str, Any]:
    """The row of one point (its error in the row when it fails)."""
    try:
        art = _compiled(source, file)
    except KvspecError as err:
        first = err.errors[0] if isinstance(err, ErrorList) else err
        return row_of_error(pid, params, first.as_dict())
    layout = art.layout
    held = max(round(math.fsum(r.prompt_tokens + r.output_tokens / 2 for r in trace)
                     / len(trace)), 1)
    try:
        result, max_len = _simulated(art, trace)
    except KvspecError as err:
        return row_of_error(pid, params, err.as_dict())
    summary, refused = result.as_dict(), result.rejected
    ranks = layout.engine.tensor_parallel_size * layout.engine.pipeline_parallel_size
    rate_per_step, saturated = per_step(result, trace, max_len)
    row: dict[str, Any] = {"id": pid, "point": params, "ok": True, "ranks": ranks,
                           "kv_cache_memory": layout.budget.memory
                           if layout.budget is not None else None,
                           **_static(art, held), "held_tokens": held,
                           "simulated": {**summary, "requests": len(trace), "refused": refused}}
    for key in OPTIONAL:
        row[key] = summary.get(key)
    row.update(_gpus(rate_per_step, ranks, rate, step_ms), saturated=saturated,
               requests_per_step=_r(rate_per_step))
    if refused:
        row.update(replicas=None, gpus=None)
    row["sha256"] = art.sha256
    row["error"] = None
    return row
