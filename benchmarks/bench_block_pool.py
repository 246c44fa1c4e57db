"""Block-pool operations per second, against a plain ``collections.deque`` free list.

    python benchmarks/bench_block_pool.py [--num-blocks N] [--blocks-per-request K] [--repeat R]

Each operation runs over the whole pool and the best of ``--repeat`` runs is
reported, in blocks (or lookups) per second:

- allocate: requests of K blocks taken from a pool of never-cached blocks;
- free: the same requests freed, each in reverse (as the engine frees them);
- evict: allocating from a pool whose free blocks are all cached, so every
  block taken also drops its hash from the prefix cache;
- hash lookup: ``lookup(hash, [group])`` of cached blocks (all hits);
- cache hit on a free block: taking a free, cached block out of the middle of
  the free queue (``touch``); the deque baseline must ``deque.remove`` it, O(N).

The baseline keeps the same bookkeeping a real pool needs — a free deque of ids,
a ref-count list, a hash per block and a hash -> block dict — with no groups,
no checks and no null block: the floor a Python pool can reach.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvspec.runtime.block_pool import BlockPool  # noqa: E402
from kvspec.runtime.hashing import make_block_hash_with_group_id  # noqa: E402


def best_rate(run: Callable[[], int], setup: Callable[[], object], repeat: int) -> float:
    """Best ops/second over ``repeat`` runs; ``run`` returns how many ops it did."""
    best = 0.0
    for _ in range(repeat):
        state = setup()
        start = time.perf_counter()
        ops = run(state)  # type: ignore[call-arg]
        elapsed = time.perf_counter() - start
        best = max(best, ops / elapsed)
    return best


# -- kvspec ------------------------------------------------------------------


def kvspec_cases(num_blocks: int, k: int) -> dict[str, tuple[Callable, Callable]]:
    usable = num_blocks - 1
    num_requests = usable // k
    hashes = [i.to_bytes(32, "big") for i in range(num_blocks)]

    def fresh() -> BlockPool:
        return BlockPool(num_blocks, hash_block_size=16)

    def allocate(pool: BlockPool) -> int:
        alloc = pool.allocate
        for _ in range(num_requests):
            alloc(k, 0)
        return num_requests * k

    def held() -> tuple[BlockPool, list]:
        pool = fresh()
        return pool, [pool.allocate(k, 0) for _ in range(num_requests)]

    def free(state) -> int:
        pool, reqs = state
        free_request = pool.free_request
        for blocks in reqs:
            free_request(blocks)
        return num_requests * k

    def all_cached() -> BlockPool:
        pool, reqs = held()
        for r, blocks in enumerate(reqs):
            pool.cache_full_blocks(blocks, hashes[r * k : (r + 1) * k], 0, k, 0)
        for blocks in reqs:
            pool.free_request(blocks)
        return pool

    def evict(pool: BlockPool) -> int:
        return allocate(pool)

    def lookup(pool: BlockPool) -> int:
        find = pool.lookup
        groups = [0]
        for h in hashes[: num_requests * k]:
            find(h, groups)
        return num_requests * k

    def touch(pool: BlockPool) -> int:
        # Every other free block, from the middle of the queue outwards.
        touch_blocks = pool.touch
        n = 0
        for h in hashes[: num_requests * k : 2]:
            hit = pool.lookup(h, [0])
            touch_blocks(hit, 0)
            n += 1
        return n

    return {
        "allocate": (allocate, fresh),
        "free (request, reversed)": (free, held),
        "evict (allocate cached)": (evict, all_cached),
        "hash lookup": (lookup, all_cached),
        "cache hit on a free block": (touch, all_cached),
    }


# -- deque baseline ------------------------------------------------------------


class DequePool:
    __slots__ = ("free", "ref", "block_hash", "cached")

    def __init__(self, num_blocks: int) -> None:
        self.free = deque(range(1, num_blocks))
        self.ref = [0] * num_blocks
        self.block_hash: list[bytes | None] = [None] * num_blocks
        self.cached: dict[bytes, int] = {}


def deque_cases(num_blocks: int, k: int) -> dict[str, tuple[Callable, Callable]]:
    usable = num_blocks - 1
    num_requests = usable // k
    hashes = [i.to_bytes(32, "big") for i in range(num_blocks)]

    def fresh() -> DequePool:
        return DequePool(num_blocks)

    def allocate(pool: DequePool) -> int:
        popleft, ref, block_hash, cached = pool.free.popleft, pool.ref, pool.block_hash, pool.cached
        for _ in range(num_requests):
            got = [popleft() for _ in range(k)]
            for b in got:
                h = block_hash[b]
                if h is not None:
                    del cached[h]
                    block_hash[b] = None
                ref[b] = 1
        return num_requests * k

    def held() -> tuple[DequePool, list]:
        pool = fresh()
        popleft = pool.free.popleft
        reqs = []
        for _ in range(num_requests):
            got = [popleft() for _ in range(k)]
            for b in got:
                pool.ref[b] = 1
            reqs.append(got)
        return pool, reqs

    def free(state) -> int:
        pool, reqs = state
        append, ref = pool.free.append, pool.ref
        for blocks in reqs:
            for b in reversed(blocks):
                ref[b] -= 1
                if ref[b] == 0:
                    append(b)
        return num_requests * k

    def all_cached() -> DequePool:
        pool, reqs = held()
        for r, blocks in enumerate(reqs):
            for i, b in enumerate(blocks):
                key = make_block_hash_with_group_id(hashes[r * k + i], 0)
                pool.block_hash[b] = key
                pool.cached[key] = b
        free((pool, reqs))
        return pool

    def lookup(pool: DequePool) -> int:
        get = pool.cached.get
        for h in hashes[: num_requests * k]:
            get(make_block_hash_with_group_id(h, 0))
        return num_requests * k

    def touch(pool: DequePool) -> int:
        remove, ref, get = pool.free.remove, pool.ref, pool.cached.get
        n = 0
        for h in hashes[: num_requests * k : 2]:
            b = get(make_block_hash_with_group_id(h, 0))
            if ref[b] == 0:
                remove(b)  # O(N) scan of the deque
            ref[b] += 1
            n += 1
        return n

    return {
        "allocate": (allocate, fresh),
        "free (request, reversed)": (free, held),
        "evict (allocate cached)": (allocate, all_cached),
        "hash lookup": (lookup, all_cached),
        "cache hit on a free block": (touch, all_cached),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-blocks", type=int, default=100_001)
    parser.add_argument("--blocks-per-request", type=int, default=16)
    parser.add_argument("--touch-blocks", type=int, default=20_001,
                        help="pool size for the cache-hit case (the deque baseline is O(N^2) there)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)

    mine = kvspec_cases(args.num_blocks, args.blocks_per_request)
    base = deque_cases(args.num_blocks, args.blocks_per_request)
    small_mine = kvspec_cases(args.touch_blocks, args.blocks_per_request)
    small_base = deque_cases(args.touch_blocks, args.blocks_per_request)

    print(
        f"block pool: {args.num_blocks} blocks, {args.blocks_per_request} blocks per request, "
        f"best of {args.repeat} (cache hits: {args.touch_blocks} blocks); Python "
        f"{sys.version.split()[0]}"
    )
    header = f"{'operation':<28} {'kvspec ops/s':>14} {'deque ops/s':>14} {'kvspec/deque':>13}"
    print(header)
    print("-" * len(header))
    for name in mine:
        if name == "cache hit on a free block":
            ours = best_rate(*small_mine[name], args.repeat)
            theirs = best_rate(*small_base[name], args.repeat)
        else:
            ours = best_rate(*mine[name], args.repeat)
            theirs = best_rate(*base[name], args.repeat)
        print(f"{name:<28} {ours:>14,.0f} {theirs:>14,.0f} {ours / theirs:>12.2f}x")


if __name__ == "__main__":
    main()
