"""``kvspec explain``: a report of what a layout does with memory."""

from __future__ import annotations

from pathlib import Path

import click

from kvspec.cli.common import USAGE, dash_is_stdout, quiet_option, single_memory
from kvspec.errors import EXIT_INVALID, EXIT_OK, EXIT_USAGE

FORMAT_BY_SUFFIX = {".html": "html", ".htm": "html", ".md": "md", ".markdown": "md",
                    ".json": "json"}


@click.command("explain", short_help="Explain what a layout does with memory.")
@click.argument("layout", type=click.Path(path_type=Path))
@click.option("--memory", help="Memory per rank for the capacity (40GiB, 42949672960). "
              "Default: the source's engine.memory or the artifact's budget.")
@click.option("--format", "fmt", type=click.Choice(["text", "md", "html", "json"]),
              help="Output format (default: from -o's suffix, else text); json: the "
              "report's data (docs/reports.md).")
@click.option("-o", "--output", type=click.Path(path_type=Path), callback=dash_is_stdout,
              help="Write the report here (atomically) instead of stdout (-: stdout).")
@click.option("--force", is_flag=True, help="Overwrite an existing output file.")
@quiet_option
def command(layout: Path, memory: str | None, fmt: str | None, output: Path | None,
            force: bool, quiet: bool) -> None:
    """Explain LAYOUT (a source .yaml or a .kvlayout.json artifact): groups, pages,
    padding, pools, capacity for a budget, waste by cause and warnings."""
    # deferred: the report (Jinja2) and the compiler (pydantic, PyYAML) load when it runs
    from kvspec.files import emit, refuse_overwrite
    from kvspec.reports.explain import explain, render
    from kvspec.reports.explain.export import report_json

    if fmt is None:
        fmt = FORMAT_BY_SUFFIX.get(output.suffix.lower(), "text") if output else "text"
    refuse_overwrite(output, force, inputs=(layout,))
    report = explain(layout, memory=single_memory(memory))
    emit(report_json(report) if fmt == "json" else render(report, fmt), output, quiet=quiet)


#: ``kvspec explain``'s exit codes and what each means (docs/cli.md).
EXITS = (
    (EXIT_OK, "the report was printed or written (a budget too small for one "
              "request still gets a report, with a warning)"),
    (EXIT_INVALID, "the layout does not exist, does not compile, or is a tampered "
                   "artifact"),
    (EXIT_USAGE, USAGE),
)
#: Pages to read next (docs/cli.md).
SEE_ALSO = ("reports.md",)
