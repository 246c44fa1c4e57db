"""Pooling policy: how memory is pooled, and the workload it is chosen for.

* ``unified`` -- one pool and one page size for every group: vLLM's plan, byte for
  byte (the default);
* ``separate`` -- one pool per class of layers (full attention, each sliding
  window, state layers...), each at its native page and block size, the budget
  split between them by their demand at the declared workload;
* ``auto`` -- every candidate the chosen runtime (``serve_with``) can serve,
  simulated at the workload; the one with the highest capacity wins.

The workload is what the pools must serve: a request trace (JSONL), or its
summary (context and output lengths, concurrency, draft tokens, prefix
sharing), from which a seeded synthetic trace is drawn.

>>> Workload(context=Lengths(2048), output=Lengths(256)).held_tokens
2176
>>> Pooling().policy, Pooling().serve_with
('unified', 'vllm')
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from kvspec.model.workloads import DEFAULT_STEP_MS

__all__ = ["ONE_SHARED_POOL", "POLICIES", "RUNTIMES", "SERVE_SEPARATE", "Lengths", "Pooling",
           "PoolingRef", "Workload"]

#: Pooling policies, in documentation order.
POLICIES = ("unified", "separate", "auto")
#: The runtimes a plan can be served by: ``vllm`` (0.33, one shared pool, through
#: kvspec's plugin) or ``kvspec`` (kvspec's own runtime: several pools).
RUNTIMES = ("vllm", "kvspec")
#: Why vLLM 0.33 cannot hold a plan of several pools (``engine-args``, the plugin's
#: guard and the exporters of caches vLLM holds all say it in these words).
ONE_SHARED_POOL = ("vLLM 0.33 keeps every group in one shared pool with one page size, so "
                   "it cannot hold them")
#: What serves a separate-pool plan instead of vLLM 0.33.
SERVE_SEPARATE = ("serve it with SGLang (`kvspec engine-args ARTIFACT --engine sglang`) or "
                  "with kvspec's own runtime (pooling.serve_with: kvspec); to serve it with "
                  "vLLM, recompile with pooling.policy: unified, or policy: auto with "
                  "serve_with: vllm (the plans vLLM's one pool can hold)")


@dataclass(frozen=True, slots=True)
class PoolingRef:
    """What an error is about: a key of the source's ``pooling`` section."""

    path: tuple[str, ...] = ("pooling",)

    def shown(self) -> str:
        return ".".join(self.path)


@dataclass(frozen=True, slots=True)
class Lengths:
    """Token counts of requests: lognormal with this ``mean`` and ``spread`` (the
    standard deviation of their logarithm; 0: every request the mean), or a
    ``histogram`` of ``(tokens, weight)`` bins."""

    mean: int
    spread: float = 0.5
    histogram: tuple[tuple[int, float], ...] | None = None

    @property
    def expected(self) -> float:
        """The mean length (of the histogram when there is one)."""
        if self.histogram:
            total = sum(w for _, w in self.histogram)
            return sum(t * w for t, w in self.histogram) / total
        return float(self.mean)


@dataclass(frozen=True, slots=True)
class Workload:
    """The traffic a plan must serve."""

    context: Lengths
    output: Lengths
    #: Requests running at once (None: the engine's max_num_seqs).
    concurrency: int | None = None
    #: Speculative tokens each decoding request holds per step.
    draft_tokens: int = 0
    #: The share of requests that open with a shared prefix (a system prompt).
    prefix_sharing: float = 0.0
    #: Tokens of that shared prefix.
    prefix_tokens: int = 512
    #: Requests in the synthetic trace drawn from this summary, and its seed.
    requests: int = 500
    seed: int = 0
    #: A JSONL request trace (its path as the source gives it), used instead.
    trace: str | None = None
    #: The trace file's sha256, so the artifact records what it was chosen for.
    trace_sha256: str | None = None
    #: The trace's format (None: from its extension and first line), a ``lengths``
    #: file's columns (prompt, output, time or None, time unit).
    trace_format: str | None = None
    columns: tuple[str, str, str | None, str] | None = None
    #: Milliseconds one engine step stands for (arrival times become steps).
    step_ms: float = DEFAULT_STEP_MS
    #: A workload preset (kvspec.model.workloads.PRESETS) drawn instead of a summary.
    preset: str | None = None

    @property
    def held_tokens(self) -> int:
        """Tokens a running request holds, on average: its prompt, half its output
        (it grows from the one to the other), and the draft tokens."""
        return round(self.context.expected + self.output.expected / 2 + self.draft_tokens)


@dataclass(frozen=True, slots=True)
class Pooling:
    """The source's ``pooling`` section."""

    policy: str = "unified"
    serve_with: str = "vllm"
    workload: Workload | None = None
    #: Manual shares of the budget by pool name (``separate``), summing to 1.
    split: tuple[tuple[str, Fraction], ...] | None = None
    #: The most groups a candidate may have (``auto``).
    max_groups: int | None = None
    #: Tokens per state block of state pools (``separate``; default: the engine's).
    state_block_size: int | None = None
    #: Tokens per block of attention pools (``separate``; default 16).
    block_size: int = 16
    #: Candidate block sizes ``auto`` tries for vLLM-servable plans.
    block_sizes: tuple[int, ...] = field(default=(16, 32, 64, 128))
