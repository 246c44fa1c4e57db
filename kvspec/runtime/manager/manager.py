"""The request-level KV cache manager: every group's blocks for every request.

:class:`KVCacheManager` does, over one or several block pools, what vLLM
0.33's ``KVCacheManager`` and its coordinators do over one pool:

* :meth:`~KVCacheManager.get_computed_blocks` -- a new request's prefix-cache hit:
  the longest prefix every group can resume at (one group looks itself up; in
  a hybrid layout each kind shortens the candidate until all agree, full
  attention first);
* :meth:`~KVCacheManager.allocate_slots` -- free what left the window, check
  that the blocks fit (for an admission, that the whole prompt fits), take the
  hits, allocate, cache the new full blocks; False when it does not fit;
* :meth:`~KVCacheManager.cache_blocks`, :meth:`~KVCacheManager.free`,
  :meth:`~KVCacheManager.new_step_starts`.

With one pool it makes vLLM 0.33's decisions: the same block ids, the same free
queue order (``tests/vllm/test_simulate_fidelity.py`` checks it against vLLM's
own scheduler). With several, each pool is checked against its own groups'
needs. No torch here.

>>> from kvspec.runtime.manager.spec import ManagedGroup, ManagedLayout, ManagedPool
>>> layout = ManagedLayout("x", (ManagedGroup("g", kind="full", block_size=4, pool="p"),),
...                        (ManagedPool("p", num_blocks=8, hash_block_size=4),),
...                        scheduler_block_size=4, max_model_len=64)
>>> manager = KVCacheManager(layout)
>>> r = manager.new_request(0, 10)
>>> manager.allocate_slots(r, 10), [b.block_id for b in r.tables[0]], manager.num_free(0)
(True, [1, 2, 3], 4)
"""

from __future__ import annotations

from functools import partial
from typing import Any

from kvspec.runtime.block_pool import Block, BlockPool
from kvspec.runtime.manager.request import RequestState
from kvspec.runtime.manager.single import (
    CrossManager,
    FullManager,
    GroupManager,
    LocalManager,
    RingManager,
    RswaManager,
    SlidingManager,
    cdiv,
)
from kvspec.runtime.manager.spec import ManagedLayout, ManagerError
from kvspec.runtime.manager.state import StateManager

__all__ = ["KVCacheManager"]

_KINDS: dict[str, type[GroupManager]] = {
    "full": FullManager, "sliding": SlidingManager, "local": LocalManager,
    "rswa": RswaManager, "state": StateManager, "cross": CrossManager, "ring": RingManager,
}

Hits = list[list[Block]]


class KVCacheManager:
    """Blocks for requests across the groups and pools of a :class:`ManagedLayout`."""

    def __init__(self, layout: ManagedLayout) -> None:
        self.layout = layout
        self.max_model_len = layout.max_model_len
        caching = layout.enable_caching
        #: One full-attention group: a request's blocks stay in its table until it is
        #: freed, so the blocks of its own keys are found in the table it was preempted
        #: with (:func:`.lookup.longest_prefix`), and the pool keeps them out of its map.
        one_full = len(layout.groups) == 1 and layout.groups[0].kind == "full"
        self.pools = tuple(BlockPool(p.num_blocks, enable_caching=caching and p.enable_caching,
                                     hash_block_size=p.hash_block_size,
                                     private_keys=one_full)
                           for p in layout.pools)
        self.group_pool = tuple(layout.pool_index(i) for i in range(len(layout.groups)))
        self.managers = tuple(
            _KINDS[g.kind](i, g, self.pools[self.group_pool[i]], layout,
                           caching and layout.pool_of(i).enable_caching)
            for i, g in enumerate(layout.groups))
        self.caching = caching
        self.num_groups = len(self.managers)
        self._states = tuple(m for m in self.managers if isinstance(m, StateManager))
        self._lookup = self._spec_groups()
        #: Whether a request none of whose keys any block holds hits nothing: every
        #: finder but chunked local attention's (its hit starts with the null blocks of
        #: the chunks before the current one, cached or not) then finds no block.
        self._unseen_misses = not any(isinstance(m, LocalManager) for m, _, _ in self._lookup)
        self._empty: Hits = [[] for _ in self.managers]
        #: Hybrid layouts cache only up to a hit boundary (a scheduler block multiple).
        self._cache_unit = layout.scheduler_block_size if self.num_groups > 1 else 1
        #: The one group of a full-attention layout: a running request's slots are
        #: then its table grown to its tokens (:meth:`_grow_full`).
        self._full = self.managers[0] if one_full else None
        #: Whether a running request's slots (:meth:`allocate_slots` with new tokens
        #: alone) cache every full block its tokens fill, after allocating and freeing
        #: nothing else: a caller caching first may then cache only when they do not fit.
        self.caches_while_growing = self._full is not None
        self._cache_grown = None if self._full is None else (
            self._full._cache_full if self._full.bs == self._full.hbs and self._full.cacheable
            else self._full.cache)
        #: Whether the one full group's blocks may be taken cached under a request's
        #: own keys (:meth:`_take_full`): its hash blocks are its blocks, all cached.
        full = self._full
        self._own_keys = full is not None and full.bs == full.hbs and full.cacheable \
            and full.pool.private_keys and not full.masks
        #: ``allocate_slots(r, 1)`` of a running request (its next token), the call made
        #: once per decode block: straight to :meth:`_grow_full` where there is one.
        self.grow_one = self._grow_full if self._full is not None else partial(
            self.allocate_slots, num_new_tokens=1)

    def _spec_groups(self) -> list[tuple[GroupManager, list[int], bool]]:
        """Groups looked up together (same kind, spec key and pool), full attention
        first; vLLM's ``verify_and_split_kv_cache_groups``."""
        out: list[tuple[GroupManager, list[int], bool]] = []
        keys: list[tuple[Any, ...]] = []
        for m in self.managers:
            g = m.group
            if not m.cacheable:
                continue
            key = (type(m), g.spec_key, g.pool)
            if g.spec_key is not None and key in keys:
                out[keys.index(key)][1].append(m.gid)
                continue
            keys.append(key)
            out.append((m, [m.gid], g.full_like))
        out.sort(key=lambda entry: not entry[2])
        if any(m.mode == "align" and m.bs > m.hbs for m in self._states):
            raise ManagerError("prefix-cache hits inside a state block (a hash block "
                               "smaller than the Mamba block) are not modelled",
                               hint="hash at the state block size")
        return out

    # -- requests -----------------------------------------------------------
    def new_request(self, index: int, num_prompt_tokens: int, *, prefix: int = 0,
                    prefix_tokens: int = 0) -> RequestState:
        """A request state with empty tables in every group."""
        r = RequestState(index, num_prompt_tokens, prefix=prefix, prefix_tokens=prefix_tokens)
        r.reset_tables(self.num_groups)
        return r

    def num_free(self, pool: int = 0) -> int:
        return self.pools[pool].free_block_queue.num_free_blocks

    def new_step_starts(self) -> None:
        for m in self._states:
            m.new_step()

    # -- prefix-cache hits ----------------------------------------------------
    def get_computed_blocks(self, r: RequestState, *, unseen: bool = False
                            ) -> tuple[Hits | None, int, int]:
        """(hit blocks per group or None, hit tokens, shared prefix boundary).
        ``unseen``: the caller knows no block was ever cached under the request's keys
        (it was never scheduled, and shares no prefix): the lookup, which would find
        nothing, is skipped where finding nothing means no hit."""
        if not self.caching or not self._lookup or (unseen and self._unseen_misses
                                                     and not r.shares_keys):
            return None, 0, 0
        max_length = r.num_tokens - 1
        if self.num_groups == 1:
            hits, length = self.managers[0].find_hit(r, max_length, [0])
            uncached = 0
        else:
            hits, length, uncached = self._hybrid_hit(r, max_length)
        boundary = length + uncached if uncached else 0
        return (hits if any(hits) else None), length, boundary

    def cannot_admit(self, r: RequestState) -> bool:
        """Whether admitting waiting ``r`` surely fails, told before its lookup: in a
        one-group full-attention layout a request sharing no keys needs a block for each
        block of its tokens (a hit is a block only it cached, free now, so it counts as
        taken), more than are free."""
        m = self._full
        return m is not None and not r.shares_keys and -(-min(
            r.num_tokens, self.max_model_len) // m.bs) > m.pool.free_block_queue.num_free_blocks

    def _hybrid_hit(self, r: RequestState, max_length: int) -> tuple[Hits, int, int]:
        """The longest hit every group agrees on: each kind in turn shortens the
        candidate until none does (full attention, found once, is trimmed)."""
        found: list[list[Block] | None] = [None] * self.num_groups
        lengths = [0] * self.num_groups
        simple = len(self._lookup) == 2 and self._lookup[0][2]
        hit, longest = max_length, 0
        while True:
            current = hit
            for m, gids, full in self._lookup:
                if full and found[gids[0]] is not None:
                    current = min(current, lengths[gids[0]])
                    continue
                blocks, current = m.find_hit(r, current, gids)
                for gid, got in zip(gids, blocks):
                    found[gid], lengths[gid] = got, current
                longest = max(longest, current)
            if current >= hit:
                break
            hit = current
            if simple:
                break
        for m, gids, full in self._lookup:
            if full:
                keep = cdiv(hit, m.bs)
                for gid in gids:
                    held = found[gid]
                    if held is not None:
                        del held[keep:]
        return [b if b is not None else [] for b in found], hit, longest - hit

    # -- allocation ---------------------------------------------------------
    def allocate_slots(self, r: RequestState, num_new_tokens: int, num_hit_tokens: int = 0,
                       hits: Hits | None = None, *, lookahead: int = 0,
                       full_sequence_must_fit: bool = False) -> bool:
        """Slots for ``num_new_tokens`` more tokens (after ``num_hit_tokens`` of
        prefix-cache hits, for a new request); False, changing nothing but freeing
        skipped blocks, when they do not fit."""
        if hits is None and not (num_hit_tokens or lookahead or full_sequence_must_fit) \
                and self._full is not None and num_new_tokens:
            return self._grow_full(r, num_new_tokens)
        if num_new_tokens == 0 and num_hit_tokens == 0:
            raise ManagerError("allocate_slots needs new tokens or hit tokens",
                               hint="schedule at least one token")
        group_hits = hits if hits is not None else self._empty
        local = r.num_computed_tokens + num_hit_tokens
        total = min(local, self.max_model_len)
        if full_sequence_must_fit:
            full = min(r.num_tokens, self.max_model_len)
            if not self._fits(r, full, group_hits, total, full, True):
                return False
        main = total + num_new_tokens
        need = min(main + lookahead, self.max_model_len)
        processed = total - r.num_in_flight_tokens
        for m in self.managers:
            m.drop_skipped(r, max(0, processed))
        if not self._fits(r, need, group_hits, total, main, False):
            return False
        if hits is not None and max(r.num_cached) < 0:
            for m in self.managers:
                m.adopt_hits(r, hits[m.gid], local)
        if self._full is not None:  # its new blocks taken cached where they can be
            new = -(-need // self._full.bs) - len(r.tables[0])
            if new > 0:
                self._take_full(r, new, min(total + num_new_tokens, r.num_tokens))
        else:
            for m in self.managers:
                m.grow(r, need, main)
        if self.caching:
            self.cache_blocks(r, min(total + num_new_tokens, r.num_tokens))
        return True

    def _grow_full(self, r: RequestState, num_new_tokens: int = 1) -> bool:
        """:meth:`allocate_slots` of a request with no hits in a one-group full-attention
        layout: nothing to drop or adopt, the table grows to the tokens' blocks."""
        m, cache_grown = self._full, self._cache_grown
        assert m is not None and cache_grown is not None, "one full-attention group"
        mml = self.max_model_len
        main = min(r.num_computed_tokens, mml) + num_new_tokens
        table = r.tables[0]
        new = -(-min(main, mml) // m.bs) - len(table)
        if new > 0:
            pool = m.pool
            if new > pool.free_block_queue.num_free_blocks:
                return False
            if new == 1:  # a decode block
                table += pool.allocate(1, 0)
            else:
                self._take_full(r, new, min(r.num_tokens, main))
        if self.caching:
            cache_grown(r, min(r.num_tokens, main))
        return True

    def _take_full(self, r: RequestState, new: int, cache_to: int) -> None:
        """``new`` blocks for the one full-attention group's table, the request's full
        blocks up to ``cache_to`` tokens among them taken cached at once when they are
        its own keys' (``BlockPool.allocate``'s ``num_own``)."""
        m: GroupManager = self._full  # type: ignore[assignment]  # called where there is one
        table = r.tables[0]
        done = len(table)
        own = min(r.num_tokens, cache_to) // m.bs - done if self._own_keys else 0
        key = r.key(done, m.bs) if 0 < own <= new and max(r.num_cached[0], 0) == done else 0
        if key < 0:
            table += m.pool.allocate(new, 0, own, key, (done + 1) * m.bs, m.bs)
            r.num_cached[0] = done + own
        else:
            table += m.pool.allocate(new, 0)

    def _fits(self, r: RequestState, num_tokens: int, hits: Hits, total: int, main: int,
              admission: bool) -> bool:
        if len(self.pools) == 1:
            need = 0
            for m in self.managers:
                need += m.blocks_needed(r, num_tokens, hits[m.gid], total, main, admission)
            return need <= self.pools[0].free_block_queue.num_free_blocks
        needs = [0] * len(self.pools)
        for m in self.managers:
            needs[self.group_pool[m.gid]] += m.blocks_needed(r, num_tokens, hits[m.gid],
                                                             total, main, admission)
        return all(n <= p.free_block_queue.num_free_blocks for n, p in zip(needs, self.pools))

    def cache_blocks(self, r: RequestState, num_tokens: int) -> None:
        """Cache the request's full blocks up to ``num_tokens`` (in a hybrid layout, up
        to the last scheduler block boundary: where a later hit can end)."""
        if self.caching:
            num_tokens -= num_tokens % self._cache_unit
            for m in self.managers:
                m.cache(r, num_tokens)

    def free(self, r: RequestState, *, resumes: bool = False) -> None:
        """Free every block of the request, group by group, each table last first.
        ``resumes``: it comes back (preempted); with private keys its table is kept,
        where its own keys' blocks are looked up."""
        r.released = r.tables[0] if resumes and self._full is not None else None
        for m in self.managers:
            m.release(r)

    def block_ids(self, r: RequestState) -> tuple[list[int], ...]:
        """The request's block ids per group (0 is the null block)."""
        return tuple([b.block_id for b in table] for table in r.tables)
