"""``kvspec explain``: a report of what a layout does with memory."""

from __future__ import annotations

from pathlib import Path

import click

from kvspec.cli.common import USAGE
from kvspec.errors import EXIT_INVALID, EXIT_OK, EXIT_USAGE

FORMAT_BY_SUFFIX = {".html": "html", ".htm": "html", ".md": "md", ".markdown": "md"}


@click.command("explain")
@click.argument("layout", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--memory", help="Memory per rank for the capacity (40GiB, 42949672960). "
              "Default: the source's engine.memory or the artifact's budget.")
@click.option("--format", "fmt", type=click.Choice(["text", "md", "html"]),
              help="Output format (default: from -o's suffix, else text).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the report here (atomically) instead of stdout.")
def command(layout: Path, memory: str | None, fmt: str | None, output: Path | None) -> None:
    """Explain LAYOUT (a source .yaml or a .kvlayout.json artifact): groups, pages,
    padding, pools, capacity for a budget, waste by cause and warnings."""
    from kvspec.cli.common import parse_bytes
    from kvspec.files import emit
    from kvspec.reports.explain import explain, render

    if fmt is None:
        fmt = FORMAT_BY_SUFFIX.get(output.suffix.lower(), "text") if output else "text"
    report = explain(layout, memory=parse_bytes(memory) if memory else None)
    text = render(report, fmt)
    emit(text, output)


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
