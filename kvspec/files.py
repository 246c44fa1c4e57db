"""Reading and writing the user's files, with errors placed at the file.

Every command reads sources, dumps, configs and artifacts the same way: a
missing or unreadable file, or invalid JSON, is a :class:`KvspecError` naming
the file (and line and column for JSON), never a traceback. Writes are atomic:
a reader never sees a half-written file, and a failed command leaves the old
file as it was.

>>> parse_size("40GiB"), parse_size("80GB"), parse_size(1024)
(42949672960, 80000000000, 1024)
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from kvspec.errors import KvspecError, SourceError


def read_text(path: str | Path, *, what: str, hint: str | None = None,
              error: type[KvspecError] = SourceError) -> str:
    """The UTF-8 text of ``path``; ``what`` names the file in messages."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error("no such file", file=str(path), hint=hint) from None
    except IsADirectoryError:
        raise error(f"is a directory, not {what}", file=str(path), hint=hint) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"cannot read {what}: {exc}", file=str(path)) from None


def read_json(path: str | Path, *, what: str, hint: str | None = None,
              error: type[KvspecError] = SourceError) -> Any:
    """The parsed JSON of ``path`` (Infinity/NaN accepted, as Hub configs use them)."""
    text = read_text(path, what=what, hint=hint, error=error)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"not valid JSON: {exc.msg}", file=str(path), line=exc.lineno,
                    column=exc.colno) from None


def write_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` so a reader never sees a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        # mkstemp creates 0600; give the file the mode a plain open() would
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def parse_size(value: int | str, *, what: str = "memory",
               error: type[KvspecError] = KvspecError) -> int:
    """Bytes from an int or a size string (``40GiB``, ``512 MiB``, ``80GB``),
    read by pydantic's ``ByteSize``, the same parser the source format uses."""
    if isinstance(value, int):
        return value
    from pydantic import ByteSize, TypeAdapter, ValidationError

    try:
        return int(TypeAdapter(ByteSize).validate_python(str(value).strip()))
    except ValidationError:
        raise error(f"{what}: cannot read {value!r} as a size",
                    expected="bytes or a size like 40GiB, 512MiB, 80GB",
                    found=str(value)) from None


def refuse_overwrite(output: str | Path | None, force: bool) -> None:
    """A usage error when ``output`` exists and ``--force`` was not given."""
    from kvspec.errors import UsageError

    if output is not None and Path(output).exists() and not force:
        raise UsageError(f"{output} exists", hint="pass --force to overwrite it")


def emit(text: str, output: str | Path | None) -> None:
    """A command's result: to stdout, or written atomically to ``output``
    (saying so on stderr, so stdout stays clean for pipes)."""
    import click

    if output is None:
        click.echo(text, nl=False)
        return
    write_atomic(output, text)
    click.echo(f"wrote {output}", err=True)
