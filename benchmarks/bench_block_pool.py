"""Block-pool operations per second: kvspec, a plain ``deque`` floor and vLLM, side by side.

    python benchmarks/bench_block_pool.py [--num-blocks N] [--blocks-per-request K]
                                          [--touch-blocks M] [--repeat R] [--vllm auto|off]

    # with vLLM's own BlockPool in the same process (no GPU needed):
    VLLM_TARGET_DEVICE=cpu /work/venv-vllm/bin/python benchmarks/bench_block_pool.py

Every operation runs over a whole pool of N blocks in requests of K blocks and is
reported in blocks (or lookups) per second, the median of ``--repeat`` runs. Runs
are interleaved: each round times every implementation once, in a rotating order,
so drift in the machine's speed hits them alike. The garbage collector is run
before and switched off during each timed run (as ``timeit`` does).

- allocate: K-block requests taken from a pool of never-cached blocks;
- free: the same requests freed, each in reverse (as the engine frees them);
- evict: allocating from a pool whose free blocks are all cached, so every block
  taken also drops its hash from the prefix cache;
- hash lookup: ``lookup(hash, [group])`` of cached blocks (all hits);
- cache hit on a free block: look a free cached block up and take it out of the
  middle of the free queue (``touch``), every other block of an M-block pool (the
  deque floor must ``deque.remove`` it, O(M), hence the smaller pool).

The floor keeps the bookkeeping a real pool needs — a free deque of ids, a
ref-count list, a hash per block and a hash -> block dict — with no groups, no
checks and no null block: about the fastest a Python pool can go.

vLLM's ``vllm.v1.core.block_pool.BlockPool`` (``get_new_blocks``, ``free_blocks``,
``get_cached_block``, ``touch``; prefix caching on, events and metrics off) runs the
same workload when ``vllm`` is importable; otherwise the comparison is skipped.
The goals are kvspec/vLLM >= 1.5 and kvspec/deque >= 0.5 for every operation.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parents[1]

OPERATIONS = ("allocate", "free", "evict", "hash lookup", "cache hit on a free block")
#: The operation timed on the smaller pool (the deque floor is O(N^2) there).
SMALL = "cache hit on a free block"
GOAL_VS_VLLM = 1.5
GOAL_VS_DEQUE = 0.5

Case = tuple[Callable[[], Any], Callable[[Any], int]]  # setup, run -> ops done


def block_hashes(num_blocks: int) -> list[bytes]:
    return [i.to_bytes(32, "big") for i in range(num_blocks)]


# -- kvspec ------------------------------------------------------------------


def kvspec_cases(num_blocks: int, k: int) -> dict[str, Case]:
    from kvspec.runtime.block_pool import BlockPool

    num_requests = (num_blocks - 1) // k
    n = num_requests * k
    hashes = block_hashes(num_blocks)

    def fresh() -> BlockPool:
        return BlockPool(num_blocks, hash_block_size=16)

    def allocate(pool: BlockPool) -> int:
        alloc = pool.allocate
        for _ in range(num_requests):
            alloc(k, 0)
        return n

    def held() -> tuple[BlockPool, list]:
        pool = fresh()
        return pool, [pool.allocate(k, 0) for _ in range(num_requests)]

    def free(state: tuple[BlockPool, list]) -> int:
        pool, reqs = state
        free_request = pool.free_request
        for blocks in reqs:
            free_request(blocks)
        return n

    def all_cached() -> BlockPool:
        pool, reqs = held()
        for r, blocks in enumerate(reqs):
            pool.cache_full_blocks(blocks, hashes[r * k : (r + 1) * k], 0, k, 0)
        for blocks in reqs:
            pool.free_request(blocks)
        return pool

    def lookup(pool: BlockPool) -> int:
        find, groups = pool.lookup, [0]
        for h in hashes[:n]:
            find(h, groups)
        return n

    def touch(pool: BlockPool) -> int:
        find, take, groups = pool.lookup, pool.touch, [0]
        for h in hashes[:n:2]:
            take(find(h, groups), 0)
        return len(hashes[:n:2])

    return {"allocate": (fresh, allocate), "free": (held, free), "evict": (all_cached, allocate),
            "hash lookup": (all_cached, lookup), SMALL: (all_cached, touch)}


# -- plain deque floor -----------------------------------------------------------


class DequePool:
    __slots__ = ("free", "ref", "block_hash", "cached")

    def __init__(self, num_blocks: int) -> None:
        self.free = deque(range(1, num_blocks))
        self.ref = [0] * num_blocks
        self.block_hash: list[bytes | None] = [None] * num_blocks
        self.cached: dict[bytes, int] = {}


def deque_cases(num_blocks: int, k: int) -> dict[str, Case]:
    from kvspec.runtime.hashing import make_block_hash_with_group_id

    num_requests = (num_blocks - 1) // k
    n = num_requests * k
    hashes = block_hashes(num_blocks)

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
        return n

    def held() -> tuple[DequePool, list]:
        pool = DequePool(num_blocks)
        popleft = pool.free.popleft
        reqs = []
        for _ in range(num_requests):
            got = [popleft() for _ in range(k)]
            for b in got:
                pool.ref[b] = 1
            reqs.append(got)
        return pool, reqs

    def free(state: tuple[DequePool, list]) -> int:
        pool, reqs = state
        append, ref = pool.free.append, pool.ref
        for blocks in reqs:
            for b in reversed(blocks):
                ref[b] -= 1
                if ref[b] == 0:
                    append(b)
        return n

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
        for h in hashes[:n]:
            get(make_block_hash_with_group_id(h, 0))
        return n

    def touch(pool: DequePool) -> int:
        remove, ref, get = pool.free.remove, pool.ref, pool.cached.get
        for h in hashes[:n:2]:
            b = get(make_block_hash_with_group_id(h, 0))
            if ref[b] == 0:
                remove(b)  # O(N) scan of the deque
            ref[b] += 1
        return len(hashes[:n:2])

    return {"allocate": (lambda: DequePool(num_blocks), allocate), "free": (held, free),
            "evict": (all_cached, allocate), "hash lookup": (all_cached, lookup),
            SMALL: (all_cached, touch)}


# -- vLLM ------------------------------------------------------------------------


def import_vllm_block_pool() -> tuple[type | None, str]:
    """vLLM's BlockPool class and its version, or ``None`` and why it is missing."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    try:
        module = importlib.import_module("vllm.v1.core.block_pool")
        version = importlib.import_module("vllm").__version__
    except Exception as err:  # noqa: BLE001 - any import failure means "skip"
        return None, f"{type(err).__name__}: {err}"
    return module.BlockPool, version


def vllm_cases(vllm_pool: type, num_blocks: int, k: int) -> dict[str, Case]:
    num_requests = (num_blocks - 1) // k
    n = num_requests * k
    hashes = block_hashes(num_blocks)

    def fresh() -> Any:
        return vllm_pool(num_blocks, enable_caching=True, hash_block_size=16)

    def allocate(pool: Any) -> int:
        get_new_blocks = pool.get_new_blocks
        for _ in range(num_requests):
            get_new_blocks(k)
        return n

    def held() -> tuple[Any, list]:
        pool = fresh()
        return pool, [pool.get_new_blocks(k) for _ in range(num_requests)]

    def free(state: tuple[Any, list]) -> int:
        pool, reqs = state
        free_blocks = pool.free_blocks
        for blocks in reqs:
            free_blocks(reversed(blocks))  # as SingleTypeKVCacheManager.free does
        return n

    def all_cached() -> Any:
        pool, reqs = held()
        for r, blocks in enumerate(reqs):
            request = SimpleNamespace(block_hashes=hashes[r * k : (r + 1) * k])
            pool.cache_full_blocks(request, blocks, 0, k, 16, 0)
        for blocks in reqs:
            pool.free_blocks(reversed(blocks))
        return pool

    def lookup(pool: Any) -> int:
        find, groups = pool.get_cached_block, [0]
        for h in hashes[:n]:
            find(h, groups)
        return n

    def touch(pool: Any) -> int:
        find, take, groups = pool.get_cached_block, pool.touch, [0]
        for h in hashes[:n:2]:
            take(find(h, groups))
        return len(hashes[:n:2])

    return {"allocate": (fresh, allocate), "free": (held, free), "evict": (all_cached, allocate),
            "hash lookup": (all_cached, lookup), SMALL: (all_cached, touch)}


# -- timing and report -------------------------------------------------------------


def time_once(case: Case) -> float:
    """Ops per second of one run of ``case`` (setup not timed, GC off while timed)."""
    setup, run = case
    gc.collect()
    state = setup()
    gc.disable()
    try:
        start = time.perf_counter()
        ops = run(state)
        elapsed = time.perf_counter() - start
    finally:
        gc.enable()
    return ops / elapsed


def measure(
    impls: dict[str, dict[str, dict[str, Case]]], repeat: int
) -> dict[str, dict[str, float]]:
    """Median ops/s per implementation and operation; rounds interleave the implementations.

    ``impls[name]`` maps ``"big"`` / ``"small"`` to that implementation's cases.
    """
    names = list(impls)
    rates: dict[str, dict[str, list[float]]] = {
        name: {op: [] for op in OPERATIONS} for name in names
    }
    for op in OPERATIONS:
        size = "small" if op == SMALL else "big"
        for round_ in range(repeat):
            shift = round_ % len(names)
            for name in names[shift:] + names[:shift]:
                rates[name][op].append(time_once(impls[name][size][op]))
    return {
        name: {op: statistics.median(r) for op, r in ops.items()} for name, ops in rates.items()
    }


def report(result: dict[str, dict[str, float]], vllm_note: str) -> None:
    has_vllm = "vllm" in result
    cols = f"{'operation':<26} {'kvspec ops/s':>13} {'deque ops/s':>13} {'kv/deque':>9}"
    if has_vllm:
        cols += f" {'vLLM ops/s':>13} {'kv/vLLM':>8}"
    print(cols)
    print("-" * len(cols))
    missed = []
    for op in OPERATIONS:
        ours, floor = result["kvspec"][op], result["deque"][op]
        line = f"{op:<26} {ours:>13,.0f} {floor:>13,.0f} {ours / floor:>8.2f}x"
        if ours / floor < GOAL_VS_DEQUE:
            missed.append(f"{op} vs deque")
        if has_vllm:
            theirs = result["vllm"][op]
            line += f" {theirs:>13,.0f} {ours / theirs:>7.2f}x"
            if ours / theirs < GOAL_VS_VLLM:
                missed.append(f"{op} vs vLLM")
        print(line)
    print(f"goals: kvspec/deque >= {GOAL_VS_DEQUE}, kvspec/vLLM >= {GOAL_VS_VLLM}; "
          + ("missed: " + ", ".join(missed) if missed else "all met"))
    print(vllm_note)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-blocks", type=int, default=100_001)
    parser.add_argument("--blocks-per-request", type=int, default=16)
    parser.add_argument("--touch-blocks", type=int, default=20_001,
                        help="pool size for the cache-hit case (the deque floor is O(N^2) there)")
    parser.add_argument("--repeat", type=int, default=7, help="runs per operation (median)")
    parser.add_argument("--vllm", choices=("auto", "off"), default="auto",
                        help="time vLLM's BlockPool too when it is importable (default)")
    parser.add_argument("--kvspec-path", type=Path, default=REPO,
                        help="the checkout to import kvspec from (to compare revisions)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(args.kvspec_path.resolve()))
    n, k, m = args.num_blocks, args.blocks_per_request, args.touch_blocks

    impls = {
        "kvspec": {"big": kvspec_cases(n, k), "small": kvspec_cases(m, k)},
        "deque": {"big": deque_cases(n, k), "small": deque_cases(m, k)},
    }
    vllm_pool, vllm_info = (None, "--vllm off") if args.vllm == "off" else import_vllm_block_pool()
    if vllm_pool is not None:
        impls["vllm"] = {"big": vllm_cases(vllm_pool, n, k), "small": vllm_cases(vllm_pool, m, k)}
        note = f"vLLM {vllm_info}: vllm.v1.core.block_pool.BlockPool, same workload, same process"
    else:
        note = f"vLLM comparison skipped ({vllm_info})"
    kvspec_file = Path(importlib.import_module("kvspec.runtime.block_pool").__file__ or "?")
    print(f"block pool: {n} blocks, {k} blocks per request ({m} for cache hits), median of "
          f"{args.repeat} interleaved runs; Python {sys.version.split()[0]}; kvspec from "
          f"{kvspec_file.parents[2]}")
    report(measure(impls, args.repeat), note)


if __name__ == "__main__":
    main()
