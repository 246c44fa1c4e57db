"""What the request-level manager manages, as plain data: pools, groups, the layout.

A :class:`ManagedPool` is one block pool (its block count, whether it caches
prefixes, the hash granularity, the bytes one block costs); a
:class:`ManagedGroup` is one KV-cache group: how it holds a request's tokens
(its *manager kind*, which decides allocation, freeing and prefix-cache hits),
its block size and the pool it draws from; a :class:`ManagedLayout` is the set
of them with the engine figures the manager reads. Nothing here knows the
artifact: :mod:`.adapter` builds these from one.

Manager kinds (vLLM 0.33's single-type managers):

======== ==========================================================================
kind     behaviour
======== ==========================================================================
full     every token's block held until the request ends (full attention, MLA,
         sink full attention, hidden states); hits are the longest cached prefix
sliding  blocks that leave the window are freed and replaced by the null block;
         a hit needs the window's blocks cached
local    chunked local attention: blocks of finished chunks are freed
rswa     full attention that frees the gap between the prompt and a decode window
state    Mamba-like state: ``none`` (one block holds the state, no caching),
         ``align`` (a state block per block boundary, all but the last two freed),
         ``all`` (kvspec's model of the reference's mode: every boundary state kept)
cross    cross-attention: a fixed allocation for the encoder tokens
ring     a one-block ring buffer per request (never cached)
======== ==========================================================================

>>> pool = ManagedPool("pool", num_blocks=64, hash_block_size=16, bytes_per_block=2048)
>>> g = ManagedGroup("g0", kind="sliding", block_size=16, pool="pool", sliding_window=64,
...                  useful_bytes_per_block=2048)
>>> ManagedLayout("x", (g,), (pool,), scheduler_block_size=16, max_model_len=4096).pool_of(0).name
'pool'
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

from kvspec.errors import KvspecError
from kvspec.model import kinds

__all__ = ["KINDS", "ManagedGroup", "ManagedLayout", "ManagedPool", "ManagerError",
           "STATE_MODES"]

#: Manager kinds, see the module docstring: each layer kind's (``Kind.manager``).
KINDS = tuple(dict.fromkeys(k.manager for k in kinds.KINDS if k.manager is not None))
#: Cache modes of a ``state`` group.
STATE_MODES = ("none", "align", "all")


class ManagerError(KvspecError):
    """A layout the request-level manager cannot manage, or a misuse of it."""


@dataclass(frozen=True, slots=True)
class ManagedPool:
    """One block pool: ``num_blocks`` blocks (block 0 is the null block)."""

    name: str
    num_blocks: int
    #: Prefix caching in this pool (a hit needs the engine's caching on too).
    enable_caching: bool = True
    #: Tokens per prefix-cache hash (every caching group's block size is a multiple).
    hash_block_size: int = 16
    #: Bytes one block id costs across every tensor of the pool.
    bytes_per_block: int = 0


@dataclass(frozen=True, slots=True)
class ManagedGroup:
    """One KV-cache group as the manager sees it."""

    name: str
    kind: str
    #: Tokens per block, as the manager allocates them (decode context parallelism
    #: included: each rank holds ``block_size / dcp`` of them).
    block_size: int
    pool: str
    sliding_window: int | None = None
    extra_retained_tokens: int = 0
    attention_chunk_size: int | None = None
    rswa_window: int | None = None
    #: ``state`` groups: the cache mode, and blocks kept for speculative decoding and
    #: prefill checkpoints.
    state_mode: str = "none"
    speculative_blocks: int = 0
    checkpoint_blocks: int = 0
    #: Tokens a prefill checkpoint's distance from the chunk start is a multiple of.
    checkpoint_alignment: int | None = None
    prefix_cacheable: bool = True
    #: Sorted first in hybrid lookups (vLLM: the spec is a ``FullAttentionSpec``).
    full_like: bool = False
    #: Groups with equal keys (and kind and pool) are looked up together.
    spec_key: Hashable = None
    #: Bytes of one block that hold data (the group's layers' unpadded pages).
    useful_bytes_per_block: int = 0
    #: ``cross`` groups: encoder tokens each request caches.
    encoder_tokens: int = 0

    @property
    def bytes_per_token(self) -> float:
        """Useful bytes per token held (attention groups)."""
        return self.useful_bytes_per_block / self.block_size


@dataclass(frozen=True, slots=True)
class ManagedLayout:
    """Groups, pools and the engine figures the manager and scheduler read."""

    name: str
    groups: tuple[ManagedGroup, ...]
    pools: tuple[ManagedPool, ...]
    #: The scheduling granularity: the LCM of the groups' block sizes.
    scheduler_block_size: int
    max_model_len: int
    #: Tokens scheduled but not yet settled (one batch per concurrent step): the
    #: admission cap of sliding and local groups.
    max_in_flight_tokens: int = 16384
    #: The engine's prefix caching switch (each pool may turn its own off).
    enable_caching: bool = True
    #: vLLM's ``prefix_cache_retention_interval`` (0: only replay boundaries).
    retention_interval: int | None = 0
    #: The engine's ``cache_config.block_size``: Mamba "align" chunks end on it.
    split_block_size: int = 16
    _pools: dict[str, int] = field(default_factory=dict, init=False, repr=False,
                                   compare=False)

    def __post_init__(self) -> None:
        _check(self)
        self._pools.update({p.name: i for i, p in enumerate(self.pools)})

    def pool_of(self, group: int) -> ManagedPool:
        return self.pools[self._pools[self.groups[group].pool]]

    def pool_index(self, group: int) -> int:
        return self._pools[self.groups[group].pool]

    @property
    def has_align_state(self) -> bool:
        return any(g.kind == "state" and g.state_mode == "align" for g in self.groups)


def _check(layout: ManagedLayout) -> None:
    names = [p.name for p in layout.pools]
    if len(set(names)) != len(names):
        raise ManagerError("two pools share a name", found=", ".join(names),
                           hint="give each ManagedPool its own name")
    for pool in layout.pools:
        if pool.num_blocks < 1 or pool.hash_block_size < 1:
            raise ManagerError(f"pool {pool.name!r} needs at least one block (the null "
                               "block) and a positive hash block size",
                               found=f"{pool.num_blocks} blocks, hash block size "
                               f"{pool.hash_block_size}",
                               hint="size the pool for its budget first")
    for group in layout.groups:
        _check_group(group, set(names), layout)


def _check_group(group: ManagedGroup, pools: set[str], layout: ManagedLayout) -> None:
    where = f"group {group.name!r}"
    if group.kind not in KINDS:
        raise ManagerError(f"{where} has an unknown manager kind", expected=", ".join(KINDS),
                           found=repr(group.kind), hint="see kvspec.runtime.manager.spec")
    if group.pool not in pools:
        raise ManagerError(f"{where} draws from pool {group.pool!r}, which is not declared",
                           expected=", ".join(sorted(pools)), found=repr(group.pool),
                           hint="add the pool to ManagedLayout.pools")
    if group.block_size < 1 or layout.scheduler_block_size % group.block_size:
        raise ManagerError(f"{where}: its block size must divide the scheduler block size",
                           found=f"{group.block_size} and {layout.scheduler_block_size}",
                           hint="the scheduler block size is the LCM of the block sizes")
    needs = {"sliding": group.sliding_window, "local": group.attention_chunk_size,
             "rswa": group.rswa_window}
    if group.kind in needs and not needs[group.kind]:
        raise ManagerError(f"{where} of kind {group.kind!r} needs its window or chunk size",
                           hint="set sliding_window, attention_chunk_size or rswa_window")
    if group.kind == "state" and group.state_mode not in STATE_MODES:
        raise ManagerError(f"{where} has an unknown state cache mode",
                           expected=", ".join(STATE_MODES), found=repr(group.state_mode),
                           hint="vLLM's mamba_cache_mode: none or align")
