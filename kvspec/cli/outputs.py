"""When a command may write its ``-o`` file: the one policy every command keeps.

* The file's suffix must be one the command writes (``explain -o r.pdf`` would
  be HTML in a file that says PDF): the error names the suffixes it does write.
  A device or a pipe (``/dev/null``, ``/dev/stdout``, a FIFO) has no suffix to
  check, and ``-`` is stdout.
* Its directory must exist, unless ``--parents`` asks to create it (as
  ``mkdir -p`` would): a typo in a path is not silently made into directories.
* An existing file is replaced only when it is the command's own earlier output,
  recognised by its content (``ours``), or with ``--force``; the command's input
  never is, even with ``--force``.

>>> check_output(Path("report.pdf"), suffixes=(".html", ".md"))  # doctest: +NORMALIZE_WHITESPACE
Traceback (most recent call last):
...
kvspec.errors.UsageError: kvspec: error: report.pdf: this command writes .html or .md files,
  not .pdf
  found: report.pdf
  hint: name the output report.html or report.md (or - for stdout)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from kvspec.errors import UsageError
from kvspec.files import _kind, is_stdout, refuse_overwrite, same_file

__all__ = ["check_output", "jsonl_with", "parents_option"]


def parents_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--parents``: create the output's missing directories (a command option)."""
    return click.option("--parents", is_flag=True,
                        help="Create the output's missing directories.")(f)


def jsonl_with(*keys: str) -> Callable[[str], bool]:
    """``ours`` for a JSONL output: its first line is an object with these ``keys``.

    >>> jsonl_with("id", "ok")('{"id": 1, "ok": true}\\n')
    True
    """
    def ours(text: str) -> bool:
        try:
            row = json.loads(text.split("\n", 1)[0])
        except ValueError:
            return False
        return isinstance(row, dict) and set(keys) <= set(row)
    return ours


def _suffix(path: Path, suffixes: Sequence[str]) -> str | None:
    """The suffix of ``path`` among ``suffixes`` (longest first: ``.kvlayout.json``)."""
    name = path.name.lower()
    return next((s for s in sorted(suffixes, key=len, reverse=True) if name.endswith(s)), None)


def _or(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]


def check_output(output: str | Path | None, *, suffixes: Sequence[str], force: bool = False,
                 parents: bool = False, inputs: tuple[str | Path, ...] = (),
                 ours: Callable[[str], bool] | None = None) -> None:
    """A :class:`UsageError` when writing ``output`` breaks the policy above; None
    (stdout) and ``-`` pass."""
    if output is None or is_stdout(output):
        return
    path = Path(output)
    if any(same_file(path, i) for i in inputs):
        raise UsageError(f"{path} is the input: writing it would lose it", found=str(path),
                         hint="give -o another path")
    kind = _kind(path)
    if kind in ("stream", "other", "dir"):  # nothing to name: written in place, or refused
        refuse_overwrite(path, force, inputs=inputs, ours=ours)
        return
    blocker = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise UsageError(f"cannot write {path}: {blocker} is a file, not a directory",
                         file=str(path), hint="give -o a path in a writable directory")
    if _suffix(path, suffixes) is None:
        stem = path.name.split(".", 1)[0] or "out"
        found = path.suffix or "a name without one"
        raise UsageError(f"{path}: this command writes {_or(list(suffixes))} files, "
                         f"not {found}", found=str(path),
                         hint=f"name the output {_or([stem + s for s in suffixes[:4]])} "
                         "(or - for stdout)")
    parent = path.parent
    if not parent.exists() and not path.is_symlink() and not parents:
        raise UsageError(f"{path}: the directory {parent} does not exist", found=str(path),
                         hint="create it first, or pass --parents to create it")
    refuse_overwrite(path, force, inputs=inputs, ours=ours)
