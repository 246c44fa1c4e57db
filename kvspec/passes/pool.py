"""The pool pass: the sized unified plan -> the plan the pooling policy keeps,
without simulating anything.

* ``unified`` keeps the sized plan as it is;
* ``separate`` plans each class of layers in a pool of its own
  (:mod:`kvspec.planner.separate`), each sized for its share of the budget
  (:func:`separate_layouts`).

Every decision that simulates -- ``auto``'s choice, a declared workload's figures,
tuning a separate plan's split -- is a driver above the compiler
(:mod:`kvspec.pooling`): it compiles each candidate through this pipeline and
compares their artifacts. :mod:`kvspec.compiler` runs it in this pass's place.

>>> from kvspec.compiler import Sized, compile_until
>>> from kvspec.model.pooling import Pooling
>>> sized = compile_until("layouts/gemma-3-27b-it.yaml", Sized)
>>> pools = separate_layouts(sized, Pooling(policy="separate", serve_with="kvspec"), 2048)
>>> [(p.name, p.layout.budget.num_blocks) for p in pools]
[('sliding_window_1024', 10583), ('full_attention', 10501)]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from kvspec.artifact import format as fmt
from kvspec.artifact.sizing import share_of
from kvspec.errors import KvspecError
from kvspec.model.engine import Engine
from kvspec.model.plan import Layout
from kvspec.model.pooling import Pooling, PoolingRef
from kvspec.model.quant.cells import Quantized
from kvspec.model.specs import LayerSpec
from kvspec.passes.size import Sized
from kvspec.planner import build_layout, size_plan
from kvspec.planner.separate import PoolPlan, plan_separate

__all__ = ["PoolLayout", "Pooled", "floored", "pool", "pool_layouts", "pooled",
           "separate_layouts"]


@dataclass(frozen=True, slots=True)
class PoolLayout:
    """One pool of a ``separate`` plan: its class's layout, sized for its share."""

    name: str
    layout: Layout
    share: Fraction
    state: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Pooled(Sized):
    """The plan the policy keeps: the unified layout (``pools`` empty), or one
    layout per pool; and the decision, when there was one to make."""

    pools: tuple[PoolLayout, ...]
    decision: fmt.PoolingRecord | None


def pooled(sized: Sized, pools: tuple[PoolLayout, ...] = (),
           decision: fmt.PoolingRecord | None = None) -> Pooled:
    """``sized`` kept as the plan (with ``pools``, a separate plan of it), and the
    decision that kept it."""
    return Pooled(text=sized.text, file=sized.file, memory=sized.memory, doc=sized.doc,
                  source=sized.source, expansion=sized.expansion, plan=sized.plan,
                  layout=sized.layout, budget_bytes=sized.budget_bytes, pools=pools,
                  decision=decision)


def pool(sized: Sized) -> Pooled:
    """The source's policy, planned statically: ``separate``'s pools for requests
    of ``max_model_len`` tokens; any other policy keeps the unified plan.

    >>> from kvspec.compiler import compile_until
    >>> from kvspec.passes.pipeline import PASSES, run
    >>> out = run(compile_until("layouts/llama-3.1-8b.yaml", Sized), PASSES[6:7])
    >>> out.pools, out.decision
    ((), None)
    """
    pooling = sized.expansion.pooling
    if pooling.policy != "separate":
        return pooled(sized)
    return pooled(sized, separate_layouts(sized, pooling, sized.layout.engine.max_model_len))


def _fitted(p: PoolPlan, max_model_len: int) -> PoolPlan:
    """The pool's plan at the final ``max_model_len`` (fitted to the budget when
    the source says auto)."""
    engine = p.plan.engine
    if engine.max_model_len == max_model_len:
        return p
    engine = dataclasses.replace(engine, max_model_len=max_model_len,
                                 original_max_model_len=max_model_len)
    return dataclasses.replace(p, plan=dataclasses.replace(p.plan, engine=engine))


def _least(name: str, model: str | None, p: PoolPlan,
           quantization: Mapping[str, Quantized | None]) -> int:
    """The fewest bytes that serve one request at ``max_model_len`` in pool ``p``."""
    return build_layout(name, model, p.plan, None, quantization).min_memory()


def floored(shares: Sequence[Fraction], least: Sequence[int], budget: int) -> list[Fraction]:
    """``shares`` with each pool's raised to what serves one request at max_model_len
    (``least`` bytes of ``budget``), the others scaled down to fill the rest; the
    shares as they were when no pool needs raising or the floors alone overfill.

    >>> floored([Fraction(9, 10), Fraction(1, 10)], [100, 300], 1000)
    [Fraction(7, 10), Fraction(3, 10)]
    """
    floor = [Fraction(n, budget) for n in least]
    if all(s >= f for s, f in zip(shares, floor)) or sum(floor) >= 1:
        return list(shares)
    fixed = [s < f for s, f in zip(shares, floor)]
    while True:
        rest = 1 - sum((f for f, x in zip(floor, fixed) if x), Fraction(0))
        free = sum((s for s, x in zip(shares, fixed) if not x), Fraction(0))
        out = [f if x else s * rest / free for s, f, x in zip(shares, floor, fixed)]
        more = [not x and o < f for o, f, x in zip(out, floor, fixed)]
        if not any(more):
            out = [o.limit_denominator(1 << 20) for o in out]
            out[-1] = 1 - sum(out[:-1], Fraction(0))
            return out
        fixed = [x or m for x, m in zip(fixed, more)]


def pool_layouts(name: str, model: str | None, engine: Engine,
                 stage_specs: Sequence[Mapping[str, LayerSpec]],
                 quantization: Mapping[str, Quantized | None], pooling: Pooling, tokens: int,
                 budget: int | None, max_model_len: int) -> tuple[PoolLayout, ...]:
    """The separate plan of these layers, each pool sized for its share of
    ``budget`` (when there is one): what compiling and re-planning both run. Shares
    split by demand are floored at what serves one request at ``max_model_len``, so
    no pool is too small for the longest request the engine admits."""
    plans = [_fitted(p, max_model_len) for p in plan_separate(engine, stage_specs, pooling,
                                                               tokens)]
    if budget is not None and pooling.split is None:
        least = [_least(name, model, p, quantization) for p in plans]
        shares = floored([p.share for p in plans], least, budget)
        plans = [dataclasses.replace(p, share=s) for p, s in zip(plans, shares)]
    out = []
    for p in plans:
        sizing = None
        if budget is not None:
            memory = share_of(budget, p.share)
            try:
                sizing = size_plan(p.plan, memory=memory)
            except KvspecError as err:
                raise err.replace(
                    message=f"pool {p.name} ({float(p.share):.1%} of the budget, "
                            f"{memory:,} bytes): {err.message}", ref=PoolingRef(),
                    hint="give the KV cache more memory, a shorter max_model_len, or this "
                         "pool a larger share (pooling.split)") from None
        layout = build_layout(name, model, p.plan, sizing, quantization)
        out.append(PoolLayout(p.name, layout, p.share, p.state))
    return tuple(out)


def separate_layouts(sized: Sized, pooling: Pooling, tokens: int) -> tuple[PoolLayout, ...]:
    """The separate plan of ``sized``'s layers for requests holding ``tokens``
    tokens, each pool sized for its share of the budget (when there is one)."""
    ex = sized.expansion
    return pool_layouts(sized.source.name, sized.source.model, ex.engine, ex.stage_specs,
                        ex.quantization, pooling, tokens, sized.budget_bytes,
                        sized.layout.engine.max_model_len)
