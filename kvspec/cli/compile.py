"""``kvspec compile``: a source -> its frozen artifact, and a summary."""

from __future__ import annotations

from pathlib import Path

import click

from kvspec.cli.common import (
    USAGE,
    check_output,
    default_artifact_path,
    echo_json,
    format_option,
    note,
    parents_option,
    progress,
    single_memory,
    warn,
)
from kvspec.cli.common import command as cli_command
from kvspec.errors import EXIT_INVALID, EXIT_OK, EXIT_USAGE, UsageError


@cli_command("compile", short_help="Compile a source into a frozen layout artifact.")
@click.argument("source", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path),
              help="Artifact path (default: SOURCE with .kvlayout.json, or stdout when "
              "SOURCE is -; -: print the artifact on stdout, without the summary).")
@click.option("--memory", "--kv-cache-memory-bytes", "memory",
              help="Plan the artifact's budget section for this memory per rank.")
@click.option("--force", is_flag=True,
              help="Overwrite an output file that is not a kvspec artifact.")
@parents_option
@format_option("text", "json", help="text: the summary; json: the same figures as one "
               "object (docs/cli.md).")
@click.option("--quiet", "-q", is_flag=True, help="Print nothing but errors.")
def command(source: Path, output: Path | None, memory: str | None, force: bool,
            parents: bool, fmt: str, quiet: bool) -> None:
    """Compile SOURCE into a frozen layout artifact and print its summary.

    A SOURCE of - is read from stdin, and the artifact then goes to stdout
    unless -o names a file.

    The summary goes to stdout, warnings and "wrote ..." to stderr. An existing
    output is replaced only when it is a kvspec artifact (or with --force); the
    source itself never is.
    """
    # deferred: the compiler and reports (pydantic, PyYAML) load when the command runs
    from kvspec.artifact import is_artifact_text
    from kvspec.compiled import CompiledArtifact
    from kvspec.compiler import PASSES, compile_until
    from kvspec.files import STDOUT, is_stdin, is_stdout
    from kvspec.reports.summary import summary, summary_data, summary_warnings

    if output is None and is_stdin(source):  # a filter: stdin to stdout
        output = Path(STDOUT)
    out = output or default_artifact_path(source)
    if is_stdout(out) and fmt == "json":
        raise UsageError("the artifact goes to stdout (-o -), and so would --format json's "
                         "summary", hint="write the artifact to a file with -o, or leave "
                         "--format json out")
    check_output(out, suffixes=(".kvlayout.json", ".json"), force=force, parents=parents,
                 inputs=(source,), ours=is_artifact_text)
    with progress(len(PASSES) + 1, label="compile", quiet=quiet) as bar:
        artifact = compile_until(source, CompiledArtifact, memory=single_memory(memory),
                                 memory_name="--memory", track=bar.track)
        if not is_stdout(out):
            artifact.write(out)
        bar.advance("write")
    if is_stdout(out):
        click.echo(artifact.text(), nl=not artifact.text().endswith("\n"))
        for w in summary_warnings(artifact):
            warn(w, quiet=quiet)
        return
    if fmt == "json":
        echo_json({"ok": True, "file": str(out), **summary_data(artifact)})
    elif not quiet:
        click.echo(summary(artifact, warnings=False))
    if fmt != "json":
        for w in summary_warnings(artifact):
            warn(w, quiet=quiet)
    note(f"wrote {out}", quiet=quiet)


#: ``kvspec compile``'s exit codes and what each means (docs/cli.md).
EXITS = (
    (EXIT_OK, "the artifact was written"),
    (EXIT_INVALID, ("the source is invalid or cannot be planned (e.g. one request "
                    "at `max_model_len` does not fit `--memory`); nothing is written")),
    (EXIT_USAGE, USAGE),
)
#: Pages to read next (docs/cli.md).
SEE_ALSO = ("format.md", "concepts.md")
