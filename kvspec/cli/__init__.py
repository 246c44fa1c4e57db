"""The ``kvspec`` command line: thin commands over the library.

One module per command, each exporting ``command``. Exit codes (documented in
docs/cli.md): 0 ok, 1 invalid input (a :class:`~kvspec.errors.KvspecError`),
2 usage error, 130 interrupted; a command may return its own code (``diff``: 1
when the plans differ). :func:`kvspec.cli.app.run` is the one place that turns
exceptions and codes into exits (and, under ``--format json``, errors into JSON
on stdout); :mod:`kvspec.cli.app` builds the click group, importing each
command's module only when it runs. What every command shares -- formats,
errors, colour, output files, progress -- is :mod:`kvspec.cli.common`.
"""

from __future__ import annotations

import sys
from typing import Any

from kvspec import _native
from kvspec._version import __version__
from kvspec.cli.commands import COMMANDS

__all__ = ["COMMANDS", "main"]


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI, turn errors into messages and exit codes.

    ``kvspec --version`` answers before anything else is imported."""
    args = sys.argv[1:] if argv is None else argv
    if args == ["--version"]:
        print(f"kvspec, version {__version__}\nsimulator: {_native.install()}")
        sys.exit(0)
    from kvspec.cli.app import run  # deferred: click and the command modules
    run(argv)


def __getattr__(name: str) -> Any:
    if name == "cli":  # the click group, built on first use
        from kvspec.cli.app import cli  # deferred: click and the command modules
        return cli
    raise AttributeError(name)


if __name__ == "__main__":  # pragma: no cover
    main()
