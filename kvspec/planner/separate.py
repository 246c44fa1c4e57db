"""The ``separate`` pooling policy: one pool per class of layers, at its native size.

A class is a layer kind with its window: full attention, each sliding window,
chunked local attention, MLA, state layers. Each class is planned on its own
(:func:`~kvspec.planner.plan.plan_layers`: one uniform group, no padding slots,
no page unification), attention at ``pooling.block_size`` tokens per block
(16 by default, however large the state pages are), state layers at their own
state block size, and placed in a pool of its own. The budget is split between
the pools by their demand at the workload (:func:`demand_shares`), or by the
source's ``split``.

>>> from kvspec.model.engine import Engine
>>> from kvspec.model.specs import FullAttention, SlidingWindow
>>> f = FullAttention(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")
>>> w = SlidingWindow(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16",
...                   sliding_window=1024)
>>> specs = [{"l0": w, "l1": w, "l2": f}]
>>> [(c.name, c.layers) for c in classes(specs)]
[('sliding_window_1024', ('l0', 'l1')), ('full_attention', ('l2',))]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from kvspec.errors import LayerRef, PlanError
from kvspec.model import kinds
from kvspec.model.blocks import pool_engine
from kvspec.model.engine import Engine
from kvspec.model.plan import Plan
from kvspec.model.pooling import Pooling, PoolingRef
from kvspec.model.specs import Attention, LayerSpec, MambaState, replace
from kvspec.planner.plan import plan_layers

__all__ = ["LayerClass", "PoolPlan", "classes", "demand_shares", "plan_separate"]



@dataclass(frozen=True, slots=True)
class LayerClass:
    """Layers that share a pool: one kind, one window."""

    name: str
    layers: tuple[str, ...]
    state: bool


@dataclass(frozen=True, slots=True)
class PoolPlan:
    """One pool of a separate plan: a plan of its class's layers alone, and its
    share of the budget."""

    name: str
    plan: Plan
    share: Fraction
    state: bool


def _class_name(spec: LayerSpec) -> str:
    kind = kinds.of(spec)
    window = getattr(spec, "sliding_window", None)
    chunk = getattr(spec, "attention_chunk_size", None)
    if kind.name in ("sliding_window", "sliding_window_mla") and window:
        return f"{kind.name}_{window}"
    if kind.name == "chunked_local" and chunk:
        return f"{kind.name}_{chunk}"
    return kind.name


def classes(stage_specs: Sequence[Mapping[str, LayerSpec]]) -> list[LayerClass]:
    """The layer classes of a model, in first-layer order."""
    found: dict[str, list[str]] = {}
    state: dict[str, bool] = {}
    for stage in stage_specs:
        for name, spec in stage.items():
            kind = kinds.of(spec)
            if not kind.separable:
                raise PlanError(
                    f"the separate policy does not pool {kind.name} layers ({name})",
                    ref=LayerRef(name), found=kind.name,
                    expected="full attention, sliding-window, chunked local, MLA and state "
                             "layers",
                    hint="keep policy: unified for this model (its layout needs the unified "
                         "planner's pool)")
            key = _class_name(spec)
            found.setdefault(key, []).append(name)
            state[key] = kind.state
    return [LayerClass(k, tuple(v), state[k]) for k, v in found.items()]


def _respec(spec: LayerSpec, engine: Engine) -> LayerSpec:
    """A layer's spec at its pool's block size (attention: the pool's; state
    layers: the state block size)."""
    if spec.block_size == engine.block_size:
        return spec
    if isinstance(spec, (Attention, MambaState)):
        respecced: LayerSpec = replace(spec, block_size=engine.block_size)
        return respecced
    return spec


def class_plans(engine: Engine, stage_specs: Sequence[Mapping[str, LayerSpec]],
                pooling: Pooling) -> list[tuple[LayerClass, Plan]]:
    """Each class of layers planned alone, at its native block size."""
    out = []
    for cls in classes(stage_specs):
        member = set(cls.layers)
        e = pool_engine(engine, pooling.block_size, pooling.state_block_size, cls.state)
        memo: dict[int, LayerSpec] = {}
        stages = [{n: memo.setdefault(id(s), _respec(s, e)) for n, s in st.items()
                   if n in member} for st in stage_specs]
        out.append((cls, plan_layers(e, stages)))
    return out


def request_bytes(plan: Plan, tokens: int) -> int:
    """Bytes of one stage-0 rank a request holding ``tokens`` tokens takes in a
    class's pool: its blocks (a window's, a state's, every token's) times the
    bytes one block costs."""
    engine = dataclasses.replace(plan.engine, max_model_len=max(tokens, 1))
    st = plan.stages[0]
    if not st.groups:
        return 0
    blocks = sum(g.spec.request_blocks(engine) for g in st.groups)
    return blocks * st.bytes_per_block


def demand_shares(plans: Sequence[tuple[LayerClass, Plan]], tokens: int
                  ) -> list[Fraction]:
    """Each pool's share of the budget: proportional to what a request holding
    ``tokens`` tokens takes in it (so every pool runs out together at that length)."""
    demand = [request_bytes(p, tokens) for _, p in plans]
    total = sum(demand)
    if total == 0:
        return [Fraction(1, len(plans))] * len(plans)
    shares = [Fraction(d, total).limit_denominator(1 << 20) for d in demand]
    shares[-1] = 1 - sum(shares[:-1], Fraction(0))  # exactly 1 in all
    return shares


def plan_separate(engine: Engine, stage_specs: Sequence[Mapping[str, LayerSpec]],
                  pooling: Pooling, tokens: int) -> tuple[PoolPlan, ...]:
    """The separate plan: each class in a pool of its own, the budget split by
    demand at ``tokens`` held per request (or by ``pooling.split``)."""
    plans = class_plans(engine, stage_specs, pooling)
    shares = demand_shares(plans, tokens)
    if pooling.split is not None:
        given = dict(pooling.split)
        names = [c.name for c, _ in plans]
        unknown = sorted(set(given) - set(names))
        if unknown or set(given) != set(names):
            raise PlanError(
                f"the split names pools {', '.join(sorted(given))}; this model's pools are "
                f"{', '.join(names)}",
                ref=PoolingRef(("pooling", "split")),
                found=", ".join(unknown) or "a pool left out", expected=", ".join(names),
                hint="give every pool a share, by the names `kvspec plan` prints")
        shares = [given[n] for n in names]
    return tuple(PoolPlan(c.name, p, s, c.state) for (c, p), s in zip(plans, shares))
