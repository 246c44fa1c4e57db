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

__all__ = ["SUMMARY_KEYS", "LiveBytes", "SimResult", "StepRecord"]

#: The summary's keys, in order.
SUMMARY_KEYS = ("steps", "mean_running", "peak_running", "preemptions", "hit_tokens",
                "mean_utilization", "peak_utilization", "utilization_while_waiting")


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
    #: Sampled steps where requests wait (kvspec's simulator): what running requests
    #: hold, for :meth:`held_while_waiting`.
    samples: tuple[Any, ...] = field(default=(), repr=False)
    #: LiveBytes' unit (1 / scale byte) and the pools' bytes.
    scale: int = 1
    pool_bytes: int = 0

    def held_while_waiting(self) -> tuple[float, float, tuple[float, ...], float] | None:
        """Averaged over the sampled steps where requests wait: running requests, the
        bytes they need (live tokens and states), the blocks they hold per group, and
        the tokens they hold; None when no request waited."""
        s = self.samples
        if not s:
            return None
        n = len(s)
        groups = len(s[0].held)
        return (sum(x.running for x in s) / n, sum(x.live for x in s) / n / self.scale,
                tuple(sum(x.held[g] for x in s) / n for g in range(groups)),
                sum(x.tokens for x in s) / n)

    def as_dict(self) -> dict[str, Any]:
        """The summary (:data:`SUMMARY_KEYS`); ``utilization_while_waiting`` is None
        when no request ever waited."""
        records = self.steps
        running = [r.running for r in records]
        used = [r.utilization for r in records]
        waited = [r.utilization for r in records if r.waiting]
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
        }


def _round(x: float) -> float:
    return round(x, 6)
