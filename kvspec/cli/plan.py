"""``kvspec plan``: the plan of a source for a memory budget, or a sweep of budgets."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import click

from kvspec.cli.common import (
    USAGE,
    echo_json,
    format_option,
    parse_bytes,
    parse_memory_range,
    quiet_option,
    warn,
)
from kvspec.cli.common import command as cli_command
from kvspec.errors import EXIT_INVALID, EXIT_OK, EXIT_USAGE, KvspecError, UsageError

if TYPE_CHECKING:
    from kvspec.artifact.format import PoolingRecord
    from kvspec.model.plan import Plan
    from kvspec.reports.plan import PoolLayout


@cli_command("plan", short_help="Print the plan of a layout for a memory budget.")
@click.argument("layout", type=click.Path(path_type=Path))
@click.option("--memory", "--kv-cache-memory-bytes", "memory",
              help="Memory per rank (40GiB, 42949672960), or a sweep "
              "20GiB..80GiB[:10GiB]. Default: the layout's own budget.")
@click.option("--num-blocks", "--num-gpu-blocks-override", "num_blocks",
              type=click.IntRange(min=1), help="Plan for this many blocks "
              "instead of a memory budget.")
@format_option("text", "json", json_alias=True, help="text: a table; json: the reference "
               "view, field by field comparable with vLLM's planner (docs/cli.md).")
@click.option("--views", is_flag=True, help="With --format json: include every layer's view.")
@quiet_option
def command(layout: Path, memory: str | None, num_blocks: int | None, fmt: str,
            views: bool, quiet: bool) -> int:
    """Print the plan of LAYOUT (a source, or a .kvlayout.json artifact) for a memory
    budget. An artifact keeps the max_model_len it was compiled for."""
    # deferred: the compiler and reports (pydantic, PyYAML) load when the command runs
    from kvspec.planner import size_plan
    from kvspec.reports import plan as report
    from kvspec.reports.refview import error_view, reference_view
    from kvspec.source.where import GivenMemory

    as_json = fmt == "json"
    if views and not as_json:
        raise UsageError("--views needs --format json",
                         hint="kvspec plan SOURCE --format json --views")
    if num_blocks is not None and memory is not None:
        raise UsageError("--memory and --num-blocks exclude each other",
                         hint="a fixed block count decides the memory, and the other way")
    pooled = report.pooled_of(layout, memory)
    if pooled is not None:
        return _print_pooled(*pooled, memory=memory, num_blocks=num_blocks, as_json=as_json,
                             quiet=quiet)
    plan, budget, where = report.plan_of(layout)
    if memory and ".." in memory:
        rows = report.sweep(plan, parse_memory_range(memory))
        if as_json:
            echo_json(report.sweep_view(plan, rows))
        else:
            click.echo(report.sweep_table(rows))
        return EXIT_OK
    given = parse_bytes(memory) if memory else None
    try:
        sizing = size_plan(plan, memory=given if given is not None else budget,
                           num_blocks=num_blocks)
    except KvspecError as err:
        if given:  # an error about the budget is about --memory
            where = dataclasses.replace(where, memory=GivenMemory(given, "--memory"))
        err = where.locate(err)
        if as_json:
            echo_json(error_view(err))
            return EXIT_INVALID
        raise err from None
    if as_json:
        echo_json(reference_view(plan, sizing, with_views=views))
        return EXIT_OK
    click.echo(report.plan_table(plan, sizing, warnings=False))
    for w in report.plan_warnings(plan, sizing):
        warn(w, quiet=quiet)
    return EXIT_OK


def _print_pooled(plan: Plan | None, pools: tuple[PoolLayout, ...], record: PoolingRecord,
                  budget: int | None, *, memory: str | None, num_blocks: int | None,
                  as_json: bool, quiet: bool) -> int:
    """``plan`` of a layout with a pooling decision: each pool's plan (or the unified
    plan), then the decision and every candidate's capacity at the workload."""
    # deferred: the compiler and reports (pydantic, PyYAML) load when the command runs
    from kvspec.reports import plan as report

    if memory and ".." in memory:
        raise UsageError("a sweep of budgets plans one pool; this layout's pooling policy "
                         "decided for its own budget",
                         hint="give one budget (--memory 40GiB): a source decides again for "
                              "it; or sweep a source without a pooling section")
    if pools and num_blocks is not None:
        raise UsageError("--num-blocks sizes one pool; this plan has "
                         f"{len(pools)} (separate pools, each its share of the budget)",
                         hint="give --memory instead: each pool gets its share of it")
    parts = report.pooled_sizings(plan, pools, parse_bytes(memory) if memory else budget,
                                  num_blocks)
    if as_json:
        echo_json(report.pooled_view(parts, record))
        return EXIT_OK
    click.echo(report.pooled_table(parts, record))
    for _, pl, sz in parts:
        for w in report.plan_warnings(pl, sz):
            warn(w, quiet=quiet)
    return EXIT_OK


#: ``kvspec plan``'s exit codes and what each means (docs/cli.md).
EXITS = (
    (EXIT_OK, ("the plan was printed (a sweep is printed even when some budgets "
               "cannot serve one request: those rows say so)")),
    (EXIT_INVALID, ("the source is invalid, there is no budget (no `--memory`, "
                    "`--num-blocks` or `engine.memory`), or the budget cannot serve "
                    "one request (with `--format json`: the reference view with `ok: false` and "
                    "the error)")),
    (EXIT_USAGE, USAGE),
)
#: Pages to read next (docs/cli.md).
SEE_ALSO = ("concepts.md", "cookbook.md")
