"""``kvspec explain``: what a layout does with memory, for a terminal, a pull
request (Markdown) or a browser (HTML with pictures).

The report is plain frozen data (:class:`Report`) computed from an artifact
body; Jinja2 templates shipped in ``kvspec/templates`` render it. A source is
compiled first (and re-planned for ``--memory``); an artifact is re-sized for
``--memory`` with :meth:`Artifact.num_blocks_for`.

One block of the main pool, as the report draws it: every group's layers sit
in *slots* of the block, and slot *i* of every group is the same bytes — a
block id belongs to one group at a time. For a block held by group ``g``::

    bytes_per_block = useful(g)          # the group's unpadded pages
                    + padded_pages(g)    # page_size_padded - unpadded page
                    + padding_slots(g)   # bytes other groups use, g leaves empty
                    + alignment          # bytes no group uses (block-stride alignment)

Waste is weighted by how many blocks each group takes for one request at
``max_model_len`` (its ``blocks_per_request``): the share of a full-length
request's blocks that holds no KV state.

>>> rep = explain("layouts/llama-3.1-8b.yaml")
>>> rep.groups[0].kind, rep.groups[0].layers, rep.capacity.num_blocks
('full_attention', ('model.layers.{0..31}.self_attn.attn',), 20480)
>>> rep.waste.total, rep.warnings
(0, ())
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from kvspec.artifact import Artifact
from kvspec.errors import KvspecError, NotEnoughMemoryError, PlanError
from kvspec.planner.plan import Plan, resolve
from kvspec.report import human_bytes
from kvspec.spec import spec_from_dict

__all__ = [
    "BlockMap",
    "Capacity",
    "GroupRow",
    "Report",
    "Segment",
    "Subject",
    "compact_layers",
    "environment",
    "explain",
    "load_subject",
    "render",
]

#: Padding above this share of a full-length request's blocks is worth a warning.
WASTE_WARNING = 0.10
#: Points of the capacity-against-memory sweep.
SWEEP_POINTS = 8
#: One colour per group (Tableau 10), cycled.
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
           "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac")
FORMATS = ("text", "md", "html")


# ---------------------------------------------------------------------------
# what was asked about: a source or an artifact
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Subject:
    """A layout loaded for a report: its artifact, and its plan when it is a source.

    ``memory`` is the budget the report is for (``--memory``, else the
    source's or artifact's own); ``misfit`` the error when one request at
    ``max_model_len`` does not fit it.
    """

    path: str
    kind: str  # "source" | "artifact"
    artifact: Artifact
    plan: Plan | None
    memory: int | None
    misfit: KvspecError | None = None

    @property
    def body(self) -> dict[str, Any]:
        return self.artifact.body


def is_artifact_path(path: str | Path) -> bool:
    """``*.json`` files are artifacts; so is any other file holding a JSON object
    with a ``body`` (a YAML source may be a flow mapping, which JSON parsing rejects
    or which has no ``body``)."""
    path = Path(path)
    if path.suffix == ".json":
        return True
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    if not text.lstrip().startswith("{"):
        return False
    try:
        data = json.loads(text)
    except ValueError:
        return False
    return isinstance(data, dict) and "body" in data


def load_subject(path: str | Path, memory: int | None = None) -> Subject:
    """Compile a source (planned for ``memory``) or read and verify an artifact."""
    from kvspec.compiler import (
        compile_unit,
        expand_pass,
        freeze_pass,
        load,
        parse,
        plan_pass,
        size_pass,
    )

    if is_artifact_path(path):
        art = Artifact.read(path)
        budget = art.body.get("budget") or {}
        mem = memory if memory is not None else budget.get("memory")
        misfit = None
        if mem is not None:
            try:
                art.num_blocks_for(memory=mem)
            except PlanError as err:
                misfit = err
        return Subject(str(path), "artifact", art, None, mem, misfit)

    unit = compile_unit(path, passes=(load, parse, expand_pass, plan_pass))
    if memory is not None:
        unit = dataclasses.replace(unit, memory=memory)
    misfit = None
    try:
        sized = size_pass(unit)
    except NotEnoughMemoryError as err:
        misfit, sized = err, unit
    mem = sized.memory if sized.memory is not None else memory
    if mem is None and unit.source is not None and unit.source.engine.memory is not None:
        mem = int(unit.source.engine.memory)
    # A budget that cannot serve one request still gets a report: plan it without one.
    frozen = freeze_pass(sized if misfit is None else dataclasses.replace(unit, memory=None))
    assert frozen.artifact is not None and frozen.plan is not None
    if mem is None and frozen.artifact.body.get("budget"):  # a fixed block count
        mem = frozen.artifact.body["budget"]["memory"]
    return Subject(str(path), "source", frozen.artifact, frozen.plan, mem, misfit)


# ---------------------------------------------------------------------------
# capacity
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Capacity:
    """What a budget holds: blocks, KV tokens, concurrent full-length requests."""

    memory: int
    fits: bool
    num_blocks: int = 0
    kv_tokens: int = 0
    max_concurrency: float = 0.0
    max_model_len: int = 0
    reason: str | None = None


def _main_groups(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [g for g in body["groups"] if not g["own_pool"]]


def blocks_per_request(body: dict[str, Any]) -> int:
    """Main-pool blocks one request at ``max_model_len`` takes (as the planner counts)."""
    return sum(-(-g["max_memory_usage_bytes"] // g["page_size_bytes"])
               for g in _main_groups(body) if g["page_size_bytes"])


def capacity(subject: Subject, memory: int) -> Capacity:
    """Capacity of ``subject`` for ``memory`` bytes per rank.

    A source is re-planned (``max_model_len: auto`` refits); an artifact keeps
    its compiled ``max_model_len`` and is re-sized.
    """
    if subject.plan is not None:
        try:
            r = resolve(subject.plan, memory=memory)
        except KvspecError as err:
            return Capacity(memory, False, reason=err.message)
        return Capacity(memory, True, r.num_blocks, r.kv_cache_size_tokens,
                        r.max_concurrency, r.engine.max_model_len)
    body = subject.body
    try:
        n = subject.artifact.num_blocks_for(memory=memory)
    except KvspecError as err:
        return Capacity(memory, False, reason=err.message)
    per_req = blocks_per_request(body)
    length = body["engine"]["max_model_len"]
    conc = n / per_req if per_req else float("inf")
    return Capacity(memory, True, n, int(conc * length) if per_req else 0, conc, length)


def min_memory(body: dict[str, Any]) -> int:
    """The smallest per-rank budget that serves one request at ``max_model_len``."""
    return max(st["min_num_blocks"] * st["bytes_per_block"] + st["fixed_bytes"]
               for st in body["stages"])


def sweep(subject: Subject, budget: int | None, points: int = SWEEP_POINTS) -> tuple[Capacity, ...]:
    """Capacity at ``points`` budgets from the least that serves one request to
    4x the budget (16x the least when there is no budget)."""
    lo = min_memory(subject.body)
    hi = 4 * budget if budget else 16 * lo
    if hi <= lo:
        hi = 2 * lo
    step = (hi - lo) / (points - 1)
    return tuple(capacity(subject, int(lo + i * step)) for i in range(points))


# ---------------------------------------------------------------------------
# one block's memory
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Segment:
    """One layer's page inside one block: ``[start, start + page)``, of which
    the first ``useful`` bytes hold state."""

    group: int
    layer: str
    start: int
    page: int
    useful: int

    @property
    def end(self) -> int:
        return self.start + self.page


@dataclass(frozen=True)
class Waste:
    """Bytes of a block that hold no state, by cause."""

    padding_slots: int = 0
    padded_pages: int = 0
    alignment: int = 0

    @property
    def total(self) -> int:
        return self.padding_slots + self.padded_pages + self.alignment


@dataclass(frozen=True)
class BlockMap:
    """Where every layer of one pipeline stage sits inside one main-pool block."""

    stage: int
    bytes_per_block: int
    segments: tuple[Segment, ...]
    #: Distinct ``(start, end)`` page positions, in order: the block's slots.
    slots: tuple[tuple[int, int], ...]
    #: Bytes any group uses (the union of all pages).
    used: int

    def of(self, group: int) -> tuple[Segment, ...]:
        return tuple(s for s in self.segments if s.group == group)

    def waste(self, group: int) -> Waste:
        mine = self.of(group)
        own = _measure([(s.start, s.end) for s in mine])
        return Waste(padding_slots=self.used - own,
                     padded_pages=sum(s.page - s.useful for s in mine),
                     alignment=self.bytes_per_block - self.used)


def _measure(intervals: list[tuple[int, int]]) -> int:
    total, end = 0, -1
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


@lru_cache(maxsize=4096)
def _pages(spec_json: str) -> tuple[int, int]:
    """``(page, unpadded page)`` of a layer spec as the artifact describes it."""
    data = json.loads(spec_json)
    page = int(data["page_size_bytes"])
    try:
        useful = spec_from_dict(data).unpadded_page_size_bytes
    except (KeyError, TypeError, ValueError):
        useful = page
    return page, min(useful, page)


def block_map(body: dict[str, Any], stage: int = 0) -> BlockMap:
    """The main-pool block of ``stage``, from the artifact's tensors.

    A layer ``l`` of a tensor starts at ``offset + l * layer_stride +
    b * block_stride`` in its pool. Block-outermost layouts (``block_stride
    == bytes_per_block``) keep the position inside a block in the constant
    part; layer-outermost ones (``layer_stride = page * N``) in the
    coefficient of ``N``: either way that is the layer's place in the block.
    """
    st = body["stages"][stage]
    per_block = st["bytes_per_block"]
    own = {g["id"] for g in body["groups"] if g["own_pool"]}
    segments = []
    for t in st["tensors"]:
        if t["group"] in own or t.get("host_resident"):
            continue
        page, useful = _pages(json.dumps(t["spec"], sort_keys=True))
        offset, stride = Artifact.affine(t["offset"]), Artifact.affine(t["layer_stride"])
        block_stride = Artifact.affine(t["block_stride"])
        outer = block_stride.is_constant and block_stride.b == per_block and per_block != page
        for i, name in enumerate(t["layers"]):
            at = offset + stride * i
            start = at.b if outer else (at.a if at.a else at.b)
            segments.append(Segment(t["group"], name, start, page, useful))
    segments.sort(key=lambda s: (s.start, s.group))
    slots = tuple(sorted({(s.start, s.end) for s in segments}))
    used = _measure(list(slots))
    return BlockMap(stage, per_block, tuple(segments), slots, used)


# ---------------------------------------------------------------------------
# layer names
# ---------------------------------------------------------------------------

_NUMBER = re.compile(r"^(.*?)(\d+)(.*)$")


def _runs(numbers: list[int]) -> str:
    """``[0, 2, 4, 6, 9]`` -> ``0..6 step 2,9``; ``[0..31]`` -> ``0..31``."""
    out, i = [], 0
    while i < len(numbers):
        j = i + 1
        if j < len(numbers):
            step = numbers[j] - numbers[i]
            while j + 1 < len(numbers) and numbers[j + 1] - numbers[j] == step:
                j += 1
            if j - i >= 2 and step > 0:
                out.append(f"{numbers[i]}..{numbers[j]}" + (f" step {step}" if step > 1 else ""))
                i = j + 1
                continue
        out.append(str(numbers[i]))
        i += 1
    return ",".join(out)


def compact_layers(names: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """Layer names with their first number folded into ranges.

    >>> compact_layers([f"model.layers.{i}.attn" for i in range(0, 42, 2)])
    ('model.layers.{0..40 step 2}.attn',)
    >>> compact_layers(["a.1.k", "a.2.k", "b"])
    ('a.{1,2}.k', 'b')
    """
    families: dict[tuple[str, str], list[int]] = {}
    plain: list[str] = []
    order: list[tuple[str, str] | str] = []
    for name in names:
        m = _NUMBER.match(name)
        if m is None:
            plain.append(name)
            order.append(name)
            continue
        key = (m.group(1), m.group(3))
        if key not in families:
            families[key] = []
            order.append(key)
        families[key].append(int(m.group(2)))
    out = []
    for key in order:
        if isinstance(key, str):
            out.append(key)
            continue
        nums = sorted(set(families[key]))
        if len(nums) == 1:
            out.append(f"{key[0]}{nums[0]}{key[1]}")
        else:
            out.append(f"{key[0]}{{{_runs(nums)}}}{key[1]}")
    return tuple(out)


# ---------------------------------------------------------------------------
# the report
# ---------------------------------------------------------------------------


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
    engine: dict[str, Any]
    settings: tuple[tuple[str, str], ...]
    groups: tuple[GroupRow, ...]
    stages: tuple[dict[str, Any], ...]
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

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _settings(eng: dict[str, Any], body: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    par = f"tensor {eng['tensor_parallel_size']}, pipeline {eng['pipeline_parallel_size']}"
    if eng.get("decode_context_parallel_size", 1) > 1:
        par += f", decode context {eng['decode_context_parallel_size']}"
    mml = f"{eng['max_model_len']:,}"
    if eng.get("original_max_model_len") == -1:
        mml += " (auto-fit to the budget)"
    rows = [("layout", eng["layout"]), ("block_size", str(eng["block_size"])),
            ("max_model_len", mml), ("max_num_seqs", str(eng["max_num_seqs"])),
            ("max_num_batched_tokens", f"{eng['max_num_batched_tokens']:,}"),
            ("kv_cache_dtype", str(eng["kv_cache_dtype"])),
            ("prefix caching", "on" if eng["enable_prefix_caching"] else "off"),
            ("hybrid manager", "on" if eng["hybrid"] else "off"),
            ("parallel", par),
            ("scheduler block", f"{body['scheduler_block_size']:,} tokens"),
            ("prefix-hash block", f"{body['hash_block_size']:,} tokens")]
    if eng.get("mamba_cache_mode", "none") != "none":
        rows.append(("mamba_cache_mode", eng["mamba_cache_mode"]))
    if eng.get("speculative_method"):
        rows.append(("speculative", str(eng["speculative_method"])))
    if eng.get("num_blocks") is not None:
        rows.append(("num_blocks", f"{eng['num_blocks']:,} (fixed by the source)"))
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


def _group_rows(body: dict[str, Any], bm: BlockMap) -> tuple[GroupRow, ...]:
    rows = []
    for g in body["groups"]:
        segs = bm.of(g["id"])
        if g["own_pool"] or not segs:
            specs = [t["spec"] for st in body["stages"] for t in st["tensors"]
                     if t["group"] == g["id"]]
            pages = tuple(sorted({_pages(json.dumps(s, sort_keys=True)) for s in specs}))
            waste = Waste(padded_pages=sum(p - u for p, u in pages))
            useful = sum(u for _, u in pages)
        else:
            pages = tuple(sorted({(s.page, s.useful) for s in segs}, reverse=True))
            waste = bm.waste(g["id"])
            useful = sum(s.useful for s in segs)
        rows.append(GroupRow(
            id=g["id"], kind=g["kind"], color=PALETTE[g["id"] % len(PALETTE)],
            layers=compact_layers(g["layers"]), num_layers=len(g["layers"]),
            block_size=g["block_size"], pages=pages, padding_slots=g["padding_slots"],
            blocks_per_request=g["blocks_per_request"], own_pool=g["own_pool"],
            useful_bytes=useful, waste=waste))
    return tuple(rows)


def _pools(body: dict[str, Any], cap: Capacity | None) -> tuple[PoolRow, ...]:
    st = body["stages"][0]
    n = cap.num_blocks if cap is not None and cap.fits else None
    own = {g["id"] for g in body["groups"] if g["own_pool"]}
    by_pool: dict[str, set[str]] = {}
    for t in st["tensors"]:
        name = t["pool"] + (" (host)" if t.get("host_resident") else "")
        by_pool.setdefault(name, set()).update(t["layers"])
    rows = []
    for name, layers in by_pool.items():
        draft = any(t["group"] in own for t in st["tensors"] if t["pool"] == name.split()[0])
        if draft and st["draft_num_blocks"]:
            per = st["fixed_bytes"] // st["draft_num_blocks"]
            rows.append(PoolRow(name, len(layers), per, st["draft_num_blocks"],
                                st["fixed_bytes"], True))
        else:
            rows.append(PoolRow(name, len(layers), st["bytes_per_block"], n,
                                n * st["bytes_per_block"] if n is not None else None, False))
    return tuple(rows)


def _weighted_waste(groups: tuple[GroupRow, ...], per_block: int
                    ) -> tuple[tuple[WasteRow, ...], float]:
    main = [g for g in groups if not g.own_pool]
    weights = [g.blocks_per_request for g in main]
    if not main:
        return (), 0.0
    if sum(weights) <= 0:
        weights = [1] * len(main)
    total_w = sum(weights)

    def avg(attr: str) -> float:
        return sum(getattr(g.waste, attr) * w for g, w in zip(main, weights)) / total_w

    causes = (
        ("padding slots", "padding_slots",
         "slots a group leaves empty because another group needs more of the block"),
        ("padded pages", "padded_pages",
         "pages padded past their content (page_size_padded) to share one page size"),
        ("alignment", "alignment",
         "bytes no group uses: the block stride rounded up to an alignment"),
    )
    rows = tuple(WasteRow(label, round(avg(attr)), avg(attr) / per_block if per_block else 0.0,
                          why) for label, attr, why in causes)
    share = sum(r.share for r in rows)
    return rows, share


#: Early-check warnings (``body["warnings"]``) that depend on the budget, and
#: padding warnings that already name the worst group.
_STATE_SLOTS = "state layers hold"
_GROUP_PADDING = "of a request's KV memory is padding"


def _warnings(body: dict[str, Any], groups: tuple[GroupRow, ...], cap: Capacity | None,
              share: float, subject: Subject) -> tuple[Warning_, ...]:
    """The planner's warnings, the compiler's early checks, and kvspec's own.

    The early checks (``body["warnings"]``) were made for the budget the
    artifact was compiled with; the state-slot check depends on it and is
    redone here for the report's budget.
    """
    out = [Warning_("planner", e["message"]) for e in body.get("log", [])
           if e["level"] == "WARNING"]
    early = body.get("warnings")
    out += [Warning_("kvspec", w) for w in early or () if not w.startswith(_STATE_SLOTS)]
    eng = body["engine"]
    if subject.misfit is not None and subject.memory is not None:
        out.append(Warning_("kvspec", f"budget {human_bytes(subject.memory)}: "
                            f"{subject.misfit.message}", subject.misfit.hint))
    if share > WASTE_WARNING and not any(_GROUP_PADDING in w for w in early or ()):
        worst = max((g for g in groups if not g.own_pool), key=lambda g: g.waste.total,
                    default=None)
        out.append(Warning_(
            "kvspec", f"padding wastes {share:.1%} of the blocks a full-length request holds",
            f"group {worst.id} ({worst.kind}) leaves {human_bytes(worst.waste.total)} of each "
            f"block it holds empty; see the waste table" if worst else None))
    state = [g for g in groups if g.kind == "mamba" and not g.own_pool]
    if state and cap is not None and cap.fits:
        per_request = sum(g.blocks_per_request for g in state)
        slots = (cap.num_blocks - 1) // per_request if per_request else 0
        if slots < eng["max_num_seqs"]:
            out.append(Warning_(
                "kvspec", f"state layers hold {slots:,} requests' states in "
                          f"{cap.num_blocks:,} blocks ({per_request} state blocks per request), "
                          f"below max_num_seqs {eng['max_num_seqs']}",
                f"lower engine.max_num_seqs to {max(slots, 1)} or give the KV cache more "
                "memory (vLLM fails at start-up with 'max_num_seqs exceeds available Mamba "
                "cache blocks')"))
    return tuple(out)


def explain(path: str | Path, *, memory: int | None = None) -> Report:
    """The report for a source or an artifact, for ``memory`` bytes per rank."""
    return build_report(load_subject(path, memory))


def build_report(subject: Subject) -> Report:
    body = subject.body
    eng = body["engine"]
    bm = block_map(body, 0)
    groups = _group_rows(body, bm)
    cap = capacity(subject, subject.memory) if subject.memory is not None else None
    if cap is not None and not cap.fits and subject.misfit is not None:
        cap = dataclasses.replace(cap, reason=subject.misfit.message)
    rows, share = _weighted_waste(groups, bm.bytes_per_block)
    avg = Waste(*(int(r.bytes) for r in rows)) if rows else Waste()
    notes = [e["message"] for e in body.get("log", []) if e["level"] != "WARNING"]
    if len(body["stages"]) > 1:
        notes.append(f"{len(body['stages'])} pipeline stages: the block picture and the "
                     "waste are stage 0's; the capacity is the smallest stage's")
    return Report(
        name=body["name"], model=body.get("model"), path=subject.path, kind=subject.kind,
        engine=eng, settings=_settings(eng, body), groups=groups,
        stages=tuple({"index": st["index"], "layers": len(st["layers"]),
                      "bytes_per_block": st["bytes_per_block"],
                      "fixed_bytes": st["fixed_bytes"],
                      "memory_per_request": st["memory_per_request"],
                      "min_num_blocks": st["min_num_blocks"]} for st in body["stages"]),
        pools=_pools(body, cap), block=bm, slot_summary=_slot_summary(bm),
        memory=subject.memory, capacity=cap,
        memory_per_request=max(st["memory_per_request"] for st in body["stages"]),
        min_num_blocks=max(st["min_num_blocks"] for st in body["stages"]),
        min_memory=min_memory(body),
        scheduler_block_size=body["scheduler_block_size"],
        hash_block_size=body["hash_block_size"], waste=avg, waste_weighted=rows,
        waste_share=share, sweep=sweep(subject, subject.memory),
        warnings=_warnings(body, groups, cap, share, subject), notes=tuple(notes))


# ---------------------------------------------------------------------------
# pictures (geometry here; the HTML template draws it)
# ---------------------------------------------------------------------------


def block_picture(report: Report, width: int = 1000) -> dict[str, Any]:
    """Rectangles of one block's memory for the HTML report's SVG.

    A row per group over the same x axis (byte 0 to ``bytes_per_block``), so
    the same column is the same bytes in every row: slots alias across groups.
    Pages are filled in the group's colour (the unpadded part solid, page
    padding hatched in the colour), empty slots hatched grey, alignment dark.
    """
    bm = report.block
    label_w, row_h, gap, top = 170, 30, 8, 40
    bar_w = width - label_w - 16
    per_block = bm.bytes_per_block or 1
    main = [g for g in report.groups if not g.own_pool]
    own = [g for g in report.groups if g.own_pool]

    def x(byte: float) -> float:
        return round(label_w + byte * bar_w / per_block, 2)

    def rect(x0: float, x1: float, y: float, fill: str, title: str, text: str = "") -> dict:
        return {"x": x0, "y": y, "w": round(max(x1 - x0, 0.6), 2), "h": row_h, "fill": fill,
                "title": title, "text": text}

    rows, rects = [], []
    y = top
    for g in main:
        rows.append({"y": y, "h": row_h, "label": f"group {g.id}", "sub": g.kind,
                     "color": g.color})
        for s, e in bm.slots:  # what the group leaves empty shows through its pages
            rects.append(rect(x(s), x(e), y, "url(#empty)",
                              f"group {g.id}: empty slot, {human_bytes(e - s)}"))
        for seg in bm.of(g.id):
            mid = seg.start + seg.useful
            num = _NUMBER.match(seg.layer)
            label = num.group(2) if num and x(mid) - x(seg.start) >= 18 else ""
            rects.append(rect(x(seg.start), x(mid), y, g.color,
                              f"{seg.layer}: {human_bytes(seg.useful)} of state at byte "
                              f"{seg.start:,} of the block", label))
            if seg.page > seg.useful:
                rects.append(rect(x(mid), x(seg.end), y, f"url(#pp{g.id})",
                                  f"{seg.layer}: {human_bytes(seg.page - seg.useful)} of "
                                  "page padding"))
        if bm.used < per_block:
            rects.append(rect(x(bm.used), x(per_block), y, "url(#align)",
                              f"alignment: {human_bytes(per_block - bm.used)} no group uses"))
        y += row_h + gap
    bottom = y - gap
    bounds = sorted({s for s, _ in bm.slots} | {e for _, e in bm.slots} | {0, per_block})
    marks = [{"x": x(b), "y1": top - 6, "y2": bottom + 6} for b in bounds]
    ticks, last = [], -1e9
    for b in bounds:
        if x(b) - last >= 64 and (b == per_block or x(per_block) - x(b) >= 64):
            anchor = "start" if b == 0 else "end" if b == per_block else "middle"
            ticks.append({"x": x(b), "text": short_bytes(b) if b else "0", "anchor": anchor})
            last = x(b)
    own_rows = []
    own_title_y = None
    if own:
        own_title_y = y + 14
        y += 24
        for g in own:
            page, useful = g.pages[0] if g.pages else (0, 0)
            w = bar_w * min(1.0, page / per_block) if page else 0
            uw = w * useful / page if page else 0
            own_rows.append({"id": g.id, "y": y, "h": row_h, "label": f"group {g.id}",
                             "sub": g.kind,
                             "color": g.color, "x": label_w, "w": round(w, 2),
                             "uw": round(uw, 2),
                             "title": f"{', '.join(g.layers)}: one page of {human_bytes(page)} "
                                      "per block of its own pool"})
            y += row_h + gap
    legend = [{"fill": g.color, "text": f"group {g.id}: {g.kind}, {g.num_layers} layers"}
              for g in report.groups]
    if any(g.padded for g in report.groups):
        legend.append({"fill": "url(#legendpad)", "text": "page padding (hatched in the "
                                                          "group's colour)"})
    if any(bm.waste(g.id).padding_slots for g in main):
        legend.append({"fill": "url(#empty)", "text": "empty slot: bytes another group uses"})
    if bm.used < per_block:
        legend.append({"fill": "url(#align)", "text": "alignment: no group's bytes"})
    cols, col_w = 3, (width - 20) // 3
    items = [{**item, "x": 10 + (i % cols) * col_w, "y": y + 14 + (i // cols) * 22}
             for i, item in enumerate(legend)]
    height = y + 14 + ((len(legend) + cols - 1) // cols) * 22 + 6
    return {"width": width, "height": height, "rows": rows, "rects": rects, "marks": marks,
            "ticks": ticks, "own": own_rows, "own_title_y": own_title_y, "legend": items,
            "label_w": label_w, "bar_w": bar_w, "top": top, "bottom": bottom,
            "groups": [{"id": g.id, "color": g.color} for g in report.groups]}


def ascii_block(report: Report, width: int = 56) -> list[tuple[str, str]]:
    """One block as a row of characters per group: ``#`` state, ``+`` page
    padding, ``.`` an empty slot, ``_`` alignment; the same column is the same bytes."""
    bm = report.block
    per = bm.bytes_per_block or 1
    rows = []
    for g in report.groups:
        if g.own_pool:
            continue
        cells = []
        for i in range(width):
            lo, hi = per * i / width, per * (i + 1) / width
            mid = (lo + hi) / 2
            ch = "_" if mid >= bm.used else "."
            for seg in bm.of(g.id):
                if seg.start <= mid < seg.end:
                    ch = "#" if mid < seg.start + seg.useful else "+"
                    break
            cells.append(ch)
        rows.append((f"group {g.id}", "".join(cells)))
    return rows


def _nice_ticks(hi: float, n: int = 5) -> list[float]:
    if hi <= 0:
        return [0.0]
    raw = hi / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    return [i * step for i in range(int(hi // step) + 1)]


def _short(n: float) -> str:
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:g}{unit}"
    return f"{n:g}"


def capacity_chart(report: Report, width: int = 560, height: int = 320) -> dict[str, Any]:
    """A line of KV tokens against memory over the sweep, the budget marked."""
    left, right, top, bottom = 70, 20, 20, 50
    pts = [c for c in report.sweep if c.fits]
    gib = 2**30
    xs_hi = max((c.memory for c in report.sweep), default=1) / gib
    ys_hi = max((c.kv_tokens for c in pts), default=1) * 1.08 or 1
    xt = _nice_ticks(xs_hi * 1.02)
    yt = _nice_ticks(ys_hi)
    x_max = max(xt[-1], xs_hi) or 1
    y_max = max(yt[-1], ys_hi) or 1
    pw, ph = width - left - right, height - top - bottom

    def px(mem_gib: float) -> float:
        return round(left + mem_gib / x_max * pw, 2)

    def py(tokens: float) -> float:
        return round(top + ph - tokens / y_max * ph, 2)

    points = [{"x": px(c.memory / gib), "y": py(c.kv_tokens),
               "title": f"{human_bytes(c.memory)}: {c.kv_tokens:,} tokens, "
                        f"{c.num_blocks:,} blocks, {c.max_concurrency:.2f}x"} for c in pts]
    budget = None
    if report.memory is not None:
        cap = report.capacity
        fits = cap is not None and cap.fits
        budget = {"x": px(report.memory / gib), "y1": top, "y2": top + ph,
                  "text": f"budget {human_bytes(report.memory)}",
                  "y": py(cap.kv_tokens) if fits else None,
                  "title": f"{human_bytes(report.memory)}: {cap.kv_tokens:,} tokens" if fits
                  else f"{human_bytes(report.memory)}: does not fit one request"}
    return {
        "width": width, "height": height, "left": left, "top": top, "pw": pw, "ph": ph,
        "path": " ".join(f"{'M' if i == 0 else 'L'}{p['x']},{p['y']}"
                         for i, p in enumerate(points)),
        "points": points, "budget": budget,
        "min": {"x": px(report.min_memory / gib),
                "text": f"one request: {human_bytes(report.min_memory)}"},
        "xticks": [{"x": px(t), "text": f"{t:g}"} for t in xt if t <= x_max],
        "yticks": [{"y": py(t), "text": _short(t)} for t in yt if t <= y_max],
    }


# ---------------------------------------------------------------------------
# rendering
# ---------------------------------------------------------------------------


def table(rows: list[list[Any]], headers: list[str], right: str = "") -> str:
    """Aligned text columns; ``right`` holds ``r`` for each right-aligned column."""
    cells = [list(map(str, headers))] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r: list[str]) -> str:
        return "  ".join(c.rjust(w) if i < len(right) and right[i] == "r" else c.ljust(w)
                         for i, (c, w) in enumerate(zip(r, widths))).rstrip()

    out = [line(cells[0]), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells[1:]]
    return "\n".join(out)


def md_table(rows: list[list[Any]], headers: list[str], right: str = "") -> str:
    def esc(c: Any) -> str:
        return str(c).replace("|", "\\|")

    aligns = ["---:" if i < len(right) and right[i] == "r" else "---"
              for i in range(len(headers))]
    out = ["| " + " | ".join(map(esc, headers)) + " |", "| " + " | ".join(aligns) + " |"]
    out += ["| " + " | ".join(map(esc, r)) + " |" for r in rows]
    return "\n".join(out)


def wrap(text: str, width: int = 78, indent: str = "  ") -> str:
    import textwrap
    return textwrap.fill(text, width=width, initial_indent=indent, subsequent_indent=indent + "  ",
                         break_on_hyphens=False)


def short_bytes(n: float) -> str:
    """``human_bytes`` without trailing zeros: ``328 KiB``, ``16.5 KiB``, ``2.02 MiB``."""
    text = human_bytes(n)
    if " " not in text:
        return text
    value, unit = text.split(" ")
    if "." in value:
        value = value.rstrip("0").rstrip(".")
    return f"{value} {unit}"


def pages_text(pages: tuple[tuple[int, int], ...]) -> str:
    return "/".join(short_bytes(p) for p, _ in pages) or "-"


def group_padding(g: GroupRow, per_page: str = "/page") -> str:
    """``1 slot, +240 KiB/page``: a group's padding slots and page padding."""
    parts = []
    if g.padding_slots:
        parts.append(f"{g.padding_slots} slot" + ("s" if g.padding_slots > 1 else ""))
    pads = sorted({p - u for p, u in g.pages if p != u}, reverse=True)
    if pads:
        parts.append("/".join(f"+{short_bytes(x)}" for x in pads) + per_page)
    return ", ".join(parts) or "-"


def arrow(change: Any) -> str:
    """``64 KiB -> 32 KiB (-50.0%)``: a diff's change, old to new."""
    ratio = getattr(change, "ratio", None)
    return f"{change.a} -> {change.b}" + (f" ({ratio:+.1%})" if ratio is not None else "")


def pct(x: float) -> str:
    return f"{x:.1%}"


@lru_cache(maxsize=1)
def environment():
    """The Jinja2 environment over ``kvspec/templates``: HTML autoescaped,
    undefined variables are errors."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("kvspec", "templates"),
        autoescape=jinja2.select_autoescape(enabled_extensions=("html.j2",),
                                            default_for_string=False, default=False),
        undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
        keep_trailing_newline=True, extensions=["jinja2.ext.do"])
    env.filters.update(bytes=human_bytes, sbytes=short_bytes, pct=pct, table=table, md_table=md_table,
                       wrap=wrap, pages=pages_text, padding=group_padding,
                       num=lambda n: f"{n:,}", arrow=arrow)
    return env


def render(report: Report, fmt: str = "text") -> str:
    """The report as ``text`` (80 columns), ``md`` or self-contained ``html``."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}")
    from kvspec import __version__
    ctx: dict[str, Any] = {"r": report, "version": __version__,
                           "ascii": ascii_block(report)}
    if fmt == "html":
        ctx["block"] = block_picture(report)
        ctx["chart"] = capacity_chart(report)
    return environment().get_template(f"explain.{fmt}.j2").render(**ctx)
