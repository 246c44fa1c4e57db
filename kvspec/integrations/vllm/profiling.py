"""``kvspec profile``'s engine-independent half: the grid of batch shapes it drives, the
step-time terms of a step vLLM scheduled, and the fit of the measured steps
(docs/latency.md#profiling-your-engine). Needs no vLLM: the engine-side driver
(:mod:`kvspec.integrations.vllm.profile_engine`) runs the grid in vLLM's process.

The grid is a list of :class:`Scenario`\\ s. Each runs in phases: a phase adds its
requests (each at a step of the phase, its prompt made of named segments of fresh
token ids, so a segment repeated across phases is a prefix-cache hit and nothing else
is), and the engine steps until they finish. Every step the engine runs is measured,
whatever its batch turned out to be: a step's terms are read from what vLLM scheduled
(:func:`step_terms`), summed exactly as kvspec's simulator sums them
(:func:`kvspec.model.steptime.shape_of`), so a chunked or preempted scenario is a
sample of another shape, never a wrong one.

>>> g = grid("quick", Limits(max_model_len=1024, max_num_batched_tokens=4096,
...                          max_num_seqs=256, block_size=128, capacity_tokens=524288))
>>> sorted({s.kind for s in g})
['decode', 'mixed', 'prefill']
>>> [s.name for s in g if s.kind == "prefill"][:3]
['prefill 16 at 0', 'prefill 16 at 256', 'prefill 16 at 512']
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kvspec.model.steptime import TERMS, LinearStepTime, shape_of
from kvspec.model.steptime_fit import Fit, Sample, nnls

__all__ = ["GRIDS", "Limits", "Phase", "Request", "Scenario", "Trimmed", "fit_steps",
           "grid", "step_terms"]

#: The grids ``--grid`` names, and what each measures (docs/latency.md's table).
GRIDS: dict[str, dict[str, Any]] = {
    "quick": {"prefill_tokens": (16, 64, 256, 768), "contexts": (0, 0.25, 0.5),
              "prefill_batch": (4,), "decode_batch": (1, 4, 16, 64),
              "decode_contexts": (32, 0.5), "decode_steps": 8,
              "mixed_decodes": (4, 32), "mixed_prefill": (64, 512), "repeats": 2},
    "full": {"prefill_tokens": (16, 32, 64, 128, 256, 512, 1024, 2048, 4096),
             "contexts": (0, 0.125, 0.25, 0.5, 0.75), "prefill_batch": (2, 4, 8),
             "decode_batch": (1, 2, 4, 8, 16, 32, 64, 128, 256),
             "decode_contexts": (32, 0.25, 0.5, 0.75), "decode_steps": 16,
             "mixed_decodes": (4, 16, 64), "mixed_prefill": (32, 128, 512, 2048),
             "repeats": 3},
}
#: Decode steps between the prefills a mixed scenario adds.
MIXED_EVERY = 3


@dataclass(frozen=True)
class Limits:
    """What bounds a batch on the engine: the artifact's settings and its KV capacity."""

    max_model_len: int
    max_num_batched_tokens: int
    max_num_seqs: int
    block_size: int
    #: Tokens the KV cache holds (num_blocks x block size of the artifact's budget).
    capacity_tokens: int


@dataclass(frozen=True)
class Request:
    """A request a phase adds at its step ``at``: a prompt of ``segments`` (name,
    tokens) and ``max_tokens`` generated."""

    at: int
    segments: tuple[tuple[str, int], ...]
    max_tokens: int

    @property
    def prompt_tokens(self) -> int:
        return sum(n for _, n in self.segments)


@dataclass(frozen=True)
class Phase:
    requests: tuple[Request, ...]


@dataclass(frozen=True)
class Scenario:
    """One cell of the grid: its kind (prefill, decode, mixed), a name, its phases."""

    kind: str
    name: str
    phases: tuple[Phase, ...] = field(default=())

    @property
    def requests(self) -> int:
        return sum(len(p.requests) for p in self.phases)


def _context(value: float, limits: Limits) -> int:
    """A context length of the grid: tokens, or a fraction of max_model_len rounded
    down to whole blocks (a prefix-cache hit is whole blocks)."""
    if isinstance(value, int):
        return value
    tokens = int(value * limits.max_model_len)
    return tokens - tokens % limits.block_size


def _prefill(p: int, c: int, k: int, tag: str) -> Scenario:
    """``k`` chunks of ``p`` tokens after ``c`` cached: a phase caching the context
    (one request of ``c`` tokens), then the ``k`` requests sharing it."""
    phases = []
    if c:
        phases.append(Phase((Request(0, ((f"{tag}/ctx", c),), 1),)))
    phases.append(Phase(tuple(Request(0, ((f"{tag}/ctx", c), (f"{tag}/new{i}", p))
                                      if c else ((f"{tag}/new{i}", p),), 1)
                              for i in range(k))))
    name = f"prefill {p} at {c}" if k == 1 else f"prefill {k}x{p} at {c}"
    return Scenario("prefill", name, tuple(phases))


def grid(name: str, limits: Limits) -> list[Scenario]:
    """The scenarios of grid ``name`` (:data:`GRIDS`) that fit ``limits``: a prompt
    and its output within max_model_len, a step's tokens within the batched tokens,
    requests within max_num_seqs and, together, within the KV capacity."""
    g = GRIDS[name]
    room = limits.max_model_len - 1
    out: list[Scenario] = []
    contexts = sorted({_context(c, limits) for c in g["contexts"]})
    for p in g["prefill_tokens"]:
        for c in contexts:
            if c + p <= room and p <= limits.max_num_batched_tokens:
                out.append(_prefill(p, c, 1, f"p{p}c{c}"))
    for k in g["prefill_batch"]:
        for p in g["prefill_tokens"]:
            if 4 * p <= room and k * p <= limits.max_num_batched_tokens \
                    and k <= limits.max_num_seqs:
                out.append(_prefill(p, 0, k, f"p{k}x{p}"))
    steps = g["decode_steps"]
    for d in g["decode_batch"]:
        for c in sorted({max(_context(c, limits), 2) for c in g["decode_contexts"]}):
            if d <= limits.max_num_seqs and c + steps <= room and \
                    d * (c + steps) <= limits.capacity_tokens:
                reqs = tuple(Request(0, ((f"d{d}c{c}/{i}", c),), steps) for i in range(d))
                out.append(Scenario("decode", f"decode {d} at {c}", (Phase(reqs),)))
    c = _context(0.25, limits) or 32
    for d in g["mixed_decodes"]:
        for p in g["mixed_prefill"]:
            n = 3
            length = MIXED_EVERY * (n + 1)
            if d + n > limits.max_num_seqs or c + length > room or p > room or \
                    p > limits.max_num_batched_tokens or \
                    d * (c + length) + n * p > limits.capacity_tokens:
                continue
            mixed = [Request(0, ((f"m{d}x{p}/{i}", c),), length) for i in range(d)]
            mixed += [Request(2 + MIXED_EVERY * j, ((f"m{d}x{p}/new{j}", p),), 1)
                      for j in range(n)]
            out.append(Scenario("mixed", f"{d} decodes + prefill {p} at {c}",
                                (Phase(tuple(mixed)),)))
    return out


# ---------------------------------------------------------------------------
# a step's terms
# ---------------------------------------------------------------------------

def step_terms(output: Any) -> tuple[int, int, int, int]:
    """The four terms (:data:`~kvspec.model.steptime.TERMS`) of a step vLLM scheduled:
    each request's tokens this step (``num_scheduled_tokens``) and the tokens it had
    computed before (``num_computed_tokens`` of ``scheduled_new_reqs`` and
    ``scheduled_cached_reqs``, prefix-cache hits included), summed by
    :func:`~kvspec.model.steptime.shape_of`, as the simulator sums its own steps."""
    before = {r.req_id: r.num_computed_tokens for r in output.scheduled_new_reqs}
    cached = output.scheduled_cached_reqs
    before.update(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
    return shape_of([(n, before[rid]) for rid, n in output.num_scheduled_tokens.items()])


# ---------------------------------------------------------------------------
# the fit
# ---------------------------------------------------------------------------

#: A shape is left out of the fit when it took over this many times the median absolute
#: relative residual longer than the model predicts (and over :data:`SLOWER` of the
#: prediction; always when over :data:`INTERRUPTED`): a step the machine interrupted
#: (another process on its cores, a page fault), not the batch's cost.
TRIM = 6.0
SLOWER = 0.25
INTERRUPTED = 1.0
#: Rounds of fitting and leaving out (each round judges every shape again).
ROUNDS = 8


@dataclass(frozen=True)
class Trimmed:
    """The fit of the kept shapes, the shapes left out as interrupted, and the steps
    measured in all."""

    fit: Fit
    kept: tuple[Sample, ...]
    dropped: tuple[Sample, ...]
    steps: int

    @property
    def max_relative(self) -> float:
        return max(abs(r) / s[4] for r, s in zip(self.fit.residuals, self.kept, strict=True)
                   if s[4] > 0)

    @property
    def measured(self) -> list[float]:
        return [s[4] for s in self.kept]


def fastest(samples: Iterable[Sample]) -> list[Sample]:
    """Each batch shape once, at its fastest over the repeats (a repeated shape's
    slower runs are the machine's interruptions), in the order first measured; steps
    that scheduled no token left out."""
    best: dict[tuple[int, int, int, int], float] = {}
    for s in samples:
        if s[0] or s[1]:
            key = (int(s[0]), int(s[1]), int(s[2]), int(s[3]))
            best[key] = min(best.get(key, s[4]), s[4])
    return [(*k, v) for k, v in best.items()]


def fit_relative(samples: Sequence[Sample]) -> Fit:
    """The non-negative linear model of ``samples`` that minimises the squared
    *relative* errors (each row divided by its measured seconds): a 3 ms decode step
    weighs as much as a 300 ms prefill, as each does in a request's latency; the
    absolute fit (:func:`kvspec.model.steptime_fit.fit_linear`) lets the long steps
    decide the fixed cost."""
    if len(samples) < len(TERMS) + 1:
        raise ValueError(f"{len(samples)} samples fit no model of {len(TERMS) + 1} "
                         "coefficients")
    rows = [[1.0 / s[4], *(float(x) / s[4] for x in s[:4])] for s in samples]
    fixed, prefill, decode, context, pairs = nnls(rows, [1.0] * len(samples))
    bounds = tuple((min(int(s[k]) for s in samples), max(int(s[k]) for s in samples))
                   for k in range(len(TERMS)))
    model = LinearStepTime(fixed, prefill, decode, context, pairs, bounds=bounds)
    residuals = tuple(s[4] - model.seconds(*(int(v) for v in s[:4])) for s in samples)
    return Fit(model, bounds, residuals, len(samples))


def fit_steps(samples: Iterable[Sample]) -> Trimmed:
    """The step-time model of measured steps: each shape at its fastest
    (:func:`fastest`), fitted on relative error (:func:`fit_relative`), then again
    without the shapes far slower than the fit predicts (:data:`TRIM` times the median
    relative residual and :data:`SLOWER`, or twice the prediction), until no shape changes
    side."""
    steps = list(samples)
    points = [p for p in fastest(steps) if p[4] > 0]
    kept = points
    fit = fit_relative(kept)
    for _ in range(ROUNDS):
        model = fit.model
        over = [p[4] / model.seconds(*p[:4]) - 1 for p in points]
        spread = statistics.median(abs(r) for r, p in zip(over, points, strict=True)
                                   if p in kept)
        limit = min(max(TRIM * spread, SLOWER), INTERRUPTED)
        now = [p for p, r in zip(points, over, strict=True) if r <= limit]
        if now == kept or len(now) < len(TERMS) + 1:
            break
        kept = now
        fit = fit_relative(kept)
    dropped = tuple(p for p in points if p not in kept)
    # the range measured is every shape's, those left out included
    bounds = tuple((min(int(p[k]) for p in points), max(int(p[k]) for p in points))
                   for k in range(len(TERMS)))
    model = LinearStepTime(*fit.model.coefficients, bounds=bounds)
    fit = replace(fit, model=model, bounds=bounds)
    return Trimmed(fit, tuple(kept), dropped, len(steps))
