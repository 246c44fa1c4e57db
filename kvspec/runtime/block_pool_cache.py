"""The prefix-cache half of the block pool: which blocks hold which block hashes.

A full block of a request is *cached* under the key ``hash + group id`` (see
:func:`~kvspec.runtime.hashing.make_block_hash_with_group_id`), which the
block keeps as its ``block_hash``; a later request of the same group whose
prefix hashes alike finds it and shares it. A cached block stays findable after
it is freed, until the pool hands it out again (it is evicted then) or
:meth:`~PrefixCachePool.evict` drops it.

The map is split by group, ``group id -> {hash: block}``, so neither a lookup
nor caching builds the key (a block makes it when asked, from its bare hash and
its group); a hash maps to one block, or to ``{block_id: block}`` when the
same content was cached in several blocks (concurrent requests), as in the
reference's ``BlockHashToBlockMap``.

>>> from kvspec.runtime.block_pool import BlockPool
>>> pool = BlockPool(4)
>>> blocks = pool.allocate(2, group_id=0)
>>> pool.cache_full_blocks(blocks, [b"h1", b"h2"], 0, 2, group_id=0)
>>> [b.block_id for b in pool.find_cached_prefix([b"h1", b"h2", b"h3"], group_id=0)]
[1, 2]
>>> pool.num_cached_blocks, pool.evict([1]), pool.num_cached_blocks
(2, [1], 1)

This module does not import torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from kvspec.runtime.block_pool_block import Block, BlockPoolError, BlockStateError
from kvspec.runtime.hashing import BlockHash, CacheKey, make_block_hash_with_group_id
from kvspec.runtime.hashing import resolve_block_hashes

if TYPE_CHECKING:  # pragma: no cover
    from kvspec.runtime.block_pool_queue import FreeBlockQueue

__all__ = ["GROUP_ID_LIMIT", "PrefixCachePool"]

#: Group ids must fit the 4 bytes of a block hash key.
GROUP_ID_LIMIT = 1 << 32

#: One group's map: block hash -> the block cached under it, or {block_id: block}
#: (typed ``Any``: the hot paths tell the two apart by ``entry.__class__ is Block``).
GroupMap = dict[CacheKey, Any]


class PrefixCachePool:
    """Prefix-cache lookups and bookkeeping, mixed into
    :class:`~kvspec.runtime.block_pool.BlockPool`.

    It keeps the map in ``_cached`` (group id -> :data:`GroupMap`); the pool
    provides ``blocks``, ``null_block`` and ``free_block_queue``.
    """

    __slots__ = ("enable_caching", "hash_block_size", "num_groups", "_cached")

    blocks: tuple[Block, ...]
    null_block: Block
    free_block_queue: FreeBlockQueue

    def _init_cache(
        self, enable_caching: bool, hash_block_size: int | None, num_groups: int | None
    ) -> None:
        if num_groups is not None and num_groups < 1:
            raise BlockPoolError("num_groups must be at least 1", found=repr(num_groups),
                                 hint="one per KV cache group of the layout "
                                 "(len(artifact.layout.groups))")
        self.enable_caching = enable_caching
        self.hash_block_size = hash_block_size
        self.num_groups = num_groups
        self._cached: dict[int, GroupMap] = {}

    @property
    def num_cached_blocks(self) -> int:
        """Blocks that hold a cached hash (held or free)."""
        return sum(
            1 if v.__class__ is Block else len(v)
            for group_map in self._cached.values()
            for v in group_map.values()
        )

    def lookup(self, block_hash: CacheKey, group_ids: Sequence[int]) -> list[Block] | None:
        """The cached block of ``block_hash`` in each of ``group_ids``, or ``None``
        when any of them misses. The blocks are not touched.

        >>> from kvspec.runtime.block_pool import BlockPool
        >>> pool = BlockPool(4)
        >>> blocks = pool.allocate(1, group_id=2)
        >>> pool.cache_full_blocks(blocks, [b"h"], 0, 1, group_id=2)
        >>> [b.block_id for b in pool.lookup(b"h", [2])], pool.lookup(b"h", [0])
        ([1], None)
        """
        if group_ids.__class__ is list and len(group_ids) == 1:  # the common case
            try:
                entry = self._cached[group_ids[0]].get(block_hash)
            except KeyError:  # nothing cached in this group yet
                self._no_group_map(group_ids[0])
                return None
            if entry is None:
                return None
            return [entry if entry.__class__ is Block else next(iter(entry.values()))]
        found: list[Block] = []
        for group_id in group_ids:
            group_map = self._cached.get(group_id)
            if not group_map:
                self._no_group_map(group_id)
                return None
            entry = group_map.get(block_hash)
            if entry is None:
                return None
            found.append(entry if entry.__class__ is Block else next(iter(entry.values())))
        return found

    def cached_map(self, group_id: int) -> GroupMap | None:
        """``group_id``'s map, block hash -> block (or ``{block_id: block}`` for one
        content cached in several blocks), for callers that look up many hashes in
        a row; None while nothing is cached in the group. Read it, never change it.

        >>> from kvspec.runtime.block_pool import BlockPool
        >>> pool = BlockPool(3)
        >>> pool.cached_map(0) is None
        True
        """
        return self._cached.get(group_id)

    def find_cached_prefix(
        self,
        block_hashes: Iterable[CacheKey],
        group_id: int,
        max_blocks: int | None = None,
    ) -> list[Block]:
        """The cached blocks of the longest prefix of ``block_hashes`` in ``group_id``.

        Stops at the first miss (or after ``max_blocks``). Hashes must already
        be at this group's block size (see ``resolve_block_hashes``).
        """
        hits: list[Block] = []
        if not self.enable_caching:
            return hits
        group_map = self._cached.get(group_id)
        if not group_map:
            self._no_group_map(group_id)
            return hits
        if max_blocks is not None and max_blocks <= 0:
            return hits
        get, append = group_map.get, hits.append
        for block_hash in block_hashes:
            entry = get(block_hash)
            if entry is None:
                break
            append(entry if entry.__class__ is Block else next(iter(entry.values())))
            if max_blocks is not None and len(hits) >= max_blocks:
                break
        return hits

    def cache_full_blocks(
        self,
        blocks: Sequence[Block],
        block_hashes: Sequence[BlockHash],
        num_cached_blocks: int,
        num_full_blocks: int,
        group_id: int,
        block_size: int | None = None,
    ) -> None:
        """Cache ``blocks[num_cached_blocks:num_full_blocks]`` of one request.

        ``block_hashes`` are the request's hashes at the pool's
        ``hash_block_size``; ``block_size`` is the group's (default: the hash
        block size), and the hash of block *i* is read at that granularity.
        Blocks must be held by ``group_id`` and not cached yet; null blocks are
        passed over. A no-op when caching is off.
        """
        if not self.enable_caching or num_cached_blocks >= num_full_blocks:
            return
        self._check_group(group_id)
        if block_size is None:
            block_size = self.hash_block_size
        hashes: Sequence[CacheKey] = block_hashes
        if self.hash_block_size is not None and block_size is not None:
            hashes = resolve_block_hashes(block_hashes, self.hash_block_size, block_size)
        if len(hashes) < num_full_blocks or len(blocks) < num_full_blocks:
            raise BlockPoolError(
                f"cannot cache {num_full_blocks} full blocks",
                expected=f"at least {num_full_blocks} blocks and block hashes",
                found=f"{len(blocks)} blocks, {len(hashes)} block hashes",
                hint="pass the request's blocks and its block hashes, one per full block",
            )
        new_blocks = blocks[num_cached_blocks:num_full_blocks]
        _check_cacheable(new_blocks, group_id)
        group_map = self._cached.setdefault(group_id, {})
        for i, block in enumerate(new_blocks, start=num_cached_blocks):
            if block.is_null:
                continue
            if block._hash is not None:  # listed twice: cached a moment ago
                raise BlockStateError(f"block {block.block_id} already has a hash",
                                      hint="a block is cached once; cache only new full "
                                      "blocks (num_cached_blocks onwards)")
            block._hash = block_hash = hashes[i]
            block._block_hash_num_tokens = None if block_size is None else (i + 1) * block_size
            entry = group_map.get(block_hash)
            if entry is None:
                group_map[block_hash] = block
            elif entry.__class__ is Block:
                group_map[block_hash] = {entry.block_id: entry, block.block_id: block}
            else:
                entry[block.block_id] = block

    def cache_block(self, block: Block, block_hash: CacheKey, group_id: int,
                    num_tokens: int | None = None) -> None:
        """Cache one held block under ``block_hash`` for ``group_id``, the prefix of
        ``num_tokens`` tokens (a request-level manager's step, unchecked: the caller
        holds the block). A block cached under another hash loses it first; one
        cached under this hash already is left alone.

        >>> from kvspec.runtime.block_pool import BlockPool
        >>> pool = BlockPool(3)
        >>> (block,) = pool.allocate(1)
        >>> pool.cache_block(block, b"h", 0, 16)
        >>> pool.lookup(b"h", [0]) == [block], block.block_hash_num_tokens
        (True, 16)
        """
        if not self.enable_caching or block.is_null:
            return
        if block._hash is not None:
            if block._hash == block_hash and block._group == group_id:
                return
            self._uncache(block)
            block._hash = block._block_hash_num_tokens = None
        block._hash = block_hash
        block._group = group_id
        block._block_hash_num_tokens = num_tokens
        group_map = self._cached.get(group_id)
        if group_map is None:
            group_map = self._cached[group_id] = {}
        entry = group_map.get(block_hash)
        if entry is None:
            group_map[block_hash] = block
        elif entry.__class__ is Block:
            group_map[block_hash] = {entry.block_id: entry, block.block_id: block}
        else:
            entry[block.block_id] = block

    def cache_run(self, blocks: Sequence[Block], block_hashes: Sequence[CacheKey],
                  group_id: int, num_tokens: int, block_size: int) -> None:
        """:meth:`cache_block` for a request's run of full blocks: ``blocks[k]`` under
        ``block_hashes[k]``, the prefix of ``num_tokens + k * block_size`` tokens
        (null blocks are passed over).

        >>> from kvspec.runtime.block_pool import BlockPool
        >>> pool = BlockPool(4)
        >>> blocks = pool.allocate(2)
        >>> pool.cache_run(blocks, [b"a", b"b"], 0, 16, 16)
        >>> [b.block_hash_num_tokens for b in blocks]
        [16, 32]
        """
        if not self.enable_caching:
            return
        group_map = self._cached.get(group_id)
        if group_map is None:
            group_map = self._cached[group_id] = {}
        get = group_map.get
        for block, block_hash in zip(blocks, block_hashes):
            if block._hash is not None or block.is_null:
                self.cache_block(block, block_hash, group_id, num_tokens)
            else:
                block._hash = block_hash
                block._group = group_id
                block._block_hash_num_tokens = num_tokens
                entry = get(block_hash)
                if entry is None:
                    group_map[block_hash] = block
                elif entry.__class__ is Block:
                    group_map[block_hash] = {entry.block_id: entry, block.block_id: block}
                else:
                    entry[block.block_id] = block
            num_tokens += block_size

    def evict(self, block_ids: Iterable[int]) -> list[int]:
        """Drop the cached hash of the given blocks (held or free); returns the ids
        that were cached. A held block stays held.

        >>> from kvspec.runtime.block_pool import BlockPool
        >>> pool = BlockPool(4)
        >>> blocks = pool.allocate(2)
        >>> pool.cache_full_blocks(blocks, [b"a", b"b"], 0, 2, group_id=0)
        >>> pool.evict([2, 3]), pool.lookup(b"b", [0])
        ([2], None)
        """
        evicted: list[int] = []
        blocks = self.blocks
        for block_id in block_ids:
            block = blocks[block_id]
            if block._hash is not None and self._uncache(block):
                evicted.append(block_id)
        return evicted

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; only allowed when no block is held.

        Returns whether the cache was reset.

        >>> from kvspec.runtime.block_pool import BlockPool
        >>> pool = BlockPool(3)
        >>> blocks = pool.allocate(1)
        >>> pool.reset_prefix_cache(), (pool.free(blocks), pool.reset_prefix_cache())[1]
        (False, True)
        """
        if self.free_block_queue.num_free_blocks != len(self.blocks) - 1:
            return False
        self._cached.clear()
        for block in self.blocks:
            block._hash = block._block_hash_num_tokens = None
        return True

    # -- internals --------------------------------------------------------

    def _uncache(self, block: Block) -> bool:
        """Drop ``block``'s hash from the map and the block; False if the map
        does not hold it under that hash."""
        group_map = self._cached.get(block._group)  # type: ignore[arg-type]
        block_hash = block._hash
        if group_map is None or block_hash is None:
            return False
        entry = group_map.get(block_hash)
        if entry is None:
            return False
        if entry.__class__ is Block:
            if entry is not block:
                return False
            del group_map[block_hash]
        else:
            if entry.pop(block.block_id, None) is None:
                return False
            if len(entry) == 1:
                group_map[block_hash] = next(iter(entry.values()))
        block._hash = block._block_hash_num_tokens = None
        return True

    def _no_group_map(self, group_id: int) -> None:
        """No map for ``group_id`` (nothing cached in it yet): check that the id
        fits a key, as a lookup by key would, and miss."""
        make_block_hash_with_group_id(b"", group_id)  # raises HashingError if not

    def _check_group(self, group_id: int) -> None:
        limit = self.num_groups if self.num_groups is not None else GROUP_ID_LIMIT
        if not isinstance(group_id, int) or not 0 <= group_id < limit:
            raise BlockPoolError(
                f"group id {group_id!r} is out of range",
                expected=f"0 <= group id < {limit}",
                found=repr(group_id),
                hint="group ids are the layout's, 0 to num_groups - 1",
            )


def _check_cacheable(blocks: Sequence[Block], group_id: int) -> None:
    """Every non-null block is held by ``group_id`` and not cached yet."""
    for block in blocks:
        if block.is_null:
            continue
        if block.ref_count <= 0 or block._group != group_id:
            raise BlockStateError(
                f"block {block.block_id} is not held by group {group_id}",
                found=f"ref count {block.ref_count}, group {block.group_id}",
                hint="cache the blocks a request holds, under the group it took them for",
            )
        if block._hash is not None:
            raise BlockStateError(f"block {block.block_id} is already cached",
                                  hint="cache only new full blocks (num_cached_blocks onwards)")
