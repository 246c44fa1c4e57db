"""A transfer plan: which bytes of one deployment's KV cache move to which bytes of
another's, for any blocks.

A plan is data: ``kvspec transfer`` makes it from two artifacts (a test makes it by
hand), and a connector (:mod:`kvspec.connectors.nixl`) executes it for a request's
blocks. It names both sides by their identity digests, so that it is never applied to
caches it was not made for, and lists each side's regions (one registered allocation
per pool per rank: rank, id, name, length in bytes) and blocks per group.

The bytes of a block are affine in its id, so a plan stores one block's runs, with
strides. A *route* is one (source rank, destination rank, group); each of its runs
``Run(src_region, src_offset, src_stride, dst_region, dst_offset, dst_stride, length,
src_sub_stride, dst_sub_stride)`` moves, for source block ``s`` to destination block
``d``::

    length bytes at  src_region + src_offset + s * src_stride + i * src_sub_stride
                 to  dst_region + dst_offset + d * dst_stride + j * dst_sub_stride

``i`` and ``j`` are 0 unless the group's block sizes differ: then the smaller block
is the unit a plan moves, and a larger block holds ``k`` of them
(``Route.src_sub_blocks``, ``dst_sub_blocks``), unit ``i`` of a block
``i * sub_stride`` bytes in. The blocks of such a group are given as the request's
block lists on both sides (:class:`BlockLists`, in token order); unit ``u`` of the
request is unit ``u % k`` of block ``blocks[u // k]`` on each side.

Offsets are relative to the region's base. A route holds as few runs as the two
layouts allow (a run ends where the source or the destination stops being contiguous),
and construction checks that every run of every block of the pool lies inside its
region.

>>> side = lambda digest: Side(digest, (Region(0, 0, "device", 4096),), {"full": 4})
>>> plan = TransferPlan(side("sha256:aa"), side("sha256:bb"),
...                     (Route(0, 0, "full", (Run(0, 0, 1024, 0, 0, 1024, 1024),)),))
>>> plan.spans({"full": [(1, 2), (2, 3)]})   # blocks 1, 2 -> 2, 3: one merged span
{(0, 0): [Span(src_region=0, src_offset=1024, dst_region=0, dst_offset=2048, length=2048)]}
>>> TransferPlan.from_json(plan.to_json()) == plan
True
"""

# one idea: a plan, the checks that make it safe to apply, and its JSON are one format;
# split, the reader and the checks would drift from the type.

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kvspec.errors import KvspecError, Location, format_path
from kvspec.jsonpos import Located, scan

#: The plan format this module reads and writes.
PLAN_VERSION = 2
#: The columns of a run, as the JSON lists them.
RUN_COLUMNS = ("src_region", "src_offset", "src_stride", "dst_region", "dst_offset",
               "dst_stride", "length", "src_sub_stride", "dst_sub_stride")
_FORMAT_HINT = "make the plan again with `kvspec transfer SRC DST --format json`"


class TransferPlanError(KvspecError):
    """A transfer plan is malformed, or does not fit the caches or blocks it is applied to."""

    #: The path into the plan's JSON the problem is at (``()``: none).
    where: tuple[str | int, ...]

    def __init__(self, message: str, *, where: tuple[str | int, ...] = (), **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self._set(where=where)


class PlanFormatError(TransferPlanError):
    """A plan's JSON or fields are not a valid plan."""


class RunOutsideRegionError(TransferPlanError):
    """A run of some block reaches past the end of its region."""


class PlanMismatchError(TransferPlanError):
    """A plan applied to caches it was not made for (digest, rank, region or size)."""


class BlockIdError(TransferPlanError):
    """Block ids outside a side's pool, a destination block given twice, or an unknown group."""


class Region(NamedTuple):
    """One registered allocation of one rank: ``id`` is what runs refer to."""

    rank: int
    id: int
    name: str
    length: int


class Run(NamedTuple):
    """One contiguous move of one block, or one unit of it (see the module's docstring)."""

    src_region: int
    src_offset: int
    src_stride: int
    dst_region: int
    dst_offset: int
    dst_stride: int
    length: int
    src_sub_stride: int = 0
    dst_sub_stride: int = 0


class BlockLists(NamedTuple):
    """A request's blocks of one group on each side, in token order: what a group whose
    block sizes differ is given as (any group may be)."""

    src: Sequence[int]
    dst: Sequence[int]


#: One unit moved: (source block, its unit, destination block, its unit).
Unit = tuple[int, int, int, int]


class Span(NamedTuple):
    """A run instantiated for a block pair: bytes relative to the regions' bases."""

    src_region: int
    src_offset: int
    dst_region: int
    dst_offset: int
    length: int


@dataclass(frozen=True, slots=True)
class Side:
    """One deployment: its identity digest, regions, and blocks per group."""

    digest: str
    regions: tuple[Region, ...]
    num_blocks: Mapping[str, int]

    def region(self, rank: int, region_id: int) -> Region | None:
        return next((r for r in self.regions if (r.rank, r.id) == (rank, region_id)), None)

    def regions_of(self, rank: int) -> tuple[Region, ...]:
        return tuple(r for r in self.regions if r.rank == rank)


@dataclass(frozen=True, slots=True)
class Route:
    """The runs of one block of ``group`` from ``src_rank`` to ``dst_rank``."""

    src_rank: int
    dst_rank: int
    group: str
    runs: tuple[Run, ...]
    #: Units a source and a destination block hold (1 and 1 unless block sizes differ).
    src_sub_blocks: int = 1
    dst_sub_blocks: int = 1

    @property
    def bytes_per_block(self) -> int:
        """Bytes one unit moves (one block, when block sizes are equal)."""
        return sum(run.length for run in self.runs)


@dataclass(frozen=True, slots=True)
class TransferPlan:
    """Which bytes move, per (source rank, destination rank, group) and block."""

    source: Side
    destination: Side
    routes: tuple[Route, ...]
    version: int = field(default=PLAN_VERSION)

    def __post_init__(self) -> None:
        _check(self)

    # -- instantiating ---------------------------------------------------------
    def groups(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(route.group for route in self.routes))

    def sub_blocks(self, group: str) -> tuple[int, int]:
        """Units a source and a destination block of ``group`` hold."""
        route = next(r for r in self.routes if r.group == group)
        return route.src_sub_blocks, route.dst_sub_blocks

    def units(self, blocks: Any) -> dict[str, list[Unit]]:
        """``blocks`` as ``{group: [(src_block, src_unit, dst_block, dst_unit), ...]}``,
        checked against both pools. ``blocks`` maps groups to ``(src_block, dst_block)``
        pairs (a pair may be one id, the same on both sides) or to :class:`BlockLists`
        (a request's blocks on each side, in token order: what a group whose block sizes
        differ takes), or is those of a one-group plan. A :class:`BlockIdError` names
        the first id outside a pool, a destination block given twice, or an unknown
        group."""
        groups = self.groups()
        if not isinstance(blocks, Mapping) or set(blocks) == {"src", "dst"}:
            if len(groups) != 1:
                raise BlockIdError(f"the plan moves {len(groups)} groups, and the blocks "
                                   "name none", expected=f"block ids per group: {groups}",
                                   hint="pass {group: [(src_block, dst_block), ...]}")
            blocks = {groups[0]: blocks}
        out: dict[str, list[Unit]] = {}
        for group, items in blocks.items():
            if group not in groups:
                raise BlockIdError(f"the plan moves no group {group!r}", found=repr(group),
                                   expected=", ".join(map(repr, groups)),
                                   hint="name the groups as the plan's routes do")
            out[group] = _units(self, group, items)
        return out

    def block_pairs(self, blocks: Any) -> dict[str, list[tuple[int, int]]]:
        """``blocks`` (as :meth:`units` takes them) as ``{group: [(src_block,
        dst_block), ...]}``: one pair per unit moved."""
        return {g: [(s, d) for s, _, d, _ in units] for g, units in self.units(blocks).items()}

    def spans(self, blocks: Any, *, src_rank: int | None = None,
              dst_rank: int | None = None) -> dict[tuple[int, int], list[Span]]:
        """The byte spans to move per (source rank, destination rank), for ``blocks``
        (as :meth:`units` takes them), in block order, adjacent spans merged."""
        units = self.units(blocks)
        out: dict[tuple[int, int], list[Span]] = {}
        for route in self.routes:
            if (src_rank is not None and route.src_rank != src_rank) or \
                    (dst_rank is not None and route.dst_rank != dst_rank):
                continue
            spans = out.setdefault((route.src_rank, route.dst_rank), [])
            for s, i, d, j in units.get(route.group, ()):
                for run in route.runs:
                    _append(spans, Span(
                        run.src_region, run.src_offset + s * run.src_stride +
                        i * run.src_sub_stride, run.dst_region,
                        run.dst_offset + d * run.dst_stride + j * run.dst_sub_stride,
                        run.length))
        return out

    # -- JSON --------------------------------------------------------------------
    def to_json(self) -> str:
        """The plan as JSON text: sorted keys, one route per line."""
        head = {"kvspec_transfer_plan": self.version, "run_columns": list(RUN_COLUMNS),
                "source": _side_json(self.source), "destination": _side_json(self.destination)}
        text = json.dumps(head, sort_keys=True, separators=(",", ":"))
        routes = ",\n".join(json.dumps(
            {"src_rank": r.src_rank, "dst_rank": r.dst_rank, "group": r.group,
             "sub_blocks": [r.src_sub_blocks, r.dst_sub_blocks],
             "runs": [list(run) for run in r.runs]}, sort_keys=True, separators=(",", ":"))
            for r in self.routes)
        return f'{text[:-1]},"routes":[\n{routes}\n]}}\n'

    @classmethod
    def from_json(cls, text: str, *, file: str | None = None) -> TransferPlan:
        """Read a plan that :meth:`to_json` wrote; a :class:`PlanFormatError` at the
        first field that is missing, unknown or of the wrong type."""
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            line, column = getattr(exc, "lineno", None), getattr(exc, "colno", None)
            raise PlanFormatError(f"a transfer plan is not valid JSON: {exc}", file=file,
                                  line=line, column=column, hint=_FORMAT_HINT) from None
        try:
            return _read_plan(data)
        except TransferPlanError as err:
            raise err.at(_position(text, file, err.where)) from None


# -- checks ----------------------------------------------------------------------


def _bad(cls: type[TransferPlanError], message: str, at: tuple, **kw: Any) -> TransferPlanError:
    return cls(message, path=format_path(at), where=at, **{"hint": _FORMAT_HINT, **kw})


def _check(plan: TransferPlan) -> None:
    if plan.version != PLAN_VERSION:
        raise _bad(PlanFormatError, f"transfer plan format {plan.version} is not one this "
                   "kvspec reads", ("kvspec_transfer_plan",), expected=str(PLAN_VERSION),
                   found=str(plan.version), hint="upgrade kvspec, or make the plan again")
    for name, side in (("source", plan.source), ("destination", plan.destination)):
        seen = set()
        for i, region in enumerate(side.regions):
            if (region.rank, region.id) in seen:
                raise _bad(PlanFormatError, f"rank {region.rank} has two regions with id "
                           f"{region.id}", (name, "regions", i, "id"))
            seen.add((region.rank, region.id))
    seen_routes = set()
    for i, route in enumerate(plan.routes):
        key = (route.src_rank, route.dst_rank, route.group)
        if key in seen_routes:
            raise _bad(PlanFormatError, f"two routes for group {route.group!r} from rank "
                       f"{route.src_rank} to rank {route.dst_rank}", ("routes", i))
        seen_routes.add(key)
        for name, side in (("source", plan.source), ("destination", plan.destination)):
            if route.group not in side.num_blocks:
                raise _bad(PlanFormatError, f"the {name} has no block count for group "
                           f"{route.group!r}", ("routes", i, "group"),
                           expected=", ".join(map(repr, side.num_blocks)))
        if route.src_sub_blocks < 1 or route.dst_sub_blocks < 1 or \
                min(route.src_sub_blocks, route.dst_sub_blocks) != 1:
            raise _bad(PlanFormatError, "a route's sub-blocks are not 1 on one side and a "
                       "count on the other", ("routes", i, "sub_blocks"),
                       found=str([route.src_sub_blocks, route.dst_sub_blocks]))
        for j, run in enumerate(route.runs):
            _check_run(plan, route, run, ("routes", i, "runs", j))


def _check_run(plan: TransferPlan, route: Route, run: Run, at: tuple) -> None:
    if run.length <= 0 or min(run) < 0:
        raise _bad(PlanFormatError, "a run moves no bytes, or has a negative field", at,
                   found=str(list(run)), expected="offsets and strides >= 0, length > 0")
    ends = (("source", plan.source, route.src_rank, run.src_region,
             run.src_offset + (route.src_sub_blocks - 1) * run.src_sub_stride, run.src_stride),
            ("destination", plan.destination, route.dst_rank, run.dst_region,
             run.dst_offset + (route.dst_sub_blocks - 1) * run.dst_sub_stride, run.dst_stride))
    for name, side, rank, region_id, offset, stride in ends:
        region = side.region(rank, region_id)
        if region is None:
            raise _bad(PlanFormatError, f"the {name} rank {rank} has no region {region_id}",
                       at, expected=", ".join(str(r.id) for r in side.regions_of(rank)))
        last = max(side.num_blocks[route.group] - 1, 0)
        end = offset + last * stride + run.length
        if end > region.length:
            raise _bad(RunOutsideRegionError, f"a run of {name} block {last} of group "
                       f"{route.group!r} ends at byte {end}, past the end of region "
                       f"{region.name!r} (rank {rank}, {region.length} B)", at,
                       expected=f"<= {region.length}", found=str(end),
                       hint="the plan was made for another geometry or block count: "
                            "make it again from the artifacts the caches were loaded from")


def _block_id(item: Any) -> int:
    if isinstance(item, bool) or not isinstance(item, int):
        raise BlockIdError(f"not a block id or a (src_block, dst_block) pair: {item!r}",
                           hint="give block ids as integers")
    return item


def _listed(plan: TransferPlan, group: str, items: Any) -> list[Unit]:
    """Units of a request's block lists (``BlockLists`` or ``{"src": ..., "dst": ...}``)."""
    ks, kd = plan.sub_blocks(group)
    src, dst = (items.src, items.dst) if isinstance(items, BlockLists) else \
        (items["src"], items["dst"])
    src, dst = [_block_id(b) for b in src], [_block_id(b) for b in dst]
    count = min(len(src) * ks, len(dst) * kd)
    return [(src[u // ks], u % ks, dst[u // kd], u % kd) for u in range(count)]


def _units(plan: TransferPlan, group: str, items: Any) -> list[Unit]:
    counts = (plan.source.num_blocks[group], plan.destination.num_blocks[group])
    if isinstance(items, BlockLists) or (isinstance(items, Mapping) and
                                         set(items) == {"src", "dst"}):
        units = _listed(plan, group, items)
    elif plan.sub_blocks(group) != (1, 1):
        raise BlockIdError(f"group {group!r} moves blocks of different sizes on each side, "
                           "and the blocks are given as pairs",
                           expected="BlockLists(src=[...], dst=[...]): the request's blocks "
                                    "on each side, in token order",
                           hint="give each side's block list; the plan splits them in units")
    else:
        units = []
        for item in items:
            pair = (item, item) if isinstance(item, int) and not isinstance(item, bool) \
                else tuple(item) if isinstance(item, (tuple, list)) else (item,)
            if len(pair) != 2:
                raise BlockIdError(f"not a block id or a (src_block, dst_block) pair: "
                                   f"{item!r}", hint="give block ids as integers")
            units.append((_block_id(pair[0]), 0, _block_id(pair[1]), 0))
    seen: set[tuple[int, int]] = set()
    for s, _, d, j in units:
        for side, block, count in (("source", s, counts[0]), ("destination", d, counts[1])):
            if not 0 <= block < count:
                raise BlockIdError(f"block {block} of group {group!r} is outside the {side} "
                                   f"pool", expected=f"0 <= block < {count}", found=str(block),
                                   hint="give block ids the pools handed out")
        if (d, j) in seen:
            raise BlockIdError(f"destination block {d} of group {group!r} is given twice",
                               hint="map each destination block from one source block")
        seen.add((d, j))
    return units


def _append(spans: list[Span], span: Span) -> None:
    last = spans[-1] if spans else None
    if last and (last.src_region, last.dst_region) == (span.src_region, span.dst_region) \
            and last.src_offset + last.length == span.src_offset \
            and last.dst_offset + last.length == span.dst_offset:
        spans[-1] = last._replace(length=last.length + span.length)
    else:
        spans.append(span)


# -- JSON ----------------------------------------------------------------------------


def _side_json(side: Side) -> dict[str, Any]:
    return {"digest": side.digest, "num_blocks": dict(side.num_blocks),
            "regions": [r._asdict() for r in side.regions]}


def _position(text: str, file: str | None, at: tuple) -> Location:
    try:
        pos = scan(text, lenient=True)[1]
    except Located:
        return Location(file)
    while at and at not in pos:
        at = at[:-1]
    line, column = pos.get(at, (None, None))
    return Location(file, line, column)


def _read_plan(data: Any) -> TransferPlan:
    top = _fields(data, (), ("kvspec_transfer_plan", "run_columns", "source", "destination",
                             "routes"))
    version = _int(top["kvspec_transfer_plan"], ("kvspec_transfer_plan",))
    if version != PLAN_VERSION:
        raise _bad(PlanFormatError, f"transfer plan format {version} is not one this "
                   "kvspec reads", ("kvspec_transfer_plan",), expected=str(PLAN_VERSION),
                   found=str(version), hint="upgrade kvspec, or make the plan again")
    if top["run_columns"] != list(RUN_COLUMNS):
        raise _bad(PlanFormatError, "a plan's runs have other columns", ("run_columns",),
                   expected=json.dumps(RUN_COLUMNS), found=json.dumps(top["run_columns"]))
    source, destination = (_read_side(top[k], (k,)) for k in ("source", "destination"))
    routes = tuple(_read_route(r, ("routes", i)) for i, r in enumerate(_list(top["routes"],
                                                                             ("routes",))))
    return TransferPlan(source, destination, routes, version)


def _read_side(data: Any, at: tuple) -> Side:
    side = _fields(data, at, ("digest", "num_blocks", "regions"))
    counts = side["num_blocks"]
    if not isinstance(counts, dict):
        raise _bad(PlanFormatError, "num_blocks is not an object", at + ("num_blocks",))
    regions = []
    for i, item in enumerate(_list(side["regions"], at + ("regions",))):
        r = _fields(item, at + ("regions", i), Region._fields)
        where = at + ("regions", i)
        regions.append(Region(rank=_int(r["rank"], where + ("rank",)),
                              id=_int(r["id"], where + ("id",)),
                              name=_str(r["name"], where + ("name",)),
                              length=_int(r["length"], where + ("length",))))
    return Side(_str(side["digest"], at + ("digest",)), tuple(regions),
                {k: _int(v, at + ("num_blocks", k)) for k, v in counts.items()})


def _read_route(data: Any, at: tuple) -> Route:
    route = _fields(data, at, ("src_rank", "dst_rank", "group", "sub_blocks", "runs"))
    subs = _list(route["sub_blocks"], at + ("sub_blocks",))
    if len(subs) != 2:
        raise _bad(PlanFormatError, "sub_blocks is not [source, destination]",
                   at + ("sub_blocks",), found=json.dumps(subs))
    runs = []
    for j, run in enumerate(_list(route["runs"], at + ("runs",))):
        if not isinstance(run, list) or len(run) != len(RUN_COLUMNS):
            raise _bad(PlanFormatError, f"a run is not a list of {len(RUN_COLUMNS)} "
                       "integers", at + ("runs", j), expected=json.dumps(RUN_COLUMNS))
        runs.append(Run(*(_int(v, at + ("runs", j, k)) for k, v in enumerate(run))))
    return Route(_int(route["src_rank"], at + ("src_rank",)),
                 _int(route["dst_rank"], at + ("dst_rank",)),
                 _str(route["group"], at + ("group",)), tuple(runs),
                 *(_int(v, at + ("sub_blocks", k)) for k, v in enumerate(subs)))


def _fields(data: Any, at: tuple, names: Sequence[str]) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise _bad(PlanFormatError, "expected an object", at, found=type(data).__name__)
    missing = [n for n in names if n not in data]
    unknown = sorted(set(data) - set(names))
    if missing or unknown:
        what = f"missing {missing[0]!r}" if missing else f"unknown field {unknown[0]!r}"
        raise _bad(PlanFormatError, f"a transfer plan's object has {what}",
                   at + ((unknown[0],) if not missing else ()),
                   expected=", ".join(names))
    return data


def _list(value: Any, at: tuple) -> list[Any]:
    if not isinstance(value, list):
        raise _bad(PlanFormatError, "expected a list", at, found=type(value).__name__)
    return value


def _int(value: Any, at: tuple) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise _bad(PlanFormatError, "expected a non-negative integer", at,
                   found=json.dumps(value))
    return value


def _str(value: Any, at: tuple) -> str:
    if not isinstance(value, str):
        raise _bad(PlanFormatError, "expected a string", at, found=json.dumps(value))
    return value
