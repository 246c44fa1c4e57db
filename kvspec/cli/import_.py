"""``kvspec import``: a per-layer spec dump (JSON) -> a kvspec source."""

from __future__ import annotations

from pathlib import Path

import click

from kvspec.cli.common import USAGE
from kvspec.errors import EXIT_INVALID, EXIT_OK, EXIT_USAGE, KvspecError, Location


@click.command("import")
@click.argument("dump", type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Where to write the source (default: stdout).")
@click.option("--force", is_flag=True, help="Overwrite an existing output file.")
def command(dump: Path, output: Path | None, force: bool) -> None:
    """Turn a per-layer spec dump (JSON) into a kvspec source."""
    from kvspec.compiler import compile_source
    from kvspec.files import emit, refuse_overwrite
    from kvspec.integrations.dump.importer import dump_to_yaml
    from kvspec.integrations.dump.read import load_dump

    data, raw = load_dump(dump)
    try:
        text = dump_to_yaml(data, file=str(dump), text=raw)
    except KvspecError as err:
        raise err.at(Location(str(dump))) from None
    compile_source(text, str(output or "<imported>"))  # what we write must compile
    refuse_overwrite(output, force)
    emit(text, output)


#: ``kvspec import``'s exit codes and what each means (docs/cli.md).
EXITS = (
    (EXIT_OK, "the source was written (or printed)"),
    (EXIT_INVALID, "the dump cannot be read, is not a per-layer spec dump, or does "
                   "not plan"),
    (EXIT_USAGE, USAGE + "; the output file exists and `--force` was not given"),
)
#: Pages to read next (docs/cli.md).
SEE_ALSO = ("format.md", "cookbook.md")
