"""``kvspec diff A B``: a semantic diff of two layouts, for review and CI.

Exit status: 0 the plans are identical, 1 they differ, 2 an error (a bad
command line, or a side that does not load or compile: never 1, so CI does
not read a broken layout as a change).
"""

from __future__ import annotations

from pathlib import Path

import click

from kvspec.cli.common import (
    EXIT_DIFFER,
    ExitWith,
    format_option,
    single_memory,
    stdin_once,
)
from kvspec.cli.common import command as cli_command
from kvspec.errors import EXIT_OK, EXIT_USAGE, KvspecError


@cli_command("diff", short_help="Compare two layouts: groups, pages, capacity.")
@click.argument("a", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("b", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--memory", "--kv-cache-memory-bytes", "memory",
              help="Compare capacity at this memory per rank (40GiB). "
              "Default: A's budget (its engine.memory, or the artifact's).")
@format_option("text", "md", "json")
@click.option("--quiet", "-q", is_flag=True,
              help="Print nothing; only the exit status says whether the plans differ.")
def command(a: Path, b: Path, memory: str | None, fmt: str, quiet: bool) -> int:
    """Compare layouts A and B (sources or artifacts, mixed allowed): groups added,
    removed or changed, pages, padding, bytes per block, engine settings, and the
    capacity change for the same budget. Exits 0 when the plans are identical,
    1 when they differ, 2 on error."""
    # deferred: the compiler and reports (pydantic, PyYAML) load when the command runs
    from kvspec.reports.diff import diff, render_diff

    stdin_once((a, b))
    budget = single_memory(memory)
    try:
        result = diff(a, b, memory=budget)
    except KvspecError as err:
        raise ExitWith(err, EXIT_USAGE) from None  # 1 means "the plans differ" here
    if not quiet:
        click.echo(render_diff(result, fmt), nl=False)
    return 0 if result.identical else EXIT_DIFFER


#: ``kvspec diff``'s exit codes and what each means (docs/cli.md).
EXITS = (
    (EXIT_OK, "the plans are identical"),
    (EXIT_DIFFER, "the plans differ (nothing is printed on stderr)"),
    (EXIT_USAGE, ("an error: a bad command line, or a side that does not load or "
                  "compile (never 1, so CI does not read a broken layout as a change)")),
)
#: Pages to read next (docs/cli.md).
SEE_ALSO = ("reports.md",)
