"""Reading an artifact from untrusted bytes, without the compiler.

Cheapest first, each refusal an :class:`~kvspec.errors.ArtifactError` at the
line and column of what is wrong, with a hint:

1. the text is JSON of this format (``kvspec.layout/3``; an artifact of another
   format is refused naming its version), with no key twice in one object (JSON
   readers disagree on which of the two counts, as the source reader says), and
   matches the format's schema (:mod:`.format`: every field present, of its type
   and range, nothing else);
2. ``sha256`` is that of the canonical text of the rest (:mod:`.text`);
3. its structure is sound (:mod:`.structure`): placement, pools, dtypes, strides
   as the axis order gives them, accounting, each spec's page size the one its
   own fields give; the budget's block count (each pool's, for separate pools)
   the one its memory and bytes per block give (:mod:`.sizing`); and, for the
   fewest blocks that serve a request and for the budget's count, every view
   inside its pool and no two block ids sharing a byte. ``load`` proves the
   latter again for the count it allocates.

That an artifact is *exactly what this compiler plans from its inputs* is not
checked here: that needs the planner, and is ``kvspec check`` / ``verify`` (and
``load(..., replan=True)``). docs/artifact.md says what each check proves.
"""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec

from kvspec.artifact.blocks import memory_problems
from kvspec.artifact.format import FORMAT, Envelope, Layout, Unsigned
from kvspec.artifact.sizing import counts_for
from kvspec.artifact.structure import Problem, shape_problems
from kvspec.artifact.text import signature
from kvspec.errors import ArtifactError, KvspecError, format_path
from kvspec.jsonpos import MAX_DEPTH, Located, scan

__all__ = ["RECOMPILE", "decode", "format_problems", "parse_path", "position"]

RECOMPILE = "recompile it from its source (kvspec compile); never edit artifacts"
_COMPILE = "compile a source with `kvspec compile model.yaml`"

_decoder = msgspec.json.Decoder(Envelope)


class _Head(msgspec.Struct):
    """Just enough of any JSON object to say which format it claims."""

    format: Any = None


_head = msgspec.json.Decoder(_Head)


def decode(text: str | bytes, origin: str) -> Envelope:
    """The checked envelope ``text`` holds (steps 1-3 of the module's list)."""
    try:
        env = _decoder.decode(text)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise _why_not(text, origin, exc) from None
    except RecursionError:
        raise _hostile(text, origin) or _unreadable(text, origin) from None
    if env.format != FORMAT:
        raise _other_format(env.format, origin)
    _no_key_twice(text, origin)
    got = signature(env.unsigned())
    if env.sha256 != got:
        raise ArtifactError("the artifact does not match its sha256: it was edited or "
                            "corrupted", file=origin, expected=env.sha256, found=got,
                            hint=RECOMPILE)
    problems = shape_problems(env.body) or _budget(env.body) or _memory(env)
    if problems:
        raise unsound(problems, origin, text)
    return env


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise _Twice
    return out


class _Twice(Exception):
    """A JSON object of the text has a key twice."""


def _no_key_twice(text: str | bytes, origin: str) -> None:
    """Refuse a text with a key twice in one object, at the second (the typed decoder
    keeps the last, silently); the positions are found only when there is one."""
    try:
        json.loads(text, object_pairs_hook=_pairs)
    except _Twice:
        s = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
        try:
            scan(s, what="the artifact", max_depth=MAX_DEPTH)
        except Located as exc:
            raise exc.error(s, origin, RECOMPILE, cls=ArtifactError).replace(
                hint=RECOMPILE) from None
        raise ArtifactError("the artifact has a key twice in one object", file=origin,
                            expected="each key once", hint=RECOMPILE) from None
    except (ValueError, RecursionError):  # read by the typed decoder already: not reached
        return


def _budget(body: Layout) -> list[Problem]:
    """The budget's block count (and each separate pool's) is the one its memory and
    the pools' bytes per block give, by the rule ``load`` sizes with."""
    if body.budget is None:
        return []
    try:
        counts = counts_for(body, 0, memory=body.budget.memory)
    except KvspecError as err:
        return [Problem(("body", "budget", "memory"), f"the budget's memory "
                        f"({body.budget.memory:,} bytes) cannot be sized: {err.message}")]
    main = next((p.name for p in body.stages[0].pools if p.num_blocks is None), None)
    out = []
    if main is not None and counts[main] != body.budget.num_blocks:
        out.append(Problem(("body", "budget", "num_blocks"), f"the budget says "
                           f"{body.budget.num_blocks} blocks; {body.budget.memory:,} bytes give "
                           f"{counts[main]} at {_per_block(body, main)} bytes per block"))
    shares = body.pooling.pools if body.pooling is not None else []
    for i, share in enumerate(shares):
        want = counts.get(share.name)
        if share.budget is not None and want is not None and share.budget.num_blocks != want:
            out.append(Problem(("body", "pooling", "pools", i, "budget", "num_blocks"),
                               f"pool {share.name}: the budget says {share.budget.num_blocks} "
                               f"blocks; its share of {body.budget.memory:,} bytes gives {want} "
                               f"at {_per_block(body, share.name)} bytes per block"))
    return out


def _per_block(body: Layout, pool: str) -> int:
    return next(p.bytes_per_block for p in body.stages[0].pools if p.name == pool)


def _memory(env: Envelope) -> list[Problem]:
    """The block-count checks for the fewest blocks that serve one request and
    for the budget's count."""
    body = env.body
    need = max((st.min_num_blocks for st in body.stages), default=1)
    counts = {need} | ({body.budget.num_blocks} if body.budget is not None else set())
    for stage in range(len(body.stages)):
        for n in sorted(counts):
            problems = memory_problems(body, stage, n)
            if problems:
                return problems
    return []


def format_problems(data: Any) -> list[str]:
    """What keeps ``data`` (parsed JSON) from matching the artifact format: empty,
    or the first problem as the format's validation reports it (its path in the
    JSON after ``at``).

    >>> format_problems({"format": "kvspec.layout/3"})
    ['Object missing required field `body`']
    """
    try:
        msgspec.convert(data, Envelope, strict=True)
    except msgspec.ValidationError as exc:
        return [str(exc)]
    except UnicodeError as exc:  # a lone surrogate: no JSON text holds it
        return [f"not text JSON can hold: {exc}"]
    return []


def unsound(problems: list[Problem], origin: str, text: str | bytes | None = None
            ) -> ArtifactError:
    """The error for an artifact whose structure breaks its invariants, placed
    at what the first problem is about (when the text is at hand)."""
    line, column = _position(text, problems[0].path) if text is not None else (None, None)
    shown = [p.message for p in problems]
    return ArtifactError(
        f"the artifact's structure is unsound ({len(problems)} problem(s)): it was edited, "
        "or written by a broken compiler", file=origin, line=line, column=column,
        path=format_path(problems[0].path),
        found="; ".join(shown[:5]) + ("; ..." if len(shown) > 5 else ""), hint=RECOMPILE)


def _other_format(fmt: Any, origin: str) -> ArtifactError:
    shown = str(fmt)[:80]
    if isinstance(fmt, str) and fmt.startswith("kvspec.layout/"):
        return ArtifactError(
            f"this artifact is format {shown}; this kvspec reads {FORMAT} only", file=origin,
            path="format", expected=FORMAT, found=shown,
            hint="recompile its source with this kvspec (kvspec compile model.yaml); "
                 "artifacts are frozen per format, and re-planning an older one would "
                 "silently change what it says")
    return ArtifactError("not a kvspec layout artifact", file=origin, path="format",
                         expected=f"format: {FORMAT}", found=shown, hint=_COMPILE)


_AT = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_STEP = re.compile(r"\.([A-Za-z_][A-Za-z_0-9]*)|\[(\d+)\]|\[('(?:[^'\\]|\\.)*')\]")


def parse_path(text: str) -> tuple[str | int, ...]:
    """msgspec's error path (``.body.groups[0].block_size``) as a tuple.

    >>> parse_path(".body.layers['a.b'].group")
    ('body', 'layers', 'a.b', 'group')
    """
    out: list[str | int] = []
    for m in _STEP.finditer(text):
        name, index, key = m.groups()
        out.append(name if name is not None else int(index) if index is not None
                   else json.loads('"' + key[1:-1].replace('"', '\\"') + '"'))
    return tuple(out)


def position(text: str | bytes, path: tuple[str | int, ...]) -> tuple[int | None, int | None]:
    """Line and column of the value at ``path`` of an artifact's ``text`` (or of its
    nearest parent); ``(None, None)`` when the text cannot be scanned.

    >>> position('{"body": {\\n "model": "m"}}', ("body", "model"))
    (2, 11)
    """
    return _position(text, path)


def _position(text: str | bytes, path: tuple[str | int, ...]) -> tuple[int | None, int | None]:
    """Line and column of the value at ``path`` (or its nearest parent)."""
    try:
        s = text.decode("utf-8") if isinstance(text, bytes) else text
        positions = scan(s, lenient=True)[1]
    except (Located, UnicodeDecodeError, RecursionError, ValueError):
        return None, None
    while path and path not in positions:
        path = path[:-1]
    return positions.get(path, (None, None))


def _why_not(text: str | bytes, origin: str, exc: Exception) -> ArtifactError:
    """What is wrong with a text the typed decoder refused, where."""
    if not isinstance(exc, msgspec.ValidationError):  # (a ValidationError is a DecodeError)
        return _not_json(text, origin)
    lines = _json_lines(text, origin)
    if lines is not None:
        return lines
    hostile = _hostile(text, origin)
    if hostile is not None:
        return hostile
    try:
        head = _head.decode(text)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        return ArtifactError("not a kvspec layout artifact", file=origin,
                             expected="a JSON object with format, compiler, source_sha256, "
                                      "sha256 and body", hint=_COMPILE)
    if head.format != FORMAT:
        return _other_format(head.format, origin)
    message = str(exc)
    if message == "Object missing required field `sha256`":
        return _unsigned(text, origin)
    m = _AT.search(message)
    path = parse_path(m.group("path")) if m else ()
    line, column = _position(text, path)
    what = message[:m.start()] if m else message
    return ArtifactError(f"does not match the artifact format: {what}", file=origin,
                         line=line, column=column,
                         path=format_path(path) if path else None, hint=RECOMPILE)


def _unsigned(text: str | bytes, origin: str) -> ArtifactError:
    """An artifact without its hash: say what the hash would be."""
    try:
        want = f"sha256: {signature(msgspec.json.decode(text, type=Unsigned))} (over the rest)"
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        want = "sha256: the hash of the rest"
    return ArtifactError("the artifact has no sha256: it was edited or corrupted", file=origin,
                         path="sha256", expected=want, found="no sha256", hint=RECOMPILE)


def _json_lines(text: str | bytes, origin: str) -> ArtifactError | None:
    """JSON Lines (a request trace, most likely) given where an artifact belongs; None
    when the text is not that."""
    s = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
    lines = [line for line in s.lstrip("\ufeff").splitlines() if line.strip()]
    if len(lines) < 2 and not origin.endswith(".jsonl"):
        return None
    try:
        first = json.loads(lines[0]) if lines else None
    except (ValueError, RecursionError):
        return None
    if not isinstance(first, dict) or "body" in first:
        return None
    trace = "prompt_tokens" in first
    return ArtifactError(
        "this is a request trace (JSON Lines), not an artifact" if trace else
        "this is JSON Lines (one object a line), not an artifact", file=origin,
        expected="a compiled .kvlayout.json artifact (one JSON document)",
        hint=f"a trace is replayed with `kvspec simulate LAYOUT --workload {origin}`; "
             "an artifact is what `kvspec compile model.yaml` writes" if trace else _COMPILE)


def _not_json(text: str | bytes, origin: str) -> ArtifactError:
    s = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
    lines = _json_lines(text, origin)
    if lines is not None:
        return lines
    if s.lstrip().startswith(("kvspec:", "#", "name:")) or origin.endswith((".yaml", ".yml")):
        return ArtifactError(
            "this is a layout source, not an artifact", file=origin,
            expected="a compiled .kvlayout.json artifact",
            hint=f"compile it with `kvspec compile {origin}` and use the .kvlayout.json it "
                 "writes")
    try:
        json.loads(s)
    except json.JSONDecodeError as exc:
        return ArtifactError(f"not valid JSON: {exc.msg}", file=origin, line=exc.lineno,
                             column=exc.colno, hint=_COMPILE)
    except (RecursionError, ValueError):
        return _unreadable(s, origin)
    try:  # what json reads but JSON has not (NaN, Infinity), at its position
        scan(s, what="an artifact", max_depth=MAX_DEPTH)
    except Located as problem:
        return problem.error(s, origin, RECOMPILE, cls=ArtifactError)
    except (RecursionError, ValueError):
        pass
    return ArtifactError("not valid JSON", file=origin, hint=_COMPILE)


def _hostile(text: str | bytes, origin: str) -> ArtifactError | None:
    """Where JSON goes past what any artifact holds (nesting, a number's digits),
    placed; None when it does not."""
    s = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
    try:
        scan(s, lenient=True, what="an artifact", max_depth=MAX_DEPTH)
    except Located as exc:
        return exc.error(s, origin, RECOMPILE, cls=ArtifactError)
    except (RecursionError, ValueError):
        return None
    return None


def _unreadable(text: str | bytes, origin: str) -> ArtifactError:
    """Where JSON goes past what an artifact holds (too deep, a number too long)."""
    s = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
    try:
        scan(s, lenient=True, what="an artifact", max_depth=MAX_DEPTH)
    except Located as exc:
        return exc.error(s, origin, RECOMPILE, cls=ArtifactError)
    return ArtifactError("not valid JSON", file=origin, hint=RECOMPILE)
