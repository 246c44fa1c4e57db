"""``kvspec validate``: check sources without writing anything."""

from __future__ import annotations

from pathlib import Path

import click

from kvspec.cli.common import USAGE
from kvspec.errors import EXIT_INVALID, EXIT_OK, EXIT_USAGE


@click.command("validate")
@click.argument("sources", nargs=-1, required=True,
                type=click.Path(dir_okay=False, path_type=Path))
def command(sources: tuple[Path, ...]) -> None:
    """Check SOURCES without writing anything."""
    from kvspec.compiler import compile_unit

    for source in sources:
        compile_unit(source)
        click.echo(f"{source}: ok")


#: ``kvspec validate``'s exit codes and what each means (docs/cli.md).
EXITS = (
    (EXIT_OK, "every source is valid"),
    (EXIT_INVALID, "a source has problems (all problems of a file are reported "
                   "together); the sources after it are not checked"),
    (EXIT_USAGE, USAGE),
)
#: Pages to read next (docs/cli.md).
SEE_ALSO = ("format.md",)
