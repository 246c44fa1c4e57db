"""``kvspec diff``: what changes between two layouts, in planning terms.

Each side is a source (compiled) or an artifact (verified); both are compared
as plans: engine settings, groups (matched by their layer sets, then by kind
and overlap), pages, padding, bytes per block, placement, block sizes, and the
capacity both give for the *same* budget (``--memory``, else A's).

>>> d = diff("layouts/llama-3.1-8b.yaml", "layouts/llama-3.1-8b.kvlayout.json")
>>> d.identical, d.capacity_a.num_blocks == d.capacity_b.num_blocks
(True, True)
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from kvspec.compiled import engine_record
from kvspec.model.kinds import describe, ref_kind_name
from kvspec.model.plan import Group, Layout
from kvspec.reports.explain import (
    Capacity,
    GroupRow,
    Report,
    Subject,
    build_report,
    capacity,
    environment,
    group_padding,
    pages_text,
    read_subject,
)
from kvspec.reports.format import compact_layers, human_bytes

__all__ = ["Change", "Diff", "GroupChange", "diff", "render_diff"]

#: ``kvspec diff`` exits 1 when the plans differ (0 when identical, 2 on error).
EXIT_DIFFER = 1

#: Engine fields that follow from others or from the budget, not the plan's choices.
_ENGINE_DERIVED = frozenset({"model_max_len"})


@dataclass(frozen=True)
class Change:
    """One field that differs: ``what`` went from ``a`` to ``b`` (display strings)."""

    what: str
    a: str
    b: str
    #: Relative change ``(b - a) / a`` where both are numbers.
    ratio: float | None = None


@dataclass(frozen=True)
class GroupChange:
    status: str  # "added" | "removed" | "changed" | "same"
    a: GroupRow | None
    b: GroupRow | None
    changes: tuple[Change, ...] = ()
    layers_added: tuple[str, ...] = ()
    layers_removed: tuple[str, ...] = ()

    @property
    def row(self) -> GroupRow:
        row = self.b if self.b is not None else self.a
        assert row is not None
        return row


@dataclass(frozen=True)
class Side:
    path: str
    kind: str
    name: str
    memory: int | None


@dataclass(frozen=True)
class Diff:
    a: Side
    b: Side
    meta: tuple[Change, ...]
    engine: tuple[Change, ...]
    layers_added: tuple[str, ...]
    layers_removed: tuple[str, ...]
    groups: tuple[GroupChange, ...]
    stages: tuple[Change, ...]
    memory: int | None
    capacity_a: Capacity | None
    capacity_b: Capacity | None
    capacity: tuple[Change, ...]
    waste: Change | None

    @property
    def identical(self) -> bool:
        return not (self.engine or self.layers_added or self.layers_removed or self.stages
                    or any(g.status != "same" for g in self.groups))

    @property
    def num_changes(self) -> int:
        return (len(self.engine) + len(self.stages) + (1 if self.layers_added else 0)
                + (1 if self.layers_removed else 0)
                + sum(1 for g in self.groups if g.status != "same"))

    def as_dict(self) -> dict[str, Any]:
        def group(g: GroupRow | None) -> dict[str, Any] | None:
            if g is None:
                return None
            return {"id": g.id, "kind": g.kind, "layers": list(g.layers),
                    "num_layers": g.num_layers, "block_size": g.block_size,
                    "pages": [{"page": p, "useful": u} for p, u in g.pages],
                    "padding_slots": g.padding_slots, "own_pool": g.own_pool,
                    "blocks_per_request": g.blocks_per_request}

        return {
            "identical": self.identical,
            "a": dataclasses.asdict(self.a), "b": dataclasses.asdict(self.b),
            "meta": [dataclasses.asdict(c) for c in self.meta],
            "engine": [dataclasses.asdict(c) for c in self.engine],
            "layers": {"added": list(self.layers_added), "removed": list(self.layers_removed)},
            "groups": [{"status": g.status, "a": group(g.a), "b": group(g.b),
                        "changes": [dataclasses.asdict(c) for c in g.changes],
                        "layers_added": list(g.layers_added),
                        "layers_removed": list(g.layers_removed)} for g in self.groups],
            "stages": [dataclasses.asdict(c) for c in self.stages],
            "memory": self.memory,
            "capacity": {"a": _cap(self.capacity_a), "b": _cap(self.capacity_b),
                         "changes": [dataclasses.asdict(c) for c in self.capacity]},
            "waste": dataclasses.asdict(self.waste) if self.waste else None,
        }


def _cap(c: Capacity | None) -> dict[str, Any] | None:
    return dataclasses.asdict(c) if c is not None else None


def _show(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, (list, dict)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def _tensors(n: int) -> str:
    return f"{n} tensor" + ("s" if n != 1 else "")


def _ratio(a: Any, b: Any) -> float | None:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) \
            and not isinstance(a, bool) and a:
        return (b - a) / a
    return None


def _change(what: str, a: Any, b: Any, fmt=_show) -> Change:
    return Change(what, fmt(a), fmt(b), _ratio(a, b))


# ---------------------------------------------------------------------------
# matching groups
# ---------------------------------------------------------------------------


def match_groups(a: Sequence[Group], b: Sequence[Group]
                 ) -> tuple[list[tuple[int, int]], list[int], list[int]]:
    """Pairs of group indices ``(i, j)``, then A's and B's unmatched ones.

    Identical layer sets pair first; then, among groups of the same kind, the
    pairs sharing the most layers; groups with nothing in common stay unpaired.
    """
    sa = [frozenset(g.layer_names) for g in a]
    sb = [frozenset(g.layer_names) for g in b]
    ka = [ref_kind_name(g.spec) for g in a]
    kb = [ref_kind_name(g.spec) for g in b]
    pairs: list[tuple[int, int]] = []
    free_a, free_b = set(range(len(a))), set(range(len(b)))
    for i in sorted(free_a):
        j = next((j for j in sorted(free_b) if sb[j] == sa[i]), None)
        if j is not None:
            pairs.append((i, j))
            free_a.discard(i)
            free_b.discard(j)
    candidates = sorted(((len(sa[i] & sb[j]), -i, -j) for i in free_a for j in free_b
                         if ka[i] == kb[j] and sa[i] & sb[j]), reverse=True)
    for _, ni, nj in candidates:
        i, j = -ni, -nj
        if i in free_a and j in free_b:
            pairs.append((i, j))
            free_a.discard(i)
            free_b.discard(j)
    return sorted(pairs), sorted(free_a), sorted(free_b)


#: Spec fields a group row shows already (page, block size) or that name the class.
_SPEC_SHOWN = frozenset({"page_size_bytes", "class", "block_size"})


def _spec_changes(names: list[str], la: Layout, lb: Layout) -> list[Change]:
    """Per-layer spec fields that differ, summarised over the group's layers."""
    seen: dict[tuple[str, str, str], int] = {}
    for n in names:
        sa, sb = describe(la.layers[n].spec), describe(lb.layers[n].spec)
        for key in sorted(set(sa) | set(sb)):
            if key not in _SPEC_SHOWN and sa.get(key) != sb.get(key):
                k = (key, _show(sa.get(key)), _show(sb.get(key)))
                seen[k] = seen.get(k, 0) + 1
    return [Change(f"{key} ({count} layer{'s' if count > 1 else ''})", va, vb)
            for (key, va, vb), count in seen.items()]


def _group_changes(ga: Group, gb: Group, ra: GroupRow, rb: GroupRow,
                   la: Layout, lb: Layout) -> list[Change]:
    out = [_change(what, va, vb) for what, va, vb in (
        ("kind", ra.kind, rb.kind), ("block_size", ra.block_size, rb.block_size),
        ("own pool", ra.own_pool, rb.own_pool),
        ("blocks per request", ra.blocks_per_request, rb.blocks_per_request)) if va != vb]
    if ra.pages != rb.pages:
        out.append(Change("page", pages_text(ra.pages), pages_text(rb.pages),
                          _ratio(sum(p for p, _ in ra.pages), sum(p for p, _ in rb.pages))))
    if group_padding(ra) != group_padding(rb):
        out.append(Change("padding", group_padding(ra), group_padding(rb)))
    if ra.useful_bytes != rb.useful_bytes:
        out.append(_change("state per block", ra.useful_bytes, rb.useful_bytes, human_bytes))
    in_b = set(gb.layer_names)
    out += _spec_changes([n for n in ga.layer_names if n in in_b], la, lb)
    return out


def _groups(la: Layout, lb: Layout, rep_a: Report, rep_b: Report) -> list[GroupChange]:
    """Every group of A and B: paired and compared, removed or added."""
    pairs, only_a, only_b = match_groups(la.groups, lb.groups)
    groups: list[GroupChange] = []
    for i, j in pairs:
        ga, gb = la.groups[i], lb.groups[j]
        ra, rb = rep_a.groups[i], rep_b.groups[j]
        changes = _group_changes(ga, gb, ra, rb, la, lb)
        set_a, set_b = set(ga.layer_names), set(gb.layer_names)
        plus = compact_layers([n for n in gb.layer_names if n not in set_a])
        minus = compact_layers([n for n in ga.layer_names if n not in set_b])
        status = "changed" if changes or plus or minus or i != j else "same"
        groups.append(GroupChange(status, ra, rb, tuple(changes), plus, minus))
    groups += [GroupChange("removed", rep_a.groups[i], None) for i in only_a]
    groups += [GroupChange("added", None, rep_b.groups[j]) for j in only_b]
    order = {"changed": 0, "removed": 1, "added": 2, "same": 3}
    groups.sort(key=lambda g: (order[g.status], g.row.id))
    return groups


# ---------------------------------------------------------------------------
# engine, blocks and placement, capacity
# ---------------------------------------------------------------------------


def _engine(la: Layout, lb: Layout) -> list[Change]:
    """Engine settings that differ, by the names an artifact gives them."""
    ea, eb = (msgspec.to_builtins(engine_record(x)) for x in (la, lb))
    return [_change(k, ea.get(k), eb.get(k)) for k in sorted(set(ea) | set(eb))
            if k not in _ENGINE_DERIVED and ea.get(k) != eb.get(k)]


def _placement(layout: Layout, index: int) -> list[tuple]:
    """A stage's tensors, each with its layers' spec: what placement compares."""
    st = layout.stage(index)
    return [(t, st.groups[t.group].layer_spec(t.layers[0])) for t in st.tensors]


_STAGE_FIGURES = (("bytes_per_block", "bytes per block", human_bytes),
                  ("fixed_bytes", "fixed bytes (own pools)", human_bytes),
                  ("memory_per_request", "one request at max_model_len", human_bytes),
                  ("min_num_blocks", "blocks to serve one request", _show))


def _stages(la: Layout, lb: Layout, rep_a: Report, rep_b: Report) -> list[Change]:
    out = []
    if len(la.stages) != len(lb.stages):
        out.append(_change("pipeline stages", len(la.stages), len(lb.stages)))
    for sa, sb in zip(rep_a.stages, rep_b.stages):
        tag = f"stage {sa.index} " if len(la.stages) > 1 else ""
        for key, label, fmt in _STAGE_FIGURES:
            if getattr(sa, key) != getattr(sb, key):
                out.append(_change(tag + label, getattr(sa, key), getattr(sb, key), fmt))
        ta, tb = _placement(la, sa.index), _placement(lb, sb.index)
        if ta != tb:
            out.append(Change(tag + "placement", _tensors(len(ta)),
                              _tensors(len(tb)) + ", offsets or strides differ"))
    for label, va, vb in (
            ("scheduler block", la.scheduler_block_size, lb.scheduler_block_size),
            ("prefix-hash block", la.hash_block_size, lb.hash_block_size),
            ("zero new blocks", la.needs_zeroing, lb.needs_zeroing)):
        if va != vb:
            out.append(_change(label, va, vb))
    return out


def _capacity(cap_a: Capacity | None, cap_b: Capacity | None) -> list[Change]:
    if cap_a is None or cap_b is None:
        return []
    if cap_a.fits != cap_b.fits:
        return [Change("serves one request", "yes" if cap_a.fits else "no",
                       "yes" if cap_b.fits else "no")]
    if not cap_a.fits:
        return []
    out = [_change(label, getattr(cap_a, key), getattr(cap_b, key))
           for key, label in (("num_blocks", "blocks"), ("kv_tokens", "KV tokens"),
                              ("max_model_len", "max_model_len"))
           if getattr(cap_a, key) != getattr(cap_b, key)]
    if f"{cap_a.max_concurrency:.2f}" != f"{cap_b.max_concurrency:.2f}":
        out.append(Change("max concurrency", f"{cap_a.max_concurrency:.2f}x",
                          f"{cap_b.max_concurrency:.2f}x",
                          _ratio(cap_a.max_concurrency, cap_b.max_concurrency)))
    return out


# ---------------------------------------------------------------------------
# the diff
# ---------------------------------------------------------------------------


def diff(path_a: str | Path, path_b: str | Path, *, memory: int | None = None) -> Diff:
    """Compare two layouts (sources or artifacts) for ``memory`` bytes per rank
    (default: A's budget)."""
    sub_a = read_subject(path_a, memory)
    sub_b = read_subject(path_b, memory if memory is not None else sub_a.memory)
    return compare(sub_a, sub_b)


def compare(sub_a: Subject, sub_b: Subject) -> Diff:
    la, lb = sub_a.layout, sub_b.layout
    rep_a, rep_b = build_report(sub_a), build_report(sub_b)
    meta = [_change(k, va, vb) for k, va, vb in (("name", la.name, lb.name),
                                                  ("model", la.model, lb.model)) if va != vb]
    added = compact_layers([n for n in lb.layers if n not in la.layers])
    removed = compact_layers([n for n in la.layers if n not in lb.layers])
    memory = sub_a.memory if sub_a.memory is not None else sub_b.memory
    cap_a = capacity(sub_a, memory) if memory is not None else None
    cap_b = capacity(sub_b, memory) if memory is not None else None
    waste = None
    if f"{rep_a.waste_share:.1%}" != f"{rep_b.waste_share:.1%}":
        waste = Change("padding waste", f"{rep_a.waste_share:.1%}", f"{rep_b.waste_share:.1%}")
    return Diff(
        a=Side(sub_a.path, sub_a.kind, la.name, sub_a.memory),
        b=Side(sub_b.path, sub_b.kind, lb.name, sub_b.memory),
        meta=tuple(meta), engine=tuple(_engine(la, lb)), layers_added=added,
        layers_removed=removed, groups=tuple(_groups(la, lb, rep_a, rep_b)),
        stages=tuple(_stages(la, lb, rep_a, rep_b)), memory=memory, capacity_a=cap_a,
        capacity_b=cap_b, capacity=tuple(_capacity(cap_a, cap_b)), waste=waste)


def render_diff(d: Diff, fmt: str = "text") -> str:
    """The diff as ``text``, ``md`` or ``json``."""
    if fmt == "json":
        return json.dumps(d.as_dict(), indent=1, sort_keys=True) + "\n"
    if fmt not in ("text", "md"):
        raise ValueError(f"unknown format {fmt!r}")
    return environment().get_template(f"diff.{fmt}.j2").render(d=d)
