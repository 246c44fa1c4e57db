"""The group pass: split layers into groups that share one block table.

The strategies (:mod:`kvspec.planner.strategies`) are tried in the reference
planner's order; the first whose shape the model has makes the groups.

>>> from kvspec.model.engine import Engine
>>> from kvspec.model.specs import FullAttention, SlidingWindow
>>> f = FullAttention(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")
>>> w = SlidingWindow(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16",
...                   sliding_window=4096)
>>> groups = group_layers(Engine(), {"l0": w, "l1": f, "l2": w, "l3": f})
>>> [(g.strategy, g.layer_names) for g in groups]
[('hybrid_page', ('l0', 'l2')), ('hybrid_page', ('l1', 'l3'))]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from kvspec.errors import LayerRef, PlanError
from kvspec.model.engine import Engine
from kvspec.model.plan import Group
from kvspec.model.specs import HiddenState, LayerSpec, UniformType
from kvspec.planner.eagle import annotate_eagle
from kvspec.planner.log import PlanLog
from kvspec.planner.merge import is_uniform, is_uniform_type
from kvspec.planner.strategies.full_allocation import full_allocation
from kvspec.planner.strategies.hidden_state import add_hidden_groups
from kvspec.planner.strategies.hybrid_page import CannotUnify, hybrid_page
from kvspec.planner.strategies.packed import packed
from kvspec.planner.strategies.promote import promote_local_specs
from kvspec.planner.strategies.state_slots import state_slots
from kvspec.planner.strategies.uniform import uniform
from kvspec.planner.strategies.uniform_type import uniform_type

_HYBRID_OFF = ("Hybrid KV cache manager is disabled for this hybrid model, This means we "
               "do not enable any optimizations for saving KV cache memory (e.g., dropping "
               "the KV cache outside the sliding window). The compute of layers like "
               "sliding window is still saved.")


def _cannot_unify(exc: CannotUnify) -> PlanError:
    return PlanError(
        f"layer {exc.name}: its page ({exc.page} bytes) does not divide the largest page "
        f"({exc.largest} bytes) and cannot be padded; padding is only supported for "
        "non-MLA attention layers",
        ref=LayerRef(exc.name), expected=f"a page size dividing {exc.largest}",
        found=str(exc.page),
        hint="use a block-outermost layout (engine.layout: BLHNC) to pack pages of "
             "different sizes, or change the block size")


def _hybrid(engine: Engine, specs: Mapping[str, LayerSpec], log: PlanLog) -> list[Group]:
    hidden = {n: s for n, s in specs.items() if isinstance(s, HiddenState)}
    rest = {n: s for n, s in specs.items() if not isinstance(s, HiddenState)}
    groups = packed(engine, rest, log)
    if groups is not None:
        return groups + [Group((n,), s, strategy="hidden_state") for n, s in hidden.items()]
    try:
        groups = hybrid_page(engine, rest, log)
    except CannotUnify as exc:
        fallback = full_allocation(specs, log)
        if fallback is None:
            raise _cannot_unify(exc) from exc
        return fallback
    if hidden:
        groups = add_hidden_groups(groups, hidden, log)
    return groups


def group_layers(engine: Engine, specs: Mapping[str, LayerSpec],
                 log: PlanLog | None = None) -> list[Group]:
    """Split the model's layers into KV cache groups (see the module docstring)."""
    log = log if log is not None else PlanLog()
    if not engine.hybrid and not (is_uniform(specs) or is_uniform_type(specs)):
        log.warning(_HYBRID_OFF)
        specs = promote_local_specs(specs)
    if not specs:
        return []
    for strategy in (uniform, uniform_type, state_slots):
        groups = strategy(engine, specs, log)
        if groups is not None:
            return groups
    return annotate_eagle(engine, specs, _hybrid(engine, specs, log), log)


def project_groups(groups: Sequence[Group], stage_layers: Sequence[str]) -> list[Group]:
    """The global groups restricted to one pipeline stage's layers."""
    owned = set(stage_layers)
    out = []
    for g in groups:
        names = tuple(n for n in g.layer_names if n in owned)
        spec = g.spec
        if len(names) == len(g.layer_names) and (  # the stage holds all of it: the group
                not isinstance(spec, UniformType) or tuple(spec.specs) == names):
            out.append(g)
            continue
        if names and isinstance(spec, UniformType):
            spec = spec.restricted(names)
        out.append(dataclasses.replace(
            g, layer_names=names, spec=spec, is_eagle=g.is_eagle and bool(names),
            padding_slots=g.padding_slots + len(g.layer_names) - len(names)))
    return out
