# one idea: the simulate command; its options all shape one run (the layout, the
# trace or fixed-length workload, the clock, the SLO) and its outputs report that run
"""``kvspec simulate LAYOUT --workload TRACE``: a request trace replayed through a
layout's pools (docs/simulate.md), and with ``--against vllm`` through vLLM 0.33's
own scheduler beside it."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from kvspec.artifact import Artifact
from kvspec.cli.common import (
    USAGE,
    check_output,
    echo_json,
    format_option,
    note,
    parents_option,
    parse_bytes,
    progress,
    quiet_option,
    stdin_once,
)
from kvspec.cli.common import command as cli_command
from kvspec.cli.trace_import import columns_of, step_options
from kvspec.errors import EXIT_INVALID, EXIT_OK, EXIT_USAGE, KvspecError, UsageError
from kvspec.files import emit, shown
from kvspec.interrupts import deferred
from kvspec.model.steptime import TERMS, ConstantStepTime
from kvspec.reports.format import count
from kvspec.reports.simulate import cap_note, latency_table, simulate_table
from kvspec.runtime.manager import from_artifact
from kvspec.sim import MAX_BLOCKS, TraceRequest, engine_settings, simulate
from kvspec.sim.formats import FORMATS, read_requests
from kvspec.sim.latency import parse_slo
from kvspec.sim.trace import MAX_TOKENS

#: Traces this long show a progress bar (on a terminal).
BAR_FROM = 2000
#: Most closed-loop clients (``--concurrency``) and most requests of a fixed-length
#: workload (``-n``): a typo's 10^12 is refused at its option, not run out of memory.
MAX_CLIENTS = MAX_FIXED_REQUESTS = 10_000_000
#: Requests of a fixed-length workload without ``-n`` (``vllm bench serve``'s default).
FIXED_REQUESTS = 1000


@dataclass(frozen=True, slots=True)
class Target:
    """What is simulated: the artifact, its pools' names and each one's block count
    (None: its own)."""

    artifact: Artifact
    pools: tuple[str, ...]
    counts: dict[str, int] | None
    source_trace: tuple[Any, ...] | None


def _ours(text: str) -> bool:
    return text.lstrip().startswith("{") and '"mean_running"' in text[:4096]


@cli_command("simulate", short_help="Replay a request trace through a layout's pools.")
@click.argument("layout", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--workload", "trace_path", type=click.Path(dir_okay=False, path_type=Path),
              help="The request trace: kvspec's JSONL (`kvspec trace` makes one), or an "
                   "Azure, Mooncake, BurstGPT or lengths file (docs/traces.md). "
                   "Default: the source's pooling.workload.")
@click.option("--workload-format", type=click.Choice(list(FORMATS)),
              help="The trace's format (docs/traces.md). Default: from its extension "
                   "and first line.")
@step_options
@click.option("--memory", "--kv-cache-memory-bytes", "memory",
              help="Memory per rank (40GiB). Default: the layout's own budget.")
@click.option("--num-blocks", "--num-gpu-blocks-override", "num_blocks",
              type=click.IntRange(min=2, max=MAX_BLOCKS),
              help="Blocks of the pool (one-pool layouts), at most 2^20.")
@click.option("--against", type=click.Choice(["vllm"]),
              help="Replay the trace through vLLM 0.33.0's own Scheduler and KVCacheManager "
                   "too, and print both (needs kvspec[vllm]).")
@click.option("--max-num-seqs", type=click.IntRange(min=1),
              help="Requests running at once (default: the layout's engine.max_num_seqs).")
@click.option("--profile", "profile_path", type=click.Path(dir_okay=False, path_type=Path),
              help="A step-time profile (docs/latency.md): each step takes what it gives "
                   "for the step's batch, arrivals are seconds, and every request is timed.")
@click.option("--slo", metavar="LIMITS",
              help="Limits per request, METRIC_pNN=TIME,... (ttft_p99=2s,tpot_p50=50ms; "
                   "metrics queue, ttft, tpot, e2e): prints latency and goodput, on the "
                   "profile's clock or, without one, --step-ms a step.")
@click.option("--concurrency", type=click.IntRange(min=1, max=MAX_CLIENTS), metavar="N",
              help="Closed-loop clients, as `vllm bench serve --max-concurrency N`: at most "
                   "N requests in flight, the next sent (in trace order) when one finishes; "
                   "timed on the profile's clock or --step-ms a step, each request from "
                   "when it is sent.")
@click.option("--isl", type=click.IntRange(min=1, max=MAX_TOKENS), metavar="TOKENS",
              help="A fixed-length workload instead of a trace: every prompt TOKENS tokens "
                   "(with --osl and -n), every request arriving at once.")
@click.option("--osl", type=click.IntRange(min=1, max=MAX_TOKENS), metavar="TOKENS",
              help="The fixed-length workload's output tokens per request.")
@click.option("-n", "--num-requests", "num_requests",
              type=click.IntRange(min=1, max=MAX_FIXED_REQUESTS), metavar="COUNT",
              help=f"The fixed-length workload's requests (default {FIXED_REQUESTS:,}).")
@format_option("text", "json", help="text: a table; json: the summary's keys per side.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the result here instead of stdout.")
@click.option("--force", is_flag=True, help="Replace an existing file that is not this "
              "command's output.")
@parents_option
@quiet_option
def command(layout: Path, trace_path: Path | None, workload_format: str | None, step_ms: float,
            columns: str | None, time_unit: str, block_tokens: int,
            memory: str | None, num_blocks: int | None,
            against: str | None, max_num_seqs: int | None, profile_path: Path | None,
            slo: str | None, concurrency: int | None, isl: int | None, osl: int | None,
            num_requests: int | None, fmt: str, output: Path | None, force: bool,
            parents: bool, quiet: bool) -> int:
    """Replay a request trace through LAYOUT (a source or a .kvlayout.json artifact):
    its pools, kvspec's request-level manager, and a model of vLLM v1's continuous
    batching. Prints steps to finish, mean and peak running requests, preemptions,
    prefix-cache hit tokens and utilisation (the bytes holding live tokens and
    states over the pools' bytes). --against vllm runs vLLM's own scheduler on the
    same trace and prints its figures beside kvspec's."""
    check_output(output, suffixes=(".json", ".txt"), force=force, parents=parents,
                 inputs=tuple(p for p in (layout, trace_path) if p is not None), ours=_ours)
    stdin_once(tuple(p for p in (layout, trace_path) if p is not None))
    if num_blocks is not None and memory is not None:
        raise UsageError("--memory and --num-blocks exclude each other",
                         hint="a fixed block count decides the memory, and the other way")
    fixed = _fixed_lengths(isl, osl, num_requests, trace_path)
    limits = parse_slo(slo) if slo is not None else ()
    target = _target(layout, memory, num_blocks)
    _check_blocks(target, layout, memory)
    clock = _clock(profile_path, target, step_ms, timed=slo is not None or bool(concurrency))
    if fixed is not None:
        trace = _fixed_trace(target, *fixed)
    else:
        trace = _trace(trace_path, target, workload_format=workload_format, step_ms=step_ms,
                       columns=columns_of(columns, time_unit), block_tokens=block_tokens)
    if not trace:
        raise KvspecError(f"{trace_path}: the trace has no requests",
                          hint="give a trace with at least one request line")
    try:
        results = {"kvspec": _simulate(target, trace, max_num_seqs, quiet, clock,
                                       concurrency or 0)}
    except KvspecError as err:  # the pools the options sized: name them
        given = f"--num-blocks {num_blocks}" if num_blocks is not None else \
            f"--memory {memory}" if memory is not None else None
        if given is None:
            raise
        raise err.replace(message=f"{given}: {err.message}") from None
    if results["kvspec"].rejected == len(trace):
        raise _all_refused(target, trace, trace_path or layout)
    if against == "vllm":
        results["vllm"] = _against_vllm(target, trace, max_num_seqs, quiet, clock,
                                        concurrency or 0)
    data = {"layout": str(layout), "requests": len(trace),
            "refused": results["kvspec"].rejected,
            **({"workload": {"isl": fixed[0], "osl": fixed[1]}} if fixed else {}),
            **({"concurrency": concurrency} if concurrency else {}),
            "pools": [{"name": n, "blocks": b} for n, b in _blocks(target)],
            **({"step_time": clock.as_dict()} if clock is not None else {}),
            **{side: _summary(target, r, side, limits) for side, r in results.items()}}
    if clock is not None and clock.outside() is not None:
        note(clock.outside(), quiet=quiet)  # type: ignore[arg-type]
    return _write(data, list(results), clock is not None, fmt, output, quiet)


def _write(data: dict[str, Any], sides: list[str], timed: bool, fmt: str,
           output: Path | None, quiet: bool) -> int:
    """The run's figures: JSON, or the table (and the latency table on a clock)."""
    if fmt == "json":
        if output is None:
            echo_json(data)
            return EXIT_OK
        emit(json.dumps(data, indent=1) + "\n", output, quiet=quiet)
        return EXIT_OK
    text = simulate_table(data, sides)
    if timed:
        text += "\n\n" + latency_table(data, sides)
    emit(text + "\n", output, quiet=quiet)
    cap = cap_note(data["kvspec"])
    if cap:
        note(cap, quiet=quiet)
    return EXIT_OK


def _target(path: Path, memory: str | None, num_blocks: int | None) -> Target:
    """The compiled layout at ``path`` (a source is compiled, at ``memory`` when
    given), its pools and their block counts."""
    # deferred: the compiler and the simulator load when the command runs
    from kvspec.compiler import Pooled, compile_until
    from kvspec.passes.freeze import freeze
    from kvspec.pooling.evaluate import workload_trace
    from kvspec.reports.explain import is_artifact_path

    source_trace = None
    given = parse_bytes(memory) if memory else None
    art: Artifact
    if is_artifact_path(path):
        art = Artifact.read(path)
    else:
        pooled = compile_until(path, Pooled, memory=given, memory_name="--memory")
        given = None  # the source was sized for it
        art = freeze(pooled)
        workload = pooled.expansion.pooling.workload
        if workload is not None:
            source_trace = workload_trace(workload, pooled).requests
    pools = tuple(art.counts_for(fewest=True))
    counts = None
    if num_blocks is not None:
        if len(pools) > 1:
            raise UsageError(f"--num-blocks sizes one pool; this plan has {len(pools)} "
                             "(separate pools, each its share of the budget)",
                             hint="give --memory instead: each pool gets its share of it")
        counts = {pools[0]: num_blocks}
    elif given is not None:
        try:
            sized = art.counts_for(memory=given)
        except KvspecError as err:
            raise err.replace(hint=f"{err.hint}; or give --memory more than {memory}") from None
        counts = {n: sized[n] for n in pools}
    return Target(art, pools, counts, source_trace)


def _check_blocks(target: Target, layout: Path, memory: str | None) -> None:
    """Refuse pools too large to simulate before building them, naming what sized them."""
    for name, n in _blocks(target):
        if n <= MAX_BLOCKS:
            continue
        what = (f"pool {name} has {n:,} blocks; the simulator holds every block, at most "
                f"{MAX_BLOCKS:,}")
        if memory is not None:
            raise UsageError(f"--memory {memory}: {what}", found=memory,
                             hint="simulate a smaller budget (the figures per block scale)")
        raise KvspecError(f"cannot simulate: {what}", file=shown(layout), path="budget",
                          hint="give --memory or --num-blocks for a smaller pool")


def _all_refused(target: Target, trace: tuple[Any, ...], path: Path) -> KvspecError:
    """Every request refused: an error, not a table of zeros."""
    limit = target.artifact.body.engine.max_model_len
    shortest = min(r.prompt_tokens for r in trace)
    return KvspecError(
        f"all {count(len(trace), 'request')} of the trace were refused: every prompt is "
        f"max_model_len ({limit:,} tokens) or more",
        file=shown(path), found=f"the shortest prompt has {shortest:,} tokens",
        hint="give a trace of shorter prompts (kvspec trace --max-prompt-tokens "
             f"{limit - 1}), or compile the layout with a larger max_model_len")


def _fixed_lengths(isl: int | None, osl: int | None, n: int | None,
                   trace_path: Path | None) -> tuple[int, int, int] | None:
    """(isl, osl, requests) of a fixed-length workload, None without one; a
    :class:`UsageError` naming the option given without its partners."""
    if isl is None and osl is None:
        if n is not None:
            raise UsageError("-n counts the requests of a fixed-length workload: give "
                             "--isl and --osl with it", found=f"-n {n}",
                             hint="e.g. --isl 1024 --osl 128 -n 500; a trace (--workload) "
                                  "has its own count")
        return None
    if isl is None or osl is None:
        given, missing = ("--isl", "--osl") if isl is not None else ("--osl", "--isl")
        raise UsageError(f"{given} without {missing}: a fixed-length workload needs both",
                         hint="e.g. --isl 1024 --osl 128 -n 500")
    if trace_path is not None:
        raise UsageError("--workload and --isl/--osl exclude each other",
                         hint="replay the trace, or the fixed-length workload, not both")
    return isl, osl, n if n is not None else FIXED_REQUESTS


def _fixed_trace(target: Target, isl: int, osl: int, n: int) -> tuple[Any, ...]:
    """``n`` requests of ``isl`` prompt tokens and ``osl`` output tokens, all at 0 (no
    prompt shares a prefix); refused, naming --isl, when vLLM would refuse them."""
    limit = target.artifact.body.engine.max_model_len
    if isl >= limit:
        raise UsageError(f"--isl {isl:,}: every prompt is max_model_len ({limit:,} tokens) "
                         "or more, and vLLM refuses such prompts", found=str(isl),
                         hint=f"give --isl {limit - 1:,} or fewer, or compile the layout "
                              "with a larger max_model_len")
    one = TraceRequest(0, isl, osl)
    return (one,) * n


def _blocks(target: Target) -> list[tuple[str, int]]:
    """Each pool's block count as simulated (the options', else the layout's own)."""
    counts = target.counts or target.artifact.counts_for(fewest=True)
    return [(name, counts[name]) for name in target.pools]


def _trace(path: Path | None, target: Target, *, workload_format: str | None = None,
           **reading: Any) -> tuple[Any, ...]:
    if path is not None:
        return read_requests(path, workload_format, **reading)
    if target.source_trace is not None:
        return target.source_trace
    raise UsageError("no trace to replay: give --workload TRACE.jsonl",
                     hint="make one with `kvspec trace -n 1000 --prompt-mean 2048 "
                          "--output-mean 256 -o trace.jsonl`, or declare pooling.workload "
                          "in the source")


@dataclass(frozen=True)
class Clock:
    """A timed run's clock: the step-time model, the profile it came from (None: the
    constant model, ``step_ms`` a step)."""

    model: Any
    step_ms: float
    profile: Path | None

    def as_dict(self) -> dict[str, Any]:
        if self.profile is None:
            return {"model": "constant", "step_ms": self.step_ms}
        coefficients = dict(zip(("fixed", *TERMS), self.model.coefficients, strict=True))
        return {"model": "linear", "profile": str(self.profile), "seconds": coefficients}

    def outside(self) -> str | None:
        """The note for a batch outside the profile's measured range (once)."""
        found = getattr(self.model, "outside", None)
        if found is None:
            return None
        term, value, (low, high) = found
        return (f"{self.profile}: a step's {term} ({value:,}) is outside the measured range "
                f"[{low:,}, {high:,}]: its time is extrapolated (noted once)")


def _clock(path: Path | None, target: Target, step_ms: float, *, timed: bool) -> Clock | None:
    """The run's clock: the profile's (checked against the layout), the constant one
    when an SLO asks for latency, else None (the step clock, untimed)."""
    if path is None:
        return Clock(ConstantStepTime(step_ms), step_ms, None) if timed else None
    # deferred: the profile's reader loads pydantic, only for --profile
    from kvspec.source.profile import read_profile

    profile = read_profile(str(path))
    body = target.artifact.body
    e = body.engine
    profile.check({"model": body.model, "tensor_parallel_size": e.tensor_parallel_size,
                   "pipeline_parallel_size": e.pipeline_parallel_size,
                   "kv_cache_dtype": e.kv_cache_dtype}, f"the layout {body.name}")
    return Clock(profile.step_time(), step_ms, path)


def _simulate(target: Target, trace: tuple[Any, ...], max_num_seqs: int | None,
              quiet: bool, clock: Clock | None = None, concurrency: int = 0) -> Any:
    layout = from_artifact(target.artifact, target.counts)
    timing: dict[str, Any] = {} if clock is None else {
        "step_time": clock.model, "step_ms": clock.step_ms, "latency": True,
        "concurrency": concurrency}
    with progress(len(trace), label="simulating", quiet=quiet, notes=True,
                  delay=None if len(trace) >= BAR_FROM else math.inf) as bar:
        return simulate(layout, trace, progress=_advance(bar), sample_held=True,
                        **engine_settings(target.artifact.body.engine, max_num_seqs),
                        **timing)


def _summary(target: Target, result: Any, side: str, slo: tuple[Any, ...] = ()
             ) -> dict[str, Any]:
    """A side's summary, with the layout's waste while memory binds (kvspec's side
    samples what running requests hold; vLLM's does not: None), and its latency when
    the run was timed."""
    # deferred: the pooling figures load with the compiler, when the command runs
    from kvspec.pooling.evaluate import layout_waste, waste_of

    with deferred():   # compiled code (kvspec.interrupts)
        waste = waste_of(result, target.artifact.body)[1] if side == "kvspec" else None
        out = {**result.as_dict(), "layout_waste": layout_waste(waste)}
        if result.latency is not None:
            out["latency"] = result.latency.as_dict(slo)
    return out


def _advance(bar: Any) -> Any:
    seen = [0]

    def tick(finished: int, total: int) -> None:
        bar.advance("requests finished", finished - seen[0])
        seen[0] = finished
    return tick


def _against_vllm(target: Target, trace: tuple[Any, ...], max_num_seqs: int | None,
                  quiet: bool, clock: Clock | None = None, concurrency: int = 0) -> Any:
    """The trace through vLLM 0.33's own scheduler, for the same plan and blocks."""
    # deferred: the vLLM bridge (vLLM, torch) loads only for --against vllm
    from kvspec.integrations import vllm as bridge

    if len(target.pools) > 1:
        raise UsageError("--against vllm: vLLM 0.33 holds one shared pool: it cannot run "
                         "this plan's "
                         f"{len(target.pools)} separate pools",
                         hint="compare the unified plan (pooling.policy: unified, or the "
                              "`unified` candidate `kvspec plan` prints) against vLLM")
    if max_num_seqs is not None:
        raise UsageError("--max-num-seqs with --against vllm: vLLM's side runs the layout's "
                         "own engine settings", hint="drop --max-num-seqs, or set "
                         "engine.max_num_seqs in the source")
    bridge.adapter()
    # deferred: vLLM (and its torch), for --against vllm only, after the check above
    from kvspec.integrations.vllm.replay import replay

    art = target.artifact
    num_blocks = target.counts[target.pools[0]] if target.counts is not None else None
    with progress(len(trace), label="vLLM's scheduler", quiet=quiet, notes=True,
                  delay=None if len(trace) >= BAR_FROM else math.inf) as bar:
        result, _ = replay(art, trace, num_blocks, progress=_advance(bar),
                           step_time=None if clock is None else clock.model,
                           step_ms=None if clock is None else clock.step_ms,
                           concurrency=concurrency)
    return result


#: ``kvspec simulate``'s exit codes and what each means (docs/cli.md).
EXITS = (
    (EXIT_OK, "the trace was replayed and its figures printed"),
    (EXIT_INVALID, ("the layout or the trace is invalid (file:line), or the pools cannot "
                   "serve one of its requests")),
    (EXIT_USAGE, USAGE + "; --against vllm without vLLM installed, or with separate pools"),
)
#: Pages to read next (docs/cli.md).
SEE_ALSO = ("simulate.md", "pooling.md")

