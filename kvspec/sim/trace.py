# one idea: kvspec's trace format, its one bound rule for every reader, and reading and
# writing it with positioned errors
"""Request traces: JSON Lines, one request per line, read with positioned errors.

Each line is one object::

    {"arrival": 0, "prompt_tokens": 1800, "output_tokens": 210}
    {"arrival": 3, "prompt_tokens": 900, "output_tokens": 64, "prefix_id": 1, "prefix_tokens": 512}

* ``arrival`` -- the engine step the request joins the waiting queue at (an
  integer, not decreasing from one line to the next);
* or ``arrival_s`` instead -- the time it arrives, in seconds from the trace's start
  (a number from 0 to 2^30, not decreasing); a trace gives every line's arrival
  the same way. On the step clock it joins at step ``floor(arrival_s / step)``
  (``step_ms``, as the other formats' times); a timed run (``simulate --profile``)
  keeps the seconds;
* ``prompt_tokens``, ``output_tokens`` -- positive integers, at most 2^31 (the
  format's bound on a request's tokens); ``arrival`` at most 2^40 (:data:`BOUNDS`,
  which every importer of :mod:`kvspec.sim.formats` holds its rows to as well);
* ``prefix_id`` (a string or an integer) and ``prefix_tokens`` (0 to
  ``prompt_tokens``), together: the request's first ``prefix_tokens`` tokens are
  those of every request with the same ``prefix_id`` (a shared system prompt),
  up to the shorter prefix of the two;
* ``prefix_blocks`` (an array of integers) and ``prefix_block_tokens`` (a positive
  integer), together, instead of a prefix id: the prompt is made of blocks of
  ``prefix_block_tokens`` tokens, block ``k`` holding content ``prefix_blocks[k]``
  (Mooncake's ``hash_ids``): two requests share their prompts block for block, up
  to the first block where their ids differ (:mod:`kvspec.sim.chains`); at most the
  blocks the prompt fills (:func:`most_blocks`).

Blank lines are skipped, and so is a UTF-8 byte-order mark at the start; a
gzip-compressed file is read as the text it holds. Every
problem is a :class:`TraceError` at ``file:line:column`` with a hint. Token ids are synthetic
(:func:`token_id`): the same for requests sharing a prefix, inside it; unique
everywhere else, so prefix caching finds exactly the declared sharing.

>>> reqs = parse_trace('{"arrival": 0, "prompt_tokens": 8, "output_tokens": 2}\\n')
>>> reqs[0].prompt_tokens, reqs[0].prefix_id
(8, None)
"""

from __future__ import annotations

import difflib
import gzip
import json
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import msgspec

from kvspec.errors import KvspecError
from kvspec.files import STDIN_NAME, is_stdin, read_text
from kvspec.jsonpos import MAX_DEPTH, Located, scan
from kvspec.model.workloads import DEFAULT_STEP_MS

__all__ = ["BOUNDS", "GZIP_MAGIC", "KEYS", "MAX_ARRIVAL", "MAX_ARRIVAL_S", "MAX_TOKENS",
           "MIN_RATE", "TraceError", "TraceRequest", "bounds_text", "key_column", "most_blocks",
           "parse_trace", "prefix_codes", "read_trace", "requests_of", "token_id",
           "trace_text", "within", "write_trace"]

#: Keys of a trace line, in their canonical order (the first three required).
KEYS = ("arrival", "prompt_tokens", "output_tokens", "prefix_id", "prefix_tokens",
        "prefix_blocks", "prefix_block_tokens", "arrival_s")
_REQUIRED = KEYS[1:3]
#: Most tokens a request's prompt or output may have (the source format's bound).
MAX_TOKENS = 2**31
#: Latest arrival step: a trace of a million requests at one every 10^6 steps.
MAX_ARRIVAL = 2**40
#: Fewest arrivals per step a synthetic trace takes (its arrivals stay below MAX_ARRIVAL).
MIN_RATE = 1e-6
#: Latest ``arrival_s`` (s): some 34 years.
MAX_ARRIVAL_S = 2**30
#: Milliseconds a step stands for when a trace's times become steps (as
#: :data:`kvspec.model.workloads.DEFAULT_STEP_MS`).
STEP_MS = DEFAULT_STEP_MS
#: The range of each integer of a trace request: the one rule of every reader of
#: traces, this module's (``simulate``, ``pooling.workload.trace``) and each format's
#: importer (:mod:`kvspec.sim.formats`, ``kvspec trace import``), so a file one of
#: them takes, the others take too.
BOUNDS: dict[str, tuple[int, int]] = {
    "arrival": (0, MAX_ARRIVAL),
    "prompt_tokens": (1, MAX_TOKENS),
    "output_tokens": (1, MAX_TOKENS),
    "prefix_tokens": (0, MAX_TOKENS),
    "prefix_block_tokens": (1, MAX_TOKENS),
}
_POWERS = {MAX_TOKENS: "2^31", MAX_ARRIVAL: "2^40"}
#: The first bytes of a gzip-compressed file: every reader of traces decompresses it.
GZIP_MAGIC = b"\x1f\x8b"
_EXAMPLE = '{"arrival": 0, "prompt_tokens": 512, "output_tokens": 128}'


class TraceError(KvspecError):
    """A trace that cannot be read."""


def within(field: str, value: object) -> bool:
    """Whether ``value`` is an integer (not a boolean) in ``field``'s :data:`BOUNDS`.

    >>> within("prompt_tokens", 2**31), within("prompt_tokens", 2**31 + 1), within("arrival", True)
    (True, False, False)
    """
    least, most = BOUNDS[field]
    return value.__class__ is int and least <= value <= most


def bounds_text(field: str, least: int | None = None) -> str:
    """``field``'s range in words: ``from 1 to 2^31`` (``least``: another lower end)."""
    low, most = BOUNDS[field]
    return f"from {low if least is None else least} to {_POWERS.get(most, f'{most:,}')}"


def most_blocks(prompt_tokens: int, block_tokens: int) -> int:
    """The most content blocks of ``block_tokens`` tokens a prompt of ``prompt_tokens``
    tokens fills (its last block may be partly filled): more is a trace error, in
    ``prefix_blocks`` and in Mooncake's ``hash_ids`` alike.

    >>> most_blocks(1024, 512), most_blocks(1025, 512)
    (2, 3)
    """
    return -(-prompt_tokens // block_tokens)


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace (see the module docstring)."""

    arrival: int
    prompt_tokens: int
    output_tokens: int
    prefix_id: str | int | None = None
    prefix_tokens: int = 0
    #: The prompt's content blocks (Mooncake's ``hash_ids``), and their tokens each.
    prefix_blocks: tuple[int, ...] = ()
    prefix_block_tokens: int = 0
    #: The arrival in seconds, for a line that gave ``arrival_s`` (``arrival`` is then
    #: its step on the step clock the trace was read with).
    arrival_s: float | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"arrival": self.arrival} if self.arrival_s is None else {
            "arrival_s": self.arrival_s}
        out.update(prompt_tokens=self.prompt_tokens, output_tokens=self.output_tokens)
        if self.prefix_id is not None:
            out["prefix_id"] = self.prefix_id
            out["prefix_tokens"] = self.prefix_tokens
        if self.prefix_blocks:
            out["prefix_blocks"] = list(self.prefix_blocks)
            out["prefix_block_tokens"] = self.prefix_block_tokens
        return out


def read_trace(path: str | Path, step_ms: float = STEP_MS) -> tuple[TraceRequest, ...]:
    """The requests of the trace file at ``path`` (``-``: stdin); ``arrival_s`` times
    become steps of ``step_ms``."""
    if is_stdin(path):
        return parse_trace(read_text(path, what="the trace", error=TraceError), STDIN_NAME,
                           step_ms)
    try:
        data = Path(path).read_bytes()
        if data.startswith(GZIP_MAGIC):  # a compressed trace (trace.jsonl.gz) reads as is
            data = gzip.decompress(data)
        text = data.decode("utf-8")
    except FileNotFoundError:
        raise TraceError("no such trace file", file=str(path),
                         hint="give the path of a JSONL trace (kvspec.sim.generate_trace "
                         "writes one)") from None
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as exc:
        raise TraceError(f"cannot read the trace: {exc}", file=str(path),
                         hint="a trace is a UTF-8 text file (or one gzip-compressed), one "
                              "JSON object per line") from None
    return parse_trace(text, file=str(path), step_ms=step_ms)


def parse_trace(text: str, file: str = "<trace>", step_ms: float = STEP_MS
                ) -> tuple[TraceRequest, ...]:
    """The requests of a trace's text; ``file`` names it in errors."""
    # (a byte-order mark: editors on Windows write one)
    lines = enumerate(text.removeprefix("\ufeff").split("\n"), start=1)
    out = tuple(requests_of(((n, line) for n, line in lines if line.strip()), file,
                            step_ms))
    if not out:
        raise TraceError("the trace has no requests", file=file,
                         hint=f"write one JSON object per line, e.g. {_EXAMPLE}")
    return out


def requests_of(lines: Iterable[tuple[int, str]], file: str, step_ms: float = STEP_MS
                ) -> Iterator[TraceRequest]:
    """The requests of a trace's numbered lines (none blank), their arrivals checked
    never to decrease and given the same way on every line; ``file`` names the trace
    in errors; ``arrival_s`` times become steps of ``step_ms``."""
    last: float = 0
    first: tuple[int, str] | None = None  # the first line's number and arrival key
    step_s = step_ms / 1000
    for number, line in lines:
        request = _request(line, file, number)
        key = "arrival" if request.arrival_s is None else "arrival_s"
        if first is None:
            first = (number, key)
        elif key != first[1]:
            raise TraceError(f"line {first[0]} gives {first[1]}, this line {key}",
                             file=file, line=number, column=key_column(line, key),
                             hint="give every line's arrival the same way: steps (arrival) "
                                  "or seconds (arrival_s)")
        now = request.arrival if request.arrival_s is None else request.arrival_s
        if now < last:
            said = (f"step {now} after step {last}" if request.arrival_s is None else
                    f"{now:g} s after {last:g} s")
            raise TraceError(f"arrivals must not decrease: {said}", file=file, line=number,
                             column=key_column(line, key), hint="sort the trace by arrival")
        last = now
        if request.arrival_s is not None:
            steps = request.arrival_s / step_s + 1e-9  # (0.3 s at 0.1 s is step 3)
            if not steps <= MAX_ARRIVAL:
                raise TraceError(f"arrival_s {request.arrival_s:g} is past step 2^40 at "
                                 f"{step_ms:g} ms a step", file=file, line=number,
                                 column=key_column(line, key),
                                 hint="give a longer --step-ms, or check the time's unit "
                                      "(seconds)")
            request = replace(request, arrival=int(steps))
        yield request


#: msgspec's JSON decoder: integers of any length read exactly, NaN is an error.
_decode = msgspec.json.Decoder().decode


def _request(line: str, file: str, number: int) -> TraceRequest:
    try:
        obj = _decode(line)
    except (msgspec.DecodeError, RecursionError):  # deep nesting: read it strictly
        obj = _strict(line, file, number)  # raises with the position, or reads it
    if obj.__class__ is not dict:
        raise TraceError("a trace line must be a JSON object", file=file, line=number,
                         column=1, found=_type(obj),
                         hint=f"write one object per line, e.g. {_EXAMPLE}")
    if line.count('"') != _quotes(obj):  # a key twice, or escapes: check strictly
        _strict(line, file, number)
    try:
        return _checked(obj)
    except _Bad as bad:
        raise TraceError(bad.message, file=file, line=number, column=key_column(line, bad.key),
                         **bad.kw) from None


def _strict(line: str, file: str, number: int) -> Any:
    """Read ``line`` strictly (a key twice, NaN, an integer too long are errors)."""
    hint = f"each line is one JSON object, e.g. {_EXAMPLE}"
    try:
        return scan(line, what="the trace line", max_depth=MAX_DEPTH)[0]
    except Located as problem:
        raise TraceError(problem.message, file=file, line=number, column=problem.pos + 1,
                         **{"hint": hint, **problem.kw}) from None
    except (RecursionError, ValueError) as exc:
        raise TraceError(f"not JSON: {exc}", file=file, line=number, column=1,
                         hint=hint) from None


class _Bad(Exception):
    def __init__(self, message: str, key: str | None, **kw: Any) -> None:
        super().__init__(message)
        self.message, self.key, self.kw = message, key, kw


def _checked(obj: dict[str, Any]) -> TraceRequest:
    for key in obj:
        if key not in KEYS:
            close = difflib.get_close_matches(key, KEYS, n=1)
            raise _Bad(f"unknown key {key!r}", key, expected=", ".join(KEYS),
                       hint=f"did you mean {close[0]!r}?" if close else
                       "a trace line has only these keys")
    if "arrival" in obj and "arrival_s" in obj:
        raise _Bad("arrival and arrival_s together", "arrival_s",
                   hint="give the arrival once: a step (arrival) or seconds (arrival_s)")
    for key in ("arrival" if "arrival_s" not in obj else "arrival_s", *_REQUIRED):
        if key not in obj:
            required = ("arrival", *_REQUIRED)
            raise _Bad(f"missing key {key!r}", None, expected=", ".join(required),
                       hint=f"every line gives {', '.join(required)}, e.g. {_EXAMPLE}"
                       + ("; or its time in seconds, arrival_s" if key == "arrival" else ""))
    seconds: float | None = None
    arrival = 0
    if "arrival_s" in obj:
        seconds = _time(obj, "arrival_s")
    else:
        arrival = _integer(obj, "arrival",
                           "arrival is the engine step the request joins the waiting queue at")
    prompt = _integer(obj, "prompt_tokens", "a prompt has at least one token")
    output = _integer(obj, "output_tokens", "a request samples at least one token")
    if "prefix_blocks" in obj or "prefix_block_tokens" in obj:
        return replace(_blocks(obj, arrival, prompt, output), arrival_s=seconds)
    prefix_id = obj.get("prefix_id")
    if ("prefix_id" in obj) != ("prefix_tokens" in obj):
        given = "prefix_id" if "prefix_id" in obj else "prefix_tokens"
        raise _Bad(f"{given} without {'prefix_tokens' if given == 'prefix_id' else 'prefix_id'}",
                   given, hint="a shared prefix needs both: which prefix, and its length")
    if prefix_id is None:
        return TraceRequest(arrival, prompt, output, arrival_s=seconds)
    if prefix_id.__class__ not in (str, int):
        raise _Bad("prefix_id must be a string or an integer", "prefix_id",
                   found=_type(prefix_id), hint='name the shared prefix, e.g. "system"')
    shared = _integer(obj, "prefix_tokens", "the shared prefix's length in tokens")
    if shared > prompt:
        raise _Bad(f"prefix_tokens ({shared}) is more than prompt_tokens ({prompt})",
                   "prefix_tokens", hint="the shared prefix is part of the prompt")
    return TraceRequest(arrival, prompt, output, prefix_id, shared, arrival_s=seconds)


def _time(obj: dict[str, Any], key: str) -> float:
    value = obj[key]
    if value.__class__ not in (int, float) or not 0 <= value <= MAX_ARRIVAL_S:
        shown = json.dumps(value) if value.__class__ in (int, float, str, bool) or \
            value is None else _type(value)
        raise _Bad(f"{key} must be a number of seconds from 0 to 2^30", key, found=shown,
                   hint="the time the request arrives, in seconds from the trace's start")
    return float(value)


def _blocks(obj: dict[str, Any], arrival: int, prompt: int, output: int) -> TraceRequest:
    """A request whose prompt is made of content blocks (``prefix_blocks``)."""
    if "prefix_id" in obj or "prefix_tokens" in obj:
        given = "prefix_id" if "prefix_id" in obj else "prefix_tokens"
        raise _Bad(f"{given} with prefix_blocks", given,
                   hint="a request shares a named prefix or content blocks, not both")
    if ("prefix_blocks" in obj) != ("prefix_block_tokens" in obj):
        given = "prefix_blocks" if "prefix_blocks" in obj else "prefix_block_tokens"
        other = "prefix_block_tokens" if given == "prefix_blocks" else "prefix_blocks"
        raise _Bad(f"{given} without {other}", given,
                   hint="content blocks need both: the blocks' ids and their tokens each")
    blocks = obj["prefix_blocks"]
    if blocks.__class__ is not list or not blocks or any(
            b.__class__ is not int or b < 0 for b in blocks):
        raise _Bad("prefix_blocks must be a non-empty array of integers, 0 or more",
                   "prefix_blocks", found=_type(blocks) if blocks.__class__ is not list
                   else "an empty array" if not blocks else
                   json.dumps(next(b for b in blocks if b.__class__ is not int or b < 0)),
                   hint="one id per block of the prompt, e.g. [0, 1, 2] (Mooncake's hash_ids)")
    size = _integer(obj, "prefix_block_tokens",
                    "the tokens of one content block (Mooncake's: 512)")
    if len(blocks) > (most := most_blocks(prompt, size)):
        raise _Bad(f"prefix_blocks has {len(blocks):,} blocks of {size:,} tokens: more than "
                   f"the prompt's {prompt:,} tokens fill ({most:,})", "prefix_blocks",
                   hint="one id per block of the prompt, at most ceil(prompt_tokens / "
                        "prefix_block_tokens) of them")
    return TraceRequest(arrival, prompt, output, None, 0, tuple(blocks), size)


def _integer(obj: dict[str, Any], key: str, hint: str) -> int:
    value = obj[key]
    if not within(key, value):
        shown = json.dumps(value) if value.__class__ in (int, float, str, bool) or \
            value is None else _type(value)
        raise _Bad(f"{key} must be an integer {bounds_text(key)}", key, found=shown,
                   hint=hint)
    return value


def _type(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
             int: "an integer", float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _quotes(obj: dict[str, Any]) -> int:
    """The double quotes a line holding ``obj`` has when nothing is escaped."""
    count = 2 * len(obj)
    prefix = obj.get("prefix_id")
    if prefix.__class__ is str:
        count += 2
    return count


def key_column(line: str, key: str | None) -> int:
    """1-based column of ``key`` on ``line`` (1 when not found)."""
    if key is None:
        return 1
    try:
        _, _, keys = scan(line, lenient=True, max_depth=MAX_DEPTH)
    except (Located, ValueError, RecursionError):
        return 1
    return keys.get((key,), (1, 1))[1]


# -- writing, token ids --------------------------------------------------------

def trace_text(requests: Iterable[TraceRequest]) -> str:
    """The JSONL text of ``requests`` (keys in canonical order)."""
    return "".join(json.dumps(r.as_dict()) + "\n" for r in requests)


def write_trace(requests: Iterable[TraceRequest], path: str | Path) -> None:
    Path(path).write_text(trace_text(requests), encoding="utf-8")


def prefix_codes(requests: Sequence[TraceRequest]) -> list[int]:
    """A positive code per request's prefix id (0: none), numbered by first use."""
    codes: dict[Any, int] = {}
    out = []
    for r in requests:
        if r.prefix_id is None:
            out.append(0)
        else:
            key = (type(r.prefix_id), r.prefix_id)
            out.append(codes.setdefault(key, len(codes) + 1))
    return out


def token_id(index: int, position: int, code: int, prefix_tokens: int, num_codes: int) -> int:
    """The synthetic token id at ``position`` of request ``index`` (prefix ``code``
    of ``num_codes``): shared inside the prefix, unique outside it."""
    if code and position < prefix_tokens:
        return (code << 40) | position
    return ((num_codes + 1 + index) << 40) | position
