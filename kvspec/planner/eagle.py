"""Which group is the drafter's: the reference's eagle-group annotation.

With an EAGLE-style speculative method, groups holding a layer that decodes
several tokens non-causally are the drafter's; with MTP, the group of the
model's last layer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from kvspec.model.engine import Engine
from kvspec.model.plan import Group
from kvspec.model.specs import LayerSpec, MambaState, layer_specs
from kvspec.planner.log import PlanLog

EAGLE_METHODS = frozenset({"eagle", "eagle3", "mtp", "dflash", "dspark"})


def annotate_eagle(engine: Engine, specs: Mapping[str, LayerSpec], groups: list[Group],
                   log: PlanLog) -> list[Group]:
    method = engine.speculative_method
    if method is None or method not in EAGLE_METHODS:
        return groups
    flagged = [any(getattr(s, "non_causal_multi_token_decode", False)
                   for s in layer_specs(g.spec)) for g in groups]
    if method == "mtp":
        names = [n for g in groups for n in g.layer_names]
        if len(names) == len(specs) and set(names) == set(specs):
            last = next(reversed(list(specs)))
            for i, g in enumerate(groups):
                if last in g.layer_names:
                    flagged[i] = True
                    break
    out = [dataclasses.replace(g, is_eagle=g.is_eagle or f) for g, f in zip(groups, flagged)]
    if not any(g.is_eagle for g in out) and any(
            isinstance(s, MambaState) for g in out for s in layer_specs(g.spec)):
        log.warning(f"Speculative decoding (method={method}) is enabled but no KV cache "
                    "group could be identified as the draft model's.")
    return out
