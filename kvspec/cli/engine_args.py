"""``kvspec engine-args ARTIFACT [--engine vllm|sglang]``: the flags that serve a plan."""

from __future__ import annotations

import json
from pathlib import Path

import click

from kvspec.cli.common import USAGE, format_option
from kvspec.cli.common import command as cli_command
from kvspec.errors import EXIT_INVALID, EXIT_OK, EXIT_USAGE


@cli_command("engine-args", short_help="Print the serving engine's flags for a plan.")
@click.argument("artifact", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--engine", type=click.Choice(["vllm", "sglang"]), default="vllm",
              show_default=True, help="The serving engine to print flags for.")
@click.option("--model", "model", help="The model to serve (default: the artifact's model).")
@click.option("--mode", type=click.Choice(["auto", "verify", "enforce"]), default="auto",
              show_default=True, help="vLLM: the plugin's KVSPEC_MODE in the environment "
              "line (auto: enforce where vLLM plans the artifact otherwise by design, else "
              "verify).")
@click.option("--pin-blocks", is_flag=True, help="vLLM: fix the block count "
              "(--num-gpu-blocks-override) instead of the memory budget.")
@format_option("text", "json", "shell", help="text (or shell): the command line; json: the "
               "flags as data.")
def command(artifact: Path, engine: str, model: str | None, mode: str, pin_blocks: bool,
            fmt: str) -> None:
    """Print the serving engine's flags for a plan.

    vLLM (the default): the plugin's environment line (KVSPEC_LAYOUT, KVSPEC_MODE),
    then block size, max model length, KV-cache dtype, prefix caching (which decides
    the Mamba cache mode), the hybrid manager, the scheduler settings the plan
    depends on, the budget (--kv-cache-memory-bytes or --num-gpu-blocks-override) and
    TP/PP/DCP; for a plan `pooling: auto` chose, what it changed. Settings with no
    flag are listed as comments. A plan of separate pools is refused: vLLM 0.33 holds
    one shared pool.

    SGLang: the pool sizes and ratios (--page-size, --max-total-tokens,
    --swa-full-tokens-ratio, --max-mamba-cache-size) that give the plan's pools,
    with --context-length, --max-running-requests and the radix cache. Needs
    neither engine."""
    # deferred: the artifact reader and the engines' flags load when it runs
    from kvspec.artifact import Artifact
    from kvspec.integrations.sglang import server_args as sglang
    from kvspec.integrations.vllm import engine_args as vllm

    art = Artifact.read(artifact)
    if engine == "sglang":
        found = sglang.server_args(art, str(artifact), model=model)
        data, text = sglang.as_json(found), sglang.render_shell(found)
    else:
        args = vllm.engine_args(art, str(artifact), model=model, mode=mode,
                                pin_blocks=pin_blocks)
        data, text = vllm.as_json(args), vllm.render_shell(args)
    if fmt == "json":
        click.echo(json.dumps(data, indent=1))
    else:
        click.echo(text, nl=False)


#: ``kvspec engine-args``'s exit codes and what each means (docs/cli.md).
EXITS = (
    (EXIT_OK, "the flags were printed"),
    (EXIT_INVALID, ("the artifact cannot be read, fails verification, or holds pools the "
                   "engine cannot serve")),
    (EXIT_USAGE, USAGE),
)
#: Pages to read next (docs/cli.md).
SEE_ALSO = ("vllm.md", "sglang.md")
