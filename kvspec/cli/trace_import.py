"""``kvspec trace import FORMAT FILE``: a trace in a format users have (Azure,
Mooncake, BurstGPT, a lengths file) converted to kvspec's JSONL, row by row, so a
file of any length is converted in bounded memory (docs/traces.md)."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import get_args

import click

from kvspec.cli.common import (
    USAGE,
    check_output,
    echo_json,
    format_option,
    parents_option,
    quiet_option,
)
from kvspec.cli.common import command as cli_command
from kvspec.cli.outputs import jsonl_with
from kvspec.errors import EXIT_INVALID, EXIT_OK, EXIT_USAGE, UsageError
from kvspec.files import is_stdout, write_atomic
from kvspec.model.pooling import TimeUnit
from kvspec.reports.format import count as plural
from kvspec.sim.formats import (
    DEFAULT_STEP_MS,
    FORMATS,
    MOONCAKE_BLOCK_TOKENS,
    Columns,
    Reader,
)
from kvspec.sim.trace import MAX_TOKENS, TraceError, TraceRequest

#: Whether a file is a trace (replaced without --force): its first line is one.
is_trace = jsonl_with("arrival", "prompt_tokens", "output_tokens")


def _trace_at(output: Path | None) -> bool:
    """Whether ``output`` is a regular file whose first line is a trace's."""
    if output is None or is_stdout(output) or not output.is_file():
        return False
    try:
        with open(output, encoding="utf-8", errors="replace") as fh:
            return is_trace(fh.readline(1 << 16))
    except OSError:
        return False


def step_options(f: click.decorators.FC) -> click.decorators.FC:
    """``--step-ms``, ``--columns``, ``--time-unit``, ``--block-tokens``: how a
    trace file is read (``trace import``, ``simulate``)."""
    f = click.option("--block-tokens", type=click.IntRange(min=1, max=MAX_TOKENS),
                     default=MOONCAKE_BLOCK_TOKENS, show_default=True,
                     help="mooncake: tokens per hash_ids block.")(f)
    f = click.option("--time-unit", type=click.Choice(get_args(TimeUnit)), default="s",
                     show_default=True, help="lengths: the unit of the time column.")(f)
    f = click.option("--columns", metavar="MAP",
                     help="lengths: the columns (or JSON keys) holding each figure, "
                          "prompt=NAME,output=NAME[,time=NAME].")(f)
    return click.option("--step-ms", type=click.FloatRange(min=0, min_open=True, max=1e6),
                        default=DEFAULT_STEP_MS, show_default=True, callback=_finite_ms,
                        help="Milliseconds one engine step stands for: a request arriving "
                             "t ms after the first joins at step floor(t / step-ms).")(f)


def _finite_ms(ctx: click.Context, param: click.Parameter, value: float) -> float:
    # click's range lets nan through (it compares false with both bounds)
    if not math.isfinite(value):
        raise UsageError(f"--step-ms {value}: not a number of milliseconds",
                         expected="a number above 0 and at most 1000000", found=str(value),
                         hint="the milliseconds one engine step stands for, e.g. --step-ms 20")
    return value


def columns_of(columns: str | None, time_unit: str) -> Columns | None:
    """``--columns``' map; a map that does not read is an error naming the option."""
    if columns is None:
        return None
    try:
        return Columns.parse(columns, time_unit)
    except TraceError as err:
        raise UsageError(f"--columns {columns!r}: {err.message}",
                         expected="prompt=NAME,output=NAME[,time=NAME]", found=repr(columns),
                         hint=err.hint or "name the columns holding each figure, e.g. "
                         "--columns prompt=input_len,output=output_len") from None


@cli_command("import", short_help="Convert a trace file (Azure, Mooncake, BurstGPT, "
             "lengths) to kvspec's JSONL.")
@click.argument("trace_format", metavar="FORMAT", type=click.Choice(list(FORMATS)))
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@step_options
@format_option("text", "json", help="text: the JSONL trace; json: a summary on stdout "
               "(the trace goes to -o).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the trace here instead of stdout.")
@click.option("--force", is_flag=True, help="Replace an existing file that is not a trace.")
@parents_option
@quiet_option
def command(trace_format: str, file: Path, step_ms: float, columns: str | None,
            time_unit: str, block_tokens: int, fmt: str, output: Path | None, force: bool,
            parents: bool, quiet: bool) -> int:
    """Convert FILE, a trace in FORMAT, to kvspec's JSONL trace: one request a line,
    arrivals in engine steps of --step-ms, Mooncake's hash_ids as prefix_blocks (so
    prefix-cache hits follow the real reuse). Formats: azure-2023, azure-2024 (CSV
    TIMESTAMP, ContextTokens, GeneratedTokens), mooncake (JSONL timestamp in ms,
    input_length, output_length, hash_ids), burstgpt (CSV Timestamp, Request tokens,
    Response tokens, ...; its rows of 0 tokens, failed requests, are skipped), lengths
    (any CSV or JSONL, with --columns), kvspec. The file is read row by row (gzip'ed or
    not; - for stdin), and held to the bounds simulate holds a trace to: a row it would
    refuse is an error at its line and column."""
    as_json = fmt == "json"
    if as_json and (output is None or is_stdout(output)):
        raise UsageError("--format json prints a summary: the trace needs -o FILE",
                         hint="give -o trace.jsonl, or drop --format json")
    # a trace there is replaced: told from its first line (never read whole: it may
    # be as long as the file being converted)
    check_output(output, suffixes=(".jsonl", ".json"), force=force or _trace_at(output),
                 parents=parents, inputs=(file,), ours=is_trace)
    reader = Reader(file, trace_format, step_ms=step_ms, columns=columns_of(columns, time_unit),
                    block_tokens=block_tokens)
    count = [0, 0]  # requests, last arrival

    def lines() -> Iterator[str]:
        for r in reader:
            count[0] += 1
            count[1] = r.arrival
            yield _line(r)
        if not count[0]:
            raise reader.empty()

    if output is None or is_stdout(output):
        write = sys.stdout.write
        for text in lines():
            write(text)
        sys.stdout.flush()
    else:
        write_atomic(output, lines())
    summary = {"format": trace_format, "rows": reader.rows, "skipped": reader.skipped,
               "requests": count[0], "last_arrival": count[1], "step_ms": step_ms}
    if as_json:
        echo_json({"ok": True, "output": str(output), **summary})
    elif not quiet:
        skipped = (f", {plural(reader.skipped, 'row')} of 0 tokens skipped" if reader.skipped
                   else "")
        where = f"wrote {output}: " if output is not None and not is_stdout(output) else ""
        click.echo(f"{where}{plural(count[0], 'request')} from {plural(reader.rows, 'row')}"
                   f"{skipped}; the "
                   f"last arrives at step {count[1]:,} ({step_ms:g} ms a step)", err=True)
    return EXIT_OK


def _line(r: TraceRequest) -> str:
    return json.dumps(r.as_dict()) + "\n"


#: ``kvspec trace import``'s exit codes and what each means (docs/cli.md).
EXITS = (
    (EXIT_OK, "the trace was converted"),
    (EXIT_INVALID, ("a row of the file is invalid (file:line:column), or the output could "
                    "not be written")),
    (EXIT_USAGE, USAGE),
)
#: Pages to read next (docs/cli.md).
SEE_ALSO = ("traces.md", "simulate.md")
