"""What the commands share: output formats, errors, colour, sizes, paths, progress.

The contract every command keeps (docs/cli.md, "Conventions"):

* **Streams.** Results go to stdout; progress, warnings and "wrote ..." go to
  stderr, so a command's stdout can be piped. ``--quiet`` silences stderr's
  notes and warnings (errors are always printed).
* **Formats.** ``--format text|json`` on every command (:func:`format_option`;
  ``--json`` is an alias where it was one). Under ``--format json`` stdout is one
  JSON document, also when the command fails: an error is
  ``{"ok": false, "errors": [...]}``, each error with the fields the text
  message shows (:func:`error_document`), usage errors and missing files
  included.
* **Exit codes.** 0 ok, 1 the input is wrong, 2 usage, 130 interrupted
  (:data:`EXIT_CODES`); ``diff``, ``verify`` and ``check`` say what 1 means
  for them.
* **Colour** on a terminal only; never with ``--no-color`` (anywhere on the
  line: every command takes it), ``NO_COLOR`` set, or ``TERM=dumb``.
* **Progress** bars for long work on a terminal (:func:`progress`).
* **Output files** (:mod:`kvspec.cli.outputs`): the suffixes a command writes,
  ``--parents``, its own earlier output replaced without ``--force``.

A new command gets all of this by being declared with :func:`command` and
:func:`format_option`, raising :class:`~kvspec.errors.KvspecError` for what goes
wrong, and printing its result through :func:`echo_json` under ``json``.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from kvspec.cli.outputs import check_output, parents_option
from kvspec.cli.progress import progress
from kvspec.errors import EXIT_INVALID, EXIT_OK, EXIT_USAGE, KvspecError, UsageError
from kvspec.files import emit, is_stdin, is_stdout, parse_size

__all__ = ["EXIT_CODES", "EXIT_INTERRUPTED", "ExitWith", "FiniteRange", "write_result",
           "written_by",
           "check_output", "command", "echo_json", "error", "error_document", "format_option",
           "note", "parents_option", "progress", "quiet_option", "style", "use_color", "warn",
           "wants_json"]

#: ``--no-color`` sets this to False; None: colour on a terminal unless NO_COLOR or TERM=dumb.
COLOR: bool | None = None
#: The output format the running command was asked for (``--format``/``--json``), once
#: its options are read; ``kvspec.cli.app.run`` resets it for every command line.
FORMAT: str | None = None

#: Ctrl-C: the shell's convention, 128 + SIGINT.
EXIT_INTERRUPTED = 130
#: What every exit code means, for every command (docs/cli.md); a command's own table
#: may narrow 1 (``diff``: the plans differ).
EXIT_CODES = (
    (EXIT_OK, "success"),
    (EXIT_INVALID, ("the input is wrong: a file is missing, unreadable or invalid, or cannot "
                    "be planned (the message names the file, line and column, the YAML path, "
                    "what was expected and found, and a hint)")),
    (EXIT_USAGE, ("a usage error: an unknown option, a missing argument, a bad value or a "
                  "refused output path (the message has the same parts)")),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C); nothing half-written is left behind"),
)


class ExitWith(Exception):  # not an error of its own: an exit code for one
    """``error``, exiting with ``code`` instead of its own: ``diff`` and ``verify`` exit 2
    when a side does not load, since 1 means "the plans differ" there. The message is
    the error's, whole."""

    def __init__(self, error: KvspecError, code: int) -> None:
        super().__init__(error.message)
        self.error, self.code = error, code


def reset() -> None:
    """Forget the last command line's colour and format (``app.run`` calls it)."""
    global COLOR, FORMAT
    COLOR, FORMAT = None, None


def use_color() -> bool | None:
    """``click.echo``'s ``color``: False when asked for none, else click decides (a tty)."""
    if COLOR is False or os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    return COLOR


def style(text: str, **kw: Any) -> str:
    """``text`` styled for a terminal (click strips it when the stream is not one)."""
    return click.style(text, **kw) if use_color() is not False else text


def note(text: str, *, quiet: bool = False) -> None:
    """A note for the user on stderr (``wrote ...``)."""
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


def error_document(err: KvspecError) -> dict[str, Any]:
    """An error as ``--format json`` prints it: ``{"ok": false, "errors": [...]}``, one
    object per problem with the fields of the text message (type, message, file, line,
    column, path, expected, found, hint)."""
    data = err.as_dict()
    problems = data.get("errors", [data])
    return {"ok": False, "errors": problems}


def echo_json(obj: Any) -> None:
    """A command's JSON result on stdout: one document, sorted keys."""
    click.echo(json.dumps(obj, indent=1, sort_keys=True))


def wants_json(argv: Sequence[str]) -> bool:
    """Whether a command line asks for JSON (read before click parses it, so an error
    in parsing is printed as JSON too)."""
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        if arg == "--json" or arg == "--format=json" or (
                arg == "--format" and i + 1 < len(argv) and argv[i + 1] == "json"):
            return True
    return False


# -- declaring commands ------------------------------------------------------------------

def _no_color(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    global COLOR  # noqa: PLW0603 - the process's --no-color, read by every message
    if value:
        COLOR = False


def _no_color_option() -> click.Option:
    return click.Option(["--no-color"], is_flag=True, expose_value=False, is_eager=True,
                        callback=_no_color,
                        help="No colour in messages (also: NO_COLOR, or TERM=dumb).")


class Command(click.Command):
    """A kvspec command: it takes ``--no-color`` wherever it stands on the line."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.params.append(_no_color_option())


def command(name: str, **kwargs: Any) -> Callable[[Callable[..., Any]], click.Command]:
    """``@click.command(name, ...)`` for a kvspec command (:class:`Command`)."""
    return click.command(name, cls=Command, **kwargs)


def _remember_format(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    global FORMAT  # noqa: PLW0603 - the process's --format, read by every error
    if value is not None:
        FORMAT = value
    return value


def _remember_json(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    global FORMAT  # noqa: PLW0603 - as _remember_format
    if value:
        FORMAT = "json"
    return value


def format_option(*choices: str, default: str | None = "text", json_alias: bool = False,
                  help: str = "Output format.",  # noqa: A002 - click's name for it
                  ) -> Callable[[Callable[..., Any]], Any]:
    """``--format`` (``fmt`` in the command) with ``choices``; ``json_alias``: ``--json``
    too, the same as ``--format json``."""
    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        if json_alias:
            inner = f

            @functools.wraps(inner)
            def f(*args: Any, **kwargs: Any) -> Any:  # the command itself
                if kwargs.pop("as_json"):
                    if kwargs["fmt"] not in (None, default, "json"):
                        raise UsageError(f"--json and --format {kwargs['fmt']} disagree",
                                         hint="--json is --format json; give one of them")
                    kwargs["fmt"] = "json"
                return inner(*args, **kwargs)

            f = click.option("--json", "as_json", is_flag=True, is_eager=True,
                             callback=_remember_json, help="Same as --format json.")(f)
        return click.option("--format", "fmt", type=click.Choice(list(choices)),
                            default=default, show_default=default is not None,
                            is_eager=True, callback=_remember_format, help=help)(f)
    return decorate


def written_by(command: str) -> Callable[[str], bool]:
    """Whether a source's text is ``kvspec COMMAND``'s output, not yet reviewed, so the
    command may replace it without ``--force``. Its header says so: ``init`` writes
    ``# Generated by:`` with its command line and a "Review it before use" sentence
    (a reviewer replaces that, as the sources in layouts/ do); ``import`` writes two
    comment lines, and a reviewer adds to them.

    >>> ours = written_by("init")
    >>> ours("# Generated by:\\n#   kvspec init --from-hf c.json\\n# Review it before use: ...\\n")
    True
    >>> ours("# Generated by:\\n#   kvspec init --from-hf c.json\\n# Reviewed: fine.\\n")
    False
    """
    def header(text: str) -> list[str]:
        return list(itertools.takewhile(lambda line: line.startswith("#"),
                                        text[:16384].splitlines()))

    def init(text: str) -> bool:
        lines = header(text)
        return any(line.startswith("#   kvspec init ") for line in lines) \
            and any("Review it before use" in line for line in lines)

    def import_(text: str) -> bool:
        lines = header(text)
        return len(lines) == 2 and lines[0].startswith("# yaml-language-server: ") \
            and lines[1].startswith("# Imported by `kvspec import`")
    return {"init": init, "import": import_}[command]


def write_result(text: str, output: Path | None, fmt: str, *, quiet: bool) -> None:
    """A written source (``init``, ``import``): to ``output`` or stdout; under
    ``--format json``, ``{"ok", "output", "source"}`` on stdout (the file is written too)."""
    if fmt == "json":
        if output is not None:
            emit(text, output, quiet=True)
        echo_json({"ok": True, "output": str(output) if output else None, "source": text})
        return
    emit(text, output, quiet=quiet)


def source_output_options(command: str) -> Callable[[Callable[..., Any]], Any]:
    """``-o``, ``--force``, ``--parents``, ``--format`` and ``--quiet`` of a command
    that writes a source (``init``, ``import``: :func:`write_result`)."""
    options = (
        click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
                     callback=dash_is_stdout, help="Where to write the source, a .yaml file "
                     "(default, or -: stdout)."),
        click.option("--force", is_flag=True, help=f"Overwrite an existing file that "
                     f"`kvspec {command}` did not write."),
        parents_option,
        format_option("text", "json", help="json: the source and where it went, as one "
                      "object (docs/cli.md)."),
        quiet_option)

    def decorate(f: Callable[..., Any]) -> Any:
        for option in reversed(options):  # the first listed is the outermost, as stacked
            f = option(f)
        return f
    return decorate


class FiniteRange(click.FloatRange):
    """``click.FloatRange`` that refuses ``inf`` and ``nan`` (which compare to nothing,
    so a range alone lets ``nan`` through), naming the option."""

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return super().convert(number, param, ctx)


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
#: What exit code 130 means for every command.
INTERRUPTED = "interrupted (Ctrl-C)"

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


def default_artifact_path(source: Path) -> Path:
    """``X.yaml`` -> ``X.kvlayout.json`` beside it."""
    name = source.name
    if not name or name == "..":
        raise UsageError(f"{str(source) or repr(str(source))} is no layout source file",
                         found=repr(str(source)),
                         hint="give the path of a layout source, e.g. layouts/llama-3.1-8b.yaml")
    for suffix in (".yaml", ".yml"):
        name = name.removesuffix(suffix)
    return source.with_name(name + ".kvlayout.json")
