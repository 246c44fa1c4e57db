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
* ``throughput`` -- requests per second one replica serves: the trace's served
  requests over the steps it took, an engine step lasting the target's
  ``step_ms``; ``replicas`` -- ``ceil(rate / throughput)``; ``gpus`` -- the
  replicas times the ranks of one (tensor x pipeline); ``requests_per_gpu`` --
  the throughput over the ranks;
* ``sha256`` -- the compiled artifact's.

The row is a function of the point alone (no times, no host): the same point gives
the same row on any worker, in any process, locally or on Ray.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

from kvspec.compiler import Pooled, SourceText, run_until
from kvspec.errors import ErrorList, KvspecError
from kvspec.passes.freeze import freeze
from kvspec.pooling import figures
from kvspec.runtime.manager import from_layouts
from kvspec.sim import TraceRequest, simulate

__all__ = ["evaluate_point", "row_of_error"]

#: Figures ``simulate`` may give beside its summary (issue 39), copied when present.
OPTIONAL = ("waiting_steps_by_reason", "utilization_while_memory_bound", "layout_waste")


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
    layouts = [(p.name, p.layout) for p in art.pools] or [("device", art.layout)]
    at_max = [figures.static_requests(x) for _, x in layouts]
    at_tokens = [(figures.workload_requests(x, tokens), n) for n, x in layouts]
    physical = [figures.physical_limit(x, tokens) for _, x in layouts]
    ok = [v for v, _ in at_tokens if v is not None]
    return {"static_requests": _r(min(v for v in at_max if v is not None))
            if all(v is not None for v in at_max) else None,
            "workload_requests": _r(min(ok)) if ok else None,
            "binding_pool": min(at_tokens)[1] if len(ok) == len(at_tokens) else None,
            "physical_limit": _r(sum(v for v in physical if v is not None))
            if all(v is not None for v in physical) else None,
            "blocks": {n: (x.budget.num_blocks if x.budget is not None else None)
                       for n, x in layouts}}


def _r(x: float) -> float:
    return round(x, 4)


def _simulated(art: Any, trace: tuple[TraceRequest, ...]) -> tuple[dict[str, Any], int]:
    pools = [(p.name, p.layout) for p in art.pools] or [("device", art.layout)]
    engine = art.layout.engine
    result = simulate(from_layouts(pools), trace, max_num_seqs=engine.max_num_seqs,
                      max_num_batched_tokens=engine.max_num_batched_tokens,
                      async_scheduling=engine.async_scheduling_resolved,
                      pipeline_parallel_size=engine.pipeline_parallel_size)
    return result.as_dict(), result.rejected


def _gpus(steps: int, served: int, ranks: int, rate: float, step_ms: float
          ) -> dict[str, Any]:
    if not served or not steps:
        return {"throughput": 0.0, "replicas": None, "gpus": None, "requests_per_gpu": 0.0}
    throughput = served / (steps * step_ms / 1000)
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
        summary, refused = _simulated(art, trace)
    except KvspecError as err:
        return row_of_error(pid, params, err.as_dict())
    ranks = layout.engine.tensor_parallel_size * layout.engine.pipeline_parallel_size
    served = len(trace) - refused
    row: dict[str, Any] = {"id": pid, "point": params, "ok": True, "ranks": ranks,
                           "kv_cache_memory": layout.budget.memory
                           if layout.budget is not None else None,
                           **_static(art, held), "held_tokens": held,
                           "simulated": {**summary, "requests": len(trace), "refused": refused}}
    for key in OPTIONAL:
        row[key] = summary.get(key)
    row.update(_gpus(summary["steps"], served, ranks, rate, step_ms))
    if refused:
        row.update(replicas=None, gpus=None)
    row["sha256"] = art.sha256
    row["error"] = None
    return row
