"""A service-level objective: limits on per-request latencies (docs/latency.md).

One rule reads a limit wherever it is written: ``METRIC_pNN=TIME`` on the command
line (``--slo ttft_p99=2s,tpot_p50=50ms``, :func:`parse_slo`) and ``METRIC_pNN: TIME``
in a source (``pooling.slo: {ttft_p99: 2s}``, :func:`parse_limit` per entry, its
problem placed at the key or the value). METRIC is one of :data:`SLO_METRICS`, NN a
percentile above 0 and at most 100, TIME a duration with its unit.

>>> [(x.metric, x.percent, x.seconds) for x in parse_slo("ttft_p99=2s, tpot_p50=50ms")]
[('ttft', 99.0, 2.0), ('tpot', 50.0, 0.05)]
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvspec.errors import UsageError
from kvspec.model.steptime import duration

__all__ = ["SLO_METRICS", "BadLimit", "Limit", "parse_limit", "parse_slo", "twice"]

#: The metrics an SLO may limit (per request: ITL is per token).
SLO_METRICS = ("queue", "ttft", "tpot", "e2e")

_LIMIT = re.compile(r"([a-z0-9]+)_p([0-9]+(?:\.[0-9]+)?)\s*=\s*(.*)")


@dataclass(frozen=True, slots=True)
class Limit:
    """One SLO limit: ``metric``'s ``percent``-th percentile within ``seconds``."""

    metric: str
    percent: float
    seconds: float
    text: str

    @property
    def key(self) -> str:
        return self.text.split("=")[0].strip()


class BadLimit(ValueError):
    """A limit that does not read: what, a hint, and where in its text (``offset``;
    ``in_value``: in the time, not the key)."""

    def __init__(self, what: str, hint: str, offset: int = 0, in_value: bool = False) -> None:
        super().__init__(what)
        self.what, self.hint, self.offset, self.in_value = what, hint, offset, in_value


def parse_limit(item: str) -> Limit:
    """The limit ``METRIC_pNN=TIME`` (stripped); :class:`BadLimit` if it is not one."""
    if not item:
        raise BadLimit("an empty limit", "write METRIC_pNN=TIME, e.g. ttft_p99=2s")
    m = _LIMIT.fullmatch(item)
    if m is None:
        raise BadLimit(f"cannot read {item!r}",
                       "write METRIC_pNN=TIME, e.g. ttft_p99=2s or tpot_p50=50ms")
    metric, pct, value = m.group(1), float(m.group(2)), m.group(3)
    if metric not in SLO_METRICS:
        raise BadLimit(f"unknown metric {metric!r}",
                       f"limit one of {', '.join(SLO_METRICS)} (per request)")
    if not 0 < pct <= 100:
        raise BadLimit(f"percentile p{m.group(2)}",
                       "a percentile is more than 0 and at most 100, e.g. p50, p99",
                       len(metric) + 2)
    seconds = duration(value)
    if seconds is None or seconds <= 0:
        raise BadLimit(f"cannot read the time {value!r}",
                       "a time is a number and its unit: 2s, 50ms, 800us",
                       item.index("=") + 1, in_value=True)
    return Limit(metric, pct, seconds, item)


def twice(limits: list[Limit], new: Limit) -> str | None:
    """The message when ``new`` limits a percentile ``limits`` already limit."""
    if any(x.metric == new.metric and x.percent == new.percent for x in limits):
        return f"{new.key} is limited twice"
    return None


def parse_slo(text: str, option: str = "--slo") -> tuple[Limit, ...]:
    """The limits of ``METRIC_pNN=TIME,...``; a :class:`UsageError` naming ``option``
    and the column of the first problem."""
    limits: list[Limit] = []
    column = 1
    for part in text.split(","):
        at = column + len(part) - len(part.lstrip())
        column += len(part) + 1
        try:
            limit = parse_limit(part.strip())
        except BadLimit as bad:
            raise _bad(option, text, at + bad.offset, bad.what, bad.hint) from None
        again = twice(limits, limit)
        if again is not None:
            raise _bad(option, text, at, again, "give each limit once")
        limits.append(limit)
    return tuple(limits)


def _bad(option: str, text: str, column: int, what: str, hint: str) -> UsageError:
    return UsageError(f"{option}: {what} (column {column})", found=text, hint=hint)
