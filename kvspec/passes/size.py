"""The size pass: the plan sized for its budget, when there is one (the caller's,
else the source's ``engine.memory``, or a fixed block count), then the Layout IR.

:func:`unsized` makes the Layout IR without a budget (for a report on a budget
that cannot serve one request); it is not part of the pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvspec.errors import PlanError
from kvspec.model.engine import BudgetRef
from kvspec.model.plan import Layout
from kvspec.passes.plan import Planned
from kvspec.planner import build_layout, size_plan


@dataclass(frozen=True, slots=True, kw_only=True)
class Sized(Planned):
    """The Layout IR, and the budget per rank it was sized for (None: none)."""

    layout: Layout
    budget_bytes: int | None


def budget_of(planned: Planned) -> int | None:
    """The budget per rank: the caller's, else the source's ``engine.memory``."""
    if planned.memory is not None:
        return planned.memory.bytes
    own = planned.source.engine.memory
    return int(own) if own is not None else None


def size(planned: Planned) -> Sized:
    """Check one request fits and size the pool for the budget, when there is one;
    then the Layout IR."""
    plan = planned.plan
    memory = budget_of(planned)
    sizing = None
    if memory is not None or plan.engine.num_gpu_blocks_override is not None:
        sizing = size_plan(plan, memory=memory)
    elif plan.engine.auto_max_model_len:
        raise PlanError("max_model_len: auto needs a memory budget to fit it to",
                        ref=BudgetRef(), hint="set engine.memory, or a fixed max_model_len")
    layout = build_layout(planned.source.name, planned.source.model, plan, sizing,
                          planned.expansion.quantization)
    return _sized(planned, layout, memory)


def unsized(planned: Planned) -> Sized:
    """The Layout IR without a budget."""
    layout = build_layout(planned.source.name, planned.source.model, planned.plan, None,
                          planned.expansion.quantization)
    return _sized(planned, layout, None)


def _sized(planned: Planned, layout: Layout, budget: int | None) -> Sized:
    return Sized(text=planned.text, file=planned.file, memory=planned.memory,
                 doc=planned.doc, source=planned.source, expansion=planned.expansion,
                 plan=planned.plan, layout=layout, budget_bytes=budget)
