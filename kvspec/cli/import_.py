"""``kvspec import``: a per-layer spec dump (JSON) -> a kvspec source."""

from __future__ import annotations

from pathlib import Path

import click

from kvspec.cli.common import (
    USAGE,
    check_output,
    source_output_options,
    write_result,
    written_by,
)
from kvspec.cli.common import command as cli_command
from kvspec.errors import (
    EXIT_INVALID,
    EXIT_OK,
    EXIT_USAGE,
    KvspecError,
    NotEnoughMemoryError,
)


@cli_command("import", short_help="Turn a per-layer spec dump (JSON) into a source.")
@click.argument("dump", type=click.Path(dir_okay=False, path_type=Path))
@source_output_options("import")
def command(dump: Path, output: Path | None, force: bool, parents: bool, fmt: str,
            quiet: bool) -> None:
    """Turn a per-layer spec dump (JSON) into a kvspec source."""
    # deferred: the dump reader and the compiler (pydantic, PyYAML) load when it runs
    from kvspec.compiler import compile_source
    from kvspec.files import shown, write_atomic
    from kvspec.integrations.dump.importer import import_source
    from kvspec.integrations.dump.locate import in_dump
    from kvspec.integrations.dump.read import read_dump_file

    data, raw = read_dump_file(dump)
    imported = import_source(data, shown(dump), raw)
    model = data.get("model")
    text = imported.text(model if isinstance(model, str) else None)
    where = dict(file=shown(dump), text=raw, dump=data, source=imported.source,
                 first_layer_of_type=imported.first_layer_of_type)
    problem = None
    try:
        compile_source(text, shown(output or dump))  # what we write must compile
    except NotEnoughMemoryError as err:  # the model is valid; its budget is too small
        problem = in_dump(err, **where)
    except KvspecError as err:
        raise in_dump(err, **where) from None
    check_output(output, suffixes=(".yaml", ".yml"), force=force, parents=parents,
                 inputs=(dump,), ours=written_by("import"))
    if problem is not None and fmt == "json":  # one document: the error
        if output is not None:
            write_atomic(output, text)
        raise problem
    write_result(text, output, fmt, quiet=quiet)
    if problem is not None:
        raise problem


#: ``kvspec import``'s exit codes and what each means (docs/cli.md).
EXITS = (
    (EXIT_OK, "the source was written (or printed)"),
    (EXIT_INVALID, ("the dump cannot be read, is not a per-layer spec dump, or does "
                    "not plan")),
    (EXIT_USAGE, USAGE + "; the output file exists, `kvspec import` did not write it and "
                 "`--force` was not given"),
)
#: Pages to read next (docs/cli.md).
SEE_ALSO = ("format.md", "cookbook.md")
