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

This module declares pooling once, as :mod:`kvspec.model.engine` declares the
engine settings: its enumerations are the ``Literal`` types below, and each field
of :class:`Workload` and :class:`Pooling` carries its default and the line that
describes it (:func:`declared`). The source schema (:mod:`kvspec.source.schema`)
and the artifact's pooling record (:mod:`kvspec.artifact.format`) take them from
here.

>>> Workload(context=Lengths(2048), output=Lengths(256)).held_tokens
2176
>>> Pooling().policy, Pooling().serve_with
('unified', 'vllm')
>>> declared(Workload, "prefix_tokens").default
512
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

from kvspec.model.slo import Limit
from kvspec.model.steptime import LinearStepTime
from kvspec.model.workloads import DEFAULT_STEP_MS, TraceFormat

__all__ = ["ONE_SHARED_POOL", "SERVE_SEPARATE", "Lengths", "PlanPolicy", "Policy",
           "Pooling", "PoolingRef", "ProfileRef", "Runtime", "TimeUnit", "Workload",
           "declared"]

#: The pooling policy a source asks for, in documentation order.
Policy = Literal["unified", "separate", "auto"]
#: The policy a plan is made by (``auto`` chooses one of them).
PlanPolicy = Literal["unified", "separate"]
#: The runtimes a plan can be served by: ``vllm`` (0.33, one shared pool, through
#: kvspec's plugin) or ``kvspec`` (kvspec's own runtime: several pools).
Runtime = Literal["vllm", "kvspec"]
#: The unit of a ``lengths`` trace's times.
TimeUnit = Literal["s", "ms"]
#: Why vLLM 0.33 cannot hold a plan of several pools (``engine-args``, the plugin's
#: guard and the exporters of caches vLLM holds all say it in these words).
ONE_SHARED_POOL = ("vLLM 0.33 keeps every group in one shared pool with one page size, so "
                   "it cannot hold them")
#: What serves a separate-pool plan instead of vLLM 0.33.
SERVE_SEPARATE = ("serve it with SGLang (`kvspec engine-args ARTIFACT --engine sglang`) or "
                  "with kvspec's own runtime (pooling.serve_with: kvspec); to serve it with "
                  "vLLM, recompile with pooling.policy: unified, or policy: auto with "
                  "serve_with: vllm (the plans vLLM's one pool can hold)")


def _key(default: Any, doc: str | None = None) -> Any:
    """A field, with the line that describes it in the source schema."""
    return dataclasses.field(default=default, metadata={"doc": doc})


def declared(cls: type, name: str) -> dataclasses.Field[Any]:
    """The field ``name`` of ``cls`` (:class:`Workload`, :class:`Pooling`): its
    ``default``, and its doc line in ``metadata["doc"]``."""
    return next(f for f in dataclasses.fields(cls) if f.name == name)


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
    concurrency: int | None = _key(
        None, "Requests running at once (default: engine.max_num_seqs).")
    #: Held by each decoding request.
    draft_tokens: int = _key(0, "Speculative tokens per step.")
    prefix_sharing: float = _key(0.0, "Share of requests opening with a shared prefix.")
    prefix_tokens: int = _key(512, "Tokens of the shared prefix.")
    requests: int = _key(500, "Requests in the synthetic trace drawn from the summary.")
    seed: int = _key(0, "Seed of that synthetic trace.")
    #: Its path from the working directory (the source gives it from its own).
    trace: str | None = _key(None, "A request trace: kvspec's JSONL, or an Azure, Mooncake, "
                             "BurstGPT or lengths file (docs/traces.md).")
    #: The trace file's sha256, so the artifact records what it was chosen for.
    trace_sha256: str | None = None
    trace_format: TraceFormat | None = _key(  # noqa: RUF009 - _key returns a dataclasses.field
        None, "The trace's format (default: from its extension and first line).")
    #: A ``lengths`` file's columns: prompt, output, time or None, time unit.
    columns: tuple[str, str, str | None, TimeUnit] | None = _key(
        None, "format lengths: its columns.")
    step_ms: float = _key(DEFAULT_STEP_MS, "Milliseconds one engine step stands for: "
                          "arrival times become steps (a trace's times, a preset's rate).")
    #: One of :data:`kvspec.model.workloads.PRESETS`.
    preset: str | None = _key(None, "A workload preset fitted to a published trace "
                              "(docs/pooling.md#workload-presets): its lengths and bursty "
                              "arrivals.")

    @property
    def held_tokens(self) -> int:
        """Tokens a running request holds, on average: its prompt, half its output
        (it grows from the one to the other), and the draft tokens."""
        return round(self.context.expected + self.output.expected / 2 + self.draft_tokens)


@dataclass(frozen=True, slots=True)
class ProfileRef:
    """The step-time profile ``auto`` judges by (``pooling.step_time.profile``): its
    path (from the working directory), its file's sha256, and its linear model's
    coefficients (seconds: fixed, then one per term) and measured range."""

    path: str
    sha256: str
    coefficients: tuple[float, float, float, float, float]
    bounds: tuple[tuple[int, int], ...] | None = None

    def step_time(self) -> LinearStepTime:
        """A fresh model (it notes the first batch outside the measured range)."""
        return LinearStepTime(*self.coefficients, bounds=self.bounds)


@dataclass(frozen=True, slots=True)
class Pooling:
    """The source's ``pooling`` section."""

    policy: Policy = _key("unified")  # noqa: RUF009 - _key returns a dataclasses.field
    serve_with: Runtime = _key(  # noqa: RUF009 - _key returns a dataclasses.field
        "vllm", "The runtime that holds the memory: vllm (one shared pool, through "
        "kvspec's plugin) or kvspec (several pools).")
    workload: Workload | None = _key(None)  # noqa: RUF009 - _key returns a dataclasses.field
    #: Shares by pool name.
    split: tuple[tuple[str, Fraction], ...] | None = _key(
        None, "separate: each pool's share of the budget, summing to 1.")
    max_groups: int | None = _key(None, "auto: at most this many groups.")
    state_block_size: int | None = _key(
        None, "separate: tokens per state block (default: the engine's).")
    block_size: int = _key(16, "separate: tokens per attention block.")
    #: Candidate block sizes ``auto`` tries for vLLM-servable plans.
    block_sizes: tuple[int, ...] = (16, 32, 64, 128)
    #: ``auto``: the SLO its candidates are judged by (goodput), in the source's order.
    slo: tuple[Limit, ...] = ()
    #: ``auto``: the step-time profile its candidates are timed on.
    profile: ProfileRef | None = None

    @property
    def judged_by(self) -> str:
        """What ``auto`` keeps the most of: ``goodput`` at the SLO, ``throughput``
        (requests/s) on the profile's clock, else ``mean_running`` (no time model to
        judge by: docs/pooling.md#auto-in-time)."""
        return "goodput" if self.slo else "throughput" if self.profile else "mean_running"
