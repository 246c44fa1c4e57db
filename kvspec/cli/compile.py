"""``kvspec compile``: a source -> its frozen artifact, and a summary."""

from __future__ import annotations

from pathlib import Path

import click

from kvspec.cli.common import USAGE, default_artifact_path, parse_bytes
from kvspec.errors import EXIT_INVALID, EXIT_OK, EXIT_USAGE


@click.command("compile")
@click.argument("source", type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Artifact path (default: SOURCE with .kvlayout.json).")
@click.option("--memory", help="Plan the artifact's budget section for this memory per rank.")
@click.option("--quiet", "-q", is_flag=True, help="Print nothing but errors.")
def command(source: Path, output: Path | None, memory: str | None, quiet: bool) -> None:
    """Compile SOURCE into a frozen layout artifact and print its summary."""
    from kvspec.compiler import compile_unit
    from kvspec.reports.summary import summary

    unit = compile_unit(source, memory=parse_bytes(memory) if memory else None)
    assert unit.artifact is not None
    out = output or default_artifact_path(source)
    unit.artifact.write(out)
    if not quiet:
        click.echo(summary(unit.artifact))
        click.echo(f"wrote {out}")


#: ``kvspec compile``'s exit codes and what each means (docs/cli.md).
EXITS = (
    (EXIT_OK, "the artifact was written"),
    (EXIT_INVALID, "the source is invalid or cannot be planned (e.g. one request "
                   "at `max_model_len` does not fit `--memory`); nothing is written"),
    (EXIT_USAGE, USAGE),
)
#: Pages to read next (docs/cli.md).
SEE_ALSO = ("format.md", "concepts.md")
