"""The group pass: split layers into groups that share one block table.

Paths, tried in the reference planner's order:

1. hybrid manager off -> local attention is promoted to full allocation;
2. no layers -> no groups (attention-free model);
3. one spec for every layer -> one group;
4. one type (same token slots), different pages -> one ``UniformType`` group;
5. MLA + compressed indexer + state layers -> the aliasing layout (``glm5``);
6. a block-outermost layout with mixed page sizes -> packed groups;
7. otherwise page unification (block-size scaling, page padding) then
   equal-size groups with padding slots, hidden-state caches last; when pages
   cannot be unified, MLA + sliding window fall back to full allocation.

>>> from kvspec.engine import Engine
>>> from kvspec.spec import FullAttention, SlidingWindow
>>> f = FullAttention(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")
>>> w = SlidingWindow(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16",
...                   sliding_window=4096)
>>> specs = {"l0": w, "l1": f, "l2": w, "l3": f}
>>> [g.layer_names for g in group_layers(Engine(), specs)]
[('l0', 'l2'), ('l1', 'l3')]
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from kvspec.dtypes import dtype_size
from kvspec.engine import Engine
from kvspec.errors import PlanError
from kvspec.planner import glm5
from kvspec.planner.log import PlanLog
from kvspec.spec import (
    MLA,
    Attention,
    ChunkedLocal,
    CircularBuffer,
    FullAttention,
    HiddenState,
    LayerSpec,
    MambaState,
    MergeConflict,
    MergeInvalid,
    SlidingWindow,
    SlidingWindowMLA,
    UniformType,
    cdiv,
    layer_specs,
    recast,
    replace,
)


@dataclass(frozen=True, slots=True)
class Group:
    """Layers sharing one block table, and the spec they share."""

    layer_names: tuple[str, ...]
    spec: LayerSpec
    is_eagle: bool = False
    #: Slots this group leaves empty so every group has the same layer count.
    padding_slots: int = 0
    #: Drafter layers with a pool of their own (GLM-5-Next layout).
    own_pool: bool = False

    def layer_spec(self, name: str) -> LayerSpec:
        if isinstance(self.spec, UniformType):
            return self.spec.specs[name]
        return self.spec

    def page_bytes(self) -> int:
        """Bytes one block of this group holds across its layers."""
        return sum(self.layer_spec(n).page_size_bytes for n in self.layer_names)


def merge_group(specs: dict[str, LayerSpec], names: Sequence[str]) -> Group:
    layer = [specs[n] for n in names]
    try:
        merged = type(layer[0]).merge(layer)
    except (MergeConflict, MergeInvalid) as exc:
        raise PlanError(
            f"layers {', '.join(names[:4])}{'...' if len(names) > 4 else ''} "
            f"cannot share one block table: {exc}",
            hint="give these layers the same kind, heads, head size and dtype") from exc
    return Group(tuple(names), merged)


def is_uniform(specs: dict[str, LayerSpec]) -> bool:
    """Whether every layer can share one spec (sliding window as full attention)."""
    if not specs:
        return True
    values = list(specs.values())
    try:
        type(values[0]).merge(values)
    except MergeConflict:
        return False
    except MergeInvalid as exc:
        raise PlanError(str(exc), hint="layers of one kind must agree on their window") from exc
    return True


def is_uniform_type(specs: dict[str, LayerSpec]) -> bool:
    try:
        return UniformType.is_uniform_type(specs)
    except MergeConflict as exc:
        raise PlanError(str(exc)) from exc


# -- hybrid manager off --------------------------------------------------------

_PROMOTIONS: tuple[tuple[type[LayerSpec], type[LayerSpec]], ...] = (
    (SlidingWindowMLA, MLA),
    (SlidingWindow, FullAttention),
    (ChunkedLocal, FullAttention),
)


def promote_local_specs(specs: dict[str, LayerSpec]) -> dict[str, LayerSpec]:
    """Allocate local-attention layers as full attention (compute is unchanged)."""
    promoted = dict(specs)
    if is_uniform(promoted) or is_uniform_type(promoted):
        return promoted
    values = list(specs.values())
    has_full = any(isinstance(s, FullAttention) for s in values)
    has_local = any(isinstance(s, (SlidingWindow, ChunkedLocal)) for s in values)
    full_sizes = {s.block_size for s in values if isinstance(s, FullAttention)}
    full_block = next(iter(full_sizes)) if len(full_sizes) == 1 else None

    if has_full and has_local:
        for name, spec in specs.items():
            target = next((to for frm, to in _PROMOTIONS if type(spec) is frm
                           or isinstance(spec, frm)), None)
            if target is None:
                continue
            assert isinstance(spec, Attention)
            block = full_block or spec.block_size
            padded = None
            if spec.page_size_padded is not None:
                scaled = spec.unpadded_page_size_bytes * block // spec.block_size
                padded = max(spec.page_size_padded, scaled)
            drop = tuple(n for n in ("extra_retained_tokens", "bounded_replay")
                         if hasattr(spec, n) and not hasattr(target, n))
            if target is FullAttention and isinstance(spec, SlidingWindowMLA):
                target = MLA
            promoted[name] = recast(
                spec, target, drop=_fields_missing(spec, target) + drop,
                block_size=block, page_size_padded=padded)
    if not (is_uniform(promoted) or is_uniform_type(promoted)):
        raise PlanError(
            "failed to promote local-attention layers to one unified type",
            hint="with the hybrid manager off every layer must be full attention "
                 "once windows are ignored; check heads, head sizes and dtypes")
    return promoted


def _fields_missing(spec: LayerSpec, target: type[LayerSpec]) -> tuple[str, ...]:
    import dataclasses
    mine = {f.name for f in dataclasses.fields(spec) if f.init}
    theirs = {f.name for f in dataclasses.fields(target) if f.init}
    return tuple(sorted(mine - theirs))


# -- page unification -----------------------------------------------------------


def unify_page_size(specs: dict[str, LayerSpec]) -> dict[str, LayerSpec]:
    """Give every layer the largest page: scale block sizes, else pad pages.

    Raises ``_CannotUnify`` when a page neither divides the largest one nor can
    be padded (MLA pages pad only through their own row alignment).
    """
    pages = {s.page_size_bytes for s in specs.values()}
    if len(pages) <= 1:
        return specs
    largest = max(pages)
    out: dict[str, LayerSpec] = {}
    for name, spec in specs.items():
        page = spec.page_size_bytes
        if page == largest:
            out[name] = spec
        elif isinstance(spec, MambaState):
            out[name] = replace(spec, page_size_padded=largest)
        elif largest % page == 0:
            out[name] = spec.with_block_size(spec.block_size * (largest // page))
        elif isinstance(spec, Attention) and not isinstance(spec, MLA):
            out[name] = replace(spec, page_size_padded=largest)
        else:
            raise _CannotUnify(name, page, largest)
        if out[name].page_size_bytes != largest:
            raise _CannotUnify(name, out[name].page_size_bytes, largest)
    return out


class _CannotUnify(Exception):
    def __init__(self, name: str, page: int, largest: int) -> None:
        super().__init__(name, page, largest)
        self.name, self.page, self.largest = name, page, largest


def _group_uniform_page(specs: dict[str, LayerSpec], log: PlanLog) -> list[Group]:
    """Equal-size groups over same-spec buckets, padding the short ones."""
    same: dict[LayerSpec, list[str]] = defaultdict(list)
    for name, spec in specs.items():
        same[spec].append(name)

    # Merge buckets whose specs can share a table (e.g. full attention that
    # differs only in its window); first fit, in order of first appearance.
    buckets: list[tuple[list[str], list[LayerSpec]]] = []
    for spec, names in same.items():
        for bucket_names, bucket_specs in buckets:
            try:
                type(bucket_specs[0]).merge([*bucket_specs, spec])
            except (MergeConflict, MergeInvalid):
                continue
            bucket_names.extend(names)
            bucket_specs.append(spec)
            break
        else:
            buckets.append((list(names), [spec]))

    sizes = [len(names) for names, _ in buckets]
    group_size = min(sizes)
    if max(sizes) < group_size * 1.5:
        # Nearly equal buckets (gpt-oss + a drafter layer: 12 sliding + 13 full)
        # pad up to the largest rather than split it.
        group_size = max(sizes)

    grouped: list[tuple[list[str], int]] = []
    for names, _ in buckets:
        padding = group_size - len(names) % group_size
        if padding != group_size:
            log.warning(f"Add {padding} padding layers, may waste at most "
                        f"{padding / len(names) * 100:.2f}% KV cache memory")
        num_groups = cdiv(len(names), group_size)
        # layers[i::n] keeps pipeline stages balanced: each stage keeps a share
        # of every group instead of whole groups.
        for i in range(num_groups):
            members = names[i::num_groups]
            grouped.append((members, group_size - len(members)))
    return [replace_padding(merge_group(specs, names), pad) for names, pad in grouped]


def replace_padding(group: Group, padding: int) -> Group:
    return Group(group.layer_names, group.spec, group.is_eagle, padding, group.own_pool)


# -- block-outermost packing ---------------------------------------------------


def _approximate_gcd(values: Sequence[int], lower_bound: int) -> int:
    """The chunk ``d >= lower_bound`` minimizing total round-up padding of
    ``values`` to multiples of ``d``; ties go to the larger ``d``."""
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


def _group_packed(engine: Engine, specs: dict[str, LayerSpec]) -> list[Group] | None:
    """Groups for pages of different sizes packed side by side in each block."""
    pages = {s.page_size_bytes for s in specs.values()}
    if not engine.layout.is_block_outermost or len(pages) <= 1:
        return None

    buckets: list[dict[str, LayerSpec]] = []
    for name, spec in specs.items():
        for bucket in buckets:
            if is_uniform_type({**bucket, name: spec}):
                bucket[name] = spec
                break
        else:
            buckets.append({name: spec})

    bucketed: list[tuple[UniformType, dict[int, list[str]], bool]] = []
    for bucket in buckets:
        uniform = UniformType.of(bucket)
        assert uniform is not None
        by_page: dict[int, list[str]] = defaultdict(list)
        for name, spec in bucket.items():
            by_page[spec.page_size_bytes].append(name)
        # A balanced bucket repeats one layer of each page size per pattern.
        balanced = len({len(v) for v in by_page.values()}) == 1
        bucketed.append((uniform, by_page, balanced))

    min_repeats = max((u.max_layers_per_page_size() for u, by_page, bal in bucketed
                       if bal and len(by_page) > 1), default=0)
    repeats = (_approximate_gcd([u.max_layers_per_page_size()
                                 for u, _, bal in bucketed if bal], min_repeats)
               if min_repeats else None)

    def num_groups_for(u: UniformType, balanced: bool) -> int:
        if balanced and repeats is not None:
            return cdiv(u.max_layers_per_page_size(), repeats)
        return 1

    def widest(by_page: dict[int, list[str]], n: int) -> int:
        return sum(cdiv(len(names), n) * page for page, names in by_page.items())

    def is_state_bucket(u: UniformType) -> bool:
        if isinstance(u.first, (MambaState, CircularBuffer)):
            return True
        return repeats is None and isinstance(u.first, SlidingWindow)

    anchor = max((widest(by_page, len(u.members) if is_state_bucket(u)
                         else num_groups_for(u, bal))
                  for u, by_page, bal in bucketed), default=0)

    groups: list[Group] = []
    for u, by_page, bal in bucketed:
        n = num_groups_for(u, bal)
        if anchor and is_state_bucket(u):
            # Cap a state group at what a block already holds, never widen it.
            per_block = max(anchor // u.first.page_size_bytes, 1)
            n = max(n, cdiv(len(u.members), per_block))
        if n == 1:
            groups.append(Group(tuple(n_ for n_, _ in u.members), u))
            continue
        pattern = list(zip(*by_page.values()))
        split = [[name for rep in pattern[i::n] for name in rep] for i in range(n)]
        if any(not names for names in split) or sum(map(len, split)) != len(u.members):
            raise PlanError(
                f"cannot pack {len(u.members)} {u.first.kind} layers into {n} equal groups "
                f"of a block-outermost layout (pages of {sorted(by_page)} bytes in counts "
                f"{[len(v) for v in by_page.values()]})",
                path="engine.layout",
                hint="use a layer-compact layout (LBNHC), or give the layers of one kind "
                     "one page size")
        for names in split:
            sub = UniformType.of({name: u.specs[name] for name in names})
            assert sub is not None
            groups.append(Group(tuple(names), sub))
    return groups


# -- hidden-state caches --------------------------------------------------------


def _largest_divisor_at_most(value: int, limit: int) -> int:
    for d in range(min(value, limit), 0, -1):
        if value % d == 0:
            return d
    return 1


def _hidden_per_token(spec: HiddenState) -> int:
    return spec.num_kv_heads * spec.head_size * dtype_size(spec.dtype)


def _add_hidden_groups(groups: list[Group], hidden: dict[str, HiddenState],
                       log: PlanLog) -> list[Group]:
    pages = {g.spec.page_size_bytes for g in groups}
    if len(pages) != 1:
        raise PlanError("hidden-state caches need one common page size across groups")
    common = pages.pop()
    need = max(_hidden_per_token(s) for s in hidden.values())
    if need > common:
        # Tensor parallelism can shrink the page below one hidden state's bytes:
        # scale every group's block up until one token fits.
        scale = cdiv(need, common)
        common *= scale
        scaled = []
        for g in groups:
            changes: dict[str, int] = {"block_size": g.spec.block_size * scale}
            padded = getattr(g.spec, "page_size_padded", None)
            if padded is not None:
                changes["page_size_padded"] = padded * scale
            scaled.append(Group(g.layer_names, replace(g.spec, **changes), g.is_eagle,
                                g.padding_slots))
        groups = scaled
    block_gcd = math.gcd(*(g.spec.block_size for g in groups))
    out = list(groups)
    for name, spec in hidden.items():
        per_token = _hidden_per_token(spec)
        block = _largest_divisor_at_most(block_gcd, max(common // per_token, 1))
        waste = common - block * per_token
        log.info(f"Using block size {block} for hidden-state cache layer {name}; "
                 f"page alignment wastes {waste} bytes ({waste / common * 100:.2f}%) "
                 "per block")
        out.append(Group((name,), replace(spec, block_size=block, page_size_padded=common)))
    return out


# -- full-allocation fallback ---------------------------------------------------


def _full_allocation_fallback(specs: dict[str, LayerSpec], log: PlanLog) -> list[Group] | None:
    values = list(specs.values())
    if any(isinstance(s, HiddenState) for s in values):
        return None
    if any(isinstance(s, (SlidingWindowMLA, ChunkedLocal)) for s in values):
        return None
    has_mla = any(isinstance(s, MLA) for s in values)
    has_swa = any(isinstance(s, SlidingWindow) for s in values)
    if not (has_mla and has_swa):
        return None
    try:
        promoted = promote_local_specs(specs)
    except PlanError:
        return None
    uniform = UniformType.of(promoted)
    if uniform is None:
        return None
    log.warning("KV cache page sizes cannot be unified; treating sliding-window layers "
                "as full attention for cache allocation. Sliding-window attention "
                "compute is unchanged.")
    return [Group(tuple(promoted), uniform)]


# -- drafter annotation ---------------------------------------------------------

_EAGLE_METHODS = frozenset({"eagle", "eagle3", "mtp", "dflash", "dspark"})


def _annotate_eagle(engine: Engine, specs: dict[str, LayerSpec],
                    groups: list[Group], log: PlanLog) -> list[Group]:
    method = engine.speculative_method
    if method is None or method not in _EAGLE_METHODS:
        return groups
    flagged = [any(getattr(s, "non_causal_multi_token_decode", False)
                   for s in layer_specs(g.spec)) for g in groups]
    if method == "mtp":
        names = [n for g in groups for n in g.layer_names]
        if len(names) == len(specs) and set(names) == set(specs):
            last = next(reversed(specs))
            for i, g in enumerate(groups):
                if last in g.layer_names:
                    flagged[i] = True
                    break
    out = [Group(g.layer_names, g.spec, g.is_eagle or f, g.padding_slots, g.own_pool)
           for g, f in zip(groups, flagged)]
    if not any(g.is_eagle for g in out) and any(
            isinstance(s, MambaState) for g in out for s in layer_specs(g.spec)):
        log.warning(f"Speculative decoding (method={method}) is enabled but no KV cache "
                    "group could be identified as the draft model's.")
    return out


# -- the pass ------------------------------------------------------------------


def group_layers(engine: Engine, specs: dict[str, LayerSpec],
                 log: PlanLog | None = None) -> list[Group]:
    """Split the model's layers into KV cache groups (see the module docstring)."""
    log = log if log is not None else PlanLog()
    if not engine.hybrid and not (is_uniform(specs) or is_uniform_type(specs)):
        log.warning("Hybrid KV cache manager is disabled for this hybrid model, This "
                    "means we do not enable any optimizations for saving KV cache memory "
                    "(e.g., dropping the KV cache outside the sliding window). The compute "
                    "of layers like sliding window is still saved.")
        specs = promote_local_specs(specs)

    if not specs:
        return []
    if is_uniform(specs):
        return [merge_group(specs, list(specs))]
    if (uniform := UniformType.of(specs)) is not None:
        return [Group(tuple(specs), uniform)]
    if (aliased := glm5.group_layers(engine, specs)) is not None:
        return aliased

    hidden = {n: s for n, s in specs.items() if isinstance(s, HiddenState)}
    rest = {n: s for n, s in specs.items() if not isinstance(s, HiddenState)}

    if (packed := _group_packed(engine, rest)) is not None:
        packed += [Group((n,), s) for n, s in hidden.items()]
        return _annotate_eagle(engine, specs, packed, log)

    try:
        rest = unify_page_size(rest)
    except _CannotUnify as exc:
        fallback = _full_allocation_fallback(specs, log)
        if fallback is None:
            err = PlanError(
                f"layer {exc.name}: its page ({exc.page} bytes) does not divide the "
                f"largest page ({exc.largest} bytes) and cannot be padded; padding is "
                "only supported for non-MLA attention layers",
                expected=f"a page size dividing {exc.largest}",
                found=str(exc.page),
                hint="use a block-outermost layout (engine.layout: BLHNC) to pack "
                     "pages of different sizes, or change the block size")
            err.layer = exc.name  # type: ignore[attr-defined]
            raise err from exc
        return fallback
    groups = _group_uniform_page(rest, log)
    if hidden:
        groups = _add_hidden_groups(groups, hidden, log)
    return _annotate_eagle(engine, specs, groups, log)


def project_groups(groups: list[Group], stage_layers: set[str] | Sequence[str]) -> list[Group]:
    """The global groups restricted to one pipeline stage's layers."""
    owned = set(stage_layers)
    out = []
    for g in groups:
        names = tuple(n for n in g.layer_names if n in owned)
        spec = g.spec
        if names and isinstance(spec, UniformType):
            spec = UniformType(block_size=spec.block_size,
                               members=tuple((n, spec.specs[n]) for n in names))
        out.append(Group(names, spec, g.is_eagle and bool(names),
                         g.padding_slots + len(g.layer_names) - len(names), g.own_pool))
    return out
