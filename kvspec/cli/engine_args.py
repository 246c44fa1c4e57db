"""``kvspec engine-args ARTIFACT --engine vllm``: the flags that reproduce a plan."""

from __future__ import annotations

import json
from pathlib import Path

import click

from kvspec.cli.common import USAGE, format_option
from kvspec.cli.common import command as cli_command
from kvspec.errors import EXIT_INVALID, EXIT_OK, EXIT_USAGE


@cli_command("engine-args", short_help="Print the vllm serve flags that reproduce a plan.")
@click.argument("artifact", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--engine", type=click.Choice(["vllm"]), required=True,
              help="The serving engine to print flags for.")
@click.option("--model", "model", help="The model to serve (default: the artifact's model).")
@click.option("--mode", type=click.Choice(["verify", "enforce"]), default="verify",
              show_default=True, help="The plugin's KVSPEC_MODE in the environment line.")
@click.option("--pin-blocks", is_flag=True, help="Fix the block count "
              "(--num-gpu-blocks-override) instead of the memory budget.")
@format_option("text", "json", "shell", help="text (or shell): the command line; json: the "
               "flags as data.")
def command(artifact: Path, engine: str, model: str | None, mode: str, pin_blocks: bool,
            fmt: str) -> None:
    """Print the vllm serve flags that reproduce a plan.

    The command line for ARTIFACT's plan: the plugin's environment line (KVSPEC_LAYOUT,
    KVSPEC_MODE), then block size, max model length, KV-cache dtype, prefix caching
    (which decides the Mamba cache mode), the hybrid manager, the scheduler settings the
    plan depends on, the budget (--kv-cache-memory-bytes or --num-gpu-blocks-override)
    and TP/PP/DCP. Settings with no flag are listed as comments. Needs no vLLM."""
    # deferred: the artifact reader and the vLLM bridge's flags load when it runs
    from kvspec.compiled import read
    from kvspec.integrations.vllm.engine_args import as_json, engine_args, render_shell

    art = read(artifact)
    args = engine_args(art, str(artifact), model=model, mode=mode, pin_blocks=pin_blocks)
    if fmt == "json":
        click.echo(json.dumps(as_json(args), indent=1))
    else:
        click.echo(render_shell(args), nl=False)


#: ``kvspec engine-args``'s exit codes and what each means (docs/cli.md).
EXITS = (
    (EXIT_OK, "the flags were printed"),
    (EXIT_INVALID, "the artifact cannot be read, or fails verification"),
    (EXIT_USAGE, USAGE),
)
#: Pages to read next (docs/cli.md).
SEE_ALSO = ("vllm.md",)
