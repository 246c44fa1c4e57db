"""``kvspec transfer``: can blocks move from one deployment's cache to another's, and how.

:func:`plan_transfer` takes two artifacts (a prefill and a decode deployment, an
engine and its offload tier) and returns a :class:`Transfer`: the verdict, the
:class:`~kvspec.connectors.plan.TransferPlan` and what it costs in descriptors.

* **compatible** -- the same geometry (the identity digest but for the model's name)
  and block counts: every rank moves its blocks' bytes to the same bytes of the same
  rank;
* **re-mappable** -- the same geometry and cells, laid out differently: another tensor
  parallel size (a destination rank gathers its heads from several source ranks, or
  several destination ranks split one source rank's), axis order, block size where one
  divides the other (the smaller block is the unit moved), pipeline split or block
  count. The plan lists per (source rank, destination rank, group) the runs of one block
  (or unit), merged where both sides are contiguous;
* **refused** -- :class:`~kvspec.connectors.compat.TransferRefused`, naming the field.

Groups are named by the destination's group id (``"0"``, ``"1"``...); each destination
group's layers must all be in one source group, whose blocks map onto it.

>>> from kvspec.artifact import Artifact
>>> art = Artifact.read("layouts/gpt-oss-120b.kvlayout.json")
>>> t = plan_transfer(art, art, src_blocks=9300, dst_blocks=9300)
>>> t.verdict, [(c.key, c.descriptors, c.per_layer_kv, c.vllm) for c in t.counts]
('compatible', [('0', 18, 36, 18), ('1', 18, 36, 18)])
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

from kvspec.artifact import Artifact
from kvspec.connectors.compat import Deployment, check, heads_total
from kvspec.connectors.descriptor import Layer, identity_digest
from kvspec.connectors.exporters.vllm_nixl import descriptors_per_block
from kvspec.connectors.plan import Region, Route, Run, Side, TransferPlan
from kvspec.connectors.remap import merge, page_runs
from kvspec.model import kinds

__all__ = ["GroupCount", "GroupPair", "Transfer", "plan_transfer"]


@dataclass(frozen=True, slots=True)
class GroupPair:
    """A destination group, the source group its blocks come from, and the unit moved:
    ``unit`` tokens, ``src_sub``/``dst_sub`` of them a block on each side."""

    key: str
    src: int
    dst: int
    unit: int | None  # None: a state group (a block is its one state)
    src_sub: int
    dst_sub: int


@dataclass(frozen=True, slots=True)
class GroupCount:
    """Descriptors one destination rank posts per destination block of a group."""

    key: str
    src_group: int
    dst_group: int
    kind: str
    layers: int
    src_block_size: int
    dst_block_size: int
    #: Bytes moved into one destination block, and the source ranks they come from.
    bytes_per_block: int
    sources: int
    #: kvspec's plan: merged runs.
    descriptors: int
    #: A connector posting one descriptor per layer and per K and V, per source rank.
    per_layer_kv: int
    #: vLLM 0.33.0's NIXL connector for the same cache (None: it cannot move these).
    vllm: int | None


@dataclass(frozen=True, slots=True)
class Transfer:
    """What ``kvspec transfer`` decided, the plan, and its descriptor counts."""

    verdict: str
    reasons: tuple[str, ...]
    plan: TransferPlan
    counts: tuple[GroupCount, ...]
    source: Deployment
    destination: Deployment


def plan_transfer(src_art: Artifact, dst_art: Artifact, *, src_file: str = "SRC",
                  dst_file: str = "DST", src_blocks: int | Mapping[str, int] | None = None,
                  dst_blocks: int | Mapping[str, int] | None = None) -> Transfer:
    """The transfer from ``src_art`` to ``dst_art``, their pools sized for
    ``src_blocks`` and ``dst_blocks`` (default: each artifact's budget or fixed count)."""
    src = Deployment.of(src_art, src_file, src_blocks)
    dst = Deployment.of(dst_art, dst_file, dst_blocks)
    check(src, dst)
    pairs = _group_pairs(src, dst)
    runs: dict[tuple[int, int, str], list[tuple[int, ...]]] = defaultdict(list)
    totals: dict[tuple[str, int, int], int | None] = {}
    for dst_rank, desc in enumerate(dst.descs):
        for d in desc.layers:
            pair = pairs[d.group]
            for key, run in _layer_runs(src, dst, d, desc.parallel.tensor_rank, pair, totals):
                runs[(key[0], dst_rank, pair.key)].append(run)
    routes = tuple(Route(sr, dr, key, tuple(Run(*r) for r in merge(found)),
                         pairs[int(key)].src_sub, pairs[int(key)].dst_sub)
                   for (sr, dr, key), found in sorted(runs.items(), key=_route_order))
    plan = TransferPlan(_side(src, pairs, "src"), _side(dst, pairs, "dst"), routes)
    verdict, reasons = _verdict(src, dst, pairs)
    return Transfer(verdict, reasons, plan, _counts(src, dst, pairs, plan), src, dst)


def _route_order(item: tuple[tuple[int, int, str], list]) -> tuple[int, int, int]:
    (sr, dr, key), _ = item
    return dr, int(key), sr


def _group_pairs(src: Deployment, dst: Deployment) -> dict[int, GroupPair]:
    """Each destination group's source group and unit; a refusal where a destination
    group's layers lie in several source groups or block sizes do not divide."""
    out = {}
    for g in dst.art.body.groups:
        names = [n for n in g.layers if n in dst.where]
        if not names:
            continue
        found = sorted(x for x in {src.art.body.layers[n].group for n in names} if x is not None)
        path = ("body", "groups", g.id)
        if len(found) != 1:
            raise dst.refuse(f"group {g.id} of {dst.file} holds layers of {len(found)} groups "
                             f"of {src.file} ({found}): one block id cannot map onto it",
                             (*path, "layers"), expected="the layers of one source group")
        sg = src.art.body.groups[found[0]]
        bs, bd = sg.block_size, g.block_size
        state = all(kinds.by_name(dst.layer(n).kind).state for n in names)
        if (bs != bd and state) or (max(bs, bd) % min(bs, bd)):
            raise dst.refuse(f"group {g.id}: block size {bd} of {dst.file} and {bs} of "
                             f"{src.file} " + ("differ, and a state group's block is one "
                                               "state" if state else "do not divide"),
                             (*path, "block_size"), expected=f"{bs}, or a divisor or "
                             f"multiple of it" if not state else str(bs), found=str(bd))
        unit = min(bs, bd)
        out[g.id] = GroupPair(str(g.id), sg.id, g.id, None if state else unit, bs // unit,
                              bd // unit)
    return out


def _layer_runs(src: Deployment, dst: Deployment, d: Layer, tensor_rank: int,
                pair: GroupPair, totals: dict) -> list[tuple[tuple[int], tuple[int, ...]]]:
    """``((src rank,), run fields)`` of destination layer ``d`` on a rank of tensor rank
    ``tensor_rank``: per source rank its heads come from, the page runs of one unit."""
    kind = kinds.by_name(d.kind)
    s0 = src.layer(d.name)
    stage = src.where[d.name][0]
    if kind.latent or kind.state:
        total = None
    else:
        sig = (s0.heads, d.heads, d.kind)
        if sig not in totals:
            totals[sig] = heads_total(src, dst, d.name)
        total = totals[sig]
    states = 1 if pair.unit is None else _unit_states(pair.unit, dst, d)
    out: list[tuple[tuple[int], tuple[int, ...]]] = []
    for src_t, a, b, k in _segments(kind.latent or kind.state, s0.heads, d.heads, src.tp,
                                    dst.tp, tensor_rank, total):
        s = src.layer(d.name, src_t)
        src_sub = states * s.state_stride if pair.src_sub > 1 else 0
        dst_sub = states * d.state_stride if pair.dst_sub > 1 else 0
        for so, do, length in page_runs(s.offset + a * s.head_stride,
                                        (s.head_stride, s.state_stride),
                                        d.offset + b * d.head_stride,
                                        (d.head_stride, d.state_stride), d.cell_bytes, k,
                                        states):
            out.append(((stage * src.tp + src_t,), (s.region, so, s.block_stride, d.region, do,
                                                    d.block_stride, length, src_sub, dst_sub)))
    return out


def _unit_states(unit: int, dst: Deployment, d: Layer) -> int:
    si, ti = dst.where[d.name]
    tps = Fraction(dst.art.body.stages[si].tensors[ti].view.tokens_per_state or "1")
    states = Fraction(unit) / tps
    if states.denominator != 1:
        raise dst.refuse(f"layer {d.name}: a unit of {unit} tokens is not a whole number of "
                         f"its states ({tps} tokens each)",
                         dst.tensor_path(d.name, "view", "tokens_per_state"))
    return int(states)


@lru_cache(maxsize=1024)
def _segments(whole: bool, hs: int, hd: int, ts: int, td: int, t_d: int, total: int | None
              ) -> tuple[tuple[int, int, int, int], ...]:
    """``(source tensor rank, its first head, destination's first head, heads)`` that
    fill the destination rank ``t_d``'s heads. ``whole``: a latent or state layer, the
    same on every rank it is on (the source rank ``t_d % ts``)."""
    if whole:
        return ((t_d % ts if ts != td else t_d, 0, 0, 1),)
    if total is None:  # one head per rank on as many ranks: rank t holds what rank t holds
        return ((t_d, 0, 0, hd),)
    mine = range(t_d * hd, t_d * hd + hd) if hd * td == total else [t_d // (td // total)]
    found: list[list[int]] = []
    for j, g in enumerate(mine):
        if hs * ts == total:
            rank, local = divmod(g, hs)
        else:  # replicated on the source: ts // total ranks hold head g
            rep = ts // total
            rank, local = g * rep + t_d % rep, 0
        last = found[-1] if found else None
        if last and last[0] == rank and last[1] + last[3] == local and last[2] + last[3] == j:
            last[3] += 1
        else:
            found.append([rank, local, j, 1])
    return tuple(tuple(f) for f in found)  # type: ignore[misc]


def _side(side: Deployment, pairs: Mapping[int, GroupPair], which: str) -> Side:
    regions = tuple(Region(d.parallel.rank, r.id, r.name, r.length)
                    for d in side.descs for r in d.regions)
    counts: dict[str, int] = {}
    for p in pairs.values():
        gid = p.src if which == "src" else p.dst
        pool = next(g.pool for d in side.descs for g in d.groups if g.id == gid)
        counts[p.key] = next(x.num_blocks for x in side.descs[0].pools if x.name == pool)
    return Side(side.descs[0].identity, regions, counts)


def _verdict(src: Deployment, dst: Deployment, pairs: Mapping[int, GroupPair]
             ) -> tuple[str, tuple[str, ...]]:
    a, b = src.art.body.engine, dst.art.body.engine
    reasons = []
    for name in ("tensor_parallel_size", "pipeline_parallel_size", "axis_order"):
        if getattr(a, name) != getattr(b, name):
            reasons.append(f"{name} {getattr(a, name)} -> {getattr(b, name)}")
    for p in pairs.values():
        if p.src_sub != p.dst_sub:
            reasons.append(f"group {p.key} block_size {p.unit * p.src_sub} -> "  # type: ignore[operator]
                           f"{p.unit * p.dst_sub}")  # type: ignore[operator]
    counts = [{x.name: x.num_blocks for x in side.descs[0].pools} for side in (src, dst)]
    if counts[0] != counts[1]:
        shown = [", ".join(f"{k} {v}" for k, v in c.items()) for c in counts]
        reasons.append(f"num_blocks {shown[0]} -> {shown[1]}")
    # the geometry decides, not the names (two sources of one config are one model)
    same = identity_digest(src.art.body, src.art.envelope.format, named=False) == \
        identity_digest(dst.art.body, dst.art.envelope.format, named=False)
    if same and not reasons:
        return "compatible", ()
    if not same and not reasons:
        reasons.append("page placement differs")
    return "re-mappable", tuple(reasons)


def _counts(src: Deployment, dst: Deployment, pairs: Mapping[int, GroupPair],
            plan: TransferPlan) -> tuple[GroupCount, ...]:
    out = []
    for p in pairs.values():
        best = None
        for rank, desc in enumerate(dst.descs):
            routes = [r for r in plan.routes if r.group == p.key and r.dst_rank == rank]
            if not routes:
                continue
            layers = sum(1 for x in desc.layers if x.group == p.dst)
            row = (sum(len(r.runs) for r in routes) * p.dst_sub, rank, layers, len(routes),
                   sum(r.bytes_per_block for r in routes) * p.dst_sub)
            best = max(best, row) if best else row
        if best is None:
            continue
        runs, rank, layers, sources, nbytes = best
        group = next(g for g in dst.descs[rank].groups if g.id == p.dst)
        out.append(GroupCount(p.key, p.src, p.dst, group.kind, layers,
                              src.art.body.groups[p.src].block_size, group.block_size, nbytes,
                              sources, runs, layers * 2 * sources * p.dst_sub,
                              _vllm(src, dst, p, rank)))
    return tuple(out)


def _vllm(src: Deployment, dst: Deployment, p: GroupPair, rank: int) -> int | None:
    """What vLLM 0.33.0's NIXL connector posts per destination block of ``p``, where it
    can move it (``base_worker.py`` ``_validate_remote_agent_handshake``, l. 2788-2860):
    one axis order on both sides; another tensor-parallel size only with heads
    contiguous in a block (``LBHNC``, ``BLHNC``) or latent (MLA) caches, a read per
    source rank; a source block no larger than the destination's, read in units."""
    order = dst.art.body.engine.axis_order
    if src.art.body.engine.axis_order != order or p.src_sub != 1:
        return None
    latent = all(kinds.by_name(x.kind).latent for x in dst.descs[rank].layers
                 if x.group == p.dst)
    if src.tp != dst.tp and not latent and order not in ("LBHNC", "BLHNC"):
        return None
    per = descriptors_per_block(dst.descs[rank], p.dst)
    reads = 1 if latent else max(1, src.tp // dst.tp)
    return None if per is None else per * reads * p.dst_sub
