"""The longest request that fits: the largest ``max_model_len`` (up to the
engine's) whose one request takes at most a given number of blocks, found by
binary search. A rule over groups that tell their blocks per request, read alike
by the planner's groups and an artifact's frozen ones.

>>> longest_fitting(100, lambda n: n <= 42)
42
>>> longest_fitting(100, lambda n: False)
0
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Protocol

from kvspec.model.engine import Engine

__all__ = ["Requesting", "longest_fitting", "longest_request"]


class Requesting(Protocol):
    """A group as the rule reads it: the blocks one request at an engine takes."""

    def blocks_per_request(self, engine: Engine) -> int: ...


def longest_fitting(longest: int, fits: Callable[[int], bool]) -> int:
    """The largest length in ``1..longest`` that ``fits`` (monotone), or 0."""
    if fits(longest):  # the common case: the configured length fits
        return longest
    if not fits(1):
        return 0
    lo, hi, best = 1, longest, 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if fits(mid):
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


def longest_request(engine: Engine, groups: Sequence[Requesting], limit: int) -> int:
    """The longest ``max_model_len`` whose request over ``groups`` takes at most
    ``limit`` blocks; 0 when not even one token fits."""
    def fits(length: int) -> bool:
        at = engine if length == engine.max_model_len else \
            dataclasses.replace(engine, max_model_len=length)
        return sum(g.blocks_per_request(at) for g in groups) <= limit

    return longest_fitting(engine.max_model_len, fits)
