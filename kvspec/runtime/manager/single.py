"""One group's share of the work: how a manager kind allocates, frees, caches.

Each class decides, for one group, what vLLM 0.33's single-type manager of
that kind decides (``single_type_kv_cache_manager.py``), so that one pool
shared by all groups hands out the same block ids in the same order:

* :meth:`~GroupManager.blocks_needed` -- blocks a request needs to hold
  ``num_tokens`` (prefix-cache hits that are free count as taken);
* :meth:`~GroupManager.adopt_hits` -- take a new request's prefix-cache hits
  (skipped ones become null blocks);
* :meth:`~GroupManager.grow` -- allocate up to ``num_tokens`` slots;
* :meth:`~GroupManager.drop_skipped` -- free blocks no attention reads any more,
  last first, and put the null block in their place;
* :meth:`~GroupManager.cache` -- cache the request's new full blocks (only those
  a later hit can use, for sparse kinds);
* :meth:`~GroupManager.release` -- free every block, last first;
* :meth:`~GroupManager.find_hit` -- the longest cached prefix of a request in
  some groups of this kind (see :mod:`.lookup`).

The ``state`` kind (Mamba) lives in :mod:`.state`. This module does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvspec.runtime.manager import lookup
from kvspec.runtime.manager.spec import ManagedGroup, ManagedLayout, ManagerError

if TYPE_CHECKING:  # pragma: no cover
    from kvspec.runtime.block_pool import Block, BlockPool
    from kvspec.runtime.manager.request import RequestState

__all__ = ["CrossManager", "FullManager", "GroupManager", "LocalManager", "RingManager",
           "RswaManager", "SlidingManager"]


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class GroupManager:
    """Full attention: every block held until the request ends (vLLM's
    ``FullAttentionManager``); the base of the other kinds."""

    def __init__(self, gid: int, group: ManagedGroup, pool: BlockPool,
                 layout: ManagedLayout, caching: bool) -> None:
        self.gid = gid
        self.group = group
        self.pool = pool
        self.null: Block = pool.null_block
        self.bs = group.block_size
        self.hbs = pool.hash_block_size or group.block_size
        if caching and group.prefix_cacheable and self.bs % self.hbs:
            raise ManagerError(f"group {group.name!r}: block size {self.bs} is not a multiple "
                               f"of the hash block size {self.hbs}",
                               hint="hash at a divisor of every caching group's block size")
        self.scale = max(self.bs // self.hbs, 1)
        self.caching = caching
        self.cacheable = caching and group.prefix_cacheable
        #: Whether the kind caches some full blocks only (:meth:`mask` is overridden).
        self.masks = type(self).mask is not GroupManager.mask
        #: Tokens a prefix-cache hit is a multiple of (the coordinator sets it).
        self.align = layout.scheduler_block_size
        self.retention = layout.retention_interval
        #: Blocks an admission reserves at most (recycling kinds), or None.
        self.cap: int | None = None

    # -- the kind's geometry ----------------------------------------------
    def skipped_tokens(self, num_computed: int) -> int:
        """Leading tokens no attention of the next token reads."""
        return 0

    def block_key(self, r: RequestState, i: int) -> int:
        return r.key((i + 1) * self.scale - 1, self.hbs)

    # -- allocation -------------------------------------------------------
    def blocks_needed(self, r: RequestState, num_tokens: int, hits: list[Block],
                      total: int, main: int, admission: bool = False) -> int:
        required = cdiv(num_tokens, self.bs)
        if admission and self.cap is not None and required > self.cap:
            required = self.cap
        held = len(r.tables[self.gid])
        if r.num_cached[self.gid] >= 0:  # running: no new hits
            return required - held if required > held else 0
        skipped = self.skipped_tokens(total) // self.bs
        new = required - max(skipped, len(hits) + held)
        free_hits = sum(1 for b in hits[max(0, skipped - held):]
                        if b.ref_count == 0 and not b.is_null)
        return max(0, new) + free_hits

    def adopt_hits(self, r: RequestState, hits: list[Block], local: int) -> None:
        table = r.tables[self.gid]
        skipped = self.skipped_tokens(local) // self.bs
        if skipped > 0:
            hits = hits[skipped:]
        if self.caching and hits:
            self.pool.touch(hits)
        if skipped > 0:
            table.extend([self.null] * skipped)
        table.extend(hits)
        r.num_cached[self.gid] = len(table)

    def grow(self, r: RequestState, num_tokens: int, main: int) -> None:
        table = r.tables[self.gid]
        new = cdiv(num_tokens, self.bs) - len(table)
        if new > 0:
            table.extend(self.pool.allocate(new, self.gid))

    # -- freeing ----------------------------------------------------------
    def drop_skipped(self, r: RequestState, processed: int) -> None:
        skipped = self.skipped_tokens(processed)
        if skipped <= 0:
            return
        table = r.tables[self.gid]
        self._free_range(table, 0, min(skipped // self.bs, len(table)))

    def _free_range(self, table: list[Block], first: int, last: int) -> None:
        """Free ``table[first:last]`` from the end back to the first null block."""
        if first >= last:
            return
        null = self.null
        freed = []
        for i in range(min(last, len(table)) - 1, first - 1, -1):
            block = table[i]
            if block is null:
                break
            freed.append(block)
            table[i] = null
        if freed:
            self.pool.free_blocks(freed)

    def release(self, r: RequestState) -> None:
        table = r.tables[self.gid]
        if table:
            self.pool.free_blocks(table[::-1])
        r.tables[self.gid] = []
        r.num_cached[self.gid] = -1

    # -- prefix caching -----------------------------------------------------
    def cache(self, r: RequestState, num_tokens: int) -> None:
        if self.cacheable:
            self._cache_full(r, num_tokens)

    def _cache_full(self, r: RequestState, num_tokens: int) -> None:
        gid = self.gid
        done = r.num_cached[gid]
        if done < 0:
            done = 0
        hashed = r.num_tokens // self.hbs * self.hbs
        full = min(hashed, num_tokens) // self.bs
        if done >= full:
            return
        mask = self.mask(r, done, full) if self.masks else None
        table = r.tables[gid]
        bs = self.bs
        if full - done == 1 and mask is None:  # a decode block: one key, no list
            self.pool.cache_block(table[done], r.key(full * self.scale - 1, self.hbs), gid,
                                  full * bs)
            r.num_cached[gid] = full
            return
        keys = r.block_keys(done, full, bs, self.hbs)
        if mask is None:
            self.pool.cache_run(table[done:full], keys, gid, (done + 1) * bs, bs)
        else:
            cache = self.pool.cache_block
            for i in range(done, full):
                block = table[i]
                if mask[i - done] and not block.is_null:
                    cache(block, keys[i - done], gid, (i + 1) * bs)
        r.num_cached[gid] = full

    def _cache_prompt_tail(self, r: RequestState, num_tokens: int) -> None:
        """The prompt's last hash boundary inside a block (hash blocks finer than the
        block): the block gets that hash if it has none (vLLM caches it as a partial
        entry; no lookup of a coarser group reads it, but it makes the block a cached
        one when it is freed)."""
        hbs = self.hbs
        boundary = min((r.num_prompt_tokens - 1) // hbs, r.num_tokens // hbs) * hbs
        if boundary == 0 or boundary > num_tokens or boundary % self.bs == 0:
            return
        table = r.tables[self.gid]
        i = boundary // self.bs
        if i < len(table) and table[i]._hash is None:
            self.pool.cache_block(table[i], r.key(boundary // hbs - 1, hbs), self.gid,
                                  boundary)

    def mask(self, r: RequestState, start: int, end: int) -> list[bool] | None:
        """Which of blocks ``start:end`` a hit can use (None: all)."""
        return None

    def find_hit(self, r: RequestState, max_length: int, gids: list[int]
                 ) -> tuple[list[list[Block]], int]:
        return lookup.longest_prefix(self, r, max_length, gids)


class FullManager(GroupManager):
    """Full attention, MLA, sink full attention, hidden states: with hash blocks finer
    than its blocks, the prompt's last hash boundary is cached too."""

    def cache(self, r: RequestState, num_tokens: int) -> None:
        if self.cacheable:
            self._cache_full(r, num_tokens)
            if self.bs != self.hbs:
                self._cache_prompt_tail(r, num_tokens)


class SlidingManager(GroupManager):
    """Sliding-window attention (vLLM's ``SlidingWindowManager``)."""

    def __init__(self, gid: int, group: ManagedGroup, pool: BlockPool,
                 layout: ManagedLayout, caching: bool) -> None:
        super().__init__(gid, group, pool, layout, caching)
        self.window = group.sliding_window or 0
        self.extra = group.extra_retained_tokens
        tokens = min(self.window - 1 + self.extra + layout.max_in_flight_tokens,
                     layout.max_model_len)
        self.cap = cdiv(tokens, self.bs) + 1
        #: Contiguous cached blocks a hit needs (the window before the next token).
        self.need = cdiv(self.window - 1, self.bs)

    def skipped_tokens(self, num_computed: int) -> int:
        skipped = num_computed - self.window + 1 - self.extra
        return max(0, skipped)

    def mask(self, r: RequestState, start: int, end: int) -> list[bool] | None:
        return lookup.window_mask(self, r, start, end)

    def find_hit(self, r: RequestState, max_length: int, gids: list[int]
                 ) -> tuple[list[list[Block]], int]:
        return lookup.window_run(self, r, max_length, gids)


class LocalManager(GroupManager):
    """Chunked local attention (vLLM's ``ChunkedLocalAttentionManager``)."""

    def __init__(self, gid: int, group: ManagedGroup, pool: BlockPool,
                 layout: ManagedLayout, caching: bool) -> None:
        super().__init__(gid, group, pool, layout, caching)
        self.chunk = group.attention_chunk_size or 1
        tokens = min(self.chunk + layout.max_in_flight_tokens, layout.max_model_len)
        self.cap = cdiv(tokens, self.bs)

    def skipped_tokens(self, num_computed: int) -> int:
        return num_computed // self.chunk * self.chunk

    def find_hit(self, r: RequestState, max_length: int, gids: list[int]
                 ) -> tuple[list[list[Block]], int]:
        if self.bs != self.align:
            raise ManagerError(f"group {self.group.name!r}: chunked local attention with "
                               "groups of other block sizes", found=f"block size {self.bs}, "
                               f"scheduler block size {self.align}",
                               hint="vLLM 0.33 does not support it either; use one block size")
        return lookup.local_chunk(self, r, max_length, gids)


class RswaManager(FullManager):
    """Full attention that frees the blocks between the prompt and the decode window."""

    def __init__(self, gid: int, group: ManagedGroup, pool: BlockPool,
                 layout: ManagedLayout, caching: bool) -> None:
        super().__init__(gid, group, pool, layout, caching)
        self.window = group.rswa_window or 0

    def drop_skipped(self, r: RequestState, processed: int) -> None:
        prompt = r.num_prompt_tokens
        start = max(prompt, processed - self.window)
        self._free_range(r.tables[self.gid], cdiv(prompt, self.bs), start // self.bs)


class CrossManager(GroupManager):
    """Cross-attention: the encoder tokens' blocks, taken once, never cached."""

    def blocks_needed(self, r: RequestState, num_tokens: int, hits: list[Block],
                      total: int, main: int, admission: bool = False) -> int:
        return super().blocks_needed(r, self.group.encoder_tokens, [], 0, 0, admission)

    def grow(self, r: RequestState, num_tokens: int, main: int) -> None:
        super().grow(r, self.group.encoder_tokens, main)

    def adopt_hits(self, r: RequestState, hits: list[Block], local: int) -> None:
        return

    def cache(self, r: RequestState, num_tokens: int) -> None:
        return


class RingManager(GroupManager):
    """A one-block ring per request (vLLM's ``CircularBufferManager``)."""

    def blocks_needed(self, r: RequestState, num_tokens: int, hits: list[Block],
                      total: int, main: int, admission: bool = False) -> int:
        return 0 if r.tables[self.gid] else 1

    def grow(self, r: RequestState, num_tokens: int, main: int) -> None:
        table = r.tables[self.gid]
        if not table:
            table.extend(self.pool.allocate(1, self.gid))

    def adopt_hits(self, r: RequestState, hits: list[Block], local: int) -> None:
        return

    def drop_skipped(self, r: RequestState, processed: int) -> None:
        return

    def cache(self, r: RequestState, num_tokens: int) -> None:
        return

    def find_hit(self, r: RequestState, max_length: int, gids: list[int]
                 ) -> tuple[list[list[Block]], int]:
        return [[] for _ in gids], 0
