"""``kvspec verify SOURCE|ARTIFACT --against vllm``: does vLLM plan what kvspec plans?

Exit status: 0 the plans agree, 1 they differ (with ``--allow-by-design``: only
where the by-design table does not explain it), 2 the check cannot run (vLLM
missing or another version, a layout that does not load, a bad command line).
"""

from __future__ import annotations

from pathlib import Path

import click

from kvspec.cli.common import ExitWith, format_option, single_memory
from kvspec.cli.common import command as cli_command
from kvspec.errors import EXIT_INVALID, EXIT_OK, EXIT_USAGE, KvspecError


@cli_command("verify", short_help="Check a plan against the installed vLLM's own planner.")
@click.argument("layout", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--against", type=click.Choice(["vllm"]), required=True,
              help="The engine whose own planner checks the plan (the installed vLLM).")
@click.option("--memory", "--kv-cache-memory-bytes", "memory",
              help="KV cache memory per rank to compare at (40GiB). Default: "
              "the layout's budget, else twice what one request needs.")
@click.option("--allow-by-design", is_flag=True, help="Exit 0 when every difference is "
              "one the by-design table explains (docs/vllm.md).")
@format_option("text", "md", "json")
@click.option("--quiet", "-q", is_flag=True,
              help="Print nothing; only the exit status says whether the plans agree.")
def command(layout: Path, against: str, memory: str | None, allow_by_design: bool,
            fmt: str, quiet: bool) -> int:
    """Check a plan against the installed vLLM's own planner.

    Plan LAYOUT (a source or an artifact) with vLLM's planning code and compare it
    with kvspec's plan field by field: groups and their order,
    block and page sizes, padding, num_blocks, tensors per stage, scheduler and
    hash block sizes, max concurrency and token capacity. Differences the
    reference planner and upstream vLLM have on purpose are marked "differs by
    design" with the rule's name. Needs kvspec[vllm]."""
    # deferred: the vLLM bridge and the compiler (pydantic, PyYAML) load when it runs
    from kvspec.integrations import vllm as bridge
    from kvspec.integrations.vllm.render import render
    from kvspec.integrations.vllm.verify import verify_path

    mem = single_memory(memory)
    try:
        adapter = bridge.adapter()
        verdict = verify_path(layout, memory=mem, adapter=adapter)
    except KvspecError as err:
        raise ExitWith(err, EXIT_USAGE) from None  # 1 means "the plans differ" here
    if not quiet:
        click.echo(render(verdict, fmt), nl=False)
    if verdict.agrees or (allow_by_design and verdict.by_design_only):
        return EXIT_OK
    return EXIT_INVALID


#: ``kvspec verify``'s exit codes and what each means (docs/cli.md).
EXITS = (
    (EXIT_OK, ("kvspec and the installed vLLM plan the same (with `--allow-by-design`: "
               "they differ only where the by-design table says so)")),
    (EXIT_INVALID, ("the plans differ; the table names each field, both values and, "
                    "where one explains it, the by-design rule")),
    (EXIT_USAGE, ("the check cannot run: vLLM is not installed (the message names the "
                  "extra) or is another version, the layout does not load, or a bad "
                  "command line")),
)
#: Pages to read next (docs/cli.md).
SEE_ALSO = ("vllm.md",)
