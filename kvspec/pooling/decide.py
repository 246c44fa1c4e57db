"""The candidates a policy weighs, their figures, and the one it keeps."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from fractions import Fraction

from kvspec.artifact import format as fmt
from kvspec.errors import KvspecError
from kvspec.model.plan import Layout
from kvspec.model.pooling import Pooling, PoolingRef, Workload
from kvspec.model.specs import MambaState
from kvspec.passes.expand import expand
from kvspec.passes.parse import Parsed
from kvspec.passes.plan import plan
from kvspec.passes.size import Sized, size
from kvspec.passes.validate import validate
from kvspec.pooling.evaluate import Evaluation, Runs, WorkloadTrace, evaluate, workload_trace
from kvspec.pooling.figures import capacity_curve
from kvspec.pooling.layouts import PoolLayout, separate_layouts

__all__ = ["Candidate", "choose", "decide", "precheck"]


@dataclass(frozen=True, slots=True)
class Candidate:
    """One plan: a unified layout, or the pools of a separate plan."""

    name: str
    policy: str
    block_size: int
    layout: Layout
    pools: tuple[PoolLayout, ...] = ()
    #: Why the runtime asked for cannot serve it (then it is reported, not chosen).
    note: str | None = None
    #: The sized plan it was made from (the source's, or with other engine settings).
    sized: Sized | None = None

    @property
    def layouts(self) -> tuple[Layout, ...]:
        return tuple(p.layout for p in self.pools) or (self.layout,)

    @property
    def groups(self) -> int:
        return sum(len(x.groups) for x in self.layouts)

    @property
    def hash_block_size(self) -> int:
        return min(x.hash_block_size for x in self.layouts)


def resized(sized: Sized, **engine: object) -> Sized | None:
    """The source compiled again up to its sized plan with other engine settings
    (the source's ``engine`` keys: ``block_size``, ``prefix_caching``, ...); None
    when it does not plan, or plans as the source does."""
    source = sized.source
    changed = source.model_copy(update={"engine": source.engine.model_copy(update=engine)})
    parsed = Parsed(text=sized.text, file=sized.file, memory=sized.memory, doc=sized.doc,
                    source=changed)
    try:
        out = size(plan(validate(expand(parsed))))
    except KvspecError:
        return None
    if out.layout.groups == sized.layout.groups and out.layout.engine == sized.layout.engine:
        return None
    return out


def _has_state(sized: Sized) -> bool:
    """Whether the model has state layers: vLLM then sizes attention blocks to the
    state page (hybrid page unification), so no other attention block size is one
    it would run."""
    return any(isinstance(s, MambaState) for st in sized.expansion.stage_specs
               for s in st.values())


#: Factors the tuning tries on the share of the pools that hold per-request constants.
SPLIT_FACTORS = (0.5, 0.7, 1.4, 2.0)


def _scaled(pools: tuple[PoolLayout, ...], factor: float
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


def tune_separate(c: Candidate, e: Evaluation, sized: Sized, pooling: Pooling, tokens: int,
                  trace: WorkloadTrace, runs: Runs | None = None
                  ) -> tuple[Candidate, Evaluation]:
    """The separate plan's split tuned by simulation: the state (or windowed) pools'
    share scaled by each of :data:`SPLIT_FACTORS`; the split running the most
    requests on average wins."""
    best = (c, e)
    for factor in SPLIT_FACTORS:
        split = _scaled(c.pools, factor)
        if split is None:
            return best
        try:
            pools = separate_layouts(c.sized or sized, dataclasses.replace(pooling, split=split),
                                     tokens)
            cand = dataclasses.replace(c, pools=pools)
            ev = evaluate(cand, trace, sized, runs)
        except KvspecError:
            continue
        if ev.simulated and best[1].simulated and \
                ev.simulated["mean_running"] > best[1].simulated["mean_running"]:
            best = (cand, ev)
    return best


def _no_prefix_caching(sized: Sized) -> Sized | None:
    """The plan without prefix caching (state layers then keep one state per
    request: vLLM's mamba_cache_mode none), or None when it has none to turn off."""
    if not sized.layout.engine.enable_prefix_caching:
        return None
    if _has_state(sized):
        return resized(sized, prefix_caching=False, mamba_cache_mode="none")
    return resized(sized, prefix_caching=False)


def _separate(name: str, sized: Sized, pooling: Pooling, tokens: int) -> Candidate:
    base = sized.layout
    try:
        pools = separate_layouts(sized, pooling, tokens)
    except KvspecError as err:
        if pooling.policy == "separate":
            raise
        return Candidate(name, "separate", pooling.block_size, base, (),
                         f"cannot plan: {err.message}", sized)
    note = "vLLM 0.33 holds one shared pool" if pooling.serve_with == "vllm" else None
    return Candidate(name, "separate", pooling.block_size, base, pools, note, sized)


def candidates(sized: Sized, pooling: Pooling, tokens: int) -> list[Candidate]:
    """vLLM's plan first, then what the policy weighs: for ``auto``, the unified
    plan at other attention block sizes (models without state layers, whose block
    size vLLM derives from the state page) and without prefix caching (which frees
    the state blocks a request keeps for hits), and the separate plan of each."""
    base = sized.layout
    out = [Candidate("unified", "unified", base.engine.block_size, base, sized=sized)]
    if pooling.policy == "auto":
        sizes = () if _has_state(sized) else pooling.block_sizes
        for b in sizes:
            other = resized(sized, block_size=b)
            if other is not None and (pooling.max_groups is None
                                      or len(other.layout.groups) <= pooling.max_groups):
                out.append(Candidate(f"unified, block {b}", "unified", b, other.layout,
                                     sized=other))
        other = _no_prefix_caching(sized)
        if other is not None:
            out.append(Candidate("unified, no prefix caching", "unified",
                                     other.layout.engine.block_size, other.layout, sized=other))
    if pooling.policy == "separate":
        out.append(_separate("separate", sized, pooling, tokens))
    elif pooling.policy == "auto":
        out.append(_separate("separate", sized, pooling, tokens))
        other = _no_prefix_caching(sized)
        if other is not None:
            out.append(_separate("separate, no prefix caching", other, pooling, tokens))
    return out


def _within_max_groups(cands: list[Candidate], pooling: Pooling) -> list[Candidate]:
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
        curve=capacity_curve(c.layouts, tokens))


#: Capacities within this share of the best are a tie: a trace of a few hundred
#: requests does not tell smaller differences apart.
TIE = 0.01


def _capacity(e: Evaluation) -> float:
    """Requests run: simulated, else static at the workload."""
    return e.simulated["mean_running"] if e.simulated else (e.workload_requests or 0.0)


#: Layout waste shares closer than this are a tie (a sampled average).
WASTE_STEP = 0.001


def _layout_waste(e: Evaluation) -> float:
    """The share of the pools the layout loses while memory binds (0 when memory
    never binds: the layout is not what limits)."""
    waste = e.simulated.get("layout_waste") if e.simulated else None
    return round(waste / WASTE_STEP) * WASTE_STEP if waste is not None else 0.0


def _memory_bound_utilization(e: Evaluation) -> float:
    used = e.simulated.get("utilization_while_memory_bound") if e.simulated else None
    return used if used is not None else 0.0


def _tiebreak(c: Candidate, e: Evaluation) -> tuple[float, float, int, float, float]:
    """Among tied candidates, higher is better: the finer prefix-match unit (none at
    all, without prefix caching, is the coarsest: turning it off must buy capacity
    to be chosen), the smaller layout waste while memory binds (padding, inflation,
    per-request constants: not the idle blocks first-come admission leaves, nor steps
    where the request cap or the token budget binds), fewer groups, capacity, then
    the utilisation while memory binds."""
    caching = all(x.engine.enable_prefix_caching for x in c.layouts)
    unit = -c.hash_block_size if caching else float("-inf")
    return (unit, -_layout_waste(e), -c.groups, _capacity(e), _memory_bound_utilization(e))


def choose(cands: list[Candidate], evaluations: list[Evaluation]) -> int:
    """The candidate ``auto`` keeps: of those the runtime can serve, the highest
    capacity, where capacities within :data:`TIE` of the best tie (but none below
    the unified plan's, so ``auto`` never runs fewer requests than vLLM's plan)."""
    servable = [i for i, c in enumerate(cands) if c.note is None]
    if not servable:
        why = "; ".join(f"{c.name}: {c.note}" for c in cands)
        raise KvspecError(f"no plan can serve this workload ({why})",
                          ref=PoolingRef(("pooling", "workload")),
                          hint="give the KV cache more memory, a shorter max_model_len, or "
                               "a workload of shorter requests")
    best = max(_capacity(evaluations[i]) for i in servable)
    # never below vLLM's plan (the first candidate), even inside the tie band
    least = _capacity(evaluations[0]) if cands[0].note is None else 0.0
    tied = [i for i in servable if _capacity(evaluations[i]) >= max(best * (1 - TIE), least)]
    return max(tied, key=lambda i: _tiebreak(cands[i], evaluations[i]))


def _workload_record(w: Workload, tokens: int) -> fmt.WorkloadRecord:
    return fmt.WorkloadRecord(
        context_tokens=w.context.expected, output_tokens=w.output.expected, held_tokens=tokens,
        concurrency=w.concurrency, draft_tokens=w.draft_tokens,
        prefix_sharing=w.prefix_sharing, requests=w.requests, seed=w.seed, trace=w.trace,
        trace_sha256=w.trace_sha256)


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


def precheck(sized: Sized, pooling: Pooling) -> None:
    """What can be checked of the pooling section without simulating (``kvspec
    validate``): the workload's trace reads and has requests the engine admits, and
    a separate plan's pools (its split's names, each pool's share of the budget) plan."""
    trace = workload_trace(pooling.workload, sized) if pooling.workload is not None else None
    if pooling.workload is not None and trace is not None:
        servable(pooling.workload, trace, sized)
    tokens = trace.held_tokens if trace is not None else sized.layout.engine.max_model_len
    if pooling.policy == "separate":
        separate_layouts(sized, pooling, tokens)
    if pooling.policy == "auto" and pooling.max_groups is not None:
        _within_max_groups(candidates(sized, pooling, tokens), pooling)  # planned, not run


def decide(sized: Sized, pooling: Pooling
           ) -> tuple[Layout, tuple[PoolLayout, ...], fmt.PoolingRecord]:
    """The layout (or pools) the policy keeps, and the record of its decision."""
    workload = pooling.workload
    trace = workload_trace(workload, sized) if workload is not None else None
    if workload is not None and trace is not None:
        servable(workload, trace, sized)
    tokens = trace.held_tokens if trace is not None else sized.layout.engine.max_model_len
    cands, evaluations = [], []
    runs: Runs = {}
    for listed in _within_max_groups(candidates(sized, pooling, tokens), pooling):
        c = listed
        try:
            e = evaluate(c, trace, sized, runs)
        except KvspecError as err:
            if c.policy == pooling.policy and pooling.policy != "auto":
                raise
            c = dataclasses.replace(c, note=f"not simulated: {err.message}")
            e = evaluate(c, None, sized)
        if c.policy == "separate" and c.pools and trace is not None and \
                pooling.split is None and e.simulated:
            c, e = tune_separate(c, e, sized, pooling, tokens, trace, runs)
        cands.append(c)
        evaluations.append(e)
    if pooling.policy == "unified":
        chosen = 0
    elif pooling.policy == "separate":
        chosen = len(cands) - 1
    else:
        chosen = choose(cands, evaluations)
    keep = cands[chosen]
    record = fmt.PoolingRecord(
        asked=pooling.policy, policy=keep.policy,  # type: ignore[arg-type]
        serve_with=pooling.serve_with,
        block_size=pooling.block_size, state_block_size=pooling.state_block_size,
        pools=_shares(keep.pools),
        workload=_workload_record(trace.workload, tokens) if trace is not None else None,
        candidates=[_record(c, e, tokens) for c, e in zip(cands, evaluations)], chosen=chosen)
    return keep.layout, keep.pools, record



