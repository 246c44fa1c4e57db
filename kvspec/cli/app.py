"""The click application: the top-level group, loading each command on demand.

A command's module is imported only when that command runs (or ``--help``
lists them all), so ``kvspec validate`` pays for nothing ``schema`` or
``explain`` needs.
"""

from __future__ import annotations

import importlib
import sys

import click

from kvspec import _native
from kvspec._version import __version__
from kvspec.cli import common
from kvspec.cli.commands import COMMANDS
from kvspec.cli.progress import library_notes
from kvspec.cli.usage import as_usage_error
from kvspec.errors import KvspecError, UsageError

#: Command name -> module (``import`` lives in ``import_``, ``engine-args`` in ``engine_args``).
MODULES = {m.rstrip("_").replace("_", "-"): m for m in COMMANDS}


class _Commands(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(MODULES)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = MODULES.get(cmd_name)
        if module is None:
            return None
        return importlib.import_module(f"kvspec.cli.{module}").command


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"],
                                              "max_content_width": 100})
@click.version_option(__version__, prog_name="kvspec",
                      message="%(prog)s, version %(version)s\nsimulator: " + _native.install())
@click.option("--no-color", is_flag=True,
              help="No colour in messages (also: the NO_COLOR environment variable).")
def cli(no_color: bool) -> None:
    """Declare, review and load KV-cache memory layouts."""
    if no_color:  # (run() has already seen it anywhere on the line)
        common.COLOR = False


def run(argv: list[str] | None) -> None:
    """Run the CLI, turn errors into messages (or JSON documents) and exit codes."""
    args = list(sys.argv[1:] if argv is None else argv)
    common.reset()
    if "--no-color" in args[: args.index("--")] if "--" in args else "--no-color" in args:
        common.COLOR = False   # before parsing: a usage error is plain too
    try:
        try:
            if any("\x00" in a for a in args):   # only from Python: argv has none
                raise UsageError("an argument holds a NUL character",
                                 found=ascii(next(a for a in args if "\x00" in a)),
                                 hint="no path or value can hold one; check how the "
                                 "arguments were built")
            with library_notes(quiet="-q" in args or "--quiet" in args):
                code = cli.main(args=args, prog_name="kvspec", standalone_mode=False)
        except click.exceptions.Abort:   # click's name for Ctrl-C (and EOF at a prompt)
            raise KeyboardInterrupt from None
        except click.exceptions.Exit as exc:   # --help, --version
            code = exc.exit_code
        except click.ClickException as exc:
            raise as_usage_error(exc, args) from None
    except KvspecError as err:
        _fail(err, args)
        sys.exit(err.exit_code)
    except common.ExitWith as exc:
        _fail(exc.error, args)
        sys.exit(exc.code)
    except KeyboardInterrupt:
        _fail(Interrupted("interrupted", hint="run the command again; nothing "
                          "half-written was left behind"), args)
        sys.exit(common.EXIT_INTERRUPTED)
    except BrokenPipeError:
        sys.exit(0)
    sys.exit(code if isinstance(code, int) else 0)


class Interrupted(KvspecError):
    """The user pressed Ctrl-C (exit 130)."""

    exit_code = common.EXIT_INTERRUPTED


def _fail(err: KvspecError, args: list[str]) -> None:
    """Say what went wrong: JSON on stdout when the command line asked for JSON, the
    message on stderr otherwise."""
    if common.FORMAT == "json" or (common.FORMAT is None and common.wants_json(args)):
        try:
            common.echo_json(common.error_document(err))
            return
        except BrokenPipeError:
            return
    common.error(err)
