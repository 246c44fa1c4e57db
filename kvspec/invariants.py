"""The artifact invariant checker (DESIGN.md, "Invariants every artifact satisfies").

``check_artifact`` returns every violation it finds (empty: the artifact is
sound); the tests run it after every compile.

* every layer is placed exactly once per stage, in exactly one group;
* every byte of every view lies inside its pool, for every admissible block
  count (checked exactly on the affine forms);
* two layers share bytes only when they sit in different groups (slot
  aliasing) — never two layers of one group, never a drafter's own region;
* the pool for the planned budget does not exceed it;
* useful bytes + padding bytes = allocated bytes, per group.

>>> from kvspec.compiler import compile
>>> check_artifact(compile("layouts/llama-3.1-8b.yaml"))
[]
"""

from __future__ import annotations

from typing import Any

from kvspec.artifact import Artifact
from kvspec.layouts import Layout
from kvspec.planner.place import view_geometry
from kvspec.spec import spec_from_dict


def _runs(geom) -> tuple[list[int], int]:
    """A page's contiguous byte runs within one block: (run offsets, run length).

    C is innermost and contiguous in every layout; N and H merge into the run
    when their stride continues it (block-compact layouts), otherwise each of
    their positions starts a run of its own (e.g. LHBNC interleaves heads and
    blocks).
    """
    from kvspec.dtypes import dtype_size

    _, h, n, c = geom.shape
    _, sh, sn, _ = geom.byte_stride
    run = c * dtype_size(geom.dtype)
    offsets = [0]
    for stride, count in sorted([(sn, n), (sh, h)]):
        if count == 1:
            continue
        if stride == run and offsets == [0]:
            run *= count
        else:
            offsets = [o + i * stride for o in offsets for i in range(count)]
    return offsets, run


def _page_extent(geom) -> int:
    """Bytes from a page's first byte to one past its last, within one block."""
    offsets, run = _runs(geom)
    return max(offsets) + run


def check_artifact(artifact: Artifact, *, probe_blocks: tuple[int, ...] = (2, 3)) -> list[str]:
    problems: list[str] = []
    body = artifact.body
    layout = Layout.parse(body["engine"]["layout"])
    all_layers = list(body["layers"])
    group_of = {n: g["id"] for g in body["groups"] for n in g["layers"]}

    # every layer in exactly one group
    seen: dict[str, int] = {}
    for g in body["groups"]:
        for n in g["layers"]:
            if n in seen:
                problems.append(f"layer {n} is in groups {seen[n]} and {g['id']}")
            seen[n] = g["id"]
    for n in all_layers:
        if n not in seen:
            problems.append(f"layer {n} is in no group")

    for st in body["stages"]:
        placed: dict[str, int] = {}
        for t in st["tensors"]:
            for n in t["layers"]:
                placed[n] = placed.get(n, 0) + 1
        for n in st["layers"]:
            if placed.get(n, 0) != 1:
                problems.append(f"stage {st['index']}: layer {n} placed {placed.get(n, 0)} times")
        for n in placed:
            if n not in st["layers"]:
                problems.append(f"stage {st['index']}: layer {n} placed but not on this stage")
        problems += _check_bounds(st, layout, artifact)
        for blocks in probe_blocks:
            problems += _check_overlaps(st, layout, blocks, group_of)

    budget = body.get("budget")
    if budget:
        for st in body["stages"]:
            used = st["bytes_per_block"] * budget["num_blocks"] + st["fixed_bytes"]
            if body["engine"].get("num_blocks") is None and used > budget["memory"]:
                problems.append(f"stage {st['index']}: {used} bytes allocated for a budget of "
                                f"{budget['memory']}")
    st0 = body["stages"][0]
    for g in body["groups"]:
        if g["own_pool"]:
            continue
        if g["padding_bytes_per_block"] < 0 or \
                g["useful_bytes_per_block"] + g["padding_bytes_per_block"] != st0["bytes_per_block"]:
            problems.append(f"group {g['id']}: useful {g['useful_bytes_per_block']} + padding "
                            f"{g['padding_bytes_per_block']} != {st0['bytes_per_block']} allocated")
    return problems


def _geoms(t: dict[str, Any], layout: Layout, blocks: int, draft_blocks: int | None):
    n = draft_blocks if t["pool"] == "draft" and draft_blocks else blocks
    fields = {k: Artifact.affine(t[k]).at(blocks) for k in ("layer_stride", "block_stride", "offset")}
    fields["layers"] = t["layers"]
    spec = spec_from_dict(t["spec"])
    return n, view_geometry(fields, spec, n, layout)


def _check_bounds(st: dict[str, Any], layout: Layout, artifact: Artifact) -> list[str]:
    """Last byte of every view within its pool for every N >= min_num_blocks.

    A view's end and the pool's size are both affine in N, so checking the
    smallest admissible N and that the end grows no faster than the pool is exact.
    """
    problems = []
    n0 = max(st["min_num_blocks"], 1)
    for t in st["tensors"]:
        size = Artifact.affine(t["size"])
        ends = []
        for n in (n0, n0 + 1):
            _, geoms = _geoms(t, layout, n, st["draft_num_blocks"])
            ends.append(max(g.byte_offset + (g.shape[0] - 1) * g.byte_stride[0]
                            + _page_extent(g) for g in geoms))
            for g in geoms:
                if g.byte_offset < 0:
                    problems.append(f"stage {st['index']}: layer {g.layer} starts before its pool")
        if ends[0] > size.at(n0):
            problems.append(f"stage {st['index']}: tensor of {t['layers'][0]} ends at byte "
                            f"{ends[0]}, past its pool of {size.at(n0)} at {n0} blocks")
        if ends[1] - ends[0] > size.a:
            problems.append(f"stage {st['index']}: tensor of {t['layers'][0]} grows faster "
                            "than its pool")
    return problems


def _check_overlaps(st: dict[str, Any], layout: Layout, blocks: int,
                    group_of: dict[str, int]) -> list[str]:
    intervals: list[tuple[int, int, str]] = []
    draft = set(st["draft_layers"])
    for t in st["tensors"]:
        _, geoms = _geoms(t, layout, blocks, st["draft_num_blocks"])
        for g in geoms:
            offsets, run = _runs(g)
            for b in range(g.shape[0]):
                base = g.byte_offset + b * g.byte_stride[0]
                intervals.extend((base + o, base + o + run, g.layer) for o in offsets)
    intervals.sort()
    problems = []
    active: list[tuple[int, str]] = []
    for start, end, layer in intervals:
        active = [(e, n) for e, n in active if e > start]
        for _, other in active:
            if other == layer:
                problems.append(f"layer {layer}: two of its pages overlap")
            elif group_of.get(other) == group_of.get(layer):
                problems.append(f"layers {other} and {layer} of group {group_of.get(layer)} "
                                "share bytes")
            elif other in draft or layer in draft:
                problems.append(f"drafter layer {other if other in draft else layer} shares "
                                "bytes with another layer")
        active.append((end, layer))
        if len(problems) > 20:
            break
    return sorted(set(problems))
