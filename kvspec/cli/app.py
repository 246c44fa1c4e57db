"""The click application: the top-level group, loading each command on demand.

A command's module is imported only when that command runs (or ``--help``
lists them all), so ``kvspec validate`` pays for nothing ``schema`` or
``explain`` needs.
"""

from __future__ import annotations

import importlib
import sys

import click

from kvspec._version import __version__
from kvspec.cli import common
from kvspec.cli.commands import COMMANDS
from kvspec.errors import EXIT_INVALID, EXIT_USAGE, KvspecError, UsageError

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
@click.version_option(__version__, prog_name="kvspec")
@click.option("--no-color", is_flag=True,
              help="No colour in messages (also: the NO_COLOR environment variable).")
def cli(no_color: bool) -> None:
    """Declare, review and load KV-cache memory layouts."""
    common.COLOR = False if no_color else None


def run(argv: list[str] | None) -> None:
    """Run the CLI, turn errors into messages and exit codes."""
    try:
        if argv is not None and any("\x00" in a for a in argv):   # only from Python: argv has none
            raise UsageError("an argument holds a NUL character",
                             found=ascii(next(a for a in argv if "\x00" in a)),
                             hint="no path or value can hold one; check how the "
                             "arguments were built")
        code = cli.main(args=argv, prog_name="kvspec", standalone_mode=False)
    except KvspecError as err:
        common.error(err)
        sys.exit(err.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(EXIT_INVALID)
    except click.ClickException as exc:
        exc.show()
        sys.exit(EXIT_USAGE if isinstance(exc, click.UsageError) else exc.exit_code)
    except BrokenPipeError:
        sys.exit(0)
    sys.exit(code if isinstance(code, int) else 0)
