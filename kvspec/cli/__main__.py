"""``python -m kvspec.cli``: the command line."""

from kvspec.cli import main

main()
