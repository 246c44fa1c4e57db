"""``kvspec plan``: the plan of a source for a memory budget, or a sweep of budgets."""

from __future__ import annotations

from pathlib import Path

import click

from kvspec.cli.common import USAGE, echo_json, parse_bytes, parse_memory_range
from kvspec.errors import EXIT_INVALID, EXIT_OK, EXIT_USAGE, KvspecError


@click.command("plan")
@click.argument("source", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--memory", help="Memory per rank (40GiB, 42949672960), or a sweep "
              "20GiB..80GiB[:10GiB]. Default: the source's engine.memory.")
@click.option("--num-blocks", type=int, help="Plan for this many blocks instead.")
@click.option("--json", "as_json", is_flag=True, help="Print the reference view as JSON.")
@click.option("--views", is_flag=True, help="With --json: include every layer's view.")
def command(source: Path, memory: str | None, num_blocks: int | None, as_json: bool,
            views: bool) -> int:
    """Print the plan of SOURCE for a memory budget."""
    from kvspec.compiler import PLAN_PASSES, compile_unit, locate
    from kvspec.planner import resolve
    from kvspec.reports.refview import error_view, reference_view
    from kvspec.reports.summary import plan_table, sweep_table

    unit = compile_unit(source, passes=PLAN_PASSES)
    assert unit.plan is not None and unit.source is not None
    if memory and ".." in memory:
        rows = []
        for budget in parse_memory_range(memory):
            try:
                rows.append((budget, resolve(unit.plan, memory=budget), None))
            except KvspecError as err:
                rows.append((budget, None, err))
        if as_json:
            echo_json([reference_view(unit.plan, r) if r else
                       {"memory": b, **error_view(e)} for b, r, e in rows])
        else:
            click.echo(sweep_table(rows))
        return 0
    budget = parse_bytes(memory) if memory else (
        int(unit.source.engine.memory) if unit.source.engine.memory is not None else None)
    try:
        resolved = resolve(unit.plan, memory=budget, num_blocks=num_blocks)
    except KvspecError as err:
        if as_json:
            echo_json(error_view(err))
            return EXIT_INVALID
        raise locate(err, unit) from None
    if as_json:
        echo_json(reference_view(unit.plan, resolved, with_views=views))
    else:
        click.echo(plan_table(unit.plan, resolved))
    return 0


#: ``kvspec plan``'s exit codes and what each means (docs/cli.md).
EXITS = (
    (EXIT_OK, "the plan was printed (a sweep is printed even when some budgets "
              "cannot serve one request: those rows say so)"),
    (EXIT_INVALID, "the source is invalid, there is no budget (no `--memory`, "
                   "`--num-blocks` or `engine.memory`), or the budget cannot serve "
                   "one request; with `--json` the error is printed as JSON too"),
    (EXIT_USAGE, USAGE),
)
#: Pages to read next (docs/cli.md).
SEE_ALSO = ("concepts.md", "cookbook.md")
