"""Pipeline stages: which layers each stage owns (a rule of the deployment, shared by
the source's expansion and the planner).

Stages split the model's decoder layers the way vLLM's ``get_pp_indices`` does:
an even share each, the remainder going one layer apiece to the stages just
before the last (the last stage also runs the LM head), unless an explicit
partition is given.

>>> stage_bounds(18, 2)
[(0, 9), (9, 18)]
>>> stage_bounds(10, 4)
[(0, 2), (2, 5), (5, 8), (8, 10)]
>>> layer_index("model.layers.12.self_attn.attn")
12
"""

from __future__ import annotations

import re

from kvspec.errors import PlanError

_LAYERS_RE = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")
_INT_RE = re.compile(r"(?:^|\.)(\d+)(?:\.|$)")


def stage_bounds(num_layers: int, pp_size: int,
                 partition: tuple[int, ...] | None = None) -> list[tuple[int, int]]:
    """``[start, end)`` layer indices of every pipeline stage."""
    if partition is not None:
        if len(partition) != pp_size:
            raise PlanError(
                f"the pipeline partition has {len(partition)} stages, the deployment {pp_size}",
                expected=f"{pp_size} layer counts", found=str(list(partition)),
                hint="give one layer count per pipeline stage (parallel.pipeline)")
        if sum(partition) != num_layers:
            raise PlanError(
                f"the pipeline partition covers {sum(partition)} layers, the model has "
                f"{num_layers}", hint="the counts must add up to the model's layers")
        sizes = list(partition)
    else:
        sizes = [num_layers // pp_size] * pp_size
        for i in range(2, num_layers % pp_size + 2):
            sizes[-i] += 1
    bounds, start = [], 0
    for size in sizes:
        bounds.append((start, start + size))
        start += size
    return bounds


def layer_index(name: str) -> int | None:
    """The decoder-layer index in a layer name (``layers.N``), or its only integer."""
    m = _LAYERS_RE.search(name)
    if m:
        return int(m.group(1))
    ints = _INT_RE.findall(name)
    if len(ints) == 1:
        return int(ints[0])
    return None


def split_stages(names: list[str], pp_size: int, num_layers: int | None,
                 partition: tuple[int, ...] | None = None) -> list[list[str]]:
    """Layer names of every stage, in model order."""
    if pp_size == 1:
        return [list(names)]
    if not names:
        return [[] for _ in range(pp_size)]
    indices = {}
    for name in names:
        idx = layer_index(name)
        if idx is None:
            raise PlanError(
                f"layer {name!r} has no layer index, so no pipeline stage owns it",
                hint="name layers with 'layers.N' (layer_name template) under pipeline "
                     "parallelism")
        indices[name] = idx
    total = num_layers if num_layers is not None else max(indices.values()) + 1
    bounds = stage_bounds(total, pp_size, partition)
    stages: list[list[str]] = [[] for _ in bounds]
    for name in names:
        idx = indices[name]
        for s, (lo, hi) in enumerate(bounds):
            if lo <= idx < hi:
                stages[s].append(name)
                break
        else:
            raise PlanError(f"layer {name!r} (index {idx}) lies beyond the model's "
                            f"{total} layers", hint="check total_num_hidden_layers")
    return stages
