"""``kvspec compile``: a source -> its frozen artifact, and a summary."""

from __future__ import annotations

from pathlib import Path

import click

from kvspec.cli.common import USAGE, default_artifact_path, note, single_memory, warn
from kvspec.errors import EXIT_INVALID, EXIT_OK, EXIT_USAGE


@click.command("compile", short_help="Compile a source into a frozen layout artifact.")
@click.argument("source", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path),
              help="Artifact path (default: SOURCE with .kvlayout.json, or stdout when "
              "SOURCE is -; -: print the artifact on stdout, without the summary).")
@click.option("--memory", help="Plan the artifact's budget section for this memory per rank.")
@click.option("--force", is_flag=True,
              help="Overwrite an output file that is not a kvspec artifact.")
@click.option("--quiet", "-q", is_flag=True, help="Print nothing but errors.")
def command(source: Path, output: Path | None, memory: str | None, force: bool,
            quiet: bool) -> None:
    """Compile SOURCE into a frozen layout artifact and print its summary.

    A SOURCE of - is read from stdin, and the artifact then goes to stdout
    unless -o names a file.

    The summary goes to stdout, warnings and "wrote ..." to stderr. An existing
    output is replaced only when it is a kvspec artifact (or with --force); the
    source itself never is.
    """
    # deferred: the compiler and reports (pydantic, PyYAML) load when the command runs
    from kvspec.artifact import Artifact, is_artifact_text
    from kvspec.compiler import compile_until
    from kvspec.files import STDOUT, is_stdin, is_stdout, refuse_overwrite
    from kvspec.reports.summary import summary, summary_warnings

    if output is None and is_stdin(source):  # a filter: stdin to stdout
        output = Path(STDOUT)
    out = output or default_artifact_path(source)
    if not is_stdout(out):
        refuse_overwrite(out, force, inputs=(source,), ours=is_artifact_text)
    artifact = compile_until(source, Artifact, memory=single_memory(memory),
                             memory_name="--memory")
    if is_stdout(out):
        click.echo(artifact.text(), nl=not artifact.text().endswith("\n"))
        for w in summary_warnings(artifact):
            warn(w, quiet=quiet)
        return
    artifact.write(out)
    if not quiet:
        click.echo(summary(artifact, warnings=False))
    for w in summary_warnings(artifact):
        warn(w, quiet=quiet)
    note(f"wrote {out}", quiet=quiet)


#: ``kvspec compile``'s exit codes and what each means (docs/cli.md).
EXITS = (
    (EXIT_OK, "the artifact was written"),
    (EXIT_INVALID, "the source is invalid or cannot be planned (e.g. one request "
                   "at `max_model_len` does not fit `--memory`); nothing is written"),
    (EXIT_USAGE, USAGE),
)
#: Pages to read next (docs/cli.md).
SEE_ALSO = ("format.md", "concepts.md")
