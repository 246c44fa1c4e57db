"""Prefix-cache hits per manager kind, and which blocks sparse kinds cache.

A hit is a list of cached blocks per group (the null block where a group does
not need the block) and its length in tokens, a multiple of the manager's
``align`` (the scheduler block size in a hybrid layout). Each finder reads
the request's block keys (:meth:`RequestState.key`) and the pool's map, as
vLLM 0.33's managers read block hashes and ``get_cached_block``:

* :func:`longest_prefix` -- full attention: cached blocks from the first on;
* :func:`window_run` -- sliding window: from the right, the first run of
  ``need`` cached blocks (the window before the next token);
* :func:`local_chunk` -- chunked local: the blocks of the last chunk;
* :func:`last_state` -- state: the rightmost cached block boundary.

:func:`window_mask` says which full blocks a sliding window group caches (the
runs a later hit can read: at the prompt's replay boundary and at a shared
prefix's end, under vLLM's default ``prefix_cache_retention_interval`` of 0).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # pragma: no cover
    from kvspec.runtime.block_pool import Block, BlockPool
    from kvspec.runtime.manager.request import RequestState


class GroupManager(Protocol):
    """What a finder reads of a group's manager (:class:`.single.GroupManager`)."""

    pool: BlockPool
    null: Block
    bs: int
    hbs: int
    scale: int
    align: int
    retention: int | None

    def block_key(self, r: RequestState, i: int) -> int: ...

__all__ = ["last_state", "local_chunk", "longest_prefix", "window_mask", "window_run"]

Hit = tuple[list[list[Any]], int]


def _finder(m: GroupManager, gids: list[int]):
    """``get(key)``: the cached block of ``key`` in each of ``gids``, or None."""
    if len(gids) == 1:
        group_map = m.pool.cached_map(gids[0])
        if group_map is None:
            return lambda key: None
        get = group_map.get

        def one(key: int) -> list[Block] | None:
            entry = get(key)
            if entry is None:
                return None
            return [entry if entry.__class__ is not dict else next(iter(entry.values()))]
        return one
    lookup = m.pool.lookup
    return lambda key: lookup(key, gids)


def longest_prefix(m: GroupManager, r: RequestState, max_length: int, gids: list[int]) -> Hit:
    bs = m.bs
    limit = min(max_length // bs, r.num_tokens // m.hbs // m.scale)
    hits: list[list[Any]] = [[] for _ in gids]
    get = _finder(m, gids)
    # the pool keeps the request's own (private, below zero) keys on the blocks it
    # was preempted with, block i at index i: nobody else holds them
    held = r.released if m.pool.private_keys and r.released is not None else ()
    for i in range(limit):
        key = m.block_key(r, i)
        if key < 0 and m.pool.private_keys:
            block = held[i] if i < len(held) else None
            if block is None or block._hash != key or block._group != gids[0]:
                break
            found: list[Block] = [block]
        else:
            got = get(key)
            if got is None:
                break
            found = got
        for blocks, block in zip(hits, found):
            blocks.append(block)
    length = len(hits[0]) * bs
    length -= length % m.align
    keep = -(-length // bs)
    for blocks in hits:
        del blocks[keep:]
    return hits, length


def window_run(m: Any, r: RequestState, max_length: int, gids: list[int]) -> Hit:
    bs, align, need = m.bs, m.align, m.need
    count = max_length // bs
    hits: list[list[Any]] = [[m.null] * count for _ in gids]
    get = _finder(m, gids)
    run = 0
    found_run = False
    for i in range(count - 1, -1, -1):
        found = get(m.block_key(r, i))
        if found is None:
            run = 0
            continue
        if run == 0 and bs != align and ((i + 1) * bs) % align:
            continue  # a run must end on an aligned boundary
        for blocks, block in zip(hits, found):
            blocks[i] = block
        run += 1
        if run >= need:
            for blocks in hits:
                del blocks[i + run:]
            found_run = True
            break
    if not found_run:  # the leading run is a hit however short
        for blocks in hits:
            del blocks[run:]
        while bs != align and (len(hits[0]) * bs) % align:
            for blocks in hits:
                blocks.pop()
    return hits, len(hits[0]) * bs


def local_chunk(m: Any, r: RequestState, max_length: int, gids: list[int]) -> Hit:
    bs, chunk = m.bs, m.chunk
    count = max_length // bs
    start = (max_length // chunk * chunk if max_length > 0 else 0) // bs
    hits: list[list[Any]] = [[m.null] * start for _ in gids]
    get = _finder(m, gids)
    for i in range(start, count):
        found = get(m.block_key(r, i))
        if found is None:
            break
        for blocks, block in zip(hits, found):
            blocks.append(block)
    return hits, len(hits[0]) * bs


def last_state(m: GroupManager, r: RequestState, max_length: int, gids: list[int]) -> Hit:
    bs, align = m.bs, m.align
    hits: list[list[Any]] = [[] for _ in gids]
    get = _finder(m, gids)
    for i in range(max_length // bs - 1, -1, -1):
        found = get(m.block_key(r, i))
        if found is None:
            continue
        if bs != align and ((i + 1) * bs) % align:
            continue
        for blocks, block in zip(hits, found):
            blocks.extend([m.null] * i)
            blocks.append(block)
        return hits, (i + 1) * bs
    return hits, 0


def window_mask(m: Any, r: RequestState, start: int, end: int) -> list[bool] | None:
    """vLLM's ``SlidingWindowManager.reachable_block_mask`` without EAGLE."""
    bs, align, need, retention = m.bs, m.align, m.need, m.retention
    if align % bs:
        return None  # the mask cannot say it block by block: cache all
    mask = [False] * (end - start)
    segment = align if retention is None else (retention or None)
    if segment is not None:
        per = segment // bs
        if need >= per:
            return None
        for i in range(start, end):
            if i % per >= per - need:
                mask[i - start] = True
    if retention is not None:
        for boundary in boundaries(r):
            stop = boundary // align * align // bs
            for j in range(max(start, stop - need), min(end, stop)):
                mask[j - start] = True
    return mask


def boundaries(r: RequestState) -> tuple[int, ...]:
    """Where a later request can resume this one's prompt: the replay boundary
    (one token short of the prompt) and a shared prefix's end, if found."""
    replay = r.num_prompt_tokens - 1
    if r.shared_prefix_boundary:
        return (replay, r.shared_prefix_boundary)
    return (replay,)
