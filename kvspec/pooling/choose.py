"""The chooser's rules: which candidates ``auto`` may keep, which it keeps, and a
separate plan's split tuned by simulation."""

from __future__ import annotations

import dataclasses
from fractions import Fraction

from kvspec.artifact import format as fmt
from kvspec.errors import KvspecError
from kvspec.model.pooling import Pooling, PoolingRef
from kvspec.passes.pool import PoolLayout
from kvspec.pooling.candidates import Candidate, separated
from kvspec.pooling.evaluate import Evaluation, Runs, WorkloadTrace, evaluate

__all__ = ["JUDGED", "SPLIT_FACTORS", "TIE", "WASTE_STEP", "capacity", "choose", "scaled",
           "tiebreak", "tune_separate", "within_max_groups"]

#: Capacities within this share of the best are a tie: a trace of a few hundred
#: requests does not tell smaller differences apart.
TIE = 0.01

#: Layout waste shares closer than this are a tie (a sampled average).
WASTE_STEP = 0.001

#: Factors the tuning tries on the share of the pools that hold per-request constants.
SPLIT_FACTORS = (0.5, 0.7, 1.4, 2.0)


def within_max_groups(cands: list[Candidate], pooling: Pooling) -> list[Candidate]:
    """``auto``'s candidates, those with more groups than ``max_groups`` noted (reported,
    not chosen); an error at ``max_groups`` when that leaves none to choose."""
    most = pooling.max_groups
    if most is None or pooling.policy != "auto":
        return cands
    out = [c if c.groups <= most or c.note is not None else
           dataclasses.replace(c, note=f"{c.groups} groups, more than max_groups ({most})")
           for c in cands]
    if all(c.note is not None for c in out):
        fewest = min(c.groups for c in cands)
        shown = "; ".join(f"{c.name}: {c.groups}" for c in cands)
        raise KvspecError(f"no candidate plan has at most max_groups ({most}) groups "
                          f"({shown})", ref=PoolingRef(("pooling", "max_groups")),
                          found=str(most), expected=f"at least {fewest}",
                          hint=f"raise max_groups to {fewest} or more, or remove it")
    return out


#: What ``auto`` keeps the most of (:attr:`Pooling.judged_by`): the simulation's key.
JUDGED = {"mean_running": "mean_running", "throughput": "requests_per_s",
          "goodput": "goodput_requests_per_s"}


def capacity(e: Evaluation, by: str = "mean_running") -> float:
    """What ``auto`` judges by (``by``: a key of :data:`JUDGED`), simulated: requests
    running on average, requests/s, or goodput at the SLO; without a simulation, the
    requests the blocks hold statically at the workload."""
    if not e.simulated:
        return e.workload_requests or 0.0
    value = e.simulated.get(JUDGED[by])
    return float(value) if value is not None else 0.0


def _layout_waste(e: Evaluation) -> float:
    """The share of the pools the layout loses while memory binds (0 when memory
    never binds: the layout is not what limits)."""
    waste = e.simulated.get("layout_waste") if e.simulated else None
    return round(waste / WASTE_STEP) * WASTE_STEP if waste is not None else 0.0


def _memory_bound_utilization(e: Evaluation) -> float:
    used = e.simulated.get("utilization_while_memory_bound") if e.simulated else None
    return used if used is not None else 0.0


def tiebreak(c: Candidate, e: Evaluation, by: str = "mean_running"
             ) -> tuple[float, float, int, float, float]:
    """Among tied candidates, higher is better: the finer prefix-match unit (none at
    all, without prefix caching, is the coarsest: turning it off must buy capacity
    to be chosen), the smaller layout waste while memory binds (padding, inflation,
    per-request constants: not the idle blocks first-come admission leaves, nor steps
    where the request cap or the token budget binds), fewer groups, capacity, then
    the utilisation while memory binds."""
    caching = all(x.engine.enable_prefix_caching for x in c.layouts)
    unit = -c.hash_block_size if caching else float("-inf")
    return (unit, -_layout_waste(e), -c.groups, capacity(e, by), _memory_bound_utilization(e))


def choose(cands: list[Candidate], evaluations: list[Evaluation],
           by: str = "mean_running") -> int:
    """The candidate ``auto`` keeps: of those the runtime can serve, the highest
    capacity (``by``: mean running, throughput or goodput, :func:`capacity`), where
    capacities within :data:`TIE` of the best tie (but none below the unified plan's,
    so ``auto`` never does worse than vLLM's plan)."""
    servable = [i for i, c in enumerate(cands) if c.note is None]
    if not servable:
        why = "; ".join(f"{c.name}: {c.note}" for c in cands)
        raise KvspecError(f"no plan can serve this workload ({why})",
                          ref=PoolingRef(("pooling", "workload")),
                          hint="give the KV cache more memory, a shorter max_model_len, or "
                               "a workload of shorter requests")
    best = max(capacity(evaluations[i], by) for i in servable)
    # never below vLLM's plan (the first candidate), even inside the tie band
    least = capacity(evaluations[0], by) if cands[0].note is None else 0.0
    tied = [i for i in servable
            if capacity(evaluations[i], by) >= max(best * (1 - TIE), least)]
    return max(tied, key=lambda i: tiebreak(cands[i], evaluations[i], by))


def scaled(pools: tuple[PoolLayout, ...], factor: float
           ) -> tuple[tuple[str, Fraction], ...] | None:
    """The split with the state pools' share (or, without state pools, the windowed
    pools') times ``factor``, the others' scaled to fill the rest."""
    fixed = [p for p in pools if p.state] or \
        [p for p in pools if p.name.startswith(("sliding", "chunked"))]
    if not fixed or len(fixed) == len(pools):
        return None
    a = sum(p.share for p in fixed)
    target = min(Fraction(95, 100), (a * Fraction(factor)).limit_denominator(1 << 20))
    out = [(p.name, (p.share * target / a if p in fixed else p.share * (1 - target) / (1 - a))
            .limit_denominator(1 << 20)) for p in pools]
    out[-1] = (out[-1][0], 1 - sum((s for _, s in out[:-1]), Fraction(0)))
    return tuple(out)


def tune_separate(c: Candidate, e: Evaluation, pooling: Pooling, tokens: int,
                  trace: WorkloadTrace, engine: fmt.Engine, budget: int | None,
                  runs: Runs | None = None) -> tuple[Candidate, Evaluation]:
    """The separate plan's split tuned by simulation: the state (or windowed) pools'
    share scaled by each of :data:`SPLIT_FACTORS`, each split compiled and
    simulated; the split with the most of what ``auto`` judges by
    (:attr:`Pooling.judged_by`: mean running, throughput or goodput) wins."""
    by = pooling.judged_by
    best = (c, e)
    for factor in SPLIT_FACTORS:
        split = scaled(c.pools, factor)
        if split is None:
            return best
        try:
            cand = separated(c.name, c.pooled, dataclasses.replace(pooling, split=split),
                             tokens)
            ev = evaluate(cand, trace, engine, budget, runs, pooling)
        except KvspecError:
            continue
        if ev.simulated and best[1].simulated and capacity(ev, by) > capacity(best[1], by):
            best = (cand, ev)
    return best
