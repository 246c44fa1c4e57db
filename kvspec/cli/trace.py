"""``kvspec trace``: a seeded synthetic request trace, in the JSONL format
``kvspec simulate`` and ``pooling.workload.trace`` read (docs/simulate.md), drawn
from lengths and a rate or from a preset (docs/pooling.md); ``kvspec trace
import`` converts the formats users have (:mod:`kvspec.cli.trace_import`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from kvspec.cli.common import (
    USAGE,
    Command,
    FiniteRange,
    check_output,
    echo_json,
    format_option,
    parents_option,
    quiet_option,
)
from kvspec.cli.trace_import import command as import_command
from kvspec.cli.trace_import import is_trace
from kvspec.errors import EXIT_INVALID, EXIT_OK, EXIT_USAGE, UsageError
from kvspec.files import emit
from kvspec.model.pooling import Workload, declared
from kvspec.sim import generate_trace
from kvspec.sim.formats import DEFAULT_STEP_MS
from kvspec.sim.presets import PRESETS, preset_trace
from kvspec.sim.trace import MAX_TOKENS, MIN_RATE, trace_text


class _Group(click.Group):
    """``kvspec trace``: a command of its own and the group of ``trace import``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.params.append(Command("x").params[-1])  # --no-color, as every command


#: The options that draw the trace (none of them goes with a subcommand).
_DRAWING = ("requests", "prompt_mean", "prompt_spread", "output_mean", "output_spread",
            "rate", "arrival_cv", "max_prompt_tokens", "prefix_share", "prefix_groups",
            "prefix_tokens", "seed", "preset", "step_ms", "output", "fmt")
#: The options a preset decides.
_PRESET_DECIDES = ("prompt_mean", "prompt_spread", "output_mean", "output_spread", "rate",
                   "arrival_cv", "prefix_share", "prefix_groups", "prefix_tokens")


@click.group("trace", cls=_Group, invoke_without_command=True,
             short_help="Write a seeded synthetic request trace (JSONL).")
@click.option("-n", "--requests", type=click.IntRange(min=1, max=10_000_000), default=1000,
              show_default=True, help="Requests in the trace.")
@click.option("--prompt-mean", type=FiniteRange(min=1, max=MAX_TOKENS), default=1024.0,
              show_default=True,
              help="Mean prompt tokens (lognormal).")
@click.option("--prompt-spread", type=FiniteRange(min=0, max=4), default=0.5,
              show_default=True, help="Standard deviation of the prompt lengths' logarithm "
              "(0: every prompt the mean).")
@click.option("--output-mean", type=FiniteRange(min=1, max=MAX_TOKENS), default=256.0,
              show_default=True,
              help="Mean output tokens (lognormal).")
@click.option("--output-spread", type=FiniteRange(min=0, max=4), default=0.5,
              show_default=True, help="Standard deviation of the output lengths' logarithm.")
@click.option("--rate", type=FiniteRange(min=MIN_RATE, max=1e9),
              help="Arrivals per engine step, a Poisson process (default: all at step 0).")
@click.option("--arrival-cv", type=FiniteRange(min=0, min_open=True, max=100),
              default=1.0, show_default=True,
              help="With --rate: the inter-arrival times' coefficient of variation (1: "
                   "Poisson; above 1: bursty, Gamma inter-arrival times).")
@click.option("--preset", type=click.Choice(list(PRESETS)),
              help="Draw lengths and arrivals from a preset fitted to a published trace "
                   "(docs/pooling.md#workload-presets).")
@click.option("--step-ms", type=FiniteRange(min=0, min_open=True, max=1e6),
              default=DEFAULT_STEP_MS, show_default=True,
              help="--preset: milliseconds one engine step stands for.")
@click.option("--max-prompt-tokens", type=click.IntRange(min=1, max=MAX_TOKENS),
              help="Cap prompts at this many tokens (e.g. max_model_len - 1).")
@click.option("--prefix-share", type=FiniteRange(min=0, max=1), default=0.0,
              show_default=True, help="Share of requests opening with a shared prefix.")
@click.option("--prefix-groups", type=click.IntRange(min=1, max=1_000_000), default=1,
              show_default=True,
              help="Distinct shared prefixes (with --prefix-share).")
@click.option("--prefix-tokens", type=click.IntRange(min=1, max=MAX_TOKENS),
              default=declared(Workload, "prefix_tokens").default,
              show_default=True,
              help="Tokens of each shared prefix.")
@click.option("--seed", type=click.IntRange(min=0, max=2**64 - 1), default=0, show_default=True,
              help="The seed: the same options and seed give the same trace.")
@format_option("text", "json", help="text: the JSONL trace; json: one document with the "
               "requests and a summary.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the trace here instead of stdout.")
@click.option("--force", is_flag=True, help="Replace an existing file that is not a trace.")
@parents_option
@quiet_option
@click.pass_context
def command(ctx: click.Context, requests: int, prompt_mean: float, prompt_spread: float,
            output_mean: float, output_spread: float, rate: float | None, arrival_cv: float,
            preset: str | None, step_ms: float, max_prompt_tokens: int | None,
            prefix_share: float, prefix_groups: int, prefix_tokens: int, seed: int, fmt: str,
            output: Path | None, force: bool, parents: bool, quiet: bool) -> int | None:
    """Write a synthetic request trace: lognormal prompt and output lengths of the
    given means and spreads, arrivals all at step 0 or at --rate per step, shared
    prefixes for --prefix-share of the requests; seeded, so the same options give the
    same trace. One JSON object per line: arrival, prompt_tokens, output_tokens
    (and prefix_id, prefix_tokens). --preset draws lengths and bursty arrivals fitted
    to a published trace instead; `kvspec trace import` converts a trace file."""
    given = [k for k in _DRAWING
             if ctx.get_parameter_source(k) is not click.core.ParameterSource.DEFAULT]
    if ctx.invoked_subcommand is not None:
        if given:
            raise UsageError(f"--{given[0].replace('_', '-')} goes with `kvspec trace`, not "
                             f"`kvspec trace {ctx.invoked_subcommand}`",
                             hint=f"put the subcommand's options after it: kvspec trace "
                                  f"{ctx.invoked_subcommand} --help lists them")
        return None
    clash = [k for k in given if k in _PRESET_DECIDES] if preset else []
    if clash:
        raise UsageError(f"--preset {preset} decides --{clash[0].replace('_', '-')}",
                         hint="drop it, or drop --preset and give the lengths and rate")
    if "step_ms" in given and not preset:
        raise UsageError("--step-ms goes with --preset", hint="--rate is already in steps")
    if "arrival_cv" in given and rate is None and not preset:
        raise UsageError("--arrival-cv goes with --rate",
                         hint="without --rate every request arrives at step 0")
    check_output(output, suffixes=(".jsonl", ".json"), force=force, parents=parents,
                 ours=is_trace)
    try:
        if preset is not None:
            trace = preset_trace(preset, requests, seed=seed, step_ms=step_ms,
                                 max_prompt_tokens=max_prompt_tokens)
        else:
            trace = generate_trace(
                requests, seed=seed, prompt_mean=prompt_mean, prompt_spread=prompt_spread,
                output_mean=output_mean, output_spread=output_spread, rate=rate,
                max_prompt_tokens=max_prompt_tokens,
                prefix_groups=prefix_groups if prefix_share else 0,
                prefix_share=prefix_share, prefix_tokens=prefix_tokens, arrival_cv=arrival_cv)
    except ValueError as exc:
        raise UsageError(str(exc), hint="see kvspec trace --help") from None
    if fmt == "json":
        doc = {"requests": [r.as_dict() for r in trace], "summary": _summary(trace)}
        if output is None:
            echo_json(doc)
        else:
            emit(json.dumps(doc, indent=1) + "\n", output, quiet=quiet)
        return EXIT_OK
    emit(trace_text(trace), output, quiet=quiet)
    return EXIT_OK


def _summary(trace: tuple[Any, ...]) -> dict[str, float | int]:
    n = len(trace)
    return {"requests": n,
            "mean_prompt_tokens": round(sum(r.prompt_tokens for r in trace) / n, 1),
            "mean_output_tokens": round(sum(r.output_tokens for r in trace) / n, 1),
            "last_arrival": trace[-1].arrival if trace else 0,
            "shared_prefix_requests": sum(1 for r in trace if r.prefix_id is not None)}


command.add_command(import_command)

#: ``kvspec trace``'s exit codes and what each means (docs/cli.md).
EXITS = (
    (EXIT_OK, "the trace was written"),
    (EXIT_INVALID, "the output could not be written"),
    (EXIT_USAGE, USAGE),
)
#: Pages to read next (docs/cli.md).
SEE_ALSO = ("simulate.md", "pooling.md")
