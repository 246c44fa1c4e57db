"""``kvspec schema``: (re)generate the JSON Schemas in ``schemas/``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from kvspec.cli.common import (
    USAGE,
    echo_json,
    format_option,
    note,
    parents_option,
    quiet_option,
)
from kvspec.cli.common import command as cli_command
from kvspec.errors import EXIT_INVALID, EXIT_OK, EXIT_USAGE, UsageError
from kvspec.reports.schemas import (
    SCHEMA_FILES,
    StaleSchemaError,
    check_schemas,
    write_schemas,
)


def _files() -> dict[str, Any]:
    """Every schema ``kvspec schema`` writes: the compiler's and the sweep grid's."""
    # deferred: pydantic (the sweep grid's model), only when the command runs
    from kvspec.sweep.grid import grid_schema

    return {**SCHEMA_FILES, "sweep.schema.json": grid_schema}


@cli_command("schema", short_help="Generate (or --check) the JSON Schemas.")
@click.option("-o", "--output-dir", "directory", default="schemas", show_default=True,
              type=click.Path(file_okay=False, path_type=Path),
              help="Directory of source.schema.json, artifact.schema.json, "
                   "descriptor.schema.json, profile.schema.json and sweep.schema.json.")
@click.option("--check", is_flag=True,
              help="Write nothing; exit 1 when the schemas there are stale or missing.")
@parents_option
@format_option("text", "json", help="json: each schema file and its state, as one object "
               "(docs/cli.md).")
@quiet_option
def command(directory: Path, check: bool, parents: bool, fmt: str, quiet: bool) -> int:
    """Generate the source, artifact, connector descriptor, step-time profile and sweep
    grid JSON
    Schemas from kvspec's models.

    "wrote ..." goes to stderr; with --check, the stale files and their diffs go
    to stdout."""
    parent = directory.absolute().parent
    if not check and not parents and not directory.is_dir() and not parent.is_dir():
        raise UsageError(f"{directory}: the directory {parent} does not exist",
                         found=str(directory),
                         hint="create it first, or pass --parents to create it")
    if not check:
        changed = write_schemas(directory, _files())
        if fmt == "json":
            echo_json(_document(directory, [(f.path, "written") for f in changed]))
            return EXIT_OK
        for f in changed:
            note(f"wrote {f.path}", quiet=quiet)
        if not changed:
            note(f"{directory}: schemas are current", quiet=quiet)
        return EXIT_OK
    stale = check_schemas(directory, _files())
    if fmt == "json":
        echo_json(_document(directory, [(f.path, "missing" if f.current is None else "stale")
                                        for f in stale]))
        return EXIT_INVALID if stale else EXIT_OK
    if not stale:
        note(f"{directory}: schemas are current", quiet=quiet)
        return EXIT_OK
    for f in stale:
        click.echo(f"{f.path}: {'missing' if f.current is None else 'stale'}")
        if f.current is not None:
            for line in f.diff():
                click.echo(f"  {line}")
    names = ", ".join(str(f.path) for f in stale)
    raise StaleSchemaError(
        f"{len(stale)} schema file(s) differ from what kvspec generates: {names}",
        file=str(directory), hint=f"run `kvspec schema -o {directory}` and commit the result")


def _document(directory: Path, files: list[tuple[Path, str]]) -> dict[str, object]:
    """``--format json``: every schema file with its state (``current`` when not listed)."""
    states = {str(p): state for p, state in files}
    names = [str(directory / n) for n in _files()]
    return {"ok": not any(s in ("stale", "missing") for s in states.values()),
            "directory": str(directory),
            "files": [{"path": n, "status": states.get(n, "current")} for n in names]}


#: ``kvspec schema``'s exit codes and what each means (docs/cli.md).
EXITS = (
    (EXIT_OK, "the schemas were written, or (with `--check`) are current"),
    (EXIT_INVALID, "with `--check`: a schema file is stale or missing"),
    (EXIT_USAGE, USAGE),
)
#: Pages to read next (docs/cli.md).
SEE_ALSO = ("format.md",)
