"""Workload presets: request traces drawn to match published LLM-serving traces.

A preset carries the numbers it was fitted to (:attr:`Preset.stated`), where they
come from and how it was fitted (docs/pooling.md#workload-presets):

* prompt and output lengths: the published trace's lengths as 200 bins of equal
  probability (:mod:`kvspec.sim.preset_tables`); a draw picks a bin uniformly and a
  length uniformly in it, so the draws have the trace's mean and, at the bins'
  edges, its quantiles (``mooncake-toolagent``, whose per-request file we could not
  read, borrows the conversation trace's shape, scaled to its published means);
* prefix blocks (``mooncake-conversation``): Mooncake-style content blocks drawn
  after the trace's structure (:func:`chains`);
* arrivals: the trace's mean rate (requests per second), with Gamma inter-arrival
  times of the trace's coefficient of variation (:func:`kvspec.sim.generate.gap`),
  turned into engine steps by a declared step time
  (:data:`~kvspec.sim.formats.DEFAULT_STEP_MS`).

>>> trace = preset_trace("azure-code-2023", 3, seed=1)
>>> [(r.arrival, r.prompt_tokens, r.output_tokens) for r in trace]
[(0, 2817, 13), (0, 130, 36), (0, 1252, 9)]
>>> try:
...     preset_named("azure-conversation")
... except TraceError as err:
...     print(err.hint)
did you mean 'azure-conversation-2023'?
"""

from __future__ import annotations

import difflib
import random
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from kvspec.model.preset_tables import TABLES
from kvspec.model.workloads import DEFAULT_STEP_MS, PRESETS, Preset
from kvspec.sim.generate import gap
from kvspec.sim.trace import TraceError, TraceRequest

__all__ = ["PRESETS", "Draws", "Preset", "chains", "draw", "preset_named", "preset_trace"]


def preset_named(name: str) -> Preset:
    """The preset called ``name``; a :class:`TraceError` with a did-you-mean if none is."""
    try:
        return PRESETS[name]
    except KeyError:
        close = difflib.get_close_matches(name, PRESETS, n=1, cutoff=0.5)
        raise TraceError(f"unknown workload preset {name!r}", expected=", ".join(PRESETS),
                         hint=f"did you mean {close[0]!r}?" if close else
                         "docs/pooling.md#workload-presets lists them") from None


@dataclass(frozen=True, slots=True)
class Draws:
    """``n`` requests drawn from a preset: inter-arrival times (s) and lengths."""

    gaps: tuple[float, ...]
    prompts: tuple[int, ...]
    outputs: tuple[int, ...]


def draw(preset: Preset, n: int, seed: int = 0) -> Draws:
    """``n`` requests' inter-arrival times and lengths, seeded."""
    rng = random.Random(seed)
    prompts_t = TABLES[(preset.table, "prompt")]
    outputs_t = TABLES[(preset.table, "output")]
    gaps, prompts, outputs = [], [], []
    for _ in range(n):
        gaps.append(gap(rng, preset.rate, preset.arrival_cv))
        prompts.append(_length(rng, prompts_t, preset.prompt_scale))
        outputs.append(_length(rng, outputs_t, preset.output_scale))
    return Draws(tuple(gaps), tuple(prompts), tuple(outputs))


def _length(rng: random.Random, table: tuple[tuple[float, float], ...], scale: float) -> int:
    low, high = table[int(rng.random() * len(table))]
    return max(1, round((low + (high - low) * rng.random()) * scale))


def chains(preset: Preset, prompts: Iterable[int], seed: int = 0) -> Iterator[tuple[int, ...]]:
    """Each prompt's content blocks (ids, one per ``preset.block_tokens`` tokens), drawn
    as :attr:`Preset.continuation` says: block 0 is everyone's; a continuing request
    opens with the full blocks of one of the ``lookback`` requests before it (of
    ``candidates`` drawn uniformly, the one it holds most of), fresh ids after. Ids
    are numbered in order, so an id is one seen before exactly when it is below the
    request's first fresh one."""
    rng = random.Random(seed + 0x5EED)  # a stream of its own: the lengths keep theirs
    size = preset.block_tokens
    recent: deque[tuple[tuple[int, ...], int]] = deque(maxlen=max(preset.lookback, 1))
    fresh = 1
    for prompt in prompts:
        n = -(-prompt // size)
        shared: tuple[int, ...] = (0,)
        if recent and rng.random() < preset.continuation:
            best, k = shared, 1
            for _ in range(preset.candidates):
                blocks, tokens = recent[-1 - int(rng.random() * len(recent))]
                if min(tokens // size, n - 1) > k:
                    best, k = blocks, min(tokens // size, n - 1)
            shared = best[:k]
        own = tuple(range(fresh, fresh + n - len(shared)))
        fresh += len(own)
        blocks = shared + own
        recent.append((blocks, prompt))
        yield blocks


def preset_trace(name: str, num_requests: int, *, seed: int = 0,
                 step_ms: float = DEFAULT_STEP_MS, max_prompt_tokens: int | None = None
                 ) -> tuple[TraceRequest, ...]:
    """A trace of ``num_requests`` requests drawn from preset ``name``: the first
    arrives at step 0, the rest at their drawn times over ``step_ms`` per step;
    prompts capped at ``max_prompt_tokens``."""
    preset = preset_named(name)
    if num_requests < 1:
        raise TraceError(f"cannot draw {num_requests} requests", hint="draw 1 or more")
    d = draw(preset, num_requests, seed)
    step_s = step_ms / 1000
    prompts = d.prompts if max_prompt_tokens is None else tuple(
        min(p, max_prompt_tokens) for p in d.prompts)
    blocks = chains(preset, prompts, seed) if preset.continuation else None
    out = []
    t = 0.0
    for i in range(num_requests):
        if i:
            t += d.gaps[i]
        if blocks is None:
            out.append(TraceRequest(int(t / step_s), prompts[i], d.outputs[i]))
        else:
            out.append(TraceRequest(int(t / step_s), prompts[i], d.outputs[i], None, 0,
                                    next(blocks), preset.block_tokens))
    return tuple(out)
