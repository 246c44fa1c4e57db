"""A sweep's results file: the rows it holds, read and checked; each new row
appended whole and durably (docs/sweep.md, "Running, resuming, Ray").

* Each row is one line, written with one ``write`` and ``fsync``'d before the
  next. Reading drops a torn last line (a line without its newline that is the
  start of a row: a kill came mid-write); any other line that is not a row, and
  a row of another grid, is refused at its ``file:line``, unless ``force``
  starts the file afresh.
* An exclusive lock (``flock``) keeps two sweeps off one file. It is this
  process's alone: a forked child (a pool's worker) closes its copy of the
  descriptor at once (:func:`os.register_at_fork`), so a worker that outlives
  its sweep never keeps the file from being resumed.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from kvspec.errors import KvspecError
from kvspec.sweep.evaluate import ROW_KEYS
from kvspec.sweep.points import Sweep

__all__ = ["Results", "StreamResults", "is_results", "results_file"]

#: The results files open in this process (a forked child closes them).
_OPEN: weakref.WeakSet[Results] = weakref.WeakSet()


def _where(path: Path, number: int) -> dict[str, Any]:
    return {"file": str(path), "line": number}


def _torn(line: bytes) -> bool:
    """Whether a last line without its newline is the start of a row, cut by a
    kill mid-write (rows are written with sorted keys: ``{"KEY": ...``, KEY a row's),
    or a whole row that lost only its newline."""
    if _row(line + b"\n") is not None:
        return True
    try:
        json.loads(line)
        return False  # whole JSON, not a row: someone else's
    except ValueError:
        pass
    m = re.match(rb'\{\s*(?:"([a-z0-9_]*)("?))?\s*$|\{"([a-z0-9_]*)":', line)
    if m is None:
        return False
    key = (m.group(1) if m.group(1) is not None else m.group(3) or b"").decode()
    closed = m.group(2) == b'"' or m.group(3) is not None
    return key in ROW_KEYS if closed else any(k.startswith(key) for k in ROW_KEYS)


def _row(line: bytes) -> dict[str, Any] | None:
    """A complete line of the results file as its row, or None if it is not one."""
    if not line.endswith(b"\n"):
        return None
    try:
        row = json.loads(line)
    except ValueError:
        return None
    if not (isinstance(row, dict) and isinstance(row.get("id"), str)
            and isinstance(row.get("point"), dict) and isinstance(row.get("ok"), bool)
            and set(row) <= ROW_KEYS):
        return None
    return row


def is_results(text: str) -> bool:
    """Whether ``text`` is a sweep's results file, as far as its first line tells:
    empty, a row, or (no newline yet) the start of one a kill cut short."""
    first, nl, _ = text.partition("\n")
    line = first.encode()
    return not text or (_row(line + b"\n") is not None if nl else _torn(line))


class Results:
    """The results file: the rows it holds, and appending one."""

    def __init__(self, path: Path, *, force: bool = False) -> None:
        self.path = path
        self.force = force
        self.rows: dict[str, dict[str, Any]] = {}
        self.dropped = 0
        self.created = False
        self.replaced = False
        self._lines: dict[str, int] = {}
        self._written = 0
        self._fd: int | None = None

    def open(self) -> Results:
        """Create or open the file, lock it, read its rows, cut a torn last line.
        An ``OSError`` when it cannot be created or opened for writing."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_RDWR | os.O_APPEND | os.O_CLOEXEC
        try:
            fd = os.open(self.path, flags | os.O_CREAT | os.O_EXCL, 0o666)
            self.created = True
        except FileExistsError:
            fd = os.open(self.path, flags)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise KvspecError(f"{self.path}: another sweep is writing it", hint="wait for it "
                              "to finish, or give another file with -o") from None
        self._fd = fd
        _OPEN.add(self)
        try:
            self._read()
        except BaseException:
            self.close()
            raise
        return self

    def _read(self) -> None:
        assert self._fd is not None
        data = _read_all(self._fd)
        lines = data.splitlines(keepends=True)
        good = 0
        for number, line in enumerate(lines, 1):
            row = _row(line)
            if row is None and number == len(lines) and not line.endswith(b"\n") \
                    and _torn(line):
                self.dropped = 1  # the last line, cut short by a kill mid-write
                self._truncate(good)
                return
            if row is None:
                if self.force:
                    self._start_afresh()
                    return
                raise KvspecError(
                    "not a row of a sweep's results" + (
                        "" if line.endswith(b"\n") else " (its last line, not one a sweep "
                        "cut short)"), **_where(self.path, number),
                    found=line[:60].decode("utf-8", "replace").rstrip("\n") +
                    ("..." if len(line) > 60 else ""),
                    hint="a sweep only appends whole rows to its file: this one was written "
                    "by something else; give another file with -o, or pass --force to start "
                    "it afresh (its lines are lost)")
            self.rows.setdefault(row["id"], row)
            self._lines.setdefault(row["id"], number)
            good += len(line)

    def adopt(self, sweep: Sweep) -> None:
        """Refuse rows of another grid (another model, or other axes) at their line;
        ``force`` starts the file afresh instead. The rows of this grid's points
        before an edit (a value, a source, a trace changed) stay: they are not
        this sweep's points, and are not reported."""
        ids = {p.id for p in sweep.points}
        models = {p.params["model"] for p in sweep.points}
        shapes = {frozenset(p.params) for p in sweep.points}
        for pid, row in self.rows.items():
            point = row["point"]
            if pid in ids or (point.get("model") in models and frozenset(point) in shapes):
                continue
            if self.force:
                self._start_afresh()
                return
            axes = ", ".join(sorted(set(next(iter(shapes), ())) - {"model"}))
            raise KvspecError(
                "a row of another grid", **_where(self.path, self._lines[pid]),
                expected=f"a point of model {' or '.join(sorted(map(str, models)))}, axes "
                f"{axes}",
                found=f"model {point.get('model')!s}, axes "
                f"{', '.join(sorted(set(point) - {'model'}))}",
                hint="give each grid its own results file with -o (the default is GRID's "
                "name with .results.jsonl), or pass --force to start this one afresh (its "
                "rows are lost)")

    def _start_afresh(self) -> None:
        self.rows.clear()
        self._lines.clear()
        self.dropped = 0
        self.replaced = True
        self._truncate(0)

    def _truncate(self, size: int) -> None:
        assert self._fd is not None
        os.ftruncate(self._fd, size)
        os.fsync(self._fd)

    def append(self, row: dict[str, Any]) -> None:
        """Write ``row`` as one line, durably."""
        assert self._fd is not None
        if row["id"] in self.rows:
            return
        data = json.dumps(row, sort_keys=True).encode() + b"\n"
        while data:  # one write: a short one happens only when the disk is full
            data = data[os.write(self._fd, data):]
        os.fsync(self._fd)
        self.rows[row["id"]] = row
        self._written += 1

    def close(self, *, discard: bool = False) -> None:
        """Close (and unlock) the file; ``discard``: remove it when this sweep
        created it and wrote nothing (a sweep that stopped before its first row
        leaves no empty file)."""
        if self._fd is None:
            return
        if discard and self.created and not self._written:
            try:
                if os.fstat(self._fd).st_size == 0:
                    self.path.unlink()
            except OSError:
                pass
        os.close(self._fd)
        self._fd = None
        _OPEN.discard(self)

    def _forget(self) -> None:
        """In a forked child: close this process's copy of the descriptor, so the
        child holds neither the file nor its lock."""
        if self._fd is not None:
            with suppress(OSError):
                os.close(self._fd)
            self._fd = None


def _read_all(fd: int) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def _forget_in_child() -> None:
    for res in list(_OPEN):
        res._forget()


os.register_at_fork(after_in_child=_forget_in_child)


class StreamResults:
    """Rows written to a stream (``-o -``, a pipe): nothing to resume from."""

    def __init__(self, write: Callable[[str], None]) -> None:
        self.rows: dict[str, dict[str, Any]] = {}
        self.dropped = 0
        self.replaced = False
        self._write = write

    def adopt(self, sweep: Sweep) -> None:
        pass

    def append(self, row: dict[str, Any]) -> None:
        if row["id"] in self.rows:
            return
        self._write(json.dumps(row, sort_keys=True) + "\n")
        self.rows[row["id"]] = row

    def close(self, *, discard: bool = False) -> None:
        pass


@contextmanager
def results_file(path: Path, *, force: bool = False) -> Iterator[Results]:
    res = Results(path, force=force).open()
    try:
        yield res
    finally:
        res.close()
