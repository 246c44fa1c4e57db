"""The pool pass: the sized unified plan -> the plan the pooling policy keeps.

* ``unified`` keeps the sized plan as it is (evaluated at the workload when the
  source declares one);
* ``separate`` plans each class of layers in a pool of its own
  (:mod:`kvspec.planner.separate`) and sizes each pool for its share of the budget;
* ``auto`` evaluates every candidate the runtime named by ``serve_with`` can serve
  (:mod:`kvspec.pooling`) and keeps the one with the highest capacity.

>>> from kvspec.compiler import Pooled, compile_until
>>> pooled = compile_until("layouts/llama-3.1-8b.yaml", Pooled)
>>> pooled.pools, pooled.decision
((), None)
"""

from __future__ import annotations

from dataclasses import dataclass

from kvspec.artifact import format as fmt
from kvspec.passes.size import Sized
from kvspec.pooling import PoolLayout, decide

__all__ = ["PoolLayout", "Pooled", "pool"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Pooled(Sized):
    """The plan the policy keeps: the unified layout (``pools`` empty), or one
    layout per pool; and the decision, when there was one to make."""

    pools: tuple[PoolLayout, ...]
    decision: fmt.PoolingRecord | None


def pool(sized: Sized) -> Pooled:
    """Apply the source's pooling policy to the sized plan."""
    pooling = sized.expansion.pooling
    pools: tuple[PoolLayout, ...] = ()
    decision = None
    layout = sized.layout
    if pooling.policy != "unified" or pooling.workload is not None:
        layout, pools, decision = decide(sized, pooling)
    return Pooled(text=sized.text, file=sized.file, memory=sized.memory, doc=sized.doc,
                  source=sized.source, expansion=sized.expansion, plan=sized.plan,
                  layout=layout, budget_bytes=sized.budget_bytes, pools=pools,
                  decision=decision)
