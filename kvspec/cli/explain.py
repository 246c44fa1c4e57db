"""``kvspec explain``: a report of what a layout does with memory."""

from __future__ import annotations

from pathlib import Path

import click

from kvspec.cli.common import (
    USAGE,
    check_output,
    dash_is_stdout,
    format_option,
    note,
    parents_option,
    progress,
    quiet_option,
    single_memory,
)
from kvspec.cli.common import command as cli_command
from kvspec.errors import EXIT_INVALID, EXIT_OK, EXIT_USAGE

#: The suffixes of each output format; the first names the format's files in messages.
SUFFIXES = {"html": (".html", ".htm"), "md": (".md", ".markdown"), "json": (".json",),
            "text": (".txt", ".text")}
FORMAT_BY_SUFFIX = {s: fmt for fmt, suffixes in SUFFIXES.items() for s in suffixes}
#: Every suffix explain writes, each format's first suffix first.
ALL_SUFFIXES = tuple(dict.fromkeys([s[0] for s in SUFFIXES.values()] + list(FORMAT_BY_SUFFIX)))


@cli_command("explain", short_help="Explain what a layout does with memory.")
@click.argument("layout", type=click.Path(path_type=Path))
@click.option("--memory", "--kv-cache-memory-bytes", "memory",
              help="Memory per rank for the capacity (40GiB, 42949672960). "
              "Default: the source's engine.memory or the artifact's budget.")
@format_option("text", "md", "html", "json", default=None,
               help="Output format (default: from -o's suffix, else text); json: the "
               "report's data (docs/reports.md).")
@click.option("-o", "--output", type=click.Path(path_type=Path), callback=dash_is_stdout,
              help="Write the report here (atomically) instead of stdout (-: stdout); "
              "its suffix is the format's: .txt, .md, .html or .json.")
@click.option("--force", is_flag=True, help="Overwrite an existing file that is not a "
              "kvspec report.")
@parents_option
@quiet_option
def command(layout: Path, memory: str | None, fmt: str | None, output: Path | None,
            force: bool, parents: bool, quiet: bool) -> None:
    """Explain LAYOUT (a source .yaml or a .kvlayout.json artifact): groups, pages,
    padding, pools, capacity for a budget, waste by cause and warnings."""
    # deferred: the report (Jinja2) and the compiler (pydantic, PyYAML) load when it runs
    from kvspec.files import emit
    from kvspec.reports.explain import build_report, read_subject, render
    from kvspec.reports.explain.export import is_report_text, report_json

    allowed = SUFFIXES[fmt] if fmt is not None else ALL_SUFFIXES
    check_output(output, suffixes=allowed, force=force, parents=parents, inputs=(layout,),
                 ours=is_report_text)
    if fmt is None:
        fmt = FORMAT_BY_SUFFIX.get(_suffix(output), "text") if output else "text"
    budget = single_memory(memory)
    with progress(4, label="explain", quiet=quiet) as bar:
        bar.advance("plan", 0)
        subject = read_subject(layout, budget, replanned=False)
        bar.advance("report")
        report = build_report(subject)
        bar.advance(f"render {fmt}")
        text = report_json(report) if fmt == "json" else render(report, fmt)
        bar.advance("write")
        emit(text, output, quiet=True)
        bar.advance("done")
    if output is not None:
        note(f"wrote {output}", quiet=quiet)


def _suffix(path: Path) -> str:
    name = path.name.lower()
    return next((s for s in sorted(FORMAT_BY_SUFFIX, key=len, reverse=True)
                 if name.endswith(s)), path.suffix.lower())


#: ``kvspec explain``'s exit codes and what each means (docs/cli.md).
EXITS = (
    (EXIT_OK, ("the report was printed or written (a budget too small for one "
               "request still gets a report, with a warning)")),
    (EXIT_INVALID, ("the layout does not exist, does not compile, or is a tampered "
                    "artifact")),
    (EXIT_USAGE, USAGE),
)
#: Pages to read next (docs/cli.md).
SEE_ALSO = ("reports.md",)
