"""What a budget holds: a source is re-planned (its subject's ``resize``, so
``max_model_len: auto`` refits); an artifact is re-sized from its frozen body
(:func:`kvspec.artifact.sizing.capacity_for`, its ``max_model_len`` as compiled).

>>> from kvspec.reports.explain.subject import read_subject
>>> art = read_subject("layouts/llama-3.1-8b.kvlayout.json", replanned=False)
>>> c = capacity(art, 80 * 2**30)
>>> c.fits, c.num_blocks, c.kv_tokens, f"{c.max_concurrency:.2f}"
(True, 40960, 655360, '5.00')
>>> capacity(art, 2**30).fits
False
"""

from __future__ import annotations

from dataclasses import dataclass

from kvspec.artifact.sizing import capacity_for
from kvspec.errors import KvspecError
from kvspec.reports.explain.frozen import FrozenLayout
from kvspec.reports.explain.subject import Subject

__all__ = ["SWEEP_POINTS", "Capacity", "capacity", "min_memory", "sweep"]

#: Points of the capacity-against-memory sweep.
SWEEP_POINTS = 8


@dataclass(frozen=True)
class Capacity:
    """What a budget holds: blocks, KV tokens, concurrent full-length requests."""

    memory: int
    fits: bool
    num_blocks: int = 0
    kv_tokens: int = 0
    max_concurrency: float = 0.0
    max_model_len: int = 0
    reason: str | None = None


def capacity(subject: Subject, memory: int) -> Capacity:
    """Capacity of ``subject`` for ``memory`` bytes per rank.

    A source is re-planned (``max_model_len: auto`` refits); an artifact keeps
    its compiled ``max_model_len`` and is re-sized.
    """
    try:
        if subject.resize is not None:
            return Capacity(memory, True, *subject.resize(memory))
        n, requests = capacity_for(subject.body, memory, subject.pool)
    except KvspecError as err:
        return Capacity(memory, False, reason=err.message)
    length = subject.body.engine.max_model_len
    return Capacity(memory, True, n, int(requests * length) if requests != float("inf") else 0,
                    requests, length)


def min_memory(layout: FrozenLayout) -> int:
    """The smallest per-rank budget that serves one request at ``max_model_len``:
    the planner's fewest blocks, and a drafter's fixed pool, on the costliest stage."""
    return layout.min_memory


def sweep(subject: Subject, budget: int | None, points: int = SWEEP_POINTS
          ) -> tuple[Capacity, ...]:
    """Capacity at ``points`` budgets from the least that serves one request to
    4x the budget (16x the least when there is no budget)."""
    lo = min_memory(subject.view)
    hi = 4 * budget if budget else 16 * lo
    if hi <= lo:
        hi = 2 * lo
    step = (hi - lo) / (points - 1)
    return tuple(capacity(subject, int(lo + i * step)) for i in range(points))
