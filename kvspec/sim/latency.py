"""Latency and throughput of a timed run, and goodput at a service-level objective.

A run on a clock (:class:`~kvspec.sim.engine.Timeline`; under the constant model,
step ``k`` runs from ``k * step`` to ``(k + 1) * step``) gives every request:

* ``queue`` -- from its arrival to the start of the first step that runs it;
* ``ttft`` -- time to first token: to the end of the step that samples its first
  token;
* ``tpot`` -- time per output token: from its first token to its last, over the
  tokens after the first (none for a request of one token);
* ``e2e`` -- end-to-end: to the end of the step that samples its last token;

and every token after a request's first an inter-token latency (``itl``: the time
since that request's token before; pooled over all tokens, as ``vllm bench serve``
pools them). A run's throughput is its finished requests, and their output tokens,
over its duration: from the first arrival to the last token.

An SLO is a list of limits ``METRIC_pNN=TIME`` (``ttft_p99=2s,tpot_p50=50ms``), METRIC
one of :data:`SLO_METRICS`. A request *meets* the SLO when each of its metrics is
within its limit (a request of one token has no TPOT and meets any TPOT limit);
**goodput** is the requests meeting it per second of the run. A limit is *attained*
when the run's NN-th percentile of its metric is within it. Percentiles interpolate
linearly between the two nearest ranks (numpy's default, as ``vllm bench serve``).

>>> percentile([1.0, 2.0, 3.0, 4.0], 50)
2.5
>>> slo = parse_slo("ttft_p99=2s, tpot_p50=50ms")
>>> [(x.metric, x.percent, x.seconds) for x in slo]
[('ttft', 99.0, 2.0), ('tpot', 50.0, 0.05)]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvspec.model.slo import SLO_METRICS, Limit, parse_slo

__all__ = ["METRICS", "PERCENTILES", "SLO_METRICS", "Latency", "Limit", "latency_of",
           "parse_slo", "percentile", "weighted_percentile"]

#: Per-request metrics, in the order reports list them.
METRICS = ("queue", "ttft", "tpot", "itl", "e2e")
#: The percentiles reported.
PERCENTILES = (50.0, 90.0, 99.0)


def percentile(values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile of sorted ``values`` (linear between ranks)."""
    if not values:
        return math.nan
    h = (len(values) - 1) * p / 100
    low = math.floor(h)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (h - low)


def weighted_percentile(pairs: Sequence[tuple[float, int]], p: float) -> float:
    """:func:`percentile` of sorted (value, count) pairs, each value ``count`` times."""
    total = sum(c for _, c in pairs)
    if total == 0:
        return math.nan
    h = (total - 1) * p / 100
    low = math.floor(h)
    a = b = math.nan
    seen = 0
    for value, c in pairs:
        if seen <= low < seen + c:
            a = value
        if seen <= low + 1 < seen + c:
            b = value
            break
        seen += c
    if math.isnan(b):
        b = a
    return a + (b - a) * (h - low)


@dataclass(frozen=True)
class Latency:
    """A timed run's per-request times (s, in trace order of the requests run) and
    its duration."""

    arrival: tuple[float, ...]
    queue: tuple[float, ...]
    ttft: tuple[float, ...]
    #: None for a request of one output token.
    tpot: tuple[float | None, ...]
    e2e: tuple[float, ...]
    outputs: tuple[int, ...]
    #: Every inter-token gap (s) and how many tokens had it, sorted.
    itl: tuple[tuple[float, int], ...]
    duration: float
    #: Each step's start and end on the clock (s), in the order the steps ran.
    step_starts: tuple[float, ...] = ()
    step_ends: tuple[float, ...] = ()

    def values(self, metric: str) -> list[float]:
        if metric == "itl":
            raise ValueError("itl is weighted: use self.itl")
        return sorted(v for v in getattr(self, metric) if v is not None)

    def met(self, limits: Sequence[Limit]) -> int:
        """Requests whose every limited metric is within its limit."""
        columns = [(getattr(self, x.metric), x.seconds) for x in limits]
        good = 0
        for i in range(len(self.e2e)):
            for column, most in columns:
                v = column[i]
                if v is not None and v > most:
                    break
            else:
                good += 1
        return good

    def attains(self, limits: Sequence[Limit]) -> bool:
        """Whether every limit is attained: the run's percentile of its metric within it
        (a metric no request has, as TPOT of one-token requests, attains any)."""
        for x in limits:
            values = self.values(x.metric)
            if values and percentile(values, x.percent) > x.seconds:
                return False
        return True

    def as_dict(self, slo: Sequence[Limit] = ()) -> dict[str, Any]:
        """The run's figures: throughput, each metric's mean and percentiles (s), and
        with ``slo`` each limit's percentile and whether it is attained, and goodput."""
        d = self.duration
        out: dict[str, Any] = {
            "duration_s": _r(d),
            "requests_per_s": _r(len(self.e2e) / d) if d > 0 else None,
            "output_tokens_per_s": _r(sum(self.outputs) / d) if d > 0 else None,
        }
        for metric in METRICS:
            if metric == "itl":
                pairs = list(self.itl)
                n = sum(c for _, c in pairs)
                mean = math.fsum(v * c for v, c in pairs) / n if n else math.nan
                pcts = [weighted_percentile(pairs, p) for p in PERCENTILES]
            else:
                vals = self.values(metric)
                mean = math.fsum(vals) / len(vals) if vals else math.nan
                pcts = [percentile(vals, p) for p in PERCENTILES]
            out[f"{metric}_s"] = {"mean": _r(mean), **{
                f"p{p:g}": _r(v) for p, v in zip(PERCENTILES, pcts, strict=True)}}
        if slo:
            good = self.met(slo)
            out["slo"] = {
                "limits": [{"limit": x.key, "seconds": x.seconds,
                            "value": _r(percentile(self.values(x.metric), x.percent)),
                            "attained": percentile(self.values(x.metric), x.percent)
                            <= x.seconds if self.values(x.metric) else True}
                           for x in slo],
                "requests_meeting": good,
                "goodput_requests_per_s": _r(good / d) if d > 0 else None}
        return out


def _r(x: float) -> float | None:
    return None if math.isnan(x) else round(x, 6)


def latency_of(requests: Sequence[Any], arrivals: Sequence[float], starts: Sequence[float],
               ends: Sequence[float], next_tokens: Sequence[int],
               gaps: Sequence[tuple[int, int]]) -> Latency:
    """The times of ``requests`` (the scheduler's, with their step numbers, arrived at
    ``arrivals`` by index), steps starting and ending at ``starts``/``ends``;
    ``next_tokens`` and ``gaps``: the scheduler's inter-token record."""
    arrival, queue, ttft, tpot, e2e, outputs = [], [], [], [], [], []
    for r in requests:
        t = arrivals[r.index]
        first, last = ends[r.first_token], ends[r.done_step]
        arrival.append(t)
        queue.append(starts[r.first_step] - t)
        ttft.append(first - t)
        n = r.num_output_tokens
        tpot.append((last - first) / (n - 1) if n > 1 else None)
        e2e.append(last - t)
        outputs.append(n)
    counts: dict[float, int] = {}
    for j, c in enumerate(next_tokens):
        if c:
            gap = ends[j] - ends[j - 1]
            counts[gap] = counts.get(gap, 0) + c
    for before, j in gaps:
        gap = ends[j] - ends[before]
        counts[gap] = counts.get(gap, 0) + 1
    done = max((ends[r.done_step] for r in requests), default=0.0)
    duration = done - min(arrival, default=0.0)
    return Latency(tuple(arrival), tuple(queue), tuple(ttft), tuple(tpot), tuple(e2e),
                   tuple(outputs), tuple(sorted(counts.items())), duration, tuple(starts),
                   tuple(ends))
