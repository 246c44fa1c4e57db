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
Times must not decrease. Rows are read one at a time (:func:`iter_requests`),
so converting a file (``kvspec trace import``) holds one row in memory; every
problem is a :class:`~kvspec.sim.trace.TraceError` at ``file:line:column``.

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
import json
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, get_args

import msgspec

from kvspec.files import is_stdin
from kvspec.jsonpos import MAX_DEPTH, Located, scan
from kvspec.model.pooling import TimeUnit
from kvspec.model.workloads import DEFAULT_STEP_MS, FORMATS, MOONCAKE_BLOCK_TOKENS
from kvspec.sim.trace import TraceError, TraceRequest, key_column, read_trace, requests_of

#: msgspec's JSON decoder (a core dependency; integers of any length read exactly).
_decode = msgspec.json.Decoder().decode

__all__ = ["DEFAULT_STEP_MS", "FORMATS", "MOONCAKE_BLOCK_TOKENS", "Columns", "Reader",
           "detect", "iter_requests", "read_requests"]

_AZURE = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_BURST = ("Timestamp", "Request tokens", "Response tokens")
_MOON = ("timestamp", "input_length", "output_length")
_COUNT = re.compile(r"\s*\d{1,15}\s*\Z")  # (a quadrillion tokens is past any count)
#: Steps a trace may span (at 20 ms a step, some 600 years).
_MAX_STEPS = 1e12


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
    """The format of the file at ``path``, from its extension and first line."""
    path = Path(path)
    suffix = path.suffix.lower()
    first = _first_line(path)
    if suffix == ".csv":
        names = {v for v, _ in _fields(first)}
        if set(_AZURE) <= names:
            return "azure-2023"
        if set(_BURST) <= names:
            return "burstgpt"
        raise TraceError(f"cannot tell which trace format {path.name} is: its header has "
                         f"neither Azure's nor BurstGPT's columns", file=str(path), line=1,
                         column=1, found=first[:80],
                         hint="name its format: lengths, with its columns (prompt=NAME,"
                              "output=NAME), or azure-2024, burstgpt, ...")
    if suffix in (".jsonl", ".json", ".ndjson"):
        try:
            keys = set(_decode(first)) if first.lstrip().startswith("{") else set()
        except (msgspec.DecodeError, RecursionError):  # not JSON, or nested too deep:
            # told by its keys' names, so the format's reader places the problem
            keys = {k for k in ("arrival", "arrival_s", "input_length") if f'"{k}"' in first}
        if "arrival" in keys or "arrival_s" in keys or not first.strip():
            return "kvspec"
        if "input_length" in keys or "hash_ids" in keys:
            return "mooncake"
        raise TraceError(f"cannot tell which trace format {path.name} is: its first line "
                         "has neither kvspec's keys (arrival, ...) nor Mooncake's "
                         "(timestamp, input_length, ...)", file=str(path), line=1, column=1,
                         hint="name its format: lengths, with its keys (prompt=KEY,"
                              "output=KEY)")
    raise TraceError(f"cannot tell which trace format {path.name} is from its extension",
                     file=str(path), expected=".csv, .jsonl",
                     hint=f"name its format: one of {', '.join(FORMATS)}")


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


class Reader:
    """The requests of one trace file, read row by row; ``rows`` and ``skipped``
    count what was read (``skipped``: BurstGPT's rows of 0 tokens)."""

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
        if block_tokens < 1:
            raise TraceError(f"a block has 1 token or more, not {block_tokens}",
                             hint=f"Mooncake's blocks are {MOONCAKE_BLOCK_TOKENS} tokens")
        self.path, self.file, self.fmt = Path(path), str(path), fmt
        self.step_s = step_ms / 1000
        self.columns = columns
        self.block_tokens = block_tokens
        self.rows = self.skipped = 0
        self._t0: float | None = None
        self._last = -math.inf

    def __iter__(self) -> Iterator[TraceRequest]:
        try:
            fh = open(self.path, "rb")  # noqa: SIM115 - closed below; lines decoded one by one
        except FileNotFoundError:
            raise TraceError("no such trace file", file=self.file,
                             hint="give the path of the trace to read") from None
        except OSError as exc:
            raise TraceError(f"cannot read the trace: {exc.strerror or exc}",
                             file=self.file, hint="give a readable file") from None
        with fh:
            if self.fmt == "kvspec":
                yield from self._kvspec(fh)
                return
            json_lines = self.fmt == "mooncake" or (
                self.fmt == "lengths" and self._is_jsonl(fh))
            rows = self._jsonl(fh) if json_lines else self._csv(fh)
            yield from rows

    def _kvspec(self, fh: IO[bytes]) -> Iterator[TraceRequest]:
        """kvspec's own lines, checked as :func:`~kvspec.sim.trace.read_trace` does."""
        for request in requests_of(self._lines(fh), self.file, self.step_s * 1000):
            self.rows += 1
            yield request

    def empty(self) -> TraceError:
        """The error of a file with no requests."""
        skipped = f" ({self.skipped:,} rows of 0 tokens skipped)" if self.skipped else ""
        return TraceError(f"the trace has no requests{skipped}", file=self.file,
                          hint=f"a {self.fmt} trace has a row per request: "
                               f"{FORMATS[self.fmt]}")

    # -- lines ------------------------------------------------------------------------
    def _lines(self, fh: IO[bytes]) -> Iterator[tuple[int, str]]:
        for number, raw in enumerate(fh, start=1):
            try:
                line = raw.decode("utf-8").rstrip("\r\n")
                if number == 1:  # a byte-order mark: editors and spreadsheets write one
                    line = line.removeprefix("\ufeff")
            except UnicodeDecodeError as exc:
                raise TraceError(f"not UTF-8 text: {exc.reason}", file=self.file,
                                 line=number, column=len(raw[:exc.start].decode()) + 1,
                                 hint="a trace is a UTF-8 text file") from None
            if line.strip():
                yield number, line

    def _is_jsonl(self, fh: IO[bytes]) -> bool:
        start = fh.read(1024).removeprefix(b"\xef\xbb\xbf").lstrip()
        fh.seek(0)
        return start.startswith(b"{")

    # -- CSV --------------------------------------------------------------------------
    def _csv(self, fh: IO[bytes]) -> Iterator[TraceRequest]:
        lines = self._lines(fh)
        head = next(lines, None)
        if head is None:
            return
        names = [v for v, _ in _fields(head[1])]
        if self.fmt in ("azure-2023", "azure-2024"):
            cols = self._header(names, _AZURE)
            time_col, prompt_col, output_col = cols
            when: Callable[[str], float] = _azure_time
        elif self.fmt == "burstgpt":
            time_col, prompt_col, output_col = self._header(names, _BURST)
            when = float
        else:
            assert self.columns is not None
            c = self.columns
            wanted = (c.prompt, c.output) + ((c.time,) if c.time else ())
            found = self._header(names, wanted)
            prompt_col, output_col = found[0], found[1]
            time_col = found[2] if c.time else -1
            when = _scaled(c.time_unit)
        width = len(names)
        for number, line in lines:
            fields = _fields(line)
            if len(fields) < width:
                raise TraceError(f"the row has {len(fields)} fields, the header "
                                 f"{width}", file=self.file, line=number,
                                 column=len(line) + 1, expected=", ".join(names),
                                 hint="every row gives a value for each column")
            self.rows += 1
            burst = self.fmt == "burstgpt"
            output = self._count_csv(fields[output_col], number, names[output_col],
                                     least=0 if burst else 1)
            prompt = self._count_csv(fields[prompt_col], number, names[prompt_col],
                                     least=0 if burst else 1)
            if not (output and prompt):  # BurstGPT's failed (or empty) requests
                self.skipped += 1
                continue
            arrival = 0
            if time_col >= 0:
                text, col = fields[time_col]
                try:
                    t = when(text.strip())
                except (ValueError, OverflowError):
                    t = math.nan
                if not math.isfinite(t):
                    raise TraceError(f"cannot read the time {text.strip()!r}",
                                     file=self.file, line=number, column=col,
                                     expected=_TIME_EXPECTED.get(self.fmt, "a number"),
                                     hint="the time the request arrived at")
                arrival = self._step(t, number, col)  # (the column, known)
            yield TraceRequest(arrival, prompt, output)

    def _header(self, names: list[str], wanted: tuple[str, ...]) -> list[int]:
        out = []
        for name in wanted:
            if name not in names:
                close = difflib.get_close_matches(name, names, n=1)
                raise TraceError(f"the header has no column {name!r}", file=self.file,
                                 line=1, column=1, expected=", ".join(wanted),
                                 found=", ".join(names)[:200],
                                 hint=f"the header has {close[0]!r}: is that the one?"
                                 if close else
                                 f"a {self.fmt} trace's header names these columns")
            out.append(names.index(name))
        return out

    def _count_csv(self, field: tuple[str, int], number: int, name: str, least: int) -> int:
        text, col = field
        if not _COUNT.match(text) or int(text) < least:
            raise TraceError(f"{name} must be a whole number of tokens, {least} or more",
                             file=self.file, line=number, column=col,
                             found=repr(text.strip()[:40]), hint=_COUNT_HINT[least])
        return int(text)

    # -- JSON Lines --------------------------------------------------------------------
    def _jsonl(self, fh: IO[bytes]) -> Iterator[TraceRequest]:
        if self.fmt == "mooncake":
            keys: tuple[str, ...] = _MOON
            time_key: str | None = "timestamp"
            to_s = 0.001
        else:
            assert self.columns is not None
            c = self.columns
            keys = (c.time or "", c.prompt, c.output)
            time_key = c.time
            to_s = 0.001 if c.time_unit == "ms" else 1.0
        for number, line in self._lines(fh):
            obj = self._object(line, number)
            self.rows += 1
            for key in keys[1:] + ((time_key,) if time_key else ()):
                if key not in obj:
                    close = difflib.get_close_matches(key, [str(k) for k in obj], n=1)
                    raise TraceError(f"missing key {key!r}", file=self.file, line=number,
                                     column=key_column(line, close[0]) if close else 1,
                                     expected=", ".join(k for k in keys if k),
                                     hint=f"the line has {close[0]!r}: is that the one?"
                                     if close else
                                     f"every line of a {self.fmt} trace gives these keys")
            prompt = self._count_json(obj, keys[1], line, number, 1)
            output = self._count_json(obj, keys[2], line, number, 1)
            arrival = 0
            if time_key is not None:
                t = obj[time_key]
                if t.__class__ not in (int, float) or not math.isfinite(t) or t < 0:
                    raise TraceError(f"{time_key} must be a number, 0 or more",
                                     file=self.file, line=number,
                                     column=key_column(line, time_key), found=_shown(t),
                                     hint="the time the request arrived at"
                                          + (" (ms)" if to_s != 1 else ""))
                arrival = self._step(t * to_s, number, line, time_key)
            if self.fmt == "mooncake" and "hash_ids" in obj:
                blocks = obj["hash_ids"]
                if blocks.__class__ is not list or any(
                        b.__class__ is not int or b < 0 for b in blocks):
                    raise TraceError("hash_ids must be an array of integers, 0 or more",
                                     file=self.file, line=number,
                                     column=key_column(line, "hash_ids"), found=_shown(blocks),
                                     hint="one id per 512-token block of the prompt")
                if blocks:
                    yield TraceRequest(arrival, prompt, output, None, 0, tuple(blocks),
                                       self.block_tokens)
                    continue
            yield TraceRequest(arrival, prompt, output)

    def _object(self, line: str, number: int) -> dict[str, Any]:
        try:
            obj = _decode(line)
        except (msgspec.DecodeError, RecursionError):  # deep nesting: read it strictly
            try:
                obj = scan(line, what="the trace line", max_depth=MAX_DEPTH)[0]
            except Located as problem:
                raise TraceError(problem.message, file=self.file, line=number,
                                 column=problem.pos + 1,
                                 **{"hint": "each line is one JSON object", **problem.kw}
                                 ) from None
            except (RecursionError, ValueError) as exc:
                raise TraceError(f"not JSON: {exc}", file=self.file, line=number, column=1,
                                 hint="each line is one JSON object") from None
        if obj.__class__ is not dict:
            raise TraceError("a trace line must be a JSON object", file=self.file,
                             line=number, column=1, found=_shown(obj),
                             hint=f"a {self.fmt} trace has one object per line")
        return obj

    def _count_json(self, obj: dict[str, Any], key: str, line: str, number: int,
                    least: int) -> int:
        value = obj[key]
        if value.__class__ is not int or value < least:
            raise TraceError(f"{key} must be a whole number of tokens, {least} or more",
                             file=self.file, line=number, column=key_column(line, key),
                             found=_shown(value), hint=_COUNT_HINT[least])
        return value

    # -- the clock ----------------------------------------------------------------------
    def _step(self, t: float, number: int, column: int | str, key: str = "") -> int:
        """The step of time ``t`` (s); ``column``: the time's, or the JSON line (its
        ``key``'s column is found only for an error)."""
        if t < self._last:
            at = column if isinstance(column, int) else key_column(column, key)
            raise TraceError("times must not decrease: this request arrives before the "
                             "one above it", file=self.file, line=number, column=at,
                             hint="sort the file by its time column")
        self._last = t
        if self._t0 is None:
            self._t0 = t
        # (a billionth of a step's slack: 0.3 s over 0.1 s steps is step 3, not 2.999...)
        steps = (t - self._t0) / self.step_s + 1e-9
        if not steps < _MAX_STEPS:
            at = column if isinstance(column, int) else key_column(column, key)
            raise TraceError(f"the request arrives {t - self._t0:.3g} s after the first: "
                             f"past step {_MAX_STEPS:.0e}", file=self.file, line=number,
                             column=at, hint="check the time's unit (Mooncake's are ms, "
                                             "BurstGPT's s), or give a longer --step-ms")
        return int(steps)


_COUNT_HINT = {0: "a count of tokens: digits only",
               1: "a request has at least one prompt token and samples at least one"}
_TIME_EXPECTED = {"azure-2023": "a date and time, e.g. 2023-11-16 18:15:46.6805900",
                  "azure-2024": "a date and time, e.g. 2024-05-10 00:00:00.009930+00:00",
                  "burstgpt": "seconds since the trace's start, e.g. 5.0"}


def _azure_time(text: str) -> float:
    """Seconds since the epoch of an Azure ``TIMESTAMP`` (UTC when it gives no zone)."""
    if len(text) > 26 and text[19:20] == "." and text[26:27].isdigit():
        text = text[:26] + text[26:].lstrip("0123456789")  # 100 ns digits: Python reads µs
    dt = datetime.fromisoformat(text)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def _scaled(unit: str) -> Callable[[str], float]:
    scale = 0.001 if unit == "ms" else 1.0
    return lambda text: float(text) * scale


def _fields(line: str) -> list[tuple[str, int]]:
    """A CSV line's fields and the 1-based column each starts at (quotes honoured)."""
    out = []
    i, n = 0, len(line)
    while True:
        start = i
        if i < n and line[i] == '"':
            i += 1
            chars = []
            while i < n:
                if line[i] == '"':
                    if i + 1 < n and line[i + 1] == '"':
                        chars.append('"')
                        i += 2
                        continue
                    i += 1
                    break
                chars.append(line[i])
                i += 1
            end = line.find(",", i)
            value = "".join(chars)
        else:
            end = line.find(",", i)
            value = line[i:] if end < 0 else line[i:end]
        out.append((value.strip(), start + 1))
        if end < 0:
            return out
        i = end + 1


def _first_line(path: Path) -> str:
    try:
        with open(path, encoding="utf-8-sig", errors="replace") as fh:
            for line in fh:
                if line.strip():
                    return line.rstrip("\r\n")
    except FileNotFoundError:
        raise TraceError("no such trace file", file=str(path),
                         hint="give the path of the trace to read") from None
    except OSError as exc:
        raise TraceError(f"cannot read the trace: {exc.strerror or exc}", file=str(path),
                         hint="give a readable file") from None
    return ""


def _shown(value: Any) -> str:
    if value.__class__ in (list, dict):
        text = json.dumps(value)
        return text if len(text) <= 40 else text[:37] + "..."
    return json.dumps(value) if value.__class__ in (int, float, str, bool) or value is None \
        else type(value).__name__
