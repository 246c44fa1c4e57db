"""What a simulation measures: per-step records, utilisation, the summary.

*Utilisation* is the bytes that hold what running requests need, over the
pools' bytes: per attention group, the tokens its attention still reads
(every computed token for full attention; the last ``sliding_window`` for a
sliding window; the current chunk for chunked local attention) times the
group's bytes per token without padding; per state group, one state per
request. Cached blocks nobody runs with, padding, blocks held past a window
and the null block count as not used.

>>> from kvspec.runtime.manager import ManagedGroup, ManagedLayout, ManagedPool
>>> layout = ManagedLayout("x", (ManagedGroup("g", kind="sliding", block_size=4, pool="p",
...                             sliding_window=8, useful_bytes_per_block=400),),
...                        (ManagedPool("p", 11, hash_block_size=4, bytes_per_block=500),),
...                        scheduler_block_size=4, max_model_len=64)
>>> live = LiveBytes(layout)
>>> live.utilization(live.of(20, 20))    # 8 tokens of 100 bytes in the window, of 5500
0.14545454545454545
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kvspec.runtime.manager import ManagedLayout

__all__ = ["REASONS", "SUMMARY_KEYS", "Limits", "LiveBytes", "SimResult", "StepRecord",
           "waiting_reason"]

#: The summary's keys, in order.
SUMMARY_KEYS = ("steps", "mean_running", "peak_running", "preemptions", "hit_tokens",
                "mean_utilization", "peak_utilization", "utilization_while_waiting",
                "waiting_steps_by_reason", "utilization_while_memory_bound")

#: Why requests wait in a step: the limit that stopped admission (``waiting_reason``).
REASONS = ("memory", "max_num_seqs", "max_num_batched_tokens")


class StepRecord(NamedTuple):
    """One engine step, as the scheduler left it (after ``schedule()``)."""

    step: int
    running: int
    waiting: int
    #: Free blocks per pool (cached blocks nobody holds count as free).
    free: tuple[int, ...]
    scheduled_tokens: int
    preempted: int
    utilization: float


class Limits(NamedTuple):
    """The engine's limits a step's admission stops at (besides memory)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    #: Tokens a prefill chunk of a Mamba ``align`` layout ends on (0: no such layout).
    align: int = 0


def waiting_reason(record: StepRecord, limits: Limits) -> str | None:
    """Why requests wait after ``record``'s step (one of :data:`REASONS`), None when
    none waits; decided as vLLM's ``Scheduler.schedule()`` stops admitting:

    * a running request was preempted (its blocks did not fit): waiting requests
      are not looked at -- ``memory``;
    * the step's token budget is spent -- ``max_num_batched_tokens`` (also when
      what is left is less than one aligned chunk of a Mamba ``align`` layout, which
      ends a chunk only on a block boundary);
    * ``max_num_seqs`` requests run -- ``max_num_seqs``;
    * otherwise the next request's prompt (after its prefix-cache hit) does not fit
      the free blocks -- ``memory`` (so do preempted requests whose outputs are
      still in flight: they wait because they were preempted).

    >>> limits = Limits(max_num_seqs=4, max_num_batched_tokens=64)
    >>> [waiting_reason(StepRecord(0, r, 1, (9,), t, 0, 0.5), limits)
    ...  for r, t in ((2, 64), (4, 10), (2, 10))]
    ['max_num_batched_tokens', 'max_num_seqs', 'memory']
    """
    if not record.waiting:
        return None
    if record.preempted:
        return "memory"
    left = limits.max_num_batched_tokens - record.scheduled_tokens
    if left <= 0:
        return "max_num_batched_tokens"
    if record.running >= limits.max_num_seqs:
        return "max_num_seqs"
    if left < limits.align:
        return "max_num_batched_tokens"
    return "memory"


class LiveBytes:
    """Bytes a running request needs, by its computed and prompt tokens, in units of
    1 / ``scale`` byte (integers: sums are exact in any order)."""

    def __init__(self, layout: ManagedLayout) -> None:
        scale = math.lcm(*(g.block_size for g in layout.groups)) if layout.groups else 1
        self.scale = scale
        self.full = self.state = 0
        self.windows: list[tuple[int, int]] = []
        self.chunks: list[tuple[int, int]] = []
        self.rswa: list[tuple[int, int]] = []
        for g in layout.groups:
            per_token = g.useful_bytes_per_block * (scale // g.block_size)
            if g.kind == "full":
                self.full += per_token
            elif g.kind == "state":
                self.state += g.useful_bytes_per_block * scale
            elif g.kind in ("sliding", "ring"):
                self.windows.append((g.sliding_window or g.block_size, per_token))
            elif g.kind == "local":
                self.chunks.append((g.attention_chunk_size or 1, per_token))
            elif g.kind == "rswa":
                self.rswa.append((g.rswa_window or 0, per_token))
        self.pool_bytes = sum(p.num_blocks * p.bytes_per_block for p in layout.pools)

    def of(self, computed: int, prompt: int) -> int:
        if computed <= 0:
            return 0
        live = self.full * computed + self.state
        for window, per_token in self.windows:
            live += per_token * min(window, computed)
        for chunk, per_token in self.chunks:
            live += per_token * (computed - (computed - 1) // chunk * chunk)
        for window, per_token in self.rswa:
            live += per_token * (min(computed, prompt) + min(max(computed - prompt, 0), window))
        return live

    def utilization(self, live: int) -> float:
        """``live`` (from :meth:`of`) over the pools' bytes."""
        return live / (self.scale * self.pool_bytes) if self.pool_bytes else 0.0


@dataclass(frozen=True)
class SimResult:
    """A simulation's per-step records (``steps``) and totals; :meth:`as_dict` is the
    summary."""

    layout: str
    #: Engine steps to finish the trace (the summary's ``steps``).
    num_steps: int
    #: One record per scheduled step.
    steps: tuple[StepRecord, ...] = field(repr=False)
    preemptions: int
    hit_tokens: int
    num_requests: int
    #: Requests whose prompt does not fit ``max_model_len`` (vLLM refuses them).
    rejected: int = 0
    #: Sampled steps where memory keeps requests waiting (kvspec's simulator, with
    #: ``sample_held``): what running requests hold, for :meth:`held_while_memory_bound`.
    samples: tuple[Any, ...] = field(default=(), repr=False)
    #: LiveBytes' unit (1 / scale byte) and the pools' bytes.
    scale: int = 1
    pool_bytes: int = 0
    #: The limits a step's admission stops at (for ``waiting_steps_by_reason``).
    limits: Limits | None = None
    #: Every request's times, when the run timed them
    #: (:class:`kvspec.sim.latency.Latency`; ``simulate(latency=True)`` or a timed model).
    latency: Any = field(default=None, repr=False)

    def held_while_memory_bound(self) -> tuple[float, float, tuple[float, ...], float] | None:
        """Averaged over the sampled steps where memory keeps requests waiting: running
        requests, the bytes they need (live tokens and states), the blocks they hold per
        group, and the tokens they hold; None when memory never did."""
        s = self.samples
        if not s:
            return None
        n = len(s)
        groups = len(s[0].held)
        return (sum(x.running for x in s) / n, sum(x.live for x in s) / n / self.scale,
                tuple(sum(x.held[g] for x in s) / n for g in range(groups)),
                sum(x.tokens for x in s) / n)

    def as_dict(self) -> dict[str, Any]:
        """The summary (:data:`SUMMARY_KEYS`). ``utilization_while_waiting``:
        utilisation averaged over every step where a request waits, whatever it waits
        for (None when none ever waited); ``waiting_steps_by_reason``: those steps by
        the limit that kept requests waiting (:func:`waiting_reason`);
        ``utilization_while_memory_bound``: utilisation averaged over the steps where
        memory is that limit (None when it never is)."""
        records = self.steps
        running = [r.running for r in records]
        used = [r.utilization for r in records]
        waited = [r.utilization for r in records if r.waiting]
        by_reason = dict.fromkeys(REASONS, 0)
        bound: list[float] = []
        if self.limits is not None:
            limits = self.limits
            for r in records:
                if r.waiting:
                    why = waiting_reason(r, limits)
                    by_reason[why] += 1  # type: ignore[index]
                    if why == "memory":
                        bound.append(r.utilization)
        return {
            "steps": self.num_steps,
            "mean_running": _round(sum(running) / len(running)) if running else 0.0,
            "peak_running": max(running, default=0),
            "preemptions": self.preemptions,
            "hit_tokens": self.hit_tokens,
            "mean_utilization": _round(math.fsum(used) / len(used)) if used else 0.0,
            "peak_utilization": _round(max(used, default=0.0)),
            "utilization_while_waiting": _round(math.fsum(waited) / len(waited))
            if waited else None,
            "waiting_steps_by_reason": by_reason if self.limits is not None else None,
            "utilization_while_memory_bound": _round(math.fsum(bound) / len(bound))
            if bound else None,
        }


def _round(x: float) -> float:
    return round(x, 6)
