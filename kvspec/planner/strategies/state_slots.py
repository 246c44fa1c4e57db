"""Strategy ``state_slots``: state layers sharing the attention layers' slots.

A model of MLA layers, compressed MLA indexer layers (``tokens_per_state >
1``) and state layers (Mamba/GDN) -- GLM-5-Next is the first -- plans as:

* one ``UniformType`` group of every MLA and indexer layer (role ``attention``);
* the indexer's kpool tail rings, one block each, in the indexer slots (``tail``);
* state groups whose pages are padded to the MLA page, so state layer *i* of
  every state group lives in MLA layer *i*'s slot (``state``);
* an optional drafter's attention layers, in groups appended last, with a pool
  of their own sized from ``max_num_seqs`` and ``max_num_batched_tokens``
  (``draft``).

The groups record the strategy and their roles, so placement and sizing
(:mod:`.state_slots_pool`) read the layout back from them, never re-detect it.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvspec.errors import LayerRef, PlanError
from kvspec.model.engine import Engine, SettingRef
from kvspec.model.plan import Group
from kvspec.model.specs import (
    MLA,
    Attention,
    DraftSlidingWindow,
    FullAttention,
    KpoolTail,
    LayerSpec,
    MambaState,
    SlidingWindow,
    UniformType,
    cdiv,
    recast,
    replace,
)
from kvspec.model.specs.base import by_spec, once_per_object
from kvspec.model.stages import layer_index, stage_bounds
from kvspec.planner.log import PlanLog
from kvspec.planner.merge import merge_group

STRATEGY = "state_slots"


def _draft_block_size(engine: Engine, target: int) -> int:
    requested = engine.draft_block_size
    if requested is None:
        if engine.draft_pool and target % 256 == 0:
            return 256
        return target
    if requested <= 0 or requested % 64 or target % requested:
        fits = [b for b in range(64, target + 1, 64) if target % b == 0]
        raise PlanError(
            f"draft block size {requested} must be a positive multiple of 64 that "
            f"divides the target block size {target}",
            ref=SettingRef("draft_block_size"), found=str(requested),
            expected=f"one of {', '.join(map(str, fits))}" if fits else
            f"a multiple of 64 dividing {target} (none does)",
            hint="leave engine.draft.block_size out to use the default (256 with a draft "
            "pool where it divides the target block size, else the target's)" if fits else
            "raise engine.block_size to a multiple of 64")
    return requested


def _draft_spec(engine: Engine, name: str, spec: LayerSpec, target_block: int) -> LayerSpec:
    assert isinstance(spec, Attention)
    if spec.page_size_padded is not None:
        raise PlanError(f"layer {name}: a padded draft page is not supported on the aliasing "
                        "layout", hint="do not skip quantization for drafter layers")
    if isinstance(spec, SlidingWindow):
        return recast(spec, DraftSlidingWindow,
                      block_size=_draft_block_size(engine, target_block))
    if target_block % spec.block_size:
        raise PlanError(
            f"layer {name}: draft block size {spec.block_size} does not divide the target "
            f"block size {target_block}",
            hint="pick an engine block_size that is a multiple of the drafter's kernel block")
    return spec.with_block_size(target_block)


def _draft_groups(engine: Engine, drafts: Mapping[str, LayerSpec],
                  target_block: int) -> list[Group]:
    scaled = {n: _draft_spec(engine, n, s, target_block) for n, s in drafts.items()}
    return [merge_group(scaled, names, strategy=STRATEGY, role="draft",
                        own_pool=engine.draft_pool) for names in by_spec(scaled.items()).values()]


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
                        "parallelism", hint="name layers with {index} (the default "
                        "layer_name has it), or set parallel.pipeline: 1")
    known = [i for i in state_idx + mla_idx if i is not None]
    total = engine.total_num_hidden_layers or (max(known) + 1)
    for lo, hi in stage_bounds(total, pp, engine.pp_layer_partition):
        n_state = sum(lo <= i < hi for i in state_idx if i is not None)
        n_mla = sum(lo <= i < hi for i in mla_idx if i is not None)
        if not n_state:
            continue
        if not n_mla:
            return None
        count = max(count, cdiv(n_state, n_mla))
    return count


def _attention_group(attn: Mapping[str, MLA]) -> tuple[Group, int, int]:
    """The MLA + indexer group, and the MLA and indexer pages."""
    idx_pages = {s.page_size_bytes for s in attn.values() if s.tokens_per_state > 1}
    if any(s.page_size_padded is not None for s in attn.values()):
        raise PlanError("the aliasing layout needs unpadded MLA pages",
                        hint="remove the MLA alignment of these layers")
    if len(idx_pages) != 1:
        raise PlanError(f"indexer layers differ in page size {sorted(idx_pages)}",
                        expected="one page size for every compressed indexer layer",
                        hint="give the indexer layers one head size, dtype and "
                             "tokens_per_state")
    mla_pages = {s.page_size_bytes for s in attn.values() if s.tokens_per_state == 1}
    if not mla_pages:
        raise PlanError("the aliasing layout needs MLA layers (tokens_per_state 1) beside "
                        "the compressed indexer layers", expected="at least one MLA layer",
                        hint="add the model's MLA layers, or give the indexers "
                             "tokens_per_state 1")
    if len(mla_pages) != 1:
        raise PlanError(f"MLA layers differ in page size {sorted(mla_pages)}",
                        expected="one page size for every MLA layer",
                        hint="give the MLA layers one head size and dtype")
    uniform = UniformType.of(attn)
    if uniform is None:
        raise PlanError("MLA and indexer layers must share one block size",
                        expected=f"one block size for every layer, found "
                        f"{sorted({s.block_size for s in attn.values()})}",
                        hint="drop the per-type block_size, so every layer uses "
                             "engine.block_size")
    return (Group(tuple(attn), uniform, strategy=STRATEGY, role="attention"),
            mla_pages.pop(), idx_pages.pop())


def _tail_group(tails: Mapping[str, LayerSpec], idx_page: int) -> Group:
    too_big = [n for n, s in tails.items() if s.unpadded_page_size_bytes > idx_page]
    if too_big:
        raise PlanError(f"kpool tail layer {too_big[0]}: its page "
                        f"({tails[too_big[0]].unpadded_page_size_bytes} bytes) does not fit "
                        f"the indexer page it shares ({idx_page} bytes)",
                        hint="a tail ring must be no larger than its indexer's page")
    pad = once_per_object(lambda s: replace(s, page_size_padded=idx_page))
    padded = {n: pad(s) for n, s in tails.items()}  # tails sharing a spec share one
    uniform = UniformType.of(padded)
    if uniform is None:
        raise PlanError("kpool tail layers must share one spec",
                        hint="give every tail layer the same kind, shapes and dtypes")
    return Group(tuple(padded), uniform, strategy=STRATEGY, role="tail")


def _state_groups(engine: Engine, states: Mapping[str, MambaState], mla_names: list[str],
                  mla_page: int) -> list[Group]:
    first, some = next(iter(states.items()))
    other = next((n for n, s in states.items() if s != some), None)
    if other is not None:
        raise PlanError(f"state layers of the aliasing layout must all have the same spec: "
                        f"{other}'s differs from {first}'s", ref=LayerRef(other),
                        hint="give every state layer the same kind, shapes and dtypes: they "
                             "share the MLA layers' slots")
    if some.unpadded_page_size_bytes > mla_page:
        raise PlanError(
            f"the state page ({some.unpadded_page_size_bytes} bytes) does not fit "
            f"the MLA page ({mla_page} bytes)",
            hint="increase tensor parallelism or use a wider KV cache dtype")
    padded = dict.fromkeys(states, replace(some, page_size_padded=mla_page))  # all alike
    count = _balanced_state_group_count(engine, list(states), mla_names)
    if count is None:
        raise PlanError(
            "a pipeline stage has state layers but no MLA layer to share slots with",
            hint="realign the stage boundaries (parallel.pipeline_partition)")
    buckets: list[list[str]] = [[] for _ in range(count)]
    for i, name in enumerate(states):
        buckets[i % count].append(name)
    return [merge_group(padded, names, strategy=STRATEGY, role="state") for names in buckets]


def state_slots(engine: Engine, specs: Mapping[str, LayerSpec],
                log: PlanLog | None = None) -> list[Group] | None:
    """The aliasing layout's groups, or None when the model is not of this shape."""
    states = {n: s for n, s in specs.items() if isinstance(s, MambaState)}
    tails = {n: s for n, s in specs.items() if isinstance(s, KpoolTail)}
    rest = {n: s for n, s in specs.items() if not isinstance(s, (MambaState, KpoolTail))}
    # A drafter's plain attention layers ride along in groups of their own.
    drafts = {n: s for n, s in rest.items() if type(s) in (SlidingWindow, FullAttention)}
    attn = {n: s for n, s in rest.items() if n not in drafts}
    if not states or not attn or not all(type(s) is MLA for s in attn.values()):
        return None
    if not any(s.tokens_per_state > 1 for s in attn.values()):  # type: ignore[attr-defined]
        return None
    group, mla_page, idx_page = _attention_group(attn)  # type: ignore[arg-type]
    groups = [group]
    if tails:
        groups.append(_tail_group(tails, idx_page))
    mla_names = [n for n, s in attn.items() if s.tokens_per_state == 1]  # type: ignore[attr-defined]
    groups += _state_groups(engine, states, mla_names, mla_page)
    groups += _draft_groups(engine, drafts, group.spec.block_size)
    return groups
