"""The state/attention aliasing layout (GLM-5-Next style models).

A model of MLA layers, compressed MLA indexer layers (``tokens_per_state > 1``)
and state layers (Mamba/GDN) plans as:

* one ``UniformType`` group of every MLA and indexer layer;
* the indexer's kpool tail rings (one block each), sharing the indexer slots;
* state groups whose pages are padded to the MLA page, so state layer *i* of
  every state group lives in MLA layer *i*'s slot;
* an optional drafter's attention layers, in groups appended last, with a pool
  of their own sized from ``max_num_seqs`` and ``max_num_batched_tokens``.

One block of the pool holds ``len(mla) * mla_page + len(indexer) * idx_page``
bytes; the memory is split into per-layer regions (layer-outermost)::

    | mla0 (+state0,i) | mla1 (+state1,i) | ... | idx0 (+tail0) | ... | draft... |
    |<- mla_page * N ->|                        |<- idx_page*N ->|
"""

from __future__ import annotations

from dataclasses import dataclass

from kvspec.affine import Affine
from kvspec.engine import Engine
from kvspec.errors import PlanError
from kvspec.planner.stages import layer_index, stage_bounds
from kvspec.spec import (
    MLA,
    Attention,
    FullAttention,
    DraftSlidingWindow,
    KpoolTail,
    LayerSpec,
    MambaState,
    SlidingWindow,
    UniformType,
    cdiv,
    recast,
    replace,
)


def _draft_block_size(engine: Engine, target: int) -> int:
    requested = engine.draft_block_size
    if requested is None:
        if engine.draft_pool and target % 256 == 0:
            return 256
        return target
    if requested <= 0 or requested % 64 or target % requested:
        raise PlanError(
            f"draft block size {requested} must be a positive multiple of 64 that "
            f"divides the target block size {target}",
            path="engine.draft.block_size", found=str(requested))
    return requested


def _draft_groups(engine: Engine, drafts: dict[str, LayerSpec], target_block: int) -> list:
    from kvspec.planner.group import Group, merge_group

    if not drafts:
        return []
    scaled: dict[str, LayerSpec] = {}
    for name, spec in drafts.items():
        assert isinstance(spec, Attention)
        if spec.page_size_padded is not None:
            raise PlanError(
                f"layer {name}: a padded draft page is not supported on the aliasing "
                "layout", hint="do not skip quantization for drafter layers")
        if isinstance(spec, SlidingWindow):
            scaled[name] = recast(spec, DraftSlidingWindow,
                                  block_size=_draft_block_size(engine, target_block))
            continue
        if target_block % spec.block_size:
            raise PlanError(
                f"layer {name}: draft block size {spec.block_size} does not divide the "
                f"target block size {target_block}",
                hint="pick an engine block_size that is a multiple of the drafter's "
                     "kernel block")
        scaled[name] = spec.with_block_size(target_block)
    by_spec: dict[LayerSpec, list[str]] = {}
    for name, spec in scaled.items():
        by_spec.setdefault(spec, []).append(name)
    own = engine.draft_pool
    return [Group(g.layer_names, g.spec, own_pool=own)
            for g in (merge_group(scaled, names) for names in by_spec.values())]


def _balanced_state_group_count(engine: Engine, state_names: list[str],
                                mla_names: list[str]) -> int | None:
    """State groups needed so that every pipeline stage's state layers fit its
    MLA slots; None when a stage has state layers and no MLA layer."""
    count = cdiv(len(state_names), len(mla_names))
    pp = engine.pipeline_parallel_size
    if pp == 1:
        return count
    state_idx = [layer_index(n) for n in state_names]
    mla_idx = [layer_index(n) for n in mla_names]
    if None in state_idx or None in mla_idx:
        raise PlanError("layer names need a layer index ('layers.N') under pipeline "
                        "parallelism")
    total = engine.total_num_hidden_layers or (max(state_idx + mla_idx) + 1)  # type: ignore[operator,type-var]
    for lo, hi in stage_bounds(total, pp, engine.pp_layer_partition):
        n_state = sum(lo <= i < hi for i in state_idx)  # type: ignore[operator]
        n_mla = sum(lo <= i < hi for i in mla_idx)  # type: ignore[operator]
        if not n_state:
            continue
        if not n_mla:
            return None
        count = max(count, cdiv(n_state, n_mla))
    return count


def group_layers(engine: Engine, specs: dict[str, LayerSpec]) -> list | None:
    """The aliasing layout's groups, or None when the model is not of this shape."""
    from kvspec.planner.group import Group, merge_group

    states = {n: s for n, s in specs.items() if isinstance(s, MambaState)}
    tails = {n: s for n, s in specs.items() if isinstance(s, KpoolTail)}
    attn = {n: s for n, s in specs.items() if not isinstance(s, (MambaState, KpoolTail))}
    # A drafter's plain attention layers ride along in groups of their own.
    drafts = {n: s for n, s in attn.items() if type(s) in (SlidingWindow, FullAttention)}
    attn = {n: s for n, s in attn.items() if n not in drafts}
    if not states or not attn or not all(type(s) is MLA for s in attn.values()):
        return None
    mla_specs: dict[str, MLA] = attn  # type: ignore[assignment]
    idx_pages = {s.page_size_bytes for s in mla_specs.values() if s.tokens_per_state > 1}
    if not idx_pages:
        return None
    if any(s.page_size_padded is not None for s in mla_specs.values()):
        raise PlanError("the aliasing layout needs unpadded MLA pages",
                        hint="remove the MLA alignment of these layers")
    if len(idx_pages) != 1:
        raise PlanError(f"indexer layers differ in page size {sorted(idx_pages)}")
    mla_names = [n for n, s in mla_specs.items() if s.tokens_per_state == 1]
    mla_pages = {mla_specs[n].page_size_bytes for n in mla_names}
    if len(mla_pages) != 1:
        raise PlanError(f"MLA layers differ in page size {sorted(mla_pages)}")
    mla_page = mla_pages.pop()
    uniform = UniformType.of(attn)
    if uniform is None:
        raise PlanError("MLA and indexer layers must share one block size")

    tail_group = None
    if tails:
        idx_page = next(iter(idx_pages))
        padded_tails = {n: replace(s, page_size_padded=idx_page) for n, s in tails.items()}
        tail_uniform = UniformType.of(padded_tails)
        if tail_uniform is None:
            raise PlanError("kpool tail layers must share one spec")
        tail_group = Group(tuple(padded_tails), tail_uniform)

    some_state = next(iter(states.values()))
    if any(s != some_state for s in states.values()):
        raise PlanError("state layers of the aliasing layout must all have the same spec")
    if some_state.unpadded_page_size_bytes > mla_page:
        raise PlanError(
            f"the state page ({some_state.unpadded_page_size_bytes} bytes) does not fit "
            f"the MLA page ({mla_page} bytes)",
            hint="increase tensor parallelism or use a wider KV cache dtype")
    padded_states = {n: replace(some_state, page_size_padded=mla_page) for n in states}
    count = _balanced_state_group_count(engine, list(states), mla_names)
    if count is None:
        raise PlanError(
            "a pipeline stage has state layers but no MLA layer to share slots with",
            hint="realign the stage boundaries (parallel.pipeline_partition)")
    buckets: list[list[str]] = [[] for _ in range(count)]
    for i, name in enumerate(states):
        buckets[i % count].append(name)

    groups = [Group(tuple(attn), uniform)]
    if tail_group is not None:
        groups.append(tail_group)
    groups += [merge_group(padded_states, names) for names in buckets]
    groups += _draft_groups(engine, drafts, uniform.block_size)
    return groups


@dataclass(frozen=True, slots=True)
class AliasLayout:
    """The aliasing layout recognised in (possibly stage-projected) groups."""

    attn: object
    states: list
    mla_names: list[str]
    idx_names: list[str]
    mla_page: int
    idx_page: int
    tail_names: list[str]
    tail_page: int
    drafts: list

    @property
    def target_bytes_per_block(self) -> int:
        return len(self.mla_names) * self.mla_page + len(self.idx_names) * self.idx_page

    @property
    def draft_bytes_per_block(self) -> int:
        return sum(len(g.layer_names) * g.spec.page_size_bytes for g in self.drafts)


def recognise(groups: list) -> AliasLayout | None:
    uniform = [g for g in groups if isinstance(g.spec, UniformType)]
    states = [g for g in groups if isinstance(g.spec, MambaState)]
    drafts = [g for g in groups if isinstance(g.spec, Attention)]
    attn = tail = None
    for g in uniform:
        members = [s for _, s in g.spec.members]
        if all(type(s) is MLA for s in members):
            attn = g
        elif all(isinstance(s, KpoolTail) for s in members):
            tail = g
    if attn is None or not states:
        return None
    if len(uniform) + len(states) + len(drafts) != len(groups):
        return None
    inner = attn.spec.specs
    if not all(type(s) is MLA and s.page_size_padded is None for s in inner.values()):
        return None
    mla_names = [n for n in attn.layer_names if inner[n].tokens_per_state == 1]
    idx_names = [n for n in attn.layer_names if inner[n].tokens_per_state > 1]
    mla_pages = {inner[n].page_size_bytes for n in mla_names}
    idx_pages = {inner[n].page_size_bytes for n in idx_names}
    if len(mla_pages) != 1 or len(idx_pages) != 1:
        return None
    mla_page, idx_page = mla_pages.pop(), idx_pages.pop()
    if any(g.spec.page_size_bytes != mla_page for g in states):
        return None
    tail_names: list[str] = []
    tail_page = 0
    if tail is not None:
        tail_names = list(tail.layer_names)
        pages = {s.unpadded_page_size_bytes for _, s in tail.spec.members}
        if len(pages) != 1 or len(tail_names) != len(idx_names):
            return None
        tail_page = pages.pop()
        if tail_page > idx_page:
            return None
    return AliasLayout(attn, states, mla_names, idx_names, mla_page, idx_page,
                       tail_names, tail_page, drafts)


def draft_pool_blocks(engine: Engine, layout: AliasLayout) -> int | None:
    """Blocks in the drafter's own pool, or None when it rides the target pool.

    A sliding-window drafter holds its window, the block it fills, one more
    across a block boundary, and the blocks one prefill chunk writes.
    """
    if not layout.drafts or not engine.draft_pool:
        return None
    if engine.draft_pool_blocks is not None:
        return engine.draft_pool_blocks
    need = 1  # the null block
    for g in layout.drafts:
        spec = g.spec
        window = getattr(spec, "sliding_window", None) or spec.block_size
        per_seq = cdiv(window, spec.block_size) + 2
        need = max(need, engine.max_num_seqs * per_seq
                   + cdiv(engine.max_num_batched_tokens, spec.block_size) + 1)
    return need


def bytes_per_block(engine: Engine, layout: AliasLayout) -> int:
    extra = 0 if engine.draft_pool else layout.draft_bytes_per_block
    return layout.target_bytes_per_block + extra


def draft_pool_bytes(engine: Engine, layout: AliasLayout) -> int:
    blocks = draft_pool_blocks(engine, layout)
    return blocks * layout.draft_bytes_per_block if blocks else 0


def memory_usage(engine: Engine, layout: AliasLayout) -> int:
    """Bytes one request at ``engine.max_model_len`` needs from the pools."""
    attn_spec: UniformType = layout.attn.spec  # type: ignore[attr-defined]
    blocks = attn_spec.max_memory_usage_pages(engine)
    blocks += sum(cdiv(g.spec.max_memory_usage_bytes(engine), g.spec.page_size_bytes)
                  for g in layout.states)
    if layout.tail_names:
        blocks += 1
    if draft_pool_blocks(engine, layout):
        return blocks * layout.target_bytes_per_block + draft_pool_bytes(engine, layout)
    for g in layout.drafts:
        if g.layer_names:
            blocks += cdiv(g.spec.max_memory_usage_bytes(engine), g.spec.page_size_bytes)
    return blocks * (layout.target_bytes_per_block + layout.draft_bytes_per_block)


def place(engine: Engine, layout: AliasLayout, groups: list) -> list:
    """Tensors of the aliasing layout, affine in the pool's block count ``N``."""
    from kvspec.planner.place import Tensor

    n = Affine(1, 0)
    d_blocks = draft_pool_blocks(engine, layout)
    d_total = d_blocks * layout.draft_bytes_per_block if d_blocks else 0
    size = n * bytes_per_block(engine, layout) + d_total
    attn_specs = layout.attn.spec.specs  # type: ignore[attr-defined]
    tensors: list[Tensor] = []

    def add(name: str, spec: LayerSpec, offset: Affine, blocks: Affine | int, pool: str,
            role: str) -> None:
        page = spec.page_size_bytes
        tensors.append(Tensor(size=size, layers=(name,), layer_stride=Affine.of(blocks) * page,
                              block_stride=Affine.of(page), offset=offset, pool=pool,
                              role=role))

    for i, name in enumerate(layout.mla_names):
        offset = n * (i * layout.mla_page)
        add(name, attn_specs[name], offset, n, "device", "mla")
        for g in layout.states:
            if i < len(g.layer_names):
                add(g.layer_names[i], g.spec, offset, n, "device", "state in mla slot")
    idx_base = n * (len(layout.mla_names) * layout.mla_page)
    for i, name in enumerate(layout.idx_names):
        offset = idx_base + n * (i * layout.idx_page)
        add(name, attn_specs[name], offset, n, "device", "indexer")
        if layout.tail_names:
            tail = layout.tail_names[i]
            tail_group = next(g for g in groups if tail in g.layer_names)
            add(tail, tail_group.spec.specs[tail], offset, n, "device", "tail in indexer slot")
    offset = idx_base + n * (len(layout.idx_names) * layout.idx_page)
    blocks: Affine | int = d_blocks if d_blocks else n
    for g in layout.drafts:
        for name in g.layer_names:
            add(name, g.spec, offset, blocks, "draft" if d_blocks else "device", "drafter")
            offset = offset + Affine.of(blocks) * g.spec.page_size_bytes
    return tensors
