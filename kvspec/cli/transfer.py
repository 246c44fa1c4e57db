"""``kvspec transfer SRC DST``: can blocks move between two deployments, and how
(docs/connectors.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from kvspec.cli.common import (
    USAGE,
    check_output,
    dash_is_stdout,
    echo_json,
    format_option,
    note,
    parents_option,
    quiet_option,
)
from kvspec.cli.common import command as cli_command
from kvspec.errors import EXIT_INVALID, EXIT_OK, EXIT_USAGE
from kvspec.files import shown, write_atomic


def _ours(text: str) -> bool:
    """Whether a file is this command's earlier plan (replaced without --force)."""
    return text.startswith('{"destination":') and '"kvspec_transfer_plan":' in text[:100_000]


@cli_command("transfer", short_help="Decide and plan block transfers between two artifacts.")
@click.argument("src", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("dst", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--src-num-blocks", type=click.IntRange(min=1),
              help="Blocks of SRC's budget-sized pools (default: its budget or fixed count, "
                   "else the fewest one request needs).")
@click.option("--dst-num-blocks", type=click.IntRange(min=1), help="The same for DST.")
@format_option("text", "json", help="text: the verdict and descriptor counts; json: those "
               "and the plan.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              callback=dash_is_stdout, help="Write the transfer plan (JSON) here.")
@click.option("--force", is_flag=True, help="Replace an existing file that is not a plan "
              "this command wrote.")
@parents_option
@quiet_option
def command(src: Path, dst: Path, src_num_blocks: int | None, dst_num_blocks: int | None,
            fmt: str, output: Path | None, force: bool, parents: bool, quiet: bool) -> int:
    """Decide whether blocks of SRC's KV cache can move to DST's (both compiled
    artifacts), and plan it: compatible (the same geometry), re-mappable (another
    tensor-parallel size, axis order, block size that divides, pipeline split or block
    count) or refused, naming the field. For each group, the descriptors one
    destination rank posts per block: kvspec's merged runs, a per-layer per-K/V
    connector's, and vLLM's NIXL connector's where it can move the cache."""
    # deferred: msgspec (the artifact reader, the transfer planner) loads when it runs
    from kvspec.artifact import Artifact
    from kvspec.connectors.describe import check_num_blocks
    from kvspec.connectors.transfer import plan_transfer

    check_output(output, suffixes=(".json",), force=force, parents=parents,
                 inputs=(src, dst), ours=_ours)
    src_art, dst_art = Artifact.read(src), Artifact.read(dst)
    check_num_blocks(src_art, src_num_blocks, "--src-num-blocks")
    check_num_blocks(dst_art, dst_num_blocks, "--dst-num-blocks")
    t = plan_transfer(src_art, dst_art, src_file=shown(src),
                      dst_file=shown(dst), src_blocks=src_num_blocks,
                      dst_blocks=dst_num_blocks)
    if output is not None:
        write_atomic(output, t.plan.to_json())
    if fmt == "json":
        echo_json(_as_json(t))
    else:
        click.echo(_text(t), nl=False)
    if output is not None:
        note(f"wrote {output}", quiet=quiet)
    return EXIT_OK


def _side(side: Any) -> dict[str, Any]:
    e = side.art.body.engine
    return {"file": side.file, "name": side.art.name, "identity": side.descs[0].identity,
            "tensor_parallel_size": e.tensor_parallel_size,
            "pipeline_parallel_size": e.pipeline_parallel_size, "axis_order": e.axis_order,
            "num_blocks": {p.name: p.num_blocks for p in side.descs[0].pools}}


def _as_json(t: Any) -> dict[str, Any]:
    groups = [{f: getattr(c, f) for f in c.__slots__} for c in t.counts]
    return {"ok": True, "verdict": t.verdict, "reasons": list(t.reasons),
            "source": _side(t.source),
            "destination": _side(t.destination), "groups": groups,
            "plan": json.loads(t.plan.to_json())}


def _line(label: str, side: Any) -> str:
    e = side.art.body.engine
    blocks = ", ".join(f"{p.name} {p.num_blocks:,}" for p in side.descs[0].pools)
    return (f"{label:<12} {side.file}: {side.art.name}, tensor {e.tensor_parallel_size} x "
            f"pipeline {e.pipeline_parallel_size}, {e.axis_order}, blocks: {blocks}")


def _text(t: Any) -> str:
    lines = [_line("source:", t.source), _line("destination:", t.destination),
             t.verdict + (": " + ", ".join(t.reasons) if t.reasons else
                          ": the same geometry, rank to rank")]
    lines.append("descriptors per destination block and rank:")
    lines.append(f"{'group':<5} {'kind':<16} {'layers':>6} {'block':>8} {'bytes':>10} "
                 f"{'from':>4} {'kvspec':>7} {'per-layer K/V':>13} {'vLLM NIXL':>9}")
    for c in t.counts:
        block = f"{c.src_block_size}->{c.dst_block_size}"
        vllm = "-" if c.vllm is None else str(c.vllm)
        lines.append(f"{c.key:<5} {c.kind:<16} {c.layers:>6} {block:>8} "
                     f"{c.bytes_per_block:>10,} {c.sources:>4} {c.descriptors:>7} "
                     f"{c.per_layer_kv:>13} {vllm:>9}")
    routes = t.plan.routes
    lines.append(f"plan: {len(routes)} route(s), {sum(len(r.runs) for r in routes):,} runs")
    return "\n".join(lines) + "\n"


#: ``kvspec transfer``'s exit codes and what each means (docs/cli.md).
EXITS = (
    (EXIT_OK, "blocks can move: compatible or re-mappable (the plan is written with `-o`)"),
    (EXIT_INVALID, ("refused (the message names the field and where it differs), or an "
                    "artifact cannot be read")),
    (EXIT_USAGE, USAGE),
)
#: Pages to read next (docs/cli.md).
SEE_ALSO = ("connectors.md",)
