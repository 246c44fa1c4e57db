"""The ``kvspec`` command line: thin commands over the library.

One module per command, each exporting ``command``. Exit codes (documented in
docs/cli.md): 0 ok, 1 invalid input (a :class:`~kvspec.errors.KvspecError`),
2 usage error; a command may return its own code (``diff``: 1 when the plans
differ). :func:`main` is the one place that turns exceptions and codes into
exits.
"""

from __future__ import annotations

import importlib
import sys

import click

from kvspec import __version__
from kvspec.cli import common
from kvspec.errors import EXIT_INVALID, EXIT_USAGE, KvspecError

#: The command modules, in the order ``kvspec --help`` lists them.
COMMANDS = ("compile", "validate", "plan", "import_", "explain", "diff", "check", "schema",
            "init", "verify", "engine_args")


@click.group(context_settings={"help_option_names": ["-h", "--help"],
                                "max_content_width": 100})
@click.version_option(__version__, prog_name="kvspec")
@click.option("--no-color", is_flag=True,
              help="No colour in messages (also: the NO_COLOR environment variable).")
def cli(no_color: bool) -> None:
    """Declare, review and load KV-cache memory layouts."""
    common.COLOR = False if no_color else None


for _name in COMMANDS:
    cli.add_command(importlib.import_module(f"kvspec.cli.{_name}").command)


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI, turn errors into messages and exit codes."""
    try:
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


if __name__ == "__main__":  # pragma: no cover
    main()
