"""What the commands share: reading sizes and ranges, output streams and colour, paths.

Results go to stdout; progress, warnings and "wrote ..." go to stderr, so a
command's stdout can be piped. ``--quiet`` silences stderr's notes and
warnings (errors are always printed). Colour is used on a terminal only, and
never with ``NO_COLOR`` set or ``--no-color``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from kvspec.errors import KvspecError, UsageError
from kvspec.files import is_stdin, is_stdout, parse_size

#: ``--no-color`` sets this to False; None: colour on a terminal unless NO_COLOR.
COLOR: bool | None = None


def use_color() -> bool | None:
    """``click.echo``'s ``color``: False when asked for none, else click decides (a tty)."""
    if COLOR is False or os.environ.get("NO_COLOR"):
        return False
    return COLOR


def style(text: str, **kw: Any) -> str:
    """``text`` styled for a terminal (click strips it when the stream is not one)."""
    return click.style(text, **kw) if use_color() is not False else text


def note(text: str, *, quiet: bool = False) -> None:
    """A note for the user on stderr (``wrote ...``, progress)."""
    if not quiet:
        click.echo(text, err=True, color=use_color())


def warn(message: str, *, quiet: bool = False) -> None:
    """A warning on stderr."""
    if not quiet:
        click.echo(style("warning:", fg="yellow", bold=True) + " " + message, err=True,
                   color=use_color())


def error(err: KvspecError) -> None:
    """An error's message on stderr: ``error:`` in bold red and ``hint:`` in cyan
    on a terminal, plain text elsewhere."""
    message = err.render()
    head, sep, rest = message.partition("error:")
    if sep:
        message = head + style("error:", fg="red", bold=True) + rest
    message = message.replace("\n  hint:", "\n  " + style("hint:", fg="cyan"), 1)
    click.echo(message, err=True, color=use_color())


def quiet_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--quiet", "-q", is_flag=True,
                        help="Print no notes or warnings on stderr, only results and "
                             "errors.")(f)


def dash_is_stdout(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """``-o -``: no output file, the result goes to stdout (an option callback)."""
    return None if is_stdout(value) else value


def stdin_once(paths: tuple[Path, ...]) -> None:
    """A usage error when ``-`` (stdin) is given for more than one input."""
    if sum(map(is_stdin, paths)) > 1:
        raise UsageError("- (stdin) is given for more than one input; it can be read once",
                         found=" ".join(map(str, paths)),
                         hint="pipe one input in, and give the others as paths")


def single_memory(text: str | None, option: str = "--memory") -> int | None:
    """One size; a range (``A..B``) is a usage error here."""
    if text is None:
        return None
    if ".." in text:
        raise UsageError(f"{option} takes one size here, not a range", found=text,
                         hint="a range (20GiB..80GiB) is for `kvspec plan`")
    return parse_bytes(text, option=option)

#: ``kvspec diff`` exits 1 when the plans differ (0 when identical, 2 on error).
EXIT_DIFFER = 1

#: What exit code 2 means for every command.
USAGE = "a usage error: an unknown option, a missing argument, a bad value"

#: Most points a ``--memory A..B:STEP`` sweep may have.
MAX_SWEEP = 1000


def parse_bytes(text: str, *, option: str = "--memory") -> int:
    """``40GiB``, ``40 GB``, ``42949672960`` -> bytes (a usage error otherwise)."""
    return parse_size(text, what=option, error=UsageError)


def parse_memory_range(text: str) -> list[int]:
    """``20GiB..80GiB`` (7 points) or ``20GiB..80GiB:10GiB`` -> budgets."""
    span, _, step = text.partition(":")
    lo_s, _, hi_s = span.partition("..")
    lo, hi = parse_bytes(lo_s), parse_bytes(hi_s)
    if hi < lo:
        raise UsageError("--memory range must go from small to large", found=text,
                         expected="LOW..HIGH[:STEP], e.g. 20GiB..80GiB",
                         hint=f"swap the ends: {hi_s}..{lo_s}")
    if step:
        inc = parse_bytes(step)
        if inc <= 0:
            raise UsageError("--memory range step must be positive", found=text,
                             expected="LOW..HIGH:STEP, e.g. 20GiB..80GiB:10GiB",
                             hint="leave the step out for 7 points")
        points = (hi - lo) // inc + 1
        if points > MAX_SWEEP:
            raise UsageError(f"--memory range has {points:,} points; at most {MAX_SWEEP:,}",
                             found=text, hint="use a larger step")
        return [lo + i * inc for i in range(points)]
    n = 7
    return sorted({lo + (hi - lo) * i // (n - 1) for i in range(n)})


def echo_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=1, sort_keys=True))


def default_artifact_path(source: Path) -> Path:
    """``X.yaml`` -> ``X.kvlayout.json`` beside it."""
    name = source.name
    if not name or name == "..":
        raise UsageError(f"{str(source) or repr(str(source))} is no layout source file",
                         found=repr(str(source)),
                         hint="give the path of a layout source, e.g. layouts/llama-3.1-8b.yaml")
    for suffix in (".yaml", ".yml"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return source.with_name(name + ".kvlayout.json")
