"""The report: plain frozen data computed from a :class:`Subject`'s frozen body
(:mod:`.frozen`), for the templates to render.

>>> rep = explain("layouts/llama-3.1-8b.yaml", memory=80 * 2**30)
>>> rep.capacity.num_blocks, rep.min_num_blocks, rep.groups[0].blocks_per_request
(40960, 8193, 8192)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from kvspec.artifact.sizing import share_of
from kvspec.model.checks import early_checks
from kvspec.model.engine import Engine
from kvspec.model.kinds import ref_kind_name
from kvspec.model.specs import MambaState
from kvspec.reports.explain.blockmap import (
    BlockMap,
    Waste,
    block_map,
    pages_of,
    tensor_spec,
)
from kvspec.reports.explain.capacity import Capacity, capacity, min_memory, sweep
from kvspec.reports.explain.frozen import FrozenLayout
from kvspec.reports.explain.pooling import PoolingView, pooling_view
from kvspec.reports.explain.subject import Subject, read_subject
from kvspec.reports.format import compact_layers, human_bytes

__all__ = ["PALETTE", "WASTE_WARNING", "GroupRow", "PoolRow", "Report", "StageRow",
           "Warning_", "WasteRow", "build_report", "explain"]

#: Padding above this share of a full-length request's blocks is worth a warning.
WASTE_WARNING = 0.10
#: One colour per group (Tableau 10), cycled.
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
           "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac")
#: Early-check padding warnings name the worst group already.
_GROUP_PADDING = "of a request's KV memory is padding"


@dataclass(frozen=True)
class GroupRow:
    id: int
    kind: str
    color: str
    layers: tuple[str, ...]
    num_layers: int
    block_size: int
    #: Distinct per-layer pages and their unpadded sizes, ``((page, useful), ...)``.
    pages: tuple[tuple[int, int], ...]
    padding_slots: int
    blocks_per_request: int
    own_pool: bool
    #: Bytes of a block this group's layers hold state in (stage 0).
    useful_bytes: int
    waste: Waste

    @property
    def padded(self) -> bool:
        return any(p != u for p, u in self.pages)


@dataclass(frozen=True)
class PoolRow:
    name: str
    layers: int
    bytes_per_block: int
    num_blocks: int | None
    bytes: int | None
    fixed: bool


@dataclass(frozen=True)
class StageRow:
    index: int
    layers: int
    bytes_per_block: int
    fixed_bytes: int
    memory_per_request: int
    min_num_blocks: int


@dataclass(frozen=True)
class WasteRow:
    cause: str
    bytes: int
    share: float
    explanation: str


@dataclass(frozen=True)
class Warning_:
    origin: str  # "planner" | "kvspec"
    message: str
    hint: str | None = None


@dataclass(frozen=True)
class Report:
    name: str
    model: str | None
    path: str
    kind: str
    engine: Engine
    settings: tuple[tuple[str, str], ...]
    groups: tuple[GroupRow, ...]
    stages: tuple[StageRow, ...]
    pools: tuple[PoolRow, ...]
    block: BlockMap
    slot_summary: str
    memory: int | None
    capacity: Capacity | None
    memory_per_request: int
    min_num_blocks: int
    min_memory: int
    scheduler_block_size: int
    hash_block_size: int
    waste: Waste
    waste_weighted: tuple[WasteRow, ...]
    waste_share: float
    sweep: tuple[Capacity, ...]
    warnings: tuple[Warning_, ...]
    notes: tuple[str, ...]
    #: The pooling policy's decision (None: the layout had none to make).
    pooling: PoolingView | None = None
    #: A separate plan's pools, each a section of one report: (name, share, report).
    pool_reports: tuple[tuple[str, float, Report], ...] = ()
    #: A pool of state slots (a separate plan's Mamba pool): its blocks are slots, one
    #: request's state each, and hold no tokens.
    state_pool: bool = False


def _settings(layout: FrozenLayout) -> tuple[tuple[str, str], ...]:
    eng = layout.engine
    par = f"tensor {eng.tensor_parallel_size}, pipeline {eng.pipeline_parallel_size}"
    if eng.decode_context_parallel_size > 1:
        par += f", decode context {eng.decode_context_parallel_size}"
    mml = f"{eng.max_model_len:,}"
    if eng.auto_max_model_len:
        mml += " (auto-fit to the budget)"
    rows = [("layout", eng.axis_order.name), ("block_size", str(eng.block_size)),
            ("max_model_len", mml), ("max_num_seqs", str(eng.max_num_seqs)),
            ("max_num_batched_tokens", f"{eng.max_num_batched_tokens:,}"),
            ("kv_cache_dtype", str(eng.kv_cache_dtype)),
            ("prefix caching", "on" if eng.enable_prefix_caching else "off"),
            ("hybrid manager", "on" if eng.hybrid else "off"),
            ("parallel", par),
            ("scheduler block", f"{layout.scheduler_block_size:,} tokens"),
            ("prefix-hash block", f"{layout.hash_block_size:,} tokens")]
    if eng.mamba_cache_mode != "none":
        rows.append(("mamba_cache_mode", eng.mamba_cache_mode))
    if eng.speculative_method:
        rows.append(("speculative", str(eng.speculative_method)))
    if eng.num_gpu_blocks_override is not None:
        rows.append(("num_blocks", f"{eng.num_gpu_blocks_override:,} (fixed by the source)"))
    return tuple(rows)


def _slot_summary(bm: BlockMap) -> str:
    sizes = sorted({e - s for s, e in bm.slots})
    if not bm.slots:
        return "no layers in the main pool"
    shape = (f"{len(bm.slots)} slot{'s' if len(bm.slots) > 1 else ''} x "
             f"{human_bytes(sizes[0])}" if len(sizes) == 1
             else f"{len(bm.slots)} slots of {len(sizes)} sizes "
                  f"({', '.join(human_bytes(s) for s in sizes)})")
    tail = bm.bytes_per_block - bm.used
    return shape + (f" + {human_bytes(tail)} alignment" if tail else "")


def _group_rows(layout: FrozenLayout, bm: BlockMap) -> tuple[GroupRow, ...]:
    rows = []
    for gid, g in enumerate(layout.groups):
        segs = bm.of(gid)
        if g.own_pool or not segs:  # not in the main block: its pages, as placed
            pages = tuple(sorted({pages_of(tensor_spec(layout, t)) for st in layout.stages
                                  for t in st.record.tensors if t.group == gid}))
            waste = Waste(padded_pages=sum(p - u for p, u in pages))
            useful = sum(u for _, u in pages)
        else:
            pages = tuple(sorted({(s.page, s.useful) for s in segs}, reverse=True))
            waste = bm.waste(gid)
            useful = sum(s.useful for s in segs)
        rows.append(GroupRow(
            id=gid, kind=ref_kind_name(g.spec), color=PALETTE[gid % len(PALETTE)],
            layers=compact_layers(g.layer_names), num_layers=len(g.layer_names),
            block_size=g.spec.block_size, pages=pages, padding_slots=g.padding_slots,
            blocks_per_request=g.blocks,
            own_pool=g.own_pool, useful_bytes=useful, waste=waste))
    return tuple(rows)


def _pools(layout: FrozenLayout, cap: Capacity | None) -> tuple[PoolRow, ...]:
    st = layout.stages[0].record
    n = cap.num_blocks if cap is not None and cap.fits else None
    own = {i for i, g in enumerate(layout.groups) if g.own_pool}
    by_pool: dict[str, set[str]] = {}
    for t in st.tensors:
        name = "device (host)" if t.pool == "host" else t.pool
        by_pool.setdefault(name, set()).update(t.layers)
    rows = []
    for name, layers in by_pool.items():
        draft = any(t.group in own for t in st.tensors if t.pool == name)
        if draft and st.draft_num_blocks:
            per = st.fixed_bytes // st.draft_num_blocks
            rows.append(PoolRow(name, len(layers), per, st.draft_num_blocks,
                                st.fixed_bytes, True))
        else:
            rows.append(PoolRow(name, len(layers), st.bytes_per_block, n,
                                n * st.bytes_per_block if n is not None else None, False))
    return tuple(rows)


_CAUSES = (
    ("padding slots", "padding_slots",
     "slots a group leaves empty because another group needs more of the block"),
    ("padded pages", "padded_pages",
     "pages padded past their content (page_size_padded) to share one page size"),
    ("alignment", "alignment",
     "bytes no group uses: the block stride rounded up to an alignment"),
)


def _weighted_waste(groups: tuple[GroupRow, ...], per_block: int
                    ) -> tuple[tuple[WasteRow, ...], float]:
    """Each cause's bytes per block, weighted by the blocks a full-length
    request holds in each group, and their share of a block."""
    main = [g for g in groups if not g.own_pool]
    if not main:
        return (), 0.0
    weights = [g.blocks_per_request for g in main]
    if sum(weights) <= 0:
        weights = [1] * len(main)
    total_w = sum(weights)

    def avg(attr: str) -> float:
        return sum(getattr(g.waste, attr) * w for g, w in zip(main, weights)) / total_w

    rows = tuple(WasteRow(label, round(avg(attr)), avg(attr) / per_block if per_block else 0.0,
                          why) for label, attr, why in _CAUSES)
    return rows, sum(r.share for r in rows)


def _warnings(subject: Subject, groups: tuple[GroupRow, ...], cap: Capacity | None,
              share: float) -> tuple[Warning_, ...]:
    """The planner's warnings, the early checks for the report's budget, and kvspec's own.

    The early checks (:func:`kvspec.model.checks.early_checks`) are made here,
    from the body, for the report's capacity, so the budget-dependent one (state
    slots) is for this budget, not the one an artifact was compiled with.
    """
    layout = subject.view
    out = [Warning_("planner", ln.message) for ln in layout.body.log if ln.level == "WARNING"]
    early = early_checks(layout, layout.engine,
                         cap.num_blocks if cap is not None and cap.fits else None)
    out += [Warning_("kvspec", w) for w in early]
    if subject.misfit is not None and subject.memory is not None:
        out.append(Warning_("kvspec", f"budget {human_bytes(subject.memory)}: "
                            f"{subject.misfit.message}", subject.misfit.hint))
    if share > WASTE_WARNING and not any(_GROUP_PADDING in w for w in early):
        worst = max((g for g in groups if not g.own_pool), key=lambda g: g.waste.total,
                    default=None)
        out.append(Warning_(
            "kvspec", f"padding wastes {share:.1%} of the blocks a full-length request holds",
            f"group {worst.id} ({worst.kind}) leaves {human_bytes(worst.waste.total)} of each "
            f"block it holds empty; see the waste table" if worst else None))
    return tuple(out)


def _stage_rows(layout: FrozenLayout) -> tuple[StageRow, ...]:
    return tuple(StageRow(st.record.index, len(st.record.layers), st.bytes_per_block,
                          st.record.fixed_bytes, st.memory_per_request, st.min_num_blocks)
                 for st in layout.stages)


def _notes(layout: FrozenLayout) -> tuple[str, ...]:
    notes = [ln.message for ln in layout.body.log if ln.level != "WARNING"]
    if len(layout.stages) > 1:
        notes.append(f"{len(layout.stages)} pipeline stages: the block picture and the "
                     "waste are stage 0's; the capacity is the smallest stage's")
    return tuple(notes)


def build_report(subject: Subject) -> Report:
    """The report of ``subject``; of a separate plan, one per pool (``pool_reports``)
    and the pooling section."""
    view = pooling_view(subject.pooling) if subject.pooling is not None else None
    if subject.pools:
        subs = []
        assert subject.pooling is not None, "a separate plan's pools come with its record"
        for (name, share, layout), record in zip(subject.pools, subject.pooling.pools):
            memory = (share_of(subject.memory, record.share) if subject.memory is not None
                      else layout.budget.memory if layout.budget is not None else None)
            one = dataclasses.replace(subject, view=layout, memory=memory, pools=(),
                                      pooling=None, pool=name)
            built = _build(one)
            state = bool(layout.groups) and all(
                isinstance(g.spec, MambaState) for g in layout.groups)
            # the pool's rows by the pool's name, not the one-pool layout's "device"
            rows = tuple(dataclasses.replace(r, name=r.name.replace("device", name, 1))
                         for r in built.pools)
            subs.append((name, share, dataclasses.replace(built, pools=rows,
                                                          state_pool=state)))
        return dataclasses.replace(subs[0][2], pooling=view, pool_reports=tuple(subs))
    return dataclasses.replace(_build(subject), pooling=view)


def _build(subject: Subject) -> Report:
    layout = subject.view
    bm = block_map(layout, 0)
    groups = _group_rows(layout, bm)
    cap = capacity(subject, subject.memory) if subject.memory is not None else None
    if cap is not None and not cap.fits and subject.misfit is not None:
        cap = dataclasses.replace(cap, reason=subject.misfit.message)
    rows, share = _weighted_waste(groups, bm.bytes_per_block)
    return Report(
        name=layout.body.name, model=layout.body.model, path=subject.path, kind=subject.kind,
        engine=layout.engine, settings=_settings(layout), groups=groups,
        stages=_stage_rows(layout), pools=_pools(layout, cap), block=bm,
        slot_summary=_slot_summary(bm), memory=subject.memory, capacity=cap,
        memory_per_request=max(st.memory_per_request for st in layout.stages),
        min_num_blocks=layout.min_num_blocks, min_memory=min_memory(layout),
        scheduler_block_size=layout.scheduler_block_size,
        hash_block_size=layout.hash_block_size,
        waste=Waste(*(int(r.bytes) for r in rows)) if rows else Waste(),
        waste_weighted=rows, waste_share=share, sweep=sweep(subject, subject.memory),
        warnings=_warnings(subject, groups, cap, share), notes=_notes(layout))


def explain(path: str | Path, *, memory: int | None = None) -> Report:
    """The report for a source or an artifact, for ``memory`` bytes per rank."""
    return build_report(read_subject(path, memory, replanned=False))
