"""The plan pass: layer specs -> groups, each stage's projection and placement (no
budget needed: :func:`kvspec.planner.plan_layers`)."""

from __future__ import annotations

from dataclasses import dataclass

from kvspec.model.plan import Plan
from kvspec.passes.validate import Validated
from kvspec.planner import plan_layers


@dataclass(frozen=True, slots=True, kw_only=True)
class Planned(Validated):
    """The memory-independent plan of every stage."""

    plan: Plan


def plan(validated: Validated) -> Planned:
    """Validated layer specs -> the plan."""
    ex = validated.expansion
    return Planned(text=validated.text, file=validated.file, memory=validated.memory,
                   doc=validated.doc, source=validated.source, expansion=ex,
                   plan=plan_layers(ex.engine, list(ex.stage_specs)))
