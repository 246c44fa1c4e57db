"""How long an engine step takes: a closed form of the step's batch (docs/latency.md).

A step's batch is summed into four terms while it is built (never searched):

* ``prefill_tokens`` -- tokens of the requests scheduled more than one token (prefill
  chunks: their linear layers run on every token);
* ``decode_requests`` -- requests scheduled one token (decodes, and a one-token chunk,
  which costs what a decode costs);
* ``context_tokens`` -- over every scheduled request, the tokens its attention reads
  after the step (computed before it, prefix-cache hits included, plus the step's):
  the KV cache a step streams from memory;
* ``prefill_pairs`` -- over the requests scheduled more than one token, the
  query-key pairs of the chunk's causal attention, ``n * c + n * (n + 1) / 2`` for
  ``n`` tokens after ``c`` computed: prefill attention's quadratic compute.

:class:`ConstantStepTime` is the step clock's convention (every step ``step_ms``,
whatever it runs); :class:`LinearStepTime` a fixed cost plus a cost per unit of
each term, fitted to a profile's measurements (:mod:`kvspec.model.steptime_fit`).
A step that schedules no token runs no forward pass: it takes no time.

>>> model = LinearStepTime(0.004, 2e-5, 1e-4, 1e-8, 1e-10)
>>> round(model.seconds(0, 32, 32 * 1000, 0) * 1000, 3)   # 32 decodes at 1,000 tokens
7.52
>>> round(model.seconds(512, 0, 512, 512 * 513 // 2) * 1000, 3)   # one 512-token prefill
14.258
>>> ConstantStepTime(20).seconds(512, 0, 512, 0)
0.02
"""

from __future__ import annotations

import math
import re
from typing import Protocol

__all__ = ["TERMS", "UNITS", "ConstantStepTime", "LinearStepTime", "StepTime", "duration",
           "shape_of", "shown_duration"]

#: Units a duration is written in (``2s``, ``50ms``, ``1.5ns``), in seconds.
UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9, "ps": 1e-12}
_DURATION = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?)\s*(s|ms|us|ns|ps)\s*")

#: The terms of a step's batch, in the order :meth:`StepTime.seconds` takes them.
TERMS = ("prefill_tokens", "decode_requests", "context_tokens", "prefill_pairs")


class StepTime(Protocol):
    """A step-time model: seconds for one step's batch, from its four sums (:data:`TERMS`)."""

    #: True when every step takes the same time (the simulator keeps its step clock).
    constant: bool

    def seconds(self, prefill_tokens: int, decode_requests: int, context_tokens: int,
                prefill_pairs: int) -> float: ...


class ConstantStepTime:
    """Every step ``step_ms`` milliseconds: the step clock (``--step-ms``)."""

    constant = True

    def __init__(self, step_ms: float) -> None:
        self.step_ms = step_ms
        self.step_s = step_ms / 1000

    def seconds(self, prefill_tokens: int, decode_requests: int, context_tokens: int,
                prefill_pairs: int) -> float:
        return self.step_s

    def __repr__(self) -> str:
        return f"ConstantStepTime({self.step_ms:g} ms)"


class LinearStepTime:
    """``fixed`` plus a cost per unit of each term (seconds); ``bounds``: each term's
    measured range (min, max) -- a batch outside it is recorded once in
    :attr:`outside` (the caller warns)."""

    constant = False

    def __init__(self, fixed: float, prefill_token: float, decode_request: float,
                 context_token: float, prefill_pair: float,
                 bounds: tuple[tuple[int, int], ...] | None = None) -> None:
        self.fixed = fixed
        self.prefill_token = prefill_token
        self.decode_request = decode_request
        self.context_token = context_token
        self.prefill_pair = prefill_pair
        self.bounds = bounds
        #: The first term found outside ``bounds``: (term, value, (min, max)); None yet.
        self.outside: tuple[str, int, tuple[int, int]] | None = None

    @property
    def coefficients(self) -> tuple[float, float, float, float, float]:
        """(fixed, then one per term of :data:`TERMS`)."""
        return (self.fixed, self.prefill_token, self.decode_request, self.context_token,
                self.prefill_pair)

    def seconds(self, prefill_tokens: int, decode_requests: int, context_tokens: int,
                prefill_pairs: int) -> float:
        if prefill_tokens == 0 and decode_requests == 0:
            return 0.0  # nothing scheduled: the engine runs no forward pass
        if self.bounds is not None and self.outside is None:
            self._check(prefill_tokens, decode_requests, context_tokens, prefill_pairs)
        return (self.fixed + self.prefill_token * prefill_tokens
                + self.decode_request * decode_requests + self.context_token * context_tokens
                + self.prefill_pair * prefill_pairs)

    def _check(self, *values: int) -> None:
        assert self.bounds is not None
        for name, value, (low, high) in zip(TERMS, values, self.bounds, strict=True):
            if value < low or value > high:
                self.outside = (name, value, (low, high))
                return

    def __repr__(self) -> str:
        return "LinearStepTime(" + ", ".join(f"{c:.4g}" for c in self.coefficients) + ")"


def shape_of(chunks: list[tuple[int, int]]) -> tuple[int, int, int, int]:
    """The four terms of a batch given as (tokens scheduled, tokens computed before)
    per request.

    >>> shape_of([(1, 99), (1, 9), (100, 0)])
    (100, 2, 210, 5050)
    """
    prefill = decode = context = pairs = 0
    for n, c in chunks:
        context += c + n
        if n == 1:
            decode += 1
        else:
            prefill += n
            pairs += n * c + n * (n + 1) // 2
    return prefill, decode, context, pairs


def duration(text: str) -> float | None:
    """Seconds of a duration written with its unit (:data:`UNITS`), None if it is not one.

    >>> duration("50ms"), duration("1.5 us"), duration("2")
    (0.05, 1.5e-06, None)
    """
    m = _DURATION.fullmatch(text)
    if m is None:
        return None
    seconds = float(m.group(1)) * UNITS[m.group(2)]
    return seconds if math.isfinite(seconds) else None


def shown_duration(seconds: float) -> str:
    """``seconds`` in the largest unit that keeps it 1 or more, 4 significant digits.

    >>> shown_duration(0.0061), shown_duration(1.25e-8), shown_duration(0.0)
    ('6.1ms', '12.5ns', '0s')
    """
    if seconds == 0:
        return "0s"
    for unit, scale in UNITS.items():
        if abs(seconds) >= scale or unit == "ps":
            return f"{seconds / scale:.4g}{unit}"
    raise AssertionError("unreachable")
