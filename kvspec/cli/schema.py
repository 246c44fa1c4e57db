"""``kvspec schema``: (re)generate the JSON Schemas in ``schemas/``."""

from __future__ import annotations

from pathlib import Path

import click

from kvspec.cli.common import USAGE, note, quiet_option
from kvspec.errors import EXIT_INVALID, EXIT_OK, EXIT_USAGE
from kvspec.reports.schemas import StaleSchemaError, check_schemas, write_schemas


@click.command("schema", short_help="Generate (or --check) the JSON Schemas.")
@click.option("-o", "--output-dir", "directory", default="schemas", show_default=True,
              type=click.Path(file_okay=False, path_type=Path),
              help="Directory of source.schema.json, artifact.schema.json and "
                   "descriptor.schema.json.")
@click.option("--check", is_flag=True,
              help="Write nothing; exit 1 when the schemas there are stale or missing.")
@quiet_option
def command(directory: Path, check: bool, quiet: bool) -> None:
    """Generate the source, artifact and connector descriptor JSON Schemas from
    kvspec's models.

    "wrote ..." goes to stderr; with --check, the stale files and their diffs go
    to stdout."""
    if not check:
        changed = write_schemas(directory)
        for f in changed:
            note(f"wrote {f.path}", quiet=quiet)
        if not changed:
            note(f"{directory}: schemas are current", quiet=quiet)
        return
    stale = check_schemas(directory)
    if not stale:
        note(f"{directory}: schemas are current", quiet=quiet)
        return
    for f in stale:
        click.echo(f"{f.path}: {'missing' if f.current is None else 'stale'}")
        if f.current is not None:
            for line in f.diff():
                click.echo(f"  {line}")
    names = ", ".join(str(f.path) for f in stale)
    raise StaleSchemaError(
        f"{len(stale)} schema file(s) differ from what kvspec generates: {names}",
        file=str(directory), hint=f"run `kvspec schema -o {directory}` and commit the result")


#: ``kvspec schema``'s exit codes and what each means (docs/cli.md).
EXITS = (
    (EXIT_OK, "the schemas were written, or (with `--check`) are current"),
    (EXIT_INVALID, "with `--check`: a schema file is stale or missing"),
    (EXIT_USAGE, USAGE),
)
#: Pages to read next (docs/cli.md).
SEE_ALSO = ("format.md",)
