"""The artifact invariant checker the tests run after every compile (CONTRIBUTING.md 6).

``check_layout`` returns every violation it finds (empty: the layout is
sound); the tests run it after every compile.

* every layer is in exactly one group, and placed exactly once on its stage;
* every byte of every view lies inside its pool, for every admissible block
  count (checked exactly on the affine forms);
* the property aliasing rests on: the bytes of block id *b* never overlap those
  of another block id *b'*, in any layer of any group -- checked per block id,
  for several block counts; within one block id, two layers share bytes only
  when they are in different groups (slot aliasing), never a drafter's own;
* the pool for the planned budget does not exceed it;
* useful bytes + padding bytes = allocated bytes, per group.

>>> from kvspec.compiler import compile
>>> check_artifact(compile("layouts/llama-3.1-8b.yaml"))
[]
"""

from __future__ import annotations

from collections.abc import Iterator

from kvspec.errors import KvspecError
from kvspec.model.geometry import ViewGeometry, view_geometry
from kvspec.model.plan import Layout, Stage, Tensor

#: Block counts the overlap check probes (besides the smallest that serves).
PROBE_BLOCKS = (2, 3, 5)


def _placement(layout: Layout) -> list[str]:
    problems = []
    seen: dict[str, int] = {}
    for gid, g in enumerate(layout.groups):
        for n in g.layer_names:
            if n in seen:
                problems.append(f"layer {n} is in groups {seen[n]} and {gid}")
            seen[n] = gid
    problems += [f"layer {n} is in no group" for n in layout.layers if n not in seen]
    for st in layout.stages:
        placed: dict[str, int] = {}
        for t in st.tensors:
            for n in t.layers:
                placed[n] = placed.get(n, 0) + 1
        problems += [f"stage {st.index}: layer {n} placed {placed.get(n, 0)} times"
                     for n in st.layer_names if placed.get(n, 0) != 1]
        problems += [f"stage {st.index}: layer {n} placed but not on this stage"
                     for n in placed if n not in st.layer_names]
    return problems


def geometries(layout: Layout, stage: Stage, t: Tensor, blocks: int) -> list[ViewGeometry]:
    """The views of one tensor when the main pool has ``blocks`` blocks."""
    n = stage.draft_num_blocks if t.pool == "draft" and stage.draft_num_blocks else blocks
    spec = stage.groups[t.group].layer_spec(t.layers[0])
    return view_geometry(t.layers, t.layer_stride.at(blocks), t.block_stride.at(blocks),
                         t.offset.at(blocks), spec, n, layout.engine.axis_order)


def _bounds(layout: Layout, st: Stage) -> list[str]:
    """Last byte of every view within its pool for every N >= min_num_blocks.

    A view's end and the pool's size are both affine in N, so checking the
    smallest admissible N and that the end grows no faster than the pool is exact.
    """
    problems = []
    n0 = max(layout.stage_figures[st.index].min_num_blocks, 1)
    for t in st.tensors:
        ends = [max(g.end() for g in geometries(layout, st, t, n)) for n in (n0, n0 + 1)]
        starts = min(g.byte_offset for g in geometries(layout, st, t, n0))
        if starts < 0:
            problems.append(f"stage {st.index}: layer {t.layers[0]} starts before its pool")
        if ends[0] > t.size.at(n0):
            problems.append(f"stage {st.index}: tensor of {t.layers[0]} ends at byte "
                            f"{ends[0]}, past its pool of {t.size.at(n0)} at {n0} blocks")
        if ends[1] - ends[0] > t.size.a:
            problems.append(f"stage {st.index}: tensor of {t.layers[0]} grows faster than "
                            "its pool")
    return problems


#: ``(start, end, layer, block id, group)`` of a contiguous run of a page.
_Run = tuple[int, int, str, int, int]


def _intervals(layout: Layout, st: Stage, blocks: int) -> Iterator[_Run]:
    """``(start, end, layer, block id, group)`` of every contiguous run of every page."""
    for t in st.tensors:
        for g in geometries(layout, st, t, blocks):
            offsets, run = g.runs()
            for b in range(g.shape[0]):
                base = g.byte_offset + b * g.byte_stride[0]
                for o in offsets:
                    yield base + o, base + o + run, g.layer, b, t.group


def _clash(a: _Run, b: _Run, draft: set[str]) -> str | None:
    (start, _, la, ba, ga), (_, _, lb, bb, gb) = a, b
    if ba != bb:
        return (f"block ids {min(ba, bb)} and {max(ba, bb)} share byte {start} "
                f"(layers {la} and {lb})")
    if la == lb:
        return f"layer {la}: two of its pages overlap"
    if ga == gb:
        return f"layers {la} and {lb} of group {ga} share bytes"
    if la in draft or lb in draft:
        return f"drafter layer {la if la in draft else lb} shares bytes with another layer"
    return None


def block_overlaps(layout: Layout, st: Stage, blocks: int, limit: int = 20) -> list[str]:
    """Violations of the block-id property on ``st`` with ``blocks`` blocks."""
    draft = set(st.draft_layer_names)
    problems: set[str] = set()
    active: list[_Run] = []
    for iv in sorted(_intervals(layout, st, blocks)):
        active = [a for a in active if a[1] > iv[0]]
        for other in active:
            clash = _clash(iv, other, draft)
            if clash:
                problems.add(f"stage {st.index}, {blocks} blocks: {clash}")
        if len(problems) >= limit:
            break
        active.append(iv)
    return sorted(problems)


def _accounting(layout: Layout) -> list[str]:
    problems = []
    if layout.budget is not None:  # a fixed block count's budget is what it costs too
        for st in layout.stages:
            used = st.memory_for(layout.budget.num_blocks)
            if used > layout.budget.memory:
                problems.append(f"stage {st.index}: {used} bytes allocated for a budget of "
                                f"{layout.budget.memory}")
    per_block = layout.stage(0).bytes_per_block
    for gid, (g, fig) in enumerate(zip(layout.groups, layout.group_figures)):
        if g.own_pool:
            continue
        if fig.padding_bytes_per_block < 0 or \
                fig.useful_bytes_per_block + fig.padding_bytes_per_block != per_block:
            problems.append(f"group {gid}: useful {fig.useful_bytes_per_block} + padding "
                            f"{fig.padding_bytes_per_block} != {per_block} allocated")
    return problems


def check_layout(layout: Layout, *, probe_blocks: tuple[int, ...] = PROBE_BLOCKS) -> list[str]:
    """Every invariant violation of ``layout`` (empty: it is sound)."""
    problems = _placement(layout)
    for st in layout.stages:
        try:
            problems += _bounds(layout, st)
            for blocks in sorted({max(n, 1) for n in probe_blocks}):
                problems += block_overlaps(layout, st, blocks)
        except KvspecError as err:
            problems.append(f"stage {st.index}: its views cannot be made: {err.message}")
    return problems + _accounting(layout)


def check_artifact(artifact, **kw) -> list[str]:  # type: ignore[no-untyped-def]
    """:func:`check_layout` of an :class:`~kvspec.artifact.Artifact`."""
    return check_layout(artifact.layout, **kw)
