"""Capacity, measured: a request trace replayed through kvspec's manager and a
model of vLLM v1's scheduler (no torch).

* :func:`simulate` -- a :class:`~kvspec.runtime.manager.ManagedLayout` and a trace in,
  a :class:`~kvspec.sim.metrics.SimResult` out (``.as_dict()``: the summary;
  ``.steps``: every step's record);
* :func:`simulate_artifact` -- the same for a compiled layout, with its engine's
  settings;
* :mod:`.trace` -- the JSONL trace format (:func:`read_trace`) and :mod:`.generate`
  -- seeded synthetic traces (:func:`generate_trace`);
* :mod:`.schedule` -- the scheduler model, :mod:`.engine` -- the step loop,
  :mod:`.metrics` -- records, utilisation, the summary.

``kvspec.integrations.vllm.replay`` runs the same trace through vLLM's own
scheduler, with the same loop and the same records.

>>> from kvspec.artifact import Artifact
>>> art = Artifact.read("layouts/llama-3.1-8b.kvlayout.json")
>>> trace = generate_trace(40, seed=3, prompt_mean=300, output_mean=60)
>>> summary = simulate_artifact(art, trace, num_blocks=120).as_dict()
>>> summary["steps"], summary["peak_running"], summary["preemptions"]
(626, 7, 8)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from kvspec.artifact import Artifact
from kvspec.artifact import format as fmt
from kvspec.errors import KvspecError
from kvspec.interrupts import deferred
from kvspec.model.engine import Engine
from kvspec.model.steptime import ConstantStepTime, StepTime
from kvspec.model.workloads import DEFAULT_STEP_MS
from kvspec.runtime.manager import KVCacheManager, ManagedLayout, from_artifact
from kvspec.sim.engine import KvspecEngine, Progress, Timeline, drive
from kvspec.sim.generate import generate_trace
from kvspec.sim.latency import Latency, latency_of
from kvspec.sim.metrics import SUMMARY_KEYS, Limits, LiveBytes, SimResult, StepRecord
from kvspec.sim.schedule import Scheduler
from kvspec.sim.trace import TraceError, TraceRequest, parse_trace, read_trace, write_trace

__all__ = ["MAX_BLOCKS", "SUMMARY_KEYS", "SimResult", "StepRecord", "TraceError", "TraceRequest",
           "admit", "engine_settings", "generate_trace", "parse_trace", "read_trace", "run",
           "arrivals_s", "run_artifact", "simulate", "simulate_artifact", "write_trace"]


#: Most blocks a simulated pool may have: the manager holds every block of its pools
#: (a few microseconds and some hundred bytes each), so a typo's 10^12 would run out
#: of memory; a million is several times any GPU's pool.
MAX_BLOCKS = 2**20


def too_many_blocks(layout: ManagedLayout) -> str | None:
    """Why ``layout``'s pools are too large to simulate, or None."""
    big = [p for p in layout.pools if p.num_blocks > MAX_BLOCKS]
    if not big:
        return None
    return (f"pool {big[0].name} has {big[0].num_blocks:,} blocks; the simulator holds "
            f"every block, at most {MAX_BLOCKS:,}")


def simulate(layout: ManagedLayout, trace: Sequence[TraceRequest], *, max_num_seqs: int = 256,
             max_num_batched_tokens: int = 8192, max_model_len: int | None = None,
             async_scheduling: bool = True, pipeline_parallel_size: int = 1,
             progress: Progress | None = None, sample_held: bool = False,
             step_time: StepTime | None = None, step_ms: float = DEFAULT_STEP_MS,
             latency: bool = False, concurrency: int = 0) -> SimResult:
    """Replay ``trace`` through ``layout``'s pools; requests whose prompt does not fit
    ``max_model_len`` (default: the layout's) are refused, as vLLM refuses them.
    ``sample_held``: also sample what running requests hold while memory keeps others
    waiting (the waste breakdown, :meth:`SimResult.held_while_memory_bound`).

    Time (docs/latency.md): on the step clock every step takes ``step_ms``; with a
    ``step_time`` model that is not constant, each step takes what the model gives for
    its batch, and arrivals are seconds (a line's ``arrival_s``, else its step times
    ``step_ms``). ``latency`` (implied by a timed model): also time every request
    (:attr:`SimResult.latency`). ``concurrency`` N > 0: closed-loop clients keep at
    most N requests in flight (:class:`~kvspec.sim.engine.Timeline`), on the timed
    clock (the constant model at ``step_ms`` without a ``step_time``), each request
    timed from when it is sent."""
    return run(layout, trace, max_num_seqs=max_num_seqs,
               max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
               async_scheduling=async_scheduling,
               pipeline_parallel_size=pipeline_parallel_size, progress=progress,
               sample_held=sample_held, step_time=step_time, step_ms=step_ms,
               latency=latency, concurrency=concurrency)[0]


def run(layout: ManagedLayout, trace: Sequence[TraceRequest], *, max_num_seqs: int = 256,
        max_num_batched_tokens: int = 8192, max_model_len: int | None = None,
        async_scheduling: bool = True, pipeline_parallel_size: int = 1,
        progress: Progress | None = None, log_blocks: bool = False, lazy: bool = True,
        sample_held: bool = False, step_time: StepTime | None = None,
        step_ms: float = DEFAULT_STEP_MS, latency: bool = False, concurrency: int = 0
        ) -> tuple[SimResult, KvspecEngine]:
    """:func:`simulate`, and the engine it ran (its scheduler, manager and, with
    ``log_blocks``, every step's block tables and free queue); ``lazy=False`` steps
    every decoding request one by one (slower, the same result)."""
    if max_model_len is not None:
        layout = replace(layout, max_model_len=max_model_len)
    depth = Engine.batches_in_flight(async_scheduling, pipeline_parallel_size)
    # the recycling groups' admission cap reads the tokens in flight: these settings'
    layout = replace(layout, max_in_flight_tokens=max_num_batched_tokens * depth)
    admitted, numbers = admit(trace, layout.max_model_len)
    if step_time is not None and step_time.constant:
        step_ms = step_time.step_ms  # type: ignore[attr-defined]
    if concurrency > 0 and step_time is None:
        step_time = ConstantStepTime(step_ms)  # a closed loop runs on the timed clock
    timed = step_time is not None and (not step_time.constant or concurrency > 0)
    track = latency or timed
    why = too_many_blocks(layout)
    if why is not None:
        raise KvspecError(f"cannot simulate: {why}",
                          hint="simulate a smaller budget: the figures per block scale")
    with deferred():   # compiled code from here (kvspec.interrupts)
        manager = KVCacheManager(layout)
        live = LiveBytes(layout)
        scheduler = Scheduler(manager, layout, live, max_num_seqs=max_num_seqs,
                              max_num_batched_tokens=max_num_batched_tokens,
                              async_scheduling=async_scheduling,
                              lazy=lazy and depth == (2 if async_scheduling else 1), track=track)
        limits = Limits(max_num_seqs, max_num_batched_tokens,
                        layout.split_block_size if layout.has_align_state else 0)
        engine = KvspecEngine(scheduler, live, admitted, log_blocks=log_blocks, numbers=numbers,
                              sample_held=sample_held, limits=limits)
        timeline = Timeline(step_time, arrivals_s(admitted, step_ms), concurrency) \
            if step_time is not None and timed else None
        records, steps = drive(engine, admitted, depth, progress, timeline)
        times = None
        if track:
            times = timed_requests(engine, records, timeline, step_ms)
        result = SimResult(layout.name, steps, tuple(records), scheduler.preemptions,
                           scheduler.hit_tokens, len(admitted), len(trace) - len(admitted),
                           tuple(engine.samples), live.scale, live.pool_bytes, limits, times)
    return result, engine


def arrivals_s(trace: Sequence[TraceRequest], step_ms: float) -> list[float]:
    """Each request's arrival in seconds: its ``arrival_s``, else its step on a clock of
    ``step_ms``."""
    step_s = step_ms / 1000
    return [r.arrival * step_s if r.arrival_s is None else r.arrival_s for r in trace]


def timed_requests(engine: KvspecEngine, records: Sequence[StepRecord],
                   timeline: Timeline | None, step_ms: float) -> Latency:
    """Every request's times (:mod:`.latency`): on ``timeline``, or on the step clock
    (step ``k`` from ``k * step_ms`` to ``(k + 1) * step_ms``, a request arriving at
    its step's start)."""
    s = engine.scheduler
    if timeline is not None:
        return latency_of(engine.requests, timeline.arrivals, timeline.starts,
                          timeline.ends, s.next_tokens, s.gaps)
    step_s = step_ms / 1000
    starts = [r.step * step_s for r in records]
    ends = [t + step_s for t in starts]
    arrivals = [r.arrival * step_s for r in engine.requests]  # (by index: all admitted)
    return latency_of(engine.requests, arrivals, starts, ends, s.next_tokens, s.gaps)


def admit(trace: Sequence[TraceRequest], max_model_len: int
          ) -> tuple[list[TraceRequest], list[int]]:
    """The requests vLLM accepts (prompt shorter than ``max_model_len``), and their
    1-based positions in the trace."""
    numbers = [i for i, r in enumerate(trace, start=1) if r.prompt_tokens < max_model_len]
    return [trace[i - 1] for i in numbers], numbers


def engine_settings(engine: fmt.Engine, max_num_seqs: int | None = None) -> dict[str, Any]:
    """:func:`simulate`'s engine keywords from an artifact's engine record (the one
    place that makes them); ``max_num_seqs``: the workload's concurrency, when it
    caps the requests running at once below the engine's."""
    return {"max_num_seqs": max_num_seqs or engine.max_num_seqs,
            "max_num_batched_tokens": engine.max_num_batched_tokens,
            "max_model_len": engine.max_model_len,
            "async_scheduling": engine.async_scheduling,
            "pipeline_parallel_size": engine.pipeline_parallel_size}


def simulate_artifact(artifact: Artifact, trace: Sequence[TraceRequest],
                      num_blocks: int | None = None, **settings: Any) -> SimResult:
    """:func:`simulate` for an artifact, with its engine's settings (any of
    which ``settings`` overrides) and ``num_blocks`` blocks (default: its own)."""
    return run_artifact(artifact, trace, num_blocks, **settings)[0]


def run_artifact(artifact: Artifact, trace: Sequence[TraceRequest], num_blocks: int | None = None,
                 **settings: Any) -> tuple[SimResult, KvspecEngine]:
    """:func:`run` for an artifact (see :func:`simulate_artifact`)."""
    kwargs = {**engine_settings(artifact.body.engine), **settings}
    return run(from_artifact(artifact, num_blocks), trace, **kwargs)
