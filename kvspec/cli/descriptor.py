"""``kvspec descriptor ARTIFACT``: one rank's cache as connectors read it (docs/connectors.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from kvspec.cli.common import (
    USAGE,
    check_output,
    dash_is_stdout,
    format_option,
    parents_option,
    quiet_option,
)
from kvspec.cli.common import command as cli_command
from kvspec.errors import EXIT_INVALID, EXIT_OK, EXIT_USAGE
from kvspec.files import emit
from kvspec.reports.format import count

#: ``--as`` targets (kvspec.connectors.exporters.EXPORTERS).
TARGETS = ("vllm-nixl", "lmcache", "dynamo")


def _ours(text: str) -> bool:
    """Whether a file is this command's earlier output (replaced without --force)."""
    head = text[:4096]
    return head.startswith("{") and ('"descriptor": "kvspec.descriptor/' in head or
                                     '"kv_caches_base_addr"' in text or
                                     '"engine_group_infos"' in text or '"layout_config"' in head)


@cli_command("descriptor", short_help="Print the connector descriptor of an artifact.")
@click.argument("artifact", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--rank", type=click.IntRange(min=0), default=0, show_default=True,
              help="The rank: pipeline stage x tensor-parallel size + tensor-parallel rank.")
@click.option("--num-blocks", type=click.IntRange(min=1),
              help="Blocks of the budget-sized pools (default: the artifact's budget or "
                   "fixed count, else the fewest one request needs).")
@click.option("--as", "target", type=click.Choice(TARGETS),
              help="Print it in a connector's format instead (JSON).")
@format_option("text", "json", help="text: a summary per region and group; json: the whole "
               "descriptor (schemas/descriptor.schema.json), or the --as format.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              callback=dash_is_stdout, help="Write the JSON here instead of stdout.")
@click.option("--force", is_flag=True, help="Replace an existing file that is not this "
              "command's output.")
@parents_option
@quiet_option
def command(artifact: Path, rank: int, num_blocks: int | None, target: str | None, fmt: str,
            output: Path | None, force: bool, parents: bool, quiet: bool) -> int:
    """Print the connector descriptor of ARTIFACT's rank --rank: its regions, and per
    group and layer where one block's bytes lie (offsets from each region's base, which
    is 0 here; LoadedCache.descriptor() gives the real addresses). --as prints what
    vLLM's NIXL connector, LMCache or Dynamo KVBM would read for the same cache, or
    names what that format cannot express."""
    # deferred: msgspec (the artifact reader, the descriptor, its exporters) loads when it runs
    from kvspec.artifact import Artifact
    from kvspec.connectors.describe import DescriptorError, check_num_blocks, describe
    from kvspec.connectors.exporters import export

    check_output(output, suffixes=(".json",), force=force, parents=parents,
                 inputs=(artifact,), ours=_ours)
    art = Artifact.read(artifact)
    check_num_blocks(art, num_blocks, "--num-blocks")
    engine = art.body.engine
    world = engine.tensor_parallel_size * engine.pipeline_parallel_size
    if rank >= world:
        raise DescriptorError(f"--rank {rank}: the deployment has {count(world, 'rank')} "
                         f"(tensor {engine.tensor_parallel_size} x pipeline "
                         f"{engine.pipeline_parallel_size})", expected=f"0..{world - 1}",
                         hint="rank = pipeline stage x tensor-parallel size + "
                              "tensor-parallel rank")
    desc = describe(art, rank=rank, num_blocks=num_blocks)
    if target is not None:
        text = json.dumps(export(desc, target), indent=1, sort_keys=True) + "\n"
    elif fmt == "json" or output is not None:
        text = desc.to_json()
    else:
        text = _summary(desc)
    emit(text, output, quiet=quiet)
    return EXIT_OK


def _summary(desc: Any) -> str:
    p = desc.parallel
    lines = [(f"{desc.name}: rank {p.rank} of {p.world_size} (tensor {p.tensor_rank} of "
              f"{p.tensor_parallel_size}, stage {p.pipeline_stage} of "
              f"{p.pipeline_parallel_size}), {desc.axis_order}, kv_cache_dtype "
              f"{desc.kv_cache_dtype}"), f"identity {desc.identity}",
             f"{'region':<12} {'memory':<6} {'bytes':>15}"]
    lines += [f"{r.id:<3}{r.name:<9} {r.memory:<6} {r.length:>15,}" for r in desc.regions]
    lines.append(f"{'group':<5} {'kind':<16} {'layers':>6} {'block':>5} {'blocks':>8} "
                 f"{'bytes/block':>11} {'runs':>5}  retention")
    for g in desc.groups:
        lines.append(f"{g.id:<5} {g.kind:<16} {len(g.layers):>6} {g.block_size:>5} "
                     f"{g.num_blocks:>8,} {g.bytes_per_block:>11,} {len(g.runs):>5}  "
                     f"{g.retention}")
    return "\n".join(lines) + "\n"


#: ``kvspec descriptor``'s exit codes and what each means (docs/cli.md).
EXITS = (
    (EXIT_OK, "the descriptor (or its export) was printed"),
    (EXIT_INVALID, ("the artifact cannot be read, the rank or block count is not one it "
                    "has, or the `--as` format cannot express the cache (the field named)")),
    (EXIT_USAGE, USAGE),
)
#: Pages to read next (docs/cli.md).
SEE_ALSO = ("connectors.md",)
