"""A candidate's capacity at the workload: static figures, and the simulation.

The workload becomes a request trace (the source's, or one drawn from its summary,
seeded), replayed through kvspec's request-level manager and its model of vLLM
v1's scheduler (:mod:`kvspec.sim`) on the candidate's pools, sized for the budget.
The waste is measured there: of the pools' bytes, averaged over the steps where
memory keeps requests waiting (not the request cap or the token budget: then the
layout is not what limits), what padding slots, padded pages, block inflation
(token slots blocks hold beyond their requests' tokens), per-request constants
(state blocks beyond the one live state, window blocks beyond the window) and
idle blocks (held by no running request) take: with the live bytes, they add up
to the pools' bytes. The first four are the layout's waste (``layout_waste``, a
share of the pools); idle blocks are the scheduler's (first-come admission waits
for the next request's whole prompt to fit).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvspec import notes
from kvspec.artifact import format as fmt
from kvspec.errors import KvspecError
from kvspec.interrupts import deferred
from kvspec.model.pooling import Pooling, PoolingRef, Workload
from kvspec.model.steptime import ConstantStepTime
from kvspec.passes.size import Sized
from kvspec.pooling.candidates import Candidate
from kvspec.pooling.figures import Figures
from kvspec.runtime.manager import ManagedLayout, from_artifact
from kvspec.sim import SimResult, TraceRequest, engine_settings, generate_trace, simulate
from kvspec.sim.formats import Columns, read_requests
from kvspec.sim.presets import preset_trace

__all__ = ["Evaluation", "Runs", "WorkloadTrace", "evaluate", "layout_waste", "timing",
           "timed_figures", "waste_of", "workload_trace"]


@dataclass(frozen=True, slots=True)
class WorkloadTrace:
    """The workload, and the trace that stands for it."""

    workload: Workload
    requests: tuple[TraceRequest, ...]

    @property
    def held_tokens(self) -> int:
        """Tokens a running request holds on average: its prompt, half its output,
        the draft tokens."""
        if not self.requests:
            return self.workload.held_tokens
        mean = math.fsum(r.prompt_tokens + r.output_tokens / 2 for r in self.requests)
        return round(mean / len(self.requests) + self.workload.draft_tokens)


def workload_trace(workload: Workload, sized: Sized) -> WorkloadTrace:
    """The trace the workload declares, or one drawn from its summary."""
    if workload.trace is not None:
        path = Path(workload.trace)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise KvspecError(f"cannot read the workload's trace {workload.trace}: "
                              f"{exc.strerror or exc}", ref=PoolingRef(("pooling", "workload",
                                                                        "trace")),
                              hint="give the trace's path relative to the source file"
                              ) from None
        columns = Columns(*workload.columns) if workload.columns else None
        requests = read_requests(path, workload.trace_format, step_ms=workload.step_ms,
                                 columns=columns)
        summary = Workload(
            context=workload.context, output=workload.output,
            draft_tokens=workload.draft_tokens, requests=len(requests), seed=workload.seed,
            trace=workload.trace, trace_sha256=hashlib.sha256(data).hexdigest())
        return WorkloadTrace(summary, requests)
    w = workload
    if w.preset is not None:
        return WorkloadTrace(w, preset_trace(
            w.preset, w.requests, seed=w.seed, step_ms=w.step_ms,
            max_prompt_tokens=sized.layout.engine.max_model_len - 1))
    requests = generate_trace(
        w.requests, seed=w.seed, prompt_mean=w.context.expected,
        prompt_spread=w.context.spread, output_mean=w.output.expected,
        output_spread=w.output.spread, max_prompt_tokens=sized.layout.engine.max_model_len - 1,
        prefix_groups=1 if w.prefix_sharing else 0, prefix_share=w.prefix_sharing,
        prefix_tokens=w.prefix_tokens)
    return WorkloadTrace(w, requests)


@dataclass(frozen=True, slots=True)
class Evaluation:
    """A candidate's figures (see :class:`kvspec.artifact.format.Candidate`)."""

    static_requests: float | None
    workload_requests: float | None
    physical_limit: float | None
    simulated: dict[str, Any] | None = None
    tokens_held: float | None = None
    waste: fmt.Waste | None = None
    binding_pool: str | None = None


def _static(candidate: Candidate, tokens: int) -> tuple[float | None, float | None, str | None]:
    """Static requests at max_model_len and at ``tokens``, and the binding pool."""
    static = candidate.figures.static_requests()
    at_tokens = candidate.figures.workload_requests(tokens)
    if static is None or any(v is None for v, _ in at_tokens):
        return None, None, None
    low = min(at_tokens)
    return static, low[0], low[1]


def waste_of(result: SimResult, body: fmt.Layout) -> tuple[float | None, fmt.Waste | None]:
    """Mean tokens held and the waste kinds while memory keeps requests waiting, from
    the samples of a simulation run with ``sample_held`` over the pools of the
    artifact whose ``body`` this is; None, None when memory never did."""
    held = result.held_while_memory_bound()
    if held is None:
        return None, None
    running, live, blocks, tokens = held
    per_group = Figures(body).block_bytes
    if len(per_group) != len(blocks):
        return None, None
    useful = sum(h * u for h, (u, _, _, _) in zip(blocks, per_group))
    padded = sum(h * p for h, (_, p, _, _) in zip(blocks, per_group))
    slots = sum(h * s for h, (_, _, s, _) in zip(blocks, per_group))
    states = sum(h * u for h, (u, _, _, st) in zip(blocks, per_group) if st)
    one_state = sum(u for u, _, _, st in per_group if st)
    per_request = max(states - running * one_state, 0.0)
    inflation = max(useful - live - per_request, 0.0)
    idle = max(result.pool_bytes - useful - padded - slots, 0.0)
    return round(tokens, 1), fmt.Waste(pool_bytes=result.pool_bytes, padding_slots=round(slots),
                             padded_pages=round(padded), block_inflation=round(inflation),
                             per_request=round(per_request), idle=round(idle))


def _told(name: str) -> Callable[[int, int], None] | None:
    """The simulation's progress as lines for :mod:`kvspec.notes` (None: nobody hears)."""
    if not notes.is_heard():
        return None

    def tick(finished: int, total: int) -> None:
        notes.tell(f"pooling: simulating {name}, {finished:,} of {total:,} requests finished")
    return tick


def layout_waste(waste: fmt.Waste | None) -> float | None:
    """The layout's share of the pool while memory binds: padding slots, padded
    pages, block inflation and per-request constants (idle blocks are the
    scheduler's)."""
    if waste is None or not waste.pool_bytes:
        return None
    lost = waste.padding_slots + waste.padded_pages + waste.block_inflation + waste.per_request
    return round(lost / waste.pool_bytes, 6)


def _unnamed(managed: ManagedLayout) -> ManagedLayout:
    """``managed`` with its name and its pools' names left out: what a simulation reads
    (two candidates whose pools differ only in name, such as a one-class model's
    separate plan and its unified plan, simulate alike)."""
    names = {p.name: str(i) for i, p in enumerate(managed.pools)}
    return dataclasses.replace(
        managed, name="", pools=tuple(dataclasses.replace(p, name=names[p.name])
                                      for p in managed.pools),
        groups=tuple(dataclasses.replace(g, pool=names[g.pool]) for g in managed.groups))


#: Simulations already run in one decision, by what they read (:func:`_unnamed`, the
#: engine settings); the trace is the decision's.
Runs = dict[tuple[ManagedLayout, tuple[tuple[str, Any], ...]], SimResult]


def timing(pooling: Pooling) -> dict[str, Any]:
    """:func:`~kvspec.sim.simulate`'s keywords for ``auto``'s judgement in time: none
    when it judges by mean running (no SLO, no profile); else every request timed, on
    the profile's clock or, with an SLO and no profile, the constant model at the
    workload's ``step_ms``."""
    if pooling.judged_by == "mean_running":
        return {}
    step_ms = pooling.workload.step_ms if pooling.workload is not None else 20.0
    model = pooling.profile.step_time() if pooling.profile is not None else \
        ConstantStepTime(step_ms)
    return {"step_time": model, "step_ms": step_ms, "latency": True}


def timed_figures(result: SimResult, pooling: Pooling) -> dict[str, Any]:
    """A timed run's figures for the decision: throughput (requests and output tokens
    a second) and, with an SLO, goodput (:mod:`kvspec.sim.latency`)."""
    if result.latency is None:
        return {}
    d = result.latency.as_dict(pooling.slo)
    out = {"requests_per_s": d["requests_per_s"],
           "output_tokens_per_s": d["output_tokens_per_s"]}
    if pooling.slo:
        out["goodput_requests_per_s"] = d["slo"]["goodput_requests_per_s"]
    return out


def evaluate(candidate: Candidate, trace: WorkloadTrace | None, engine: fmt.Engine,
             budget: int | None, runs: Runs | None = None,
             pooling: Pooling | None = None) -> Evaluation:
    """``candidate``'s figures at the workload; its artifact simulated when there is
    a budget, under the source's ``engine`` settings (its artifact's engine record).
    ``runs``: simulations of this decision so far (the simulation is deterministic, so
    a candidate whose pools simulate alike reuses one; its waste is still its own).
    ``pooling``: with an SLO or a profile, the run is timed (:func:`timing`) and its
    throughput and goodput join the figures."""
    tokens = trace.held_tokens if trace is not None else engine.max_model_len
    static, at_tokens, binding = _static(candidate, tokens)
    live = candidate.figures.live_bytes(tokens)
    physical = budget / live if budget is not None and live else None
    if trace is None or budget is None or candidate.note:
        return Evaluation(static, at_tokens, physical, binding_pool=binding)
    managed = from_artifact(candidate.artifact)
    settings = engine_settings(engine, trace.workload.concurrency)
    key = (_unnamed(managed), tuple(settings.items()))
    result = runs.get(key) if runs is not None else None
    if result is None:
        result = simulate(managed, trace.requests, sample_held=True,
                          progress=_told(candidate.name), **settings,
                          **(timing(pooling) if pooling is not None else {}))
        if runs is not None:
            runs[key] = result
    with deferred():   # compiled code (kvspec.interrupts)
        tokens_held, waste = waste_of(result, candidate.artifact.body)
        simulated = {**result.as_dict(), "layout_waste": layout_waste(waste),
                     **(timed_figures(result, pooling) if pooling is not None else {})}
    return Evaluation(static, at_tokens, physical, simulated=simulated,
                      tokens_held=tokens_held, waste=waste, binding_pool=binding)
