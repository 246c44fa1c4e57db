"""Strategy ``hybrid_page``: hybrid models whose pages can be made one size.

Page unification gives every layer the largest page (block sizes scaled up
where a page divides it, pages padded where it does not); then same-spec
buckets split into groups of one size, the short ones padded with empty slots,
so slot *i* of every group can alias the same bytes.

>>> from kvspec.model.engine import Engine
>>> from kvspec.model.specs import FullAttention, SlidingWindow
>>> f = FullAttention(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")
>>> w = SlidingWindow(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16",
...                   sliding_window=4096)
>>> [g.layer_names for g in hybrid_page(Engine(), {"l0": w, "l1": f, "l2": w, "l3": f})]
[('l0', 'l2'), ('l1', 'l3')]
"""

from __future__ import annotations

from collections.abc import Mapping

from kvspec.model.engine import Engine
from kvspec.model.plan import Group
from kvspec.model.specs import (
    MLA,
    Attention,
    LayerSpec,
    MambaState,
    MergeConflict,
    MergeInvalid,
    cdiv,
    replace,
)
from kvspec.model.specs.base import by_spec, distinct
from kvspec.planner.log import PlanLog
from kvspec.planner.merge import merge_group


class CannotUnify(Exception):
    """A page that neither divides the largest one nor can be padded."""

    def __init__(self, name: str, page: int, largest: int) -> None:
        super().__init__(name, page, largest)
        self.name, self.page, self.largest = name, page, largest


def _unified(name: str, spec: LayerSpec, largest: int) -> LayerSpec:
    page = spec.page_size_bytes
    if page == largest:
        return spec
    if isinstance(spec, MambaState):
        out: LayerSpec = replace(spec, page_size_padded=largest)
    elif largest % page == 0:
        out = spec.with_block_size(spec.block_size * (largest // page))
    elif isinstance(spec, Attention) and not isinstance(spec, MLA):
        out = replace(spec, page_size_padded=largest)
    else:
        raise CannotUnify(name, page, largest)
    if out.page_size_bytes != largest:
        raise CannotUnify(name, out.page_size_bytes, largest)
    return out


def unify_page_size(specs: Mapping[str, LayerSpec]) -> dict[str, LayerSpec]:
    """Give every layer the largest page: scale block sizes, else pad pages
    (MLA pages pad only through their own row alignment)."""
    pages = {s.page_size_bytes for s in distinct(specs.values())}
    if len(pages) <= 1:
        return dict(specs)
    largest = max(pages)
    unified: dict[str, LayerSpec] = {}  # equal specs, one unified spec
    for spec, names in by_spec(specs.items()).items():
        made = _unified(names[0], spec, largest)
        unified.update((n, made) for n in names)
    return {n: unified[n] for n in specs}


def _buckets(specs: Mapping[str, LayerSpec]) -> list[tuple[list[str], list[LayerSpec]]]:
    """Same-spec buckets, merged where their specs can share a table (full
    attention that differs only in its window): first fit, in order of first
    appearance."""
    same = by_spec(specs.items())
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
    return buckets


def group_uniform_page(specs: Mapping[str, LayerSpec], log: PlanLog) -> list[Group]:
    """Equal-size groups over same-spec buckets, padding the short ones."""
    buckets = _buckets(specs)
    sizes = [len(names) for names, _ in buckets]
    group_size = min(sizes)
    if max(sizes) < group_size * 1.5:
        # Nearly equal buckets (gpt-oss + a drafter layer: 12 sliding + 13 full)
        # pad up to the largest rather than split it.
        group_size = max(sizes)
    groups: list[Group] = []
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
            groups.append(merge_group(specs, members, strategy="hybrid_page",
                                      padding_slots=group_size - len(members)))
    return groups


def hybrid_page(engine: Engine, specs: Mapping[str, LayerSpec],
                log: PlanLog | None = None) -> list[Group]:
    """Unify pages, then equal-size groups; :class:`CannotUnify` when pages cannot."""
    return group_uniform_page(unify_page_size(specs), log or PlanLog())
