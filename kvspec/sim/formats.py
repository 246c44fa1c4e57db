"""Request traces in the formats users have, read row by row into trace requests.

One module: each format is a small row reader (the names: :data:`FORMATS`); they
share the CSV and JSON Lines scanning, the step clock and the positioned errors.

* ``kvspec`` -- kvspec's own JSONL trace (:mod:`kvspec.sim.trace`);
* ``azure-2023``, ``azure-2024`` -- the Azure LLM inference traces: CSV with
  ``TIMESTAMP`` (a date and time), ``ContextTokens``, ``GeneratedTokens``;
* ``mooncake`` -- Mooncake's FAST'25 traces: JSONL with ``timestamp`` (ms since
  the first request), ``input_length``, ``output_length`` and ``hash_ids`` (one id
  per 512-token block; the blocks become the request's ``prefix_blocks``, so
  prefix-cache hits follow the real reuse, :mod:`kvspec.sim.chains`);
* ``burstgpt`` -- BurstGPT: CSV with ``Timestamp`` (s), ``Model``, ``Request
  tokens``, ``Response tokens``, ``Total tokens``, ``Log Type``; rows with 0
  response tokens (the failures BurstGPT keeps, its README says) or 0 request
  tokens are skipped, and counted;
* ``lengths`` -- any CSV or JSONL of prompt and output lengths, with a column map
  (:class:`Columns`): ``prompt=input_len,output=output_len`` and, optionally,
  ``time=ts`` (in ``time_unit``, s or ms); without a time column every request
  arrives at step 0.

Arrival times become engine steps through a declared step time: the request
arriving ``t`` seconds after the first joins the waiting queue at step
``floor(t / step)``, ``step`` = ``step_ms`` (default :data:`DEFAULT_STEP_MS`).
Times must not decrease; numbers of s or ms lie in 0..2^33 s (:data:`MAX_TIME_S`).
Counts and arrivals keep :data:`kvspec.sim.trace.BOUNDS`, simulate's own rule. Rows
are read one at a time (:func:`iter_requests`; gzip'ed or not, ``-``: stdin), so a
conversion holds one row in memory; every problem is a
:class:`~kvspec.sim.trace.TraceError` at ``file:line:column``.

>>> import tempfile, os
>>> d = tempfile.mkdtemp(); p = os.path.join(d, "a.csv")
>>> _ = open(p, "w").write("TIMESTAMP,ContextTokens,GeneratedTokens\\n"
...     "2023-11-16 18:15:46.6805900,374,44\\n2023-11-16 18:15:46.7805900,396,109\\n")
>>> detect(p), [(r.arrival, r.prompt_tokens) for r in read_requests(p, step_ms=50)]
('azure-2023', [(0, 374), (2, 396)])
"""

# one idea: one row reader per format, over one CSV and JSONL scanner, one step clock
# and one way of placing errors; split apart, each would re-derive the others.

from __future__ import annotations

import difflib
import gzip
import io
import json
import math
import re
import sys
import zlib
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any, Protocol, get_args

import msgspec

from kvspec.files import STDIN_NAME, is_stdin
from kvspec.jsonpos import MAX_DEPTH, Located, scan
from kvspec.model.pooling import TimeUnit
from kvspec.model.workloads import DEFAULT_STEP_MS, FORMATS, MOONCAKE_BLOCK_TOKENS
from kvspec.sim.trace import (
    BOUNDS,
    GZIP_MAGIC,
    MAX_ARRIVAL,
    MAX_TOKENS,
    TraceError,
    TraceRequest,
    bounds_text,
    key_column,
    most_blocks,
    read_trace,
    requests_of,
    within,
)

#: msgspec's JSON decoder (a core dependency; integers of any length read exactly).
_decode = msgspec.json.Decoder().decode

__all__ = ["DEFAULT_STEP_MS", "FORMATS", "MOONCAKE_BLOCK_TOKENS", "Columns", "Reader",
           "detect", "iter_requests", "read_requests"]

_AZURE = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_BURST = ("Timestamp", "Request tokens", "Response tokens")
_MOON = ("timestamp", "input_length", "output_length")
#: A count of tokens: ASCII digits (20 of them are past any bound, and read exactly).
_COUNT = re.compile(r"\s*[0-9]{1,20}\s*\Z")
#: The longest line a trace may have: a row is held whole, the file never is.
MAX_LINE_BYTES = 1 << 26
#: The latest time a trace's numbers may give (s): below it a double holds a time to
#: the microsecond (2^33 s is some 272 years).
MAX_TIME_S = 2.0**33


@dataclass(frozen=True, slots=True)
class Columns:
    """Where a ``lengths`` file keeps each figure: its column (CSV) or key (JSONL)
    names, and the unit of its times."""

    prompt: str
    output: str
    time: str | None = None
    time_unit: str = "s"

    @classmethod
    def parse(cls, text: str, time_unit: str = "s") -> Columns:
        """``prompt=NAME,output=NAME[,time=NAME]``.

        >>> Columns.parse("prompt=input_len,output=output_len")
        Columns(prompt='input_len', output='output_len', time=None, time_unit='s')
        """
        given: dict[str, str] = {}
        for part in text.split(","):
            key, sep, name = part.partition("=")
            key = key.strip()
            if not sep or key not in ("prompt", "output", "time") or not name.strip():
                raise TraceError(f"cannot read the column map {text!r} at {part!r}",
                                 expected="prompt=NAME,output=NAME[,time=NAME]",
                                 hint="name the columns (or JSON keys) holding the prompt "
                                      "and output lengths, e.g. prompt=input_len,"
                                      "output=output_len")
            given[key] = name.strip()
        missing = [k for k in ("prompt", "output") if k not in given]
        if missing:
            raise TraceError(f"the column map {text!r} has no {' and no '.join(missing)}",
                             expected="prompt=NAME,output=NAME[,time=NAME]",
                             hint="both lengths are needed; the time is optional")
        if time_unit not in get_args(TimeUnit):
            raise TraceError(f"unknown time unit {time_unit!r}", expected="s or ms",
                             hint="the unit of the time column's numbers")
        return cls(given["prompt"], given["output"], given.get("time"), time_unit)


def detect(path: str | Path) -> str:
    """The format of the file at ``path``, from its first line: a CSV header with
    Azure's or BurstGPT's columns, a JSON object with kvspec's or Mooncake's keys
    (a gzip-compressed file's first line; an empty file is kvspec's, whose reader
    says it has no requests)."""
    path = Path(path)
    suffix = Path(path.name.removesuffix(".gz").removesuffix(".GZ")).suffix.lower()
    first = _first_line(path)
    start = first.lstrip()[:1]
    convert = ("; or convert it once: kvspec trace import FORMAT FILE -o trace.jsonl "
               "(docs/traces.md)")
    if not first.strip():  # kvspec's reader says so of a .jsonl; of any other, here
        if suffix in (".jsonl", ".json", ".ndjson"):
            return "kvspec"
        raise TraceError("the trace has no requests: the file is empty", file=str(path),
                         hint="a trace has a line per request, in one of the formats "
                              "docs/traces.md lists")
    if start == "[":
        raise TraceError(f"{path.name} is a JSON array: a trace is JSON Lines, one object "
                         "per line", file=str(path), line=1, column=1, hint=_ARRAY_HINT)
    if start == "{" or suffix in (".jsonl", ".json", ".ndjson"):
        try:
            keys = set(_decode(first)) if start == "{" else set()
        except (msgspec.DecodeError, RecursionError, TypeError):  # not JSON, or nested
            # too deep: told by its keys' names, so the format's reader places the problem
            keys = {k for k in ("arrival", "arrival_s", "input_length") if f'"{k}"' in first}
        if "arrival" in keys or "arrival_s" in keys:
            return "kvspec"
        if "input_length" in keys or "hash_ids" in keys:
            return "mooncake"
        raise TraceError(f"cannot tell which trace format {path.name} is: its first line "
                         "has neither kvspec's keys (arrival, ...) nor Mooncake's "
                         "(timestamp, input_length, ...)", file=str(path), line=1, column=1,
                         found=first[:80],
                         hint="name its format: lengths, with its keys (prompt=KEY,"
                              f"output=KEY){convert}")
    names = {v for v, _ in _fields(first)}
    if set(_AZURE) <= names:
        return "azure-2023"
    if set(_BURST) <= names:
        return "burstgpt"
    raise TraceError(f"cannot tell which trace format {path.name} is: its header has "
                     f"neither Azure's nor BurstGPT's columns", file=str(path), line=1,
                     column=1, found=first[:80],
                     hint="name its format: lengths, with its columns (prompt=NAME,"
                          f"output=NAME), or azure-2024, burstgpt, ...{convert}")


def read_requests(path: str | Path, fmt: str | None = None, *,
                  step_ms: float = DEFAULT_STEP_MS, columns: Columns | None = None,
                  block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> tuple[TraceRequest, ...]:
    """Every request of the trace at ``path`` in format ``fmt`` (default: detected)."""
    fmt = fmt or ("kvspec" if is_stdin(path) else detect(path))
    if fmt == "kvspec":
        return read_trace(path, step_ms)
    reader = Reader(path, fmt, step_ms=step_ms, columns=columns, block_tokens=block_tokens)
    out = tuple(reader)
    if not out:
        raise reader.empty()
    return out


def iter_requests(path: str | Path, fmt: str | None = None, **kw: Any) -> Iterator[TraceRequest]:
    """The requests of the trace at ``path``, one at a time (see :class:`Reader`)."""
    return iter(Reader(path, fmt or detect(path), **kw))


class _Source(Protocol):
    """A file's bytes, line by line, with a look ahead (a file, stdin, a gzip stream)."""

    def peek(self, size: int, /) -> bytes: ...

    def read(self, size: int = ..., /) -> bytes: ...

    def seek(self, offset: int, whence: int = ..., /) -> int: ...

    def readline(self, size: int = ..., /) -> bytes: ...

    def __iter__(self) -> Iterator[bytes]: ...


class Reader:
    """The requests of one trace file, read row by row; ``rows`` and ``skipped``
    count what was read (``skipped``: BurstGPT's rows of 0 tokens). ``-`` reads
    stdin; a gzip-compressed file is read as it decompresses."""

    def __init__(self, path: str | Path, fmt: str, *, step_ms: float = DEFAULT_STEP_MS,
                 columns: Columns | None = None,
                 block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> None:
        if fmt not in FORMATS:
            close = difflib.get_close_matches(fmt, FORMATS, n=1)
            raise TraceError(f"unknown trace format {fmt!r}", expected=", ".join(FORMATS),
                             hint=f"did you mean {close[0]!r}?" if close else
                             "see docs/traces.md")
        if fmt == "lengths" and columns is None:
            raise TraceError("the lengths format needs a column map", file=str(path),
                             expected="--columns prompt=NAME,output=NAME[,time=NAME]",
                             hint="name the columns (or JSON keys) holding the lengths")
        if not (step_ms > 0 and math.isfinite(step_ms)):
            raise TraceError(f"the step time must be a positive number of ms, not {step_ms}",
                             hint=f"the default is {DEFAULT_STEP_MS:g} ms per engine step")
        if not within("prefix_block_tokens", block_tokens):
            raise TraceError(f"a block has {bounds_text('prefix_block_tokens')} tokens, not "
                             f"{block_tokens}",
                             hint=f"Mooncake's blocks are {MOONCAKE_BLOCK_TOKENS} tokens")
        self.path, self.fmt = Path(path), fmt
        self.file = STDIN_NAME if is_stdin(path) else str(path)
        self.step_s = step_ms / 1000
        self.columns = columns
        self.block_tokens = block_tokens
        self.rows = self.skipped = 0
        self._t0: float | None = None
        self._last: float = -math.inf
        self._zoned: bool | None = None  # whether the first Azure time gave a zone

    def __iter__(self) -> Iterator[TraceRequest]:
        with ExitStack() as stack:
            fh = self._open(stack)
            if self.fmt == "kvspec":
                yield from self._kvspec(fh)
                return
            json_lines = self.fmt == "mooncake" or (
                self.fmt == "lengths" and self._is_json(fh))
            rows = self._jsonl(fh) if json_lines else self._csv(fh)
            yield from rows

    def _open(self, stack: ExitStack) -> _Source:
        """The file's bytes, decompressed when it is gzip's (stdin for ``-``)."""
        if self.file == STDIN_NAME:
            fh = _peekable(sys.stdin.buffer)
        else:
            fh = stack.enter_context(_opened(self.path, self.file))
        try:
            gzipped = fh.peek(2)[:2] == GZIP_MAGIC
        except OSError as exc:
            raise TraceError(f"cannot read the trace: {exc.strerror or exc}",
                             file=self.file, hint="give a readable file") from None
        if gzipped:
            return stack.enter_context(gzip.GzipFile(fileobj=fh, mode="rb"))
        return fh

    def _kvspec(self, fh: _Source) -> Iterator[TraceRequest]:
        """kvspec's own lines, checked as :func:`~kvspec.sim.trace.read_trace` does."""
        for request in requests_of(self._lines(fh), self.file, self.step_s * 1000):
            self.rows += 1
            yield request

    def empty(self) -> TraceError:
        """The error of a file with no requests."""
        skipped = f" ({self.skipped:,} rows of 0 tokens skipped)" if self.skipped else ""
        rows = "a row" if self.fmt in ("azure-2023", "azure-2024", "burstgpt") else "a line"
        return TraceError(f"the trace has no requests{skipped}", file=self.file,
                          hint=f"{_a(self.fmt)} trace has {rows} per request: "
                               f"{FORMATS[self.fmt]}")

    # -- lines ------------------------------------------------------------------------
    def _lines(self, fh: _Source) -> Iterator[tuple[int, str]]:
        number = 0
        try:
            for number, raw in enumerate(iter(partial(fh.readline, MAX_LINE_BYTES), b""),
                                         start=1):
                if len(raw) == MAX_LINE_BYTES and not raw.endswith(b"\n"):
                    raise TraceError(f"the line is longer than {MAX_LINE_BYTES:,} bytes",
                                     file=self.file, line=number, column=1,
                                     hint="a trace has one request per line: is this file a "
                                          "trace? (a prompt of 2^31 tokens in Mooncake's "
                                          "512-token blocks is some 40 MiB of hash_ids)")
                try:
                    line = raw.decode("utf-8").rstrip("\r\n")
                    if number == 1:  # a byte-order mark: editors and spreadsheets write one
                        line = line.removeprefix("\ufeff")
                except UnicodeDecodeError as exc:
                    raise TraceError(f"not UTF-8 text: {exc.reason}", file=self.file,
                                     line=number, column=len(raw[:exc.start].decode()) + 1,
                                     hint="a trace is a UTF-8 text file (or one "
                                          "gzip-compressed)") from None
                if line.strip():
                    yield number, line
        except (OSError, EOFError, zlib.error) as exc:  # a disk error, a damaged gzip file
            past = f" past line {number:,}" if number else ""
            raise TraceError(f"cannot read the trace{past}: "
                             f"{getattr(exc, 'strerror', None) or exc}", file=self.file,
                             line=number + 1, hint=_DAMAGED) from None

    def _is_json(self, fh: _Source) -> bool:
        start = fh.peek(1024)[:1024].removeprefix(b"\xef\xbb\xbf").lstrip()
        return start[:1] in (b"{", b"[")

    # -- CSV --------------------------------------------------------------------------
    def _csv(self, fh: _Source) -> Iterator[TraceRequest]:
        lines = self._lines(fh)
        head = next(lines, None)
        if head is None:
            return
        names = [v.strip() for v in self._split(head[1], head[0])]
        azure = self.fmt in ("azure-2023", "azure-2024")
        if azure:
            time_col, prompt_col, output_col = self._header(names, _AZURE, head[1])
            unit_s = 1e-6  # times are read as whole microseconds since the epoch
        elif self.fmt == "burstgpt":
            time_col, prompt_col, output_col = self._header(names, _BURST, head[1])
            unit_s = 1.0
        else:
            assert self.columns is not None
            c = self.columns
            wanted = (c.prompt, c.output) + ((c.time,) if c.time else ())
            found = self._header(names, wanted, head[1])
            prompt_col, output_col = found[0], found[1]
            time_col = found[2] if c.time else -1
            unit_s = 0.001 if c.time_unit == "ms" else 1.0
        unit_step = self.step_s / unit_s  # one step, in the time column's unit
        most = MAX_TIME_S / unit_s
        least = 0 if self.fmt == "burstgpt" else 1  # BurstGPT's 0s: failures, skipped
        width = len(names)
        for number, line in lines:
            fields = self._split(line, number)
            if len(fields) != width:
                self._width(fields, names, line, number)
            self.rows += 1
            prompt = self._count_csv(fields, prompt_col, names, line, number,
                                     "prompt_tokens", least)
            output = self._count_csv(fields, output_col, names, line, number,
                                     "output_tokens", least)
            if not (output and prompt):  # BurstGPT's failed (or empty) requests
                self.skipped += 1
                continue
            arrival = 0
            if time_col >= 0:
                text = fields[time_col].strip()
                t = (self._azure_us(text, line, number, time_col) if azure else
                     self._number_time(text, line, number, time_col, names, most, unit_s))
                arrival = self._step(t, unit_step, number, line, time_col)
            yield TraceRequest(arrival, prompt, output)

    def _split(self, line: str, number: int) -> list[str]:
        """A CSV line's fields (quotes honoured; a quote that does not close, or text
        after a closing quote, is an error)."""
        if '"' not in line:
            return line.split(",")
        try:
            return [v for v, _ in _fields(line, strict=True)]
        except _Unquoted as bad:
            raise TraceError(bad.message, file=self.file, line=number, column=bad.column,
                             hint="a trace has one row per line; a quote inside a quoted "
                                  'value is written twice ("")') from None

    def _width(self, fields: list[str], names: list[str], line: str, number: int) -> None:
        width = len(names)
        if len(fields) < width:
            raise TraceError(f"the row has {len(fields)} fields, the header {width}",
                             file=self.file, line=number, column=len(line) + 1,
                             expected=", ".join(names),
                             hint="every row gives a value for each column")
        raise TraceError(f"the row has {len(fields)} fields, the header {width}: which "
                         "value is whose column cannot be told", file=self.file,
                         line=number, column=_column(line, width),
                         expected=", ".join(names), found=repr(line[:80]),
                         hint='a comma inside a value? quote the value ("1,200"), or '
                              "write numbers without thousands separators")

    def _header(self, names: list[str], wanted: tuple[str, ...], head: str) -> list[int]:
        out = []
        for name in wanted:
            if name not in names:
                close = difflib.get_close_matches(name, names, n=1)
                sep = _separator(head) if len(names) == 1 else None
                raise TraceError(f"the header has no column {name!r}", file=self.file,
                                 line=1, column=1, expected=", ".join(wanted),
                                 found=", ".join(names)[:200],
                                 hint=f"its columns are separated by {sep!r}: a trace's CSV "
                                      "is separated by commas" if sep else
                                 "the file is JSON, not CSV: name its format (mooncake, "
                                 "lengths, kvspec)" if head.lstrip()[:1] in ("{", "[") else
                                 f"the header has {close[0]!r}: is that the one?"
                                 if close else
                                 f"{_a(self.fmt)} trace's header names these columns")
            index = names.index(name)
            if name in names[index + 1:]:
                again = names.index(name, index + 1)
                raise TraceError(f"the header names the column {name!r} twice",
                                 file=self.file, line=1, column=_column(head, again),
                                 expected=f"{name!r} once",
                                 hint="which of the two holds the figure cannot be told: "
                                      "rename or remove one of them")
            out.append(index)
        return out

    def _count_csv(self, fields: list[str], index: int, names: list[str], line: str,
                   number: int, field: str, least: int) -> int:
        text = fields[index]
        if _COUNT.match(text):
            value = int(text)
            if within(field, value) or value == least == 0:
                return value
        raise TraceError(f"{names[index]} must be a whole number of tokens "
                         f"{bounds_text(field, least)}", file=self.file, line=number,
                         column=_column(line, index), found=repr(text.strip()[:40]),
                         hint="the header again? keep one header, at the top"
                         if text.strip() == names[index] else
                         _count_hint(text.strip(), least))

    def _azure_us(self, text: str, line: str, number: int, index: int) -> int:
        """Microseconds since the epoch of an Azure ``TIMESTAMP`` (UTC when it gives no
        zone, which every row must do alike)."""
        try:
            dt = _azure_datetime(text)
        except (ValueError, OverflowError):
            raise TraceError(f"cannot read the time {text!r}", file=self.file, line=number,
                             column=_column(line, index), expected=_TIME_EXPECTED[self.fmt],
                             hint="the time the request arrived at") from None
        zoned = dt.tzinfo is not None
        if self._zoned is None:
            self._zoned = zoned
        elif zoned != self._zoned:
            has = "gives a zone" if zoned else "gives no zone"
            raise TraceError(f"the time {text!r} {has}, the first row's "
                             f"{'does not' if zoned else 'does'}: read as UTC, the times "
                             "without one would be off by the others' offset",
                             file=self.file, line=number, column=_column(line, index),
                             hint="give every time a zone (e.g. +00:00), or none (UTC)")
        if not zoned:
            dt = dt.replace(tzinfo=UTC)
        return (dt - _EPOCH) // _MICROSECOND

    def _number_time(self, text: str, line: str, number: int, index: int, names: list[str],
                     most: float, unit_s: float) -> float:
        try:
            t = float(text)
        except ValueError:
            t = math.nan
        if not math.isfinite(t):
            raise TraceError(f"cannot read the time {text!r}", file=self.file, line=number,
                             column=_column(line, index),
                             expected=_TIME_EXPECTED.get(self.fmt, "a number"),
                             hint="the time the request arrived at")
        if not 0 <= t < most:
            raise self._time_range(names[index], text, number, _column(line, index), unit_s)
        return t

    def _time_range(self, name: str, shown: str, number: int, column: int,
                    unit_s: float) -> TraceError:
        unit = "ms" if unit_s == 0.001 else "s"
        return TraceError(f"{name} must be a time from 0 to {MAX_TIME_S / unit_s:,.0f} {unit} "
                          "(2^33 s, some 272 years)", file=self.file, line=number,
                          column=column, found=shown,
                          hint=f"{'milliseconds' if unit == 'ms' else 'seconds'} since the "
                               "trace's start (read to the microsecond: up to 2^33 s)"
                               + ("; is the unit ms? (--time-unit ms)"
                                  if self.fmt == "lengths" and unit == "s" else ""))

    # -- JSON Lines --------------------------------------------------------------------
    def _jsonl(self, fh: _Source) -> Iterator[TraceRequest]:
        if self.fmt == "mooncake":
            keys: tuple[str, ...] = _MOON
            time_key: str | None = "timestamp"
            unit_s = 0.001
        else:
            assert self.columns is not None
            c = self.columns
            keys = (c.time or "", c.prompt, c.output)
            time_key = c.time
            unit_s = 0.001 if c.time_unit == "ms" else 1.0
        unit_step = self.step_s / unit_s
        most = MAX_TIME_S / unit_s
        required = keys[1:] + ((time_key,) if time_key else ())
        mooncake = self.fmt == "mooncake"
        (low, high), (least, most_out) = BOUNDS["prompt_tokens"], BOUNDS["output_tokens"]
        for number, line in self._lines(fh):
            obj = self._object(line, number)
            self.rows += 1
            for key in required:
                if key not in obj:
                    close = difflib.get_close_matches(key, [str(k) for k in obj], n=1)
                    raise TraceError(f"missing key {key!r}", file=self.file, line=number,
                                     column=key_column(line, close[0]) if close else 1,
                                     expected=", ".join(k for k in keys if k),
                                     hint=f"the line has {close[0]!r}: is that the one?"
                                     if close else
                                     f"every line of {_a(self.fmt)} trace gives these keys")
            prompt, output = obj[keys[1]], obj[keys[2]]
            if prompt.__class__ is not int or not low <= prompt <= high:  # (BOUNDS, inline)
                self._count_json(obj, keys[1], line, number, "prompt_tokens")
            if output.__class__ is not int or not least <= output <= most_out:
                self._count_json(obj, keys[2], line, number, "output_tokens")
            arrival = 0
            if time_key is not None:
                t = obj[time_key]
                if t.__class__ not in (int, float) or not 0 <= t < most:
                    if t.__class__ in (int, float) and math.isfinite(t):
                        raise self._time_range(time_key, _shown(t), number,
                                               key_column(line, time_key), unit_s)
                    raise TraceError(f"{time_key} must be a number, 0 or more",
                                     file=self.file, line=number,
                                     column=key_column(line, time_key), found=_shown(t),
                                     hint="the time the request arrived at"
                                          + (" (ms)" if unit_s != 1 else ""))
                arrival = self._step(t, unit_step, number, line, time_key)
            blocks = (self._hash_ids(obj, prompt, keys[1], line, number)
                      if mooncake and "hash_ids" in obj else ())
            if blocks:
                yield TraceRequest(arrival, prompt, output, None, 0, blocks, self.block_tokens)
                continue
            yield TraceRequest(arrival, prompt, output)

    def _hash_ids(self, obj: dict[str, Any], prompt: int, prompt_key: str, line: str,
                  number: int) -> tuple[int, ...]:
        """A Mooncake row's ``hash_ids`` (none: ``()``), at most the blocks its prompt fills."""
        blocks = obj["hash_ids"]
        if blocks.__class__ is not list or (blocks and (  # (C loops: a row's ids)
                set(map(type, blocks)) != {int} or min(blocks) < 0)):
            raise TraceError("hash_ids must be an array of integers, 0 or more",
                             file=self.file, line=number,
                             column=key_column(line, "hash_ids"), found=_shown(blocks),
                             hint=f"one id per {self.block_tokens}-token block of the prompt")
        if len(blocks) > (fill := most_blocks(prompt, self.block_tokens)):
            raise TraceError(
                f"hash_ids has {len(blocks):,} blocks of {self.block_tokens:,} tokens: more "
                f"than the prompt's {prompt:,} tokens ({prompt_key}) fill ({fill:,})",
                file=self.file, line=number, column=key_column(line, "hash_ids"),
                found=_shown(blocks),
                hint=f"one id per {self.block_tokens}-token block of the prompt, "
                     f"ceil({prompt_key} / {self.block_tokens}) at most (--block-tokens if "
                     "the trace's blocks are another size)")
        return tuple(blocks)

    def _object(self, line: str, number: int) -> dict[str, Any]:
        try:
            obj = _decode(line)
        except (msgspec.DecodeError, RecursionError):  # deep nesting: read it strictly
            obj = self._strict(line, number)
        if obj.__class__ is not dict:
            raise TraceError("a trace line must be a JSON object", file=self.file,
                             line=number, column=1, found=_shown(obj),
                             hint=_ARRAY_HINT if obj.__class__ is list and any(
                                 o.__class__ is dict for o in obj) else
                             f"{_a(self.fmt)} trace has one object per line")
        quotes = line.count('"')  # fewer in obj than on the line: a key twice, or escapes
        if quotes != 2 * len(obj) and quotes != _quotes(obj, deep=False) \
                and quotes != _quotes(obj):
            self._strict(line, number)  # raises at the key given twice, or reads it
        return obj

    def _strict(self, line: str, number: int) -> Any:
        """``line`` read strictly: a key twice, NaN, bad JSON are errors at their column."""
        array = line.lstrip().startswith("[")
        hint = _ARRAY_HINT if array else "each line is one JSON object"
        try:
            return scan(line, what="the trace line", max_depth=MAX_DEPTH)[0]
        except Located as problem:
            if array and "ends early" in problem.message:  # an array over several lines
                raise TraceError("the file is a JSON array: a trace is JSON Lines, one "
                                 "object per line", file=self.file, line=number, column=1,
                                 hint=_ARRAY_HINT) from None
            raise TraceError(problem.message, file=self.file, line=number,
                             column=problem.pos + 1, **{"hint": hint, **problem.kw}
                             ) from None
        except (RecursionError, ValueError) as exc:
            raise TraceError(f"not JSON: {exc}", file=self.file, line=number, column=1,
                             hint=hint) from None

    def _count_json(self, obj: dict[str, Any], key: str, line: str, number: int,
                    field: str) -> None:
        """The error of a count out of ``field``'s bounds (none when it is within them)."""
        value = obj[key]
        if not within(field, value):
            raise TraceError(f"{key} must be a whole number of tokens {bounds_text(field)}",
                             file=self.file, line=number, column=key_column(line, key),
                             found=_shown(value),
                             hint=_count_hint(value if value.__class__ is int else None, 1))

    # -- the clock ----------------------------------------------------------------------
    def _step(self, t: float, unit_step: float, number: int, line: str,
              at: int | str) -> int:
        """The step of time ``t`` (in the file's unit, ``unit_step`` of them a step);
        ``at``: the time's field (CSV) or key (JSON), placed only for an error."""
        if t < self._last:
            raise TraceError("times must not decrease: this request arrives before the "
                             "one above it", file=self.file, line=number,
                             column=self._at(line, at), hint="sort the file by its time column")
        self._last = t
        if self._t0 is None:
            self._t0 = t
        # (a billionth of a step's slack: 0.3 s over 0.1 s steps is step 3, not 2.999...)
        steps = (t - self._t0) / unit_step + 1e-9
        if not steps < MAX_ARRIVAL + 1:  # (infinite at a step of 1e-300 ms)
            seconds = (t - self._t0) * self.step_s / unit_step
            raise TraceError(f"the request arrives {seconds:.3g} s after the first: step "
                             f"{steps:.3g}, past the last a trace holds (arrival "
                             f"{bounds_text('arrival')})", file=self.file, line=number,
                             column=self._at(line, at),
                             hint="check the time's unit (Mooncake's are ms, BurstGPT's s), "
                                  "or give a longer --step-ms")
        return int(steps)

    @staticmethod
    def _at(line: str, at: int | str) -> int:
        return _column(line, at) if isinstance(at, int) else key_column(line, at)


_COUNT_HINT = {0: "a count of tokens: digits only",
               1: "a request has at least one prompt token and samples at least one"}
_TIME_EXPECTED = {"azure-2023": "a date and time, e.g. 2023-11-16 18:15:46.6805900",
                  "azure-2024": "a date and time, e.g. 2024-05-10 00:00:00.009930+00:00",
                  "burstgpt": "seconds since the trace's start, e.g. 5.0"}
_ARRAY_HINT = ("a trace is JSON Lines, one object per line, not one JSON array "
               "(`jq -c '.[]' FILE > FILE.jsonl` converts it)")
_DAMAGED = "give a readable, complete file (a gzip file cut short cannot be read to its end)"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def _a(fmt: str) -> str:
    """``fmt`` with its article: "an azure-2023", "a mooncake"."""
    return f"{'an' if fmt[0] in 'aeiou' else 'a'} {fmt}"


def _count_hint(value: object, least: int) -> str:
    """The hint for a count out of range: too large, or not one."""
    big = (isinstance(value, int) and value > MAX_TOKENS) or (
        isinstance(value, str) and value.isascii() and value.isdigit()
        and int(value[:20]) > MAX_TOKENS)
    if big:
        return ("a request's prompt or output is at most 2^31 tokens in a kvspec trace "
                "(simulate refuses more)")
    return _COUNT_HINT[least]


def _azure_datetime(text: str) -> datetime:
    """An Azure ``TIMESTAMP``'s date and time (its 100 ns digit dropped: Python reads µs)."""
    if len(text) > 26 and text[19:20] == "." and text[26:27].isdigit():
        text = text[:26] + text[26:].lstrip("0123456789")
    return datetime.fromisoformat(text)


def _azure_time(text: str) -> float:
    """Seconds since the epoch of an Azure ``TIMESTAMP`` (UTC when it gives no zone)."""
    dt = _azure_datetime(text)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def _separator(line: str) -> str | None:
    """The character a one-column header is likely separated by (not a comma)."""
    counts = {sep: line.count(sep) for sep in (";", "\t", "|")}
    sep = max(counts, key=lambda k: counts[k])
    return sep if counts[sep] else None


class _Unquoted(Exception):
    def __init__(self, message: str, column: int) -> None:
        super().__init__(message)
        self.message, self.column = message, column


def _fields(line: str, strict: bool = False) -> list[tuple[str, int]]:
    """A CSV line's fields and the 1-based column each starts at (quotes honoured;
    ``strict``: a quote that does not close, or text after one, is :class:`_Unquoted`)."""
    out = []
    i, n = 0, len(line)
    while True:
        start = i
        if i < n and line[i] == '"':
            i += 1
            chars = []
            closed = False
            while i < n:
                if line[i] == '"':
                    if i + 1 < n and line[i + 1] == '"':
                        chars.append('"')
                        i += 2
                        continue
                    i += 1
                    closed = True
                    break
                chars.append(line[i])
                i += 1
            end = line.find(",", i)
            if strict and not closed:
                raise _Unquoted("a quoted value that does not close on its line", start + 1)
            if strict and line[i:n if end < 0 else end].strip():
                raise _Unquoted("text after a quoted value's closing quote", i + 1)
            value = "".join(chars)
        else:
            end = line.find(",", i)
            value = line[i:] if end < 0 else line[i:end]
        out.append((value.strip(), start + 1))
        if end < 0:
            return out
        i = end + 1


def _column(line: str, index: int) -> int:
    """The 1-based column field ``index`` of a CSV line starts at (past the last
    field: the line's end)."""
    fields = _fields(line)
    return fields[index][1] if index < len(fields) else len(line) + 1


def _peekable(fh: Any) -> _Source:
    """``fh`` with ``peek`` (stdin is; a test's in-memory stdin may not be)."""
    return fh if hasattr(fh, "peek") else io.BufferedReader(fh)


def _opened(path: Path, file: str) -> io.BufferedReader:
    try:
        return open(path, "rb")  # (the caller closes it; lines decoded one by one)
    except FileNotFoundError:
        raise TraceError("no such trace file", file=file,
                         hint="give the path of the trace to read") from None
    except IsADirectoryError:
        raise TraceError("a directory, not a trace file", file=file,
                         hint="give the path of the trace file in it") from None
    except OSError as exc:
        raise TraceError(f"cannot read the trace: {exc.strerror or exc}",
                         file=file, hint="give a readable file") from None


def _first_line(path: Path) -> str:
    with ExitStack() as stack:
        fh: _Source = stack.enter_context(_opened(path, str(path)))
        try:
            if fh.peek(2)[:2] == GZIP_MAGIC:
                fh = stack.enter_context(gzip.GzipFile(fileobj=fh, mode="rb"))
            for n, raw in enumerate(iter(partial(fh.readline, MAX_LINE_BYTES), b"")):
                line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                if n == 0:
                    line = line.removeprefix("\ufeff")
                if line.strip():
                    return line
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceError(f"cannot read the trace: {getattr(exc, 'strerror', None) or exc}",
                             file=str(path), hint=_DAMAGED) from None
    return ""


def _quotes(obj: Any, deep: bool = True) -> int:
    """The double quotes a JSON text of ``obj`` has (keys and strings, their quotes
    escaped; a ``\\u0022`` escape aside), not counting those inside arrays and
    objects unless ``deep``: fewer than the line's, a key was given twice."""
    count = 0
    values = obj.values() if obj.__class__ is dict else obj
    if obj.__class__ is dict:
        for key in obj:
            count += 2 + key.count('"')
    for value in values:
        if value.__class__ is str:
            count += 2 + value.count('"')
        elif deep and value.__class__ in (dict, list):
            count += _quotes(value)
    return count


def _shown(value: Any) -> str:
    if value.__class__ in (list, dict):
        text = json.dumps(value)
        return text if len(text) <= 40 else text[:37] + "..."
    return json.dumps(value) if value.__class__ in (int, float, str, bool) or value is None \
        else type(value).__name__
