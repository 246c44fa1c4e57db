"""The driver: the policy's candidates compiled, simulated and compared, the winner
kept with the record of the decision.

:func:`decide` takes the pool pass's place when :mod:`kvspec.compiler` runs the
pipeline; a source whose policy is ``unified`` and declares no workload gets the
pool pass itself (:func:`kvspec.passes.pool.pool`).
"""

from __future__ import annotations

import dataclasses

from kvspec.artifact import format as fmt
from kvspec.errors import KvspecError
from kvspec.model.pooling import Pooling, PoolingRef, Workload
from kvspec.passes.pool import Pooled, PoolLayout, pool, pooled, separate_layouts
from kvspec.passes.size import Sized
from kvspec.pooling.candidates import Candidate, candidates
from kvspec.pooling.choose import choose, tune_separate, within_max_groups
from kvspec.pooling.evaluate import Evaluation, Runs, WorkloadTrace, evaluate, workload_trace
from kvspec.pooling.figures import capacity_curve

__all__ = ["check_pool", "decide", "precheck", "servable"]


def _simulated(summary: dict[str, object]) -> fmt.Simulated:
    by_reason = summary.get("waiting_steps_by_reason")
    return fmt.Simulated(**{**summary, "waiting_steps_by_reason":  # type: ignore[arg-type]
                            fmt.WaitingSteps(**by_reason) if isinstance(by_reason, dict)
                            else None})


def _record(c: Candidate, e: Evaluation, tokens: int) -> fmt.Candidate:
    return fmt.Candidate(
        name=c.name, policy=c.policy, block_size=c.block_size, groups=c.groups,
        static_requests=e.static_requests, workload_requests=e.workload_requests,
        physical_limit=e.physical_limit,
        simulated=_simulated(e.simulated) if e.simulated else None, tokens_held=e.tokens_held,
        waste=e.waste, binding_pool=e.binding_pool, note=c.note,
        curve=capacity_curve(c.figures, tokens))


def _workload_record(w: Workload, tokens: int) -> fmt.WorkloadRecord:
    return fmt.WorkloadRecord(
        context_tokens=w.context.expected, output_tokens=w.output.expected, held_tokens=tokens,
        concurrency=w.concurrency, draft_tokens=w.draft_tokens,
        prefix_sharing=w.prefix_sharing, requests=w.requests, seed=w.seed, trace=w.trace,
        trace_sha256=w.trace_sha256)


def _judged(pooling: Pooling, trace: WorkloadTrace | None) -> fmt.Judged | None:
    """What ``auto`` judged by, when it judged in time (None: by mean running, as
    before: the record is unchanged)."""
    if pooling.policy != "auto" or pooling.judged_by == "mean_running":
        return None
    p = pooling.profile
    return fmt.Judged(
        metric=pooling.judged_by,  # type: ignore[arg-type]
        slo=[x.text for x in pooling.slo],
        profile=p.path if p is not None else None,
        profile_sha256=p.sha256 if p is not None else None,
        step_ms=None if p is not None or trace is None else trace.workload.step_ms)


def _shares(pools: tuple[PoolLayout, ...]) -> list[fmt.PoolShare]:
    return [fmt.PoolShare(name=p.name, share=[p.share.numerator, p.share.denominator],
                          state=p.state, budget=p.layout.budget) for p in pools]


def servable(workload: Workload, trace: WorkloadTrace, sized: Sized) -> None:
    """Refuse a workload no plan can serve, at the workload: prompts of max_model_len
    or more (vLLM refuses them), every one of a trace's, or a summary's on average
    (its synthetic trace would otherwise cut them short and say nothing)."""
    limit = sized.layout.engine.max_model_len
    hint = (f"the engine admits prompts shorter than max_model_len ({limit:,}): give "
            "shorter requests, or a larger engine.max_model_len")
    if workload.trace is not None:
        refused = sum(1 for r in trace.requests if r.prompt_tokens >= limit)
        if trace.requests and refused == len(trace.requests):
            raise KvspecError(
                f"no plan can serve this workload: all {refused:,} request"
                f"{'s' if refused != 1 else ''} of the trace have a prompt of max_model_len "
                f"({limit:,} tokens) or more", ref=PoolingRef(("pooling", "workload", "trace")),
                found=f"the shortest prompt has {min(r.prompt_tokens for r in trace.requests):,}"
                      " tokens", hint=hint)
        return
    mean = workload.context.expected
    if mean >= limit:
        raise KvspecError(
            f"no plan can serve this workload: its prompts average {mean:,.0f} tokens, "
            f"max_model_len ({limit:,}) or more",
            ref=PoolingRef(("pooling", "workload", "context_tokens")),
            found=f"{mean:,.0f} tokens", expected=f"fewer than {limit:,} tokens", hint=hint)


def _trace(sized: Sized, pooling: Pooling) -> tuple[WorkloadTrace | None, int]:
    """The workload's trace (checked servable) and the tokens a request holds: on
    average at the workload, else ``max_model_len``."""
    workload = pooling.workload
    if workload is None:
        return None, sized.layout.engine.max_model_len
    trace = workload_trace(workload, sized)
    servable(workload, trace, sized)
    return trace, trace.held_tokens


def precheck(sized: Sized, pooling: Pooling) -> None:
    """What can be checked of the pooling section without simulating (``kvspec
    validate``): the workload's trace reads and has requests the engine admits, and
    a separate plan's pools (its split's names, each pool's share of the budget) plan."""
    _, tokens = _trace(sized, pooling)
    if pooling.policy == "separate":
        separate_layouts(sized, pooling, tokens)
    if pooling.policy == "auto" and pooling.max_groups is not None:
        within_max_groups(candidates(sized, pooling, tokens), pooling)  # compiled, not run


def check_pool(sized: Sized) -> Sized:
    """The pooling section's checks that need no simulation (``kvspec validate``):
    the workload's trace reads, a separate plan's pools plan. Gives ``sized`` back."""
    precheck(sized, sized.expansion.pooling)
    return sized


def _evaluated(c: Candidate, pooling: Pooling, trace: WorkloadTrace | None, tokens: int,
               engine: fmt.Engine, budget: int | None, runs: Runs
               ) -> tuple[Candidate, Evaluation]:
    """``c`` and its figures; a candidate that cannot be simulated is noted (the one
    the policy asks for, unless ``auto``, raises); a separate plan's split tuned."""
    try:
        e = evaluate(c, trace, engine, budget, runs, pooling)
    except KvspecError as err:
        if c.policy == pooling.policy and pooling.policy != "auto":
            raise
        c = dataclasses.replace(c, note=f"not simulated: {err.message}")
        e = evaluate(c, None, engine, budget)
    if c.policy == "separate" and c.pools and trace is not None and \
            pooling.split is None and e.simulated:
        c, e = tune_separate(c, e, pooling, tokens, trace, engine, budget, runs)
    return c, e


def decide(sized: Sized) -> Pooled:
    """The pool pass as the compiler runs it: the plan the source's policy keeps,
    and the record of its decision (none for ``unified`` without a workload)."""
    pooling = sized.expansion.pooling
    if pooling.policy == "unified" and pooling.workload is None:
        return pool(sized)
    trace, tokens = _trace(sized, pooling)
    listed = within_max_groups(candidates(sized, pooling, tokens), pooling)
    engine = listed[0].artifact.body.engine  # vLLM's plan: the source's settings
    runs: Runs = {}
    cands, evaluations = [], []
    for listed_one in listed:
        c, e = _evaluated(listed_one, pooling, trace, tokens, engine, sized.budget_bytes, runs)
        cands.append(c)
        evaluations.append(e)
    if pooling.policy == "unified":
        chosen = 0
    elif pooling.policy == "separate":
        chosen = len(cands) - 1
    else:
        chosen = choose(cands, evaluations, pooling.judged_by)
    keep = cands[chosen]
    record = fmt.PoolingRecord(
        asked=pooling.policy, policy=keep.policy,  # type: ignore[arg-type]
        serve_with=pooling.serve_with,
        block_size=pooling.block_size, state_block_size=pooling.state_block_size,
        pools=_shares(keep.pools),
        workload=_workload_record(trace.workload, tokens) if trace is not None else None,
        candidates=[_record(c, e, tokens) for c, e in zip(cands, evaluations)], chosen=chosen,
        judged_by=_judged(pooling, trace))
    # the source's compile, with the kept candidate's plan (as the pool pass gives it)
    return dataclasses.replace(pooled(sized, keep.pools, record), layout=keep.layout)
