"""``kvspec verify --against vllm``: a plan checked against the installed vLLM's own.

kvspec's per-rank specs become vLLM spec objects; vLLM's planning calls run
on them for the same engine settings and budget (:func:`..v0_33.plan`); both
plans are compared field by field (:mod:`.compare`), and differences the
by-design table explains (:mod:`.by_design`) are marked as such.

The budget is ``--memory``, else the layout's own (``engine.memory``, the
artifact's budget, or a fixed block count); a layout without one is compared
at twice the memory one request at ``max_model_len`` needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvspec.errors import KvspecError
from kvspec.integrations.vllm.by_design import Rule, applicable
from kvspec.integrations.vllm.compare import Row, compare
from kvspec.integrations.vllm.engine_args import conflicts
from kvspec.integrations.vllm.specs import engine_settings, to_vllm
from kvspec.model.plan import Plan
from kvspec.planner import min_blocks_to_serve, size_plan
from kvspec.reports.explain import read_subject
from kvspec.reports.refview import error_view, reference_view


@dataclass(frozen=True)
class Verdict:
    """The outcome of one ``verify``."""

    path: str
    vllm_version: str
    memory: int
    #: Where the budget came from (``--memory``, the layout, a default).
    memory_origin: str
    rows: tuple[Row, ...]
    rules: tuple[Rule, ...]
    #: Settings vLLM's config stage would change before it plans (engine-args warns too).
    notes: tuple[str, ...] = ()
    kvspec: dict[str, Any] = field(repr=False, default_factory=dict)
    vllm: dict[str, Any] = field(repr=False, default_factory=dict)

    @property
    def agrees(self) -> bool:
        return not self.rows

    @property
    def by_design_only(self) -> bool:
        return bool(self.rows) and all(r.rule is not None for r in self.rows)

    @property
    def rules_used(self) -> tuple[Rule, ...]:
        seen: dict[str, Rule] = {}
        for row in self.rows:
            if row.rule is not None:
                seen.setdefault(row.rule.id, row.rule)
        return tuple(seen.values())


def budget(plan: Plan, layout_memory: int | None, memory: int | None) -> tuple[int, str]:
    """The budget to compare at, and where it came from."""
    if memory is not None:
        return memory, "--memory"
    if layout_memory is not None:
        return layout_memory, "the layout's budget"
    need = min_blocks_to_serve(plan.engine, plan.stages)
    override = plan.engine.num_gpu_blocks_override
    if override is not None:
        return max(s.memory_for(max(override, need)) for s in plan.stages), \
            "the layout's block count"
    return max(s.memory_for(2 * need) for s in plan.stages), (
        "none in the layout: twice what one request at max_model_len needs")


def kvspec_view(plan: Plan, memory: int) -> dict[str, Any]:
    """kvspec's plan for ``memory`` in the reference view, with per-stage figures."""
    try:
        sizing = size_plan(plan, memory=memory)
    except KvspecError as err:
        return error_view(err)
    view = reference_view(plan, sizing)
    for st, worker in zip(plan.stages, view["workers"]):
        worker["pool_bytes_per_block"] = st.bytes_per_block
        worker["groups"] = [list(g.layer_names) for g in st.groups]  # empty ones too, as vLLM
    return view


def kvspec_inputs(plan: Plan) -> dict[str, dict[str, Any]]:
    """Each layer's vLLM description, with kvspec's page size."""
    out = {}
    for name, spec in plan.specs.items():
        desc = to_vllm(spec)
        desc["page_size_bytes"] = spec.page_size_bytes
        out[name] = desc
    return out


def verify_plan(plan: Plan, memory: int, *, adapter: Any, path: str = "<plan>",
                memory_origin: str = "--memory") -> Verdict:
    """Compare kvspec's plan of ``plan`` with the installed vLLM's."""
    kv = kvspec_view(plan, memory)
    stages = [{n: to_vllm(plan.specs[n]) for n in st.layer_names} for st in plan.stages]
    vl = adapter.plan(engine_settings(plan.engine), stages, memory)
    rules = applicable(plan)
    inputs = kvspec_inputs(plan) if vl.get("input_specs") else None
    rows = compare(kv, vl, rules, inputs, adapter.class_defaults())
    return Verdict(path, adapter.VERSION, memory, memory_origin, tuple(rows), rules,
                   tuple(conflicts(plan)), kv, vl)


def verify_path(path: str | Path, *, memory: int | None = None, adapter: Any) -> Verdict:
    """``verify`` of a source (compiled) or an artifact (read and verified)."""
    subject = read_subject(path, memory)
    plan = subject.plan if subject.plan is not None else subject.layout.plan
    layout_memory = subject.memory if memory is None else None
    mem, origin = budget(plan, layout_memory, memory)
    return verify_plan(plan, mem, adapter=adapter, path=subject.path, memory_origin=origin)
