"""``kvspec validate``: check sources without writing anything."""

from __future__ import annotations

from pathlib import Path

import click

from kvspec.cli.common import (
    USAGE,
    echo_json,
    error,
    error_document,
    format_option,
    note,
    quiet_option,
    stdin_once,
    warn,
)
from kvspec.cli.common import command as cli_command
from kvspec.errors import EXIT_INVALID, EXIT_OK, EXIT_USAGE, KvspecError


@cli_command("validate", short_help="Check sources without writing anything.")
@click.argument("sources", nargs=-1, required=True, type=click.Path(path_type=Path))
@format_option("text", "json", help="text: one line per source (problems on stderr); "
               "json: one object per source on stdout (docs/cli.md).")
@quiet_option
def command(sources: tuple[Path, ...], fmt: str, quiet: bool) -> int:
    """Check SOURCES without writing anything: every source, every problem.

    A SOURCE of - is read from stdin (one at most).

    Each source is checked, also after one that fails; the exit code is 1 when
    any has a problem.
    """
    # deferred: the compiler and reports (pydantic, PyYAML) load when the command runs
    from kvspec.compiler import Pass, Sized, compile_until, run
    from kvspec.files import shown
    from kvspec.pooling import check_pool
    from kvspec.reports.plan import layout_warnings

    stdin_once(sources)
    results = []
    for source in sources:
        name = shown(source)
        try:
            sized = run(compile_until(source, Sized), (Pass.of(check_pool),))
            warnings = layout_warnings(sized.layout)
            results.append({"file": name, "ok": True, "errors": [], "warnings": warnings})
        except KvspecError as err:
            results.append({"file": name, "ok": False,
                            "errors": error_document(err)["errors"], "warnings": []})
            if fmt == "text":
                error(err)
            continue
        if fmt == "text" and not quiet:
            click.echo(f"{name}: ok")
            for w in warnings:
                warn(f"{name}: {w}")
    if fmt == "json":
        echo_json(results)
    bad = sum(not r["ok"] for r in results)
    if fmt == "text" and bad and len(results) > 1:
        note(f"{bad} of {len(results)} sources have problems", quiet=quiet)
    return EXIT_OK if all(r["ok"] for r in results) else EXIT_INVALID


#: ``kvspec validate``'s exit codes and what each means (docs/cli.md).
EXITS = (
    (EXIT_OK, "every source is valid"),
    (EXIT_INVALID, ("a source has problems (every source is checked, and all problems of "
                    "each are reported together)")),
    (EXIT_USAGE, USAGE),
)
#: Pages to read next (docs/cli.md).
SEE_ALSO = ("format.md",)
