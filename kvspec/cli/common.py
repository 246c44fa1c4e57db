"""What the commands share: reading sizes and ranges, JSON output, paths."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from kvspec.errors import UsageError

#: ``kvspec diff`` exits 1 when the plans differ (0 when identical, 2 on error).
EXIT_DIFFER = 1

#: What exit code 2 means for every command.
USAGE = "a usage error: an unknown option, a missing argument, a bad value"

#: Most points a ``--memory A..B:STEP`` sweep may have.
MAX_SWEEP = 1000


def parse_bytes(text: str, *, option: str = "--memory") -> int:
    """``40GiB``, ``40 GB``, ``42949672960`` -> bytes (a usage error otherwise)."""
    from kvspec.files import parse_size
    return parse_size(text, what=option, error=UsageError)


def parse_memory_range(text: str) -> list[int]:
    """``20GiB..80GiB`` (7 points) or ``20GiB..80GiB:10GiB`` -> budgets."""
    span, _, step = text.partition(":")
    lo_s, _, hi_s = span.partition("..")
    lo, hi = parse_bytes(lo_s), parse_bytes(hi_s)
    if hi < lo:
        raise UsageError("--memory range must go from small to large", found=text)
    if step:
        inc = parse_bytes(step)
        if inc <= 0:
            raise UsageError("--memory range step must be positive", found=text)
        out, v = [], lo
        while v <= hi and len(out) < MAX_SWEEP:
            out.append(v)
            v += inc
        return out
    n = 7
    return sorted({lo + (hi - lo) * i // (n - 1) for i in range(n)})


def echo_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=1, sort_keys=True))


def default_artifact_path(source: Path) -> Path:
    """``X.yaml`` -> ``X.kvlayout.json`` beside it."""
    name = source.name
    for suffix in (".yaml", ".yml"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return source.with_name(name + ".kvlayout.json")
