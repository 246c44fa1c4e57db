"""Strategy ``packed``: pages of different sizes side by side in each block.

Only a block-outermost axis order (``BLHNC``, ``BLNHC``, ``BHLNC``) can hold
pages of several sizes in one block. Layers are bucketed by type; a balanced
bucket (one layer of each page size per pattern repeat) splits into groups of
a common repeat count, and state buckets are capped at what a block already
holds::

    group 0: | blk 0 [ A | B | pad ] | blk 1 [ A | B | pad ] | ...
    group 1: | blk 0 [  C  |   D   ] | blk 1 [  C  |   D   ] | ...
             |<-- bytes_per_block -->|
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kvspec.errors import PlanError
from kvspec.model.engine import Engine, SettingRef
from kvspec.model.plan import Group
from kvspec.model.specs import (
    CircularBuffer,
    LayerSpec,
    MambaState,
    SlidingWindow,
    UniformType,
    cdiv,
)
from kvspec.model.specs.base import distinct
from kvspec.planner.log import PlanLog
from kvspec.planner.merge import is_uniform_type


def approximate_gcd(values: Sequence[int], lower_bound: int) -> int:
    """The chunk ``d >= lower_bound`` minimizing total round-up padding of
    ``values`` to multiples of ``d``; ties go to the larger ``d``.

    >>> approximate_gcd([12, 24], 6), approximate_gcd([12, 13], 1)
    (12, 1)
    """
    lo = max(1, lower_bound)
    hi = max(values)
    if lo > hi:
        return lo
    best, best_pad = lo, None
    for d in range(lo, hi + 1):
        pad = sum(-x % d for x in values)
        if best_pad is None or pad <= best_pad:
            best, best_pad = d, pad
    return best


@dataclass(frozen=True, slots=True)
class _Bucket:
    uniform: UniformType
    by_page: dict[int, list[str]]
    #: One layer of each page size per pattern repeat.
    balanced: bool

    def widest(self, n: int) -> int:
        return sum(cdiv(len(names), n) * page for page, names in self.by_page.items())


def _buckets(specs: Mapping[str, LayerSpec]) -> list[_Bucket]:
    """Each layer joins the first bucket it is of one type with (else opens one).

    Every kind's "same type" test compares each layer with the bucket's first
    alone, so a layer fits a bucket exactly when it fits with that first layer:
    one test per bucket and distinct spec, not one per layer pair."""
    groups: list[tuple[LayerSpec, dict[str, LayerSpec]]] = []
    fits: dict[tuple[int, int], bool] = {}
    for name, spec in specs.items():
        for i, (first, bucket) in enumerate(groups):
            key = (i, id(spec))
            ok = fits.get(key)
            if ok is None:
                ok = fits[key] = is_uniform_type([first, spec])
            if ok:
                bucket[name] = spec
                break
        else:
            groups.append((spec, {name: spec}))
    out = []
    for _, bucket in groups:
        uniform = UniformType.of(bucket)
        assert uniform is not None
        by_page: dict[int, list[str]] = defaultdict(list)
        for name, spec in bucket.items():
            by_page[spec.page_size_bytes].append(name)
        out.append(_Bucket(uniform, dict(by_page), len({len(v) for v in by_page.values()}) == 1))
    return out


def _repeats(buckets: list[_Bucket]) -> int | None:
    balanced = [b for b in buckets if b.balanced]
    lower = max((b.uniform.max_layers_per_page_size() for b in balanced if len(b.by_page) > 1),
                default=0)
    if not lower:
        return None
    return approximate_gcd([b.uniform.max_layers_per_page_size() for b in balanced], lower)


def _split(b: _Bucket, n: int) -> list[Group]:
    u = b.uniform
    if n == 1:
        return [Group(tuple(name for name, _ in u.members), u, strategy="packed")]
    pattern = list(zip(*b.by_page.values()))
    split = [[name for rep in pattern[i::n] for name in rep] for i in range(n)]
    if any(not names for names in split) or sum(map(len, split)) != len(u.members):
        raise PlanError(
            f"cannot pack {len(u.members)} {u.first.kind} layers into {n} equal groups "
            f"of a block-outermost layout (pages of {sorted(b.by_page)} bytes in counts "
            f"{[len(v) for v in b.by_page.values()]})", ref=SettingRef("axis_order"),
            hint="use a layer-compact layout (LBNHC), or give the layers of one kind "
                 "one page size")
    return [Group(tuple(names), u.restricted(names), strategy="packed") for names in split]


def packed(engine: Engine, specs: Mapping[str, LayerSpec],
           log: PlanLog | None = None) -> list[Group] | None:
    """Groups for pages of different sizes packed per block, or None when the
    axis order is not block-outermost or every page has one size."""
    if not engine.axis_order.is_block_outermost:
        return None
    pages = {s.page_size_bytes for s in distinct(specs.values())}
    if len(pages) <= 1:
        return None
    buckets = _buckets(specs)
    repeats = _repeats(buckets)

    def num_groups(b: _Bucket) -> int:
        if b.balanced and repeats is not None:
            return cdiv(b.uniform.max_layers_per_page_size(), repeats)
        return 1

    def is_state(b: _Bucket) -> bool:
        if isinstance(b.uniform.first, (MambaState, CircularBuffer)):
            return True
        return repeats is None and isinstance(b.uniform.first, SlidingWindow)

    anchor = max((b.widest(len(b.uniform.members) if is_state(b) else num_groups(b))
                  for b in buckets), default=0)
    groups: list[Group] = []
    for b in buckets:
        n = num_groups(b)
        if anchor and is_state(b):
            # Cap a state group at what a block already holds, never widen it.
            per_block = max(anchor // b.uniform.first.page_size_bytes, 1)
            n = max(n, cdiv(len(b.uniform.members), per_block))
        groups += _split(b, n)
    return groups
