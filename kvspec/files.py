"""Reading and writing the user's files, and reading sizes, with errors at the file.

Every command reads sources, dumps, configs and artifacts the same way: a
missing or unreadable file, or bytes that are not UTF-8 (at their line and
column), is a :class:`KvspecError` naming the file, never a traceback (the
readers of each format place invalid JSON or YAML at its line and column).
Writes are atomic (a reader never sees a half-written file; a failed command
leaves the old file as it was; a temporary file a killed writer left behind is
cleaned up by the next write), never go over the input, and never replace a
file that is not kvspec's own without ``--force``.

An input given as ``-`` is read from stdin (once: every reader of ``-`` in
one command gets the same text) and named ``<stdin>`` in messages.

Sizes have one strict grammar everywhere (flags, sources, the Python API):
an integer of bytes, or a number and a unit -- ``KiB MiB GiB TiB PiB`` (powers
of two), ``KB MB GB TB PB`` (powers of ten), ``B``.

>>> parse_size("40GiB"), parse_size("80GB"), parse_size(1024), parse_size("1.5 KiB")
(42949672960, 80000000000, 1024, 1536)
"""

from __future__ import annotations

import os
import re
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from kvspec.errors import KvspecError, SourceError, UsageError

_UNITS = {"": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
          "pib": 2**50, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "pb": 10**15}
_SIZE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)$")  # ASCII digits only
SIZE_EXPECTED = "bytes (42949672960) or a size: 40GiB, 512MiB (powers of 2), 80GB (of 10)"
#: Largest KV cache budget per rank a size may give: 256 TiB, far above any device
#: (or host offload tier), and block offsets into it stay far inside 64 bits.
MAX_MEMORY = 2**48


def _any_case(unit: str) -> str:
    return "".join(f"[{c.lower()}{c.upper()}]" for c in unit)


#: The same grammar as a JSON Schema pattern (ECMA-262, which has no case flag), from
#: the units themselves: a decimal only with a unit above a byte (whether it comes to
#: whole bytes, no pattern can say).
_BYTES = "|".join(_any_case(u) for u, f in _UNITS.items() if u and f == 1)
_LARGER = "|".join(_any_case(u) for u, f in _UNITS.items() if f > 1)
SIZE_PATTERN = rf"^\s*([0-9]+\s*({_BYTES})?|[0-9]+(\.[0-9]+)?\s*({_LARGER}))\s*$"
#: Temporary files of an atomic write, and how old one must be to be stale.
_TMP = ".kvspec-tmp-"
_STALE_S = 60.0


def size_bytes(value: object) -> int | None:
    """The bytes a size means, or None when it is not one (booleans are not)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if not isinstance(value, str):
        return None
    m = _SIZE.match(value.strip())
    if not m or m.group(2).lower() not in _UNITS:
        return None
    number, unit = m.group(1), _UNITS[m.group(2).lower()]
    if "." not in number:
        return int(number) * unit
    whole, frac = number.split(".")
    total = int(whole) * unit + int(frac) * unit // 10 ** len(frac)
    return total if int(frac) * unit % 10 ** len(frac) == 0 else None


def size_hint(value: object) -> str:
    """How to write a size that :func:`size_bytes` refused, from what was written."""
    if isinstance(value, bool):
        return "true and false are not sizes; write bytes or a size such as 40GiB"
    text = str(value).strip()
    if text.startswith("-"):
        return "a size cannot be negative"
    m = _SIZE.match(text)
    if m and m.group(2).lower() in _UNITS:  # a known unit: not a whole number of bytes
        return "a size is a whole number of bytes: use a smaller unit or fewer decimals"
    if m and m.group(2).lower() + "b" in _UNITS:  # "40G": a unit without its "B"
        number, unit = m.group(1), m.group(2).upper()
        return f"did you mean '{number}{unit}iB' (powers of 2) or '{number}{unit}B' (of 10)?"
    if re.search(r"[0-9][,_ ][0-9]", text):
        return "write the number without separators, e.g. 40000000000 or 40GB"
    return "one number and one unit: B, KiB, MiB, GiB, TiB, PiB, or KB, MB, GB, TB, PB"


def parse_size(value: int | str, *, what: str = "memory",
               error: type[KvspecError] = KvspecError) -> int:
    """Bytes from an int or a size string; ``error`` names ``what`` otherwise."""
    n = size_bytes(value)
    if n is None:
        raise error(f"{what}: cannot read {value!r} as a size", expected=SIZE_EXPECTED,
                    found=repr(value), hint="no commas, one number, one unit")
    if n > MAX_MEMORY:
        raise error(f"{what}: {value} is more memory than any rank has", expected="at most "
                    "256TiB per rank", found=repr(value), hint=MEMORY_HINT)
    return n


#: The hint for a size above :data:`MAX_MEMORY`.
MEMORY_HINT = "the budget is per rank (one GPU's KV cache), e.g. 40GiB: check the unit"


# ---------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------


def _position(data: bytes, at: int) -> tuple[int, int]:
    """1-based (line, column) of byte ``at`` (the column counts characters)."""
    start = data.rfind(b"\n", 0, at) + 1
    return data.count(b"\n", 0, at) + 1, len(data[start:at].decode("utf-8", "replace")) + 1


#: ``-`` as an input: stdin, named :data:`STDIN_NAME` in messages.
STDIN = "-"
STDIN_NAME = "<stdin>"
_stdin_read: tuple[object, bytes] | None = None  # (the stream, what it held)


def is_stdin(path: str | Path | None) -> bool:
    return path is not None and str(path) == STDIN


def shown(path: str | Path) -> str:
    """How messages name the input ``path`` (``<stdin>`` for ``-``)."""
    return STDIN_NAME if is_stdin(path) else str(path)


def _stdin_bytes() -> bytes:
    """All of stdin, read once per stream (a command may look at its input twice:
    ``explain -`` tells a source from an artifact by its text, then reads it)."""
    global _stdin_read  # noqa: PLW0603 - stdin is read once per process
    stream = sys.stdin
    if _stdin_read is not None and _stdin_read[0] is stream:
        return _stdin_read[1]
    if stream is None:
        raise OSError("stdin is closed")
    buffer = getattr(stream, "buffer", None)
    data = buffer.read() if buffer is not None else stream.read().encode("utf-8")
    _stdin_read = (stream, data)
    return data


def read_text(path: str | Path, *, what: str, hint: str | None = None,
              error: type[KvspecError] = SourceError) -> str:
    """The UTF-8 text of ``path`` (stdin for ``-``); ``what`` names the file in
    messages."""
    if is_stdin(path):
        try:
            data = _stdin_bytes()
        except (OSError, ValueError) as exc:  # closed, or not readable
            raise error(f"cannot read {what} from stdin: {exc}", file=STDIN_NAME,
                        hint="pipe the file in (kvspec validate - < model.yaml), or give "
                        "its path") from None
        return _decoded(data, STDIN_NAME, what, error)
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise error("no such file", file=str(path), hint=hint) from None
    except IsADirectoryError:
        raise error(f"is a directory, not {what}", file=str(path), hint=hint) from None
    except OSError as exc:
        raise error(f"cannot read {what}: {exc.strerror or exc}", file=str(path),
                    hint=hint or "check the path and its permissions") from None
    return _decoded(data, str(path), what, error)


def _decoded(data: bytes, file: str, what: str, error: type[KvspecError]) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line, column = _position(data, exc.start)
        raise error(f"{what} is not UTF-8 text: byte {data[exc.start]:#04x} cannot be "
                    "decoded", file=file, line=line, column=column,
                    hint="save the file as UTF-8") from None


# ---------------------------------------------------------------------------
# writing
# ---------------------------------------------------------------------------


def _clean_stale(path: Path) -> None:
    """Remove temporaries a killed writer of ``path`` left behind."""
    now, prefix = time.time(), f".{path.name}{_TMP}"
    for tmp in path.parent.iterdir():   # not glob: the name may hold * ? [
        if not tmp.name.startswith(prefix):
            continue
        try:
            if now - tmp.stat().st_mtime > _STALE_S:
                tmp.unlink()
        except OSError:
            pass


#: ``-o -``: the result goes to stdout.
STDOUT = "-"


def is_stdout(output: str | Path | None) -> bool:
    return output is not None and str(output) == STDOUT


def _kind(path: Path) -> str | None:
    """What an existing ``path`` is, its links followed: ``file``, ``dir``,
    ``stream`` (a character device such as /dev/null or a terminal, a pipe:
    written in place), ``other`` (a block device, a socket); None if absent."""
    try:
        mode = path.stat().st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    return "stream" if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode) else "other"


def _write_stream(path: Path, text: str | Iterable[str]) -> None:
    try:
        with open(path, "w", encoding="utf-8") as fh:
            _write(fh, text)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}", file=str(path),
                         hint="give -o a path in a writable directory, or - for stdout"
                         ) from None


def _mode_for(path: Path) -> int:
    """The mode a file written at ``path`` gets: the one it has when it exists (a
    replace keeps it, as writing in place would), else what open() would give."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _sync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable, where the file system allows it."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write(fh: Any, text: str | Iterable[str]) -> None:
    if isinstance(text, str):
        fh.write(text)
    else:
        fh.writelines(text)   # lines streamed: a long file never held whole


def write_atomic(path: str | Path, text: str | Iterable[str]) -> None:
    """Write ``text`` (or its lines, streamed) to ``path`` so a reader never sees
    a half-written file;
    a :class:`KvspecError` (``UsageError``) when the path cannot be written. The
    file is synced before it is renamed into place, and the rename after, so a
    crash or power loss leaves the old file or the new one, never an empty one.

    A symbolic link stays: its target is written. A character device or a pipe
    (``/dev/null``, ``/dev/stdout``, a FIFO) is written in place, never replaced;
    a block device or a socket is refused."""
    path = Path(path)
    kind = _kind(path)
    if kind == "stream":
        _write_stream(path, text)
        return
    if kind == "other":
        raise UsageError(f"cannot write {path}: it is a device or socket, not a file",
                         file=str(path), hint="give -o a file path, or - for stdout")
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    blocker = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise UsageError(f"cannot write {path}: {blocker} is a file, not a directory",
                         file=str(path), hint="give -o a path in a writable directory")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_dir():
            raise IsADirectoryError(21, "is a directory")
        _clean_stale(path)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}{_TMP}", dir=path.parent)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: cannot create a file in {path.parent} "
                         f"({exc.strerror or exc})", file=str(path),
                         hint="give -o a path in a writable directory") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            _write(fh, text)
            fh.flush()
            os.fsync(fh.fileno())   # the bytes are on disk before the name points at them
        os.chmod(tmp, _mode_for(path))   # mkstemp creates 0600
        os.replace(tmp, path)
        _sync_directory(path.parent)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}", file=str(path),
                         hint="give -o a path in a writable directory") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def same_file(a: str | Path, b: str | Path) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve() or os.path.samefile(a, b)
    except OSError:
        return False


def refuse_overwrite(output: str | Path | None, force: bool, *,
                     inputs: tuple[str | Path, ...] = (),
                     ours: Callable[[str], bool] | None = None) -> None:
    """A usage error when writing ``output`` would lose something: it is one of the
    ``inputs`` (never, even with ``--force``), or it exists and ``--force`` was not
    given (unless ``ours(text)`` says it is kvspec's own kind of file, which the
    command regenerates)."""
    if output is None:
        return
    for i in inputs:
        if same_file(output, i):
            raise UsageError(f"{output} is the input: writing it would lose it",
                             hint="give -o another path")
    path = Path(output)
    kind = _kind(path)
    if kind == "stream":   # /dev/null, /dev/stdout, a pipe: nothing there to lose
        return
    if kind is None or force:
        return
    if ours is not None and path.is_file():
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            text = ""
        if ours(text):
            return
    what = " and is not a file kvspec wrote" if ours is not None else ""
    raise UsageError(f"{output} exists{what}", hint="pass --force to overwrite it")


def emit(text: str, output: str | Path | None, *, quiet: bool = False) -> None:
    """A command's result: to stdout, or written atomically to ``output``
    (saying so on stderr, so stdout stays clean for pipes)."""
    import click  # deferred: click (only a command writes output)

    if output is None:
        click.echo(text, nl=False)
        return
    write_atomic(output, text)
    if not quiet:
        click.echo(f"wrote {output}", err=True)
