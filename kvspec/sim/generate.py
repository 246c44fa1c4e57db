"""Synthetic request traces, seeded: the same arguments give the same trace.

Prompt and output lengths are lognormal with the given mean (in tokens) and
spread (the standard deviation of their logarithm: 0 gives every request the
mean); arrivals are all at step 0, or ``rate`` requests per step: a Poisson
process, or with ``arrival_cv`` (the inter-arrival times' coefficient of
variation) other than 1, Gamma inter-arrival times of that variation (bursty
above 1, :func:`gap`). With ``prefix_groups``, a ``prefix_share`` of the requests open with
one of that many shared prefixes (a system prompt of ``prefix_tokens`` tokens,
capped by the prompt).

>>> trace = generate_trace(3, seed=1, prompt_mean=100, output_mean=10, rate=0.5)
>>> [(r.arrival, r.prompt_tokens, r.output_tokens) for r in trace]
[(0, 58, 8), (3, 147, 7), (3, 158, 8)]
>>> generate_trace(3, seed=1, prompt_mean=100, output_mean=10, rate=0.5) == trace
True
"""

from __future__ import annotations

import math
import random

from kvspec.sim.trace import MAX_ARRIVAL, MAX_TOKENS, TraceError, TraceRequest

__all__ = ["gap", "generate_trace"]


def generate_trace(num_requests: int, *, seed: int = 0, prompt_mean: float = 1024,
                   prompt_spread: float = 0.5, output_mean: float = 256,
                   output_spread: float = 0.5, rate: float | None = None,
                   max_prompt_tokens: int | None = None, prefix_groups: int = 0,
                   prefix_share: float = 0.0, prefix_tokens: int = 512,
                   arrival_cv: float = 1.0) -> tuple[TraceRequest, ...]:
    """A trace of ``num_requests`` requests (see the module docstring)."""
    _check(num_requests, prompt_mean, output_mean, prompt_spread, output_spread, rate,
           prefix_groups, prefix_share)
    if not (arrival_cv > 0 and math.isfinite(arrival_cv)):
        raise TraceError(f"cannot generate a trace: arrival_cv {arrival_cv} (more than 0)",
                         hint="1 is a Poisson process; above 1, bursty arrivals")
    rng = random.Random(seed)
    time = 0.0
    out = []
    for _ in range(num_requests):
        if rate is not None:
            time += gap(rng, rate, arrival_cv)
        prompt = _length(rng, prompt_mean, prompt_spread)
        if max_prompt_tokens is not None:
            prompt = min(prompt, max_prompt_tokens)
        output = _length(rng, output_mean, output_spread)
        prefix: int | None = None
        shared = 0
        if prefix_groups and rng.random() < prefix_share:
            prefix = rng.randrange(prefix_groups)
            shared = min(prefix_tokens, prompt)
        out.append(TraceRequest(min(int(time), MAX_ARRIVAL), prompt, output, prefix, shared))
    return tuple(out)


def gap(rng: random.Random, rate: float, cv: float = 1.0) -> float:
    """One inter-arrival time of ``rate`` arrivals per unit: exponential (``cv`` 1,
    a Poisson process), else Gamma of shape ``1 / cv**2`` and mean ``1 / rate``.

    >>> rng = random.Random(0)
    >>> round(sum(gap(rng, 2.0, 1.5) for _ in range(100_000)) / 100_000, 2)
    0.5
    """
    if cv == 1.0:
        return rng.expovariate(rate)
    shape = 1 / (cv * cv)
    return rng.gammavariate(shape, 1 / (rate * shape))


def _length(rng: random.Random, mean: float, spread: float) -> int:
    if spread == 0:
        return min(max(1, round(mean)), MAX_TOKENS)
    mu = math.log(mean) - spread * spread / 2  # the lognormal's mean is then ``mean``
    return min(max(1, round(rng.lognormvariate(mu, spread))), MAX_TOKENS)


def _check(num: int, prompt_mean: float, output_mean: float, prompt_spread: float,
           output_spread: float, rate: float | None, groups: int, share: float) -> None:
    problems = []
    numbers = {"prompt_mean": prompt_mean, "output_mean": output_mean,
               "prompt_spread": prompt_spread, "output_spread": output_spread, "rate": rate,
               "prefix_share": share}
    bad = [f"{k} {v}" for k, v in numbers.items() if v is not None and not math.isfinite(v)]
    if bad:  # nan compares to nothing: checked first, by name
        raise TraceError("cannot generate a trace: not finite: " + ", ".join(bad),
                         hint="give finite numbers")
    if num < 1:
        problems.append(f"num_requests {num} (1 or more)")
    if not (1 <= prompt_mean <= MAX_TOKENS and 1 <= output_mean <= MAX_TOKENS):
        problems.append(f"means {prompt_mean}, {output_mean} (1 to 2^31 tokens)")
    if not (0 <= prompt_spread <= 4 and 0 <= output_spread <= 4):
        problems.append("a spread outside 0 to 4")
    if rate is not None and rate <= 0:
        problems.append(f"rate {rate} (more than 0 requests per step)")
    if groups < 0 or not 0 <= share <= 1:
        problems.append(f"prefix_groups {groups}, prefix_share {share}")
    if problems:
        raise TraceError("cannot generate a trace: " + "; ".join(problems),
                         hint="give positive counts and means, spreads of 0 or more, a share "
                         "from 0 to 1")
