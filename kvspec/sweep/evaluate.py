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
import random
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from kvspec.compiler import Pooled, SourceText, run_until
from kvspec.errors import ErrorList, KvspecError
from kvspec.model.steptime import ConstantStepTime
from kvspec.passes.freeze import freeze
from kvspec.pooling.figures import Figures
from kvspec.runtime.manager import from_artifact
from kvspec.sim import SimResult, TraceRequest, engine_settings, simulate
from kvspec.sim.latency import Latency, Limit
from kvspec.sim.trace import MAX_ARRIVAL_S

__all__ = ["ROW_KEYS", "Timing", "evaluate_point", "row_of_error"]


@dataclass(frozen=True)
class Timing:
    """A point's clock in seconds and its SLO: a step-time profile (its file and
    text), or, with ``profile_text`` None, the constant model of ``step_ms``; an
    arrival given as a step stands for ``arrival_ms``."""

    profile_file: str | None
    profile_text: str | None
    step_ms: float | None
    slo: tuple[Limit, ...]
    arrival_ms: float

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
    "saturated", "requests_per_step", "sha256", "clock", "latency", "slo"})


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


def _simulated(art: Any, trace: tuple[TraceRequest, ...], **timing: Any
               ) -> tuple[SimResult, int]:
    engine = art.body.engine
    result = simulate(from_artifact(art), trace, **engine_settings(engine), **timing)
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
    if math.isnan(step_ms):  # a profile's point: its throughput is measured in seconds
        return {}
    throughput = per_step * 1000 / step_ms
    replicas = math.ceil(rate / throughput - 1e-9)
    return {"throughput": _r(throughput), "replicas": replicas, "gpus": replicas * ranks,
            "requests_per_gpu": _r(throughput / ranks)}


def evaluate_point(pid: str, params: dict[str, Any], source: str, file: str,
                   trace: tuple[TraceRequest, ...], rate: float, step_ms: float,
                   timing: Timing | None = None) -> dict[str, Any]:
    """The row of one point (its error in the row when it fails); with ``timing``,
    timed in seconds (docs/sweep.md, "In time")."""
    try:
        art = _compiled(source, file)
    except KvspecError as err:
        first = err.errors[0] if isinstance(err, ErrorList) else err
        return row_of_error(pid, params, first.as_dict())
    layout = art.layout
    held = max(round(math.fsum(r.prompt_tokens + r.output_tokens / 2 for r in trace)
                     / len(trace)), 1)
    try:
        clock = None if timing is None else _clock(timing, art)
        result, max_len = _simulated(art, trace) if clock is None else _simulated(
            art, trace, step_time=clock(), step_ms=timing.arrival_ms,  # type: ignore[union-attr]
            latency=True)
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
    if timing is not None and clock is not None:
        try:
            _timed(row, timing, clock, art, trace, result, rate, ranks)
        except KvspecError as err:
            return row_of_error(pid, params, err.as_dict())
    if refused:
        row.update(replicas=None, gpus=None)
    row["sha256"] = art.sha256
    row["error"] = None
    return row


@lru_cache(maxsize=8)
def _profile(text: str, file: str) -> Any:
    # deferred: the profile's reader (pydantic), only for a grid with profiles
    from kvspec.source.profile import parse_profile

    return parse_profile(text, file)


def _clock(timing: Timing, art: Any) -> Any:
    """What makes the point's step-time model (a new one per run: a profile's model
    notes the first batch outside its range); a profile for another model,
    parallelism or KV cache dtype than the point's is refused, at its field."""
    if timing.profile_text is None:
        assert timing.step_ms is not None
        ms = timing.step_ms
        return lambda: ConstantStepTime(ms)
    assert timing.profile_file is not None
    profile = _profile(timing.profile_text, timing.profile_file)
    body = art.body
    e = body.engine
    profile.check({"model": body.model, "tensor_parallel_size": e.tensor_parallel_size,
                   "pipeline_parallel_size": e.pipeline_parallel_size,
                   "kv_cache_dtype": e.kv_cache_dtype}, "this point's layout")
    return profile.step_time


def per_second(result: SimResult, trace: tuple[TraceRequest, ...]) -> tuple[float, bool]:
    """:func:`per_step`'s rule on the clock in seconds: the busy interval runs from
    the start of the first step at which requests wait and a request has finished
    to the start of the last step at which requests wait; saturated when at least
    :data:`MIN_FINISHED` requests finish in it (their last token's step ends in
    it), the requests per second being those over its seconds. Otherwise the
    finished requests over the run's duration (first arrival to last token): a
    lower bound."""
    lat: Latency = result.latency
    finish = sorted(a + e for a, e in zip(lat.arrival, lat.e2e, strict=True))
    starts = lat.step_starts
    window = [i for i, rec in enumerate(result.steps)
              if rec.waiting and finish and starts[i] >= finish[0]]
    if len(window) >= 2:
        t0, t1 = starts[window[0]], starts[window[-1]]
        done = bisect.bisect_right(finish, t1) - bisect.bisect_right(finish, t0)
        if done >= MIN_FINISHED and t1 > t0:
            return done / (t1 - t0), True
    return (len(finish) / lat.duration if lat.duration > 0 else 0.0), False


def _timed(row: dict[str, Any], timing: Timing, clock: Any, art: Any,
           trace: tuple[TraceRequest, ...], result: SimResult, rate: float, ranks: int
           ) -> None:
    """A timed point's figures: its clock, its latency, its throughput in seconds
    (a profile's; the constant model's is the step clock's), and with an SLO the
    replicas that meet it at the target rate."""
    row["clock"] = {"model": "constant", "step_ms": timing.step_ms} \
        if timing.profile_text is None else {"model": "linear", "profile": timing.profile_file}
    row["latency"] = result.latency.as_dict()
    if timing.profile_text is not None:
        throughput, saturated = per_second(result, trace)
        row.update(saturated=saturated, requests_per_step=None, **_replicas(
            throughput, ranks, rate))
    else:
        throughput, saturated = row["throughput"], row["saturated"]
    if timing.slo and not result.rejected:
        slo = slo_replicas(art, trace, timing, clock, rate, throughput, saturated)
        n = slo["replicas"]
        row.update(slo=slo, replicas=n, gpus=None if n is None else n * ranks)


def _replicas(throughput: float, ranks: int, rate: float) -> dict[str, Any]:
    if throughput <= 0:
        return {"throughput": 0.0, "replicas": None, "gpus": None, "requests_per_gpu": 0.0}
    replicas = math.ceil(rate / throughput - 1e-9)
    return {"throughput": _r(throughput), "replicas": replicas, "gpus": replicas * ranks,
            "requests_per_gpu": _r(throughput / ranks)}


#: Doublings of the replica count an SLO search tries before it gives up.
MAX_DOUBLINGS = 40


def unit_arrivals(trace: tuple[TraceRequest, ...], arrival_ms: float) -> list[float]:
    """The workload's arrival pattern at one request per second (s): its own times
    (``arrival_s``, else its step times ``arrival_ms``) scaled to that mean rate, or,
    when every request arrives at once, a Poisson process (seed 0)."""
    times = [r.arrival * arrival_ms / 1000 if r.arrival_s is None else r.arrival_s
             for r in trace]
    first, span = times[0], times[-1] - times[0]
    if span > 0 and len(times) > 1:
        return [(t - first) * (len(times) - 1) / span for t in times]
    draw, t, out = random.Random(0), 0.0, []
    for _ in trace:
        out.append(t)
        t += draw.expovariate(1.0)
    return out


def slo_replicas(art: Any, trace: tuple[TraceRequest, ...], timing: Timing, clock: Any,
                 rate: float, throughput: float, saturated: bool) -> dict[str, Any]:
    """The fewest replicas that meet the SLO at ``rate`` (docs/sweep.md, "In time"):
    one replica at ``rate / n`` requests per second attains every limit; ``n`` at
    least what the throughput needs when it was measured saturated. Doubling from
    there, then halving the gap (a lighter load is taken never to break a limit a
    heavier one meets); unmet when a load at which every request ran alone (no
    lighter one changes a request's times), or the latest arrival a trace takes,
    still breaks a limit."""
    unit = unit_arrivals(trace, timing.arrival_ms)
    step_s = None if timing.step_ms is None else timing.step_ms / 1000
    runs: dict[int, tuple[bool, Latency, int]] = {}

    def attempt(n: int) -> tuple[bool, Latency, int]:
        if n not in runs:
            load = rate / n
            timed = tuple(replace(r, arrival=math.floor(t / load / step_s), arrival_s=None)
                          if step_s is not None else replace(
                              r, arrival=0, arrival_s=t / load) for r, t in zip(trace, unit))
            result, _ = _simulated(art, timed, step_time=clock(), step_ms=timing.arrival_ms,
                                   latency=True)
            lat = result.latency
            peak = max((rec.running for rec in result.steps), default=0)
            runs[n] = (lat.attains(timing.slo), lat, peak)
        return runs[n]

    low = math.ceil(rate / throughput - 1e-9) if saturated and throughput > 0 else 1
    failed, n = low - 1, low
    for _ in range(MAX_DOUBLINGS):
        met, _, peak = attempt(n)
        if met or peak <= 1 or unit[-1] * n / rate > MAX_ARRIVAL_S:
            break
        failed, n = n, n * 2
    met = runs[n][0]
    if met:
        while n - failed > 1:
            mid = (failed + n) // 2
            if attempt(mid)[0]:
                n = mid
            else:
                failed = mid
    lat = runs[n][1]
    figures = lat.as_dict(timing.slo)
    return {"limits": [x.text for x in timing.slo], "met": met,
            "replicas": n if met else None,
            "replica_rate": _r(rate / n) if met else None,
            "runs": len(runs), "at": {"replicas": n, "requests_per_s": _r(rate / n),
                                      **figures}}
