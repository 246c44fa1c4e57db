"""Reading an artifact: refuse anything no compiler could have written.

1. the envelope: a JSON object of this format, whose ``sha256`` (over
   everything else: format, compiler, source hash and body) matches;
2. the envelope and the planning inputs the planner takes as they are (engine,
   budget, name) match the schema: every field present, of its type and range
   (a removed ``compiler``, ``max_num_seqs: -1``, an unknown cache mode);
3. planning the body's inputs again gives exactly this body, compared as
   canonical text -- so an edited body with a recomputed hash
   (``layer_stride: 0``, a removed group, a changed page) is refused, naming
   the first field that differs.

Everything in the body that is not an input is re-derived in 3, so the full
schema (:mod:`.schema`) runs only to explain a failure precisely.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from kvspec.artifact import (
    COMPILER,
    FORMAT,
    Artifact,
    canonical_json,
    encoded_text,
    envelope_texts,
    sha256_text,
)
from kvspec.artifact.codec import Inputs, decode_inputs, encode
from kvspec.artifact.jsontext import ORJSON_SORTED as _ORJSON
from kvspec.errors import ArtifactError, KvspecError, format_path
from kvspec.jsonpos import MAX_DEPTH, Located, scan
from kvspec.model.quant.cells import Quantized, quantized

_RECOMPILE = "recompile it from its source (kvspec compile); never edit artifacts"


def _unreadable(text: str, origin: str) -> ArtifactError:
    """Where ``text``, JSON that ``json`` could not take (it recursed too deep, or
    met an integer too long for Python), goes past what an artifact holds."""
    try:
        scan(text, lenient=True, what="an artifact", max_depth=MAX_DEPTH)
    except Located as exc:
        return exc.error(text, origin, _RECOMPILE, cls=ArtifactError)
    return ArtifactError("not valid JSON", file=origin, hint=_RECOMPILE)


def parse_text(text: str, origin: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        if text.lstrip().startswith(("kvspec:", "#", "name:")) or origin.endswith((".yaml",
                                                                                   ".yml")):
            raise ArtifactError(
                "this is a layout source, not an artifact", file=origin,
                expected="a compiled .kvlayout.json artifact",
                hint=f"compile it with `kvspec compile {origin}` and use the "
                     ".kvlayout.json it writes") from None
        raise ArtifactError(f"not valid JSON: {exc.msg}", file=origin, line=exc.lineno,
                            column=exc.colno,
                            hint="compile a source with `kvspec compile model.yaml`") from None
    except (RecursionError, ValueError):  # nested too deep, or an integer too long
        raise _unreadable(text, origin) from None


Path = tuple[str | int, ...]


def first_difference(a: Any, b: Any, path: Path = ("body",)) -> tuple[Path, str, Any, Any] | None:
    """The first path where ``a`` and ``b`` differ, what differs there (``""``: the
    values, ``" (length)"``: a list's length) and both."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            if key not in a or key not in b:
                return (*path, key), "", a.get(key, "<absent>"), b.get(key, "<absent>")
            found = first_difference(a[key], b[key], (*path, key))
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b)):
            found = first_difference(x, y, (*path, i))
            if found:
                return found
        if len(a) != len(b):
            return path, " (length)", len(a), len(b)
        return None
    if a != b or type(a) is not type(b):
        return path, "", a, b
    return None


def _where(text: str | None, path: Path) -> tuple[int | None, int | None]:
    """Line and column in ``text`` of the value at ``path`` (or of its nearest parent
    there: an absent key, an edited container)."""
    if text is None:
        return None, None
    try:
        positions = scan(text, lenient=True)[1]
    except Located:
        return None, None
    while path and path not in positions:
        path = path[:-1]
    return positions.get(path, (None, None))


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 120 else text[:117] + "..."


def _envelope(data: Any, origin: str) -> str | None:
    """Check the envelope; the body's canonical text (None when not a dict)."""
    if not isinstance(data, dict) or "body" not in data:
        raise ArtifactError("not a kvspec layout artifact", file=origin,
                            expected="a JSON object with format, compiler, source_sha256, "
                                     "sha256 and body",
                            hint="compile a source with `kvspec compile model.yaml`")
    fmt = data.get("format")
    if fmt != FORMAT:
        raise ArtifactError(f"unsupported artifact format {fmt!r}", file=origin,
                            expected=FORMAT, found=str(fmt),
                            hint="recompile the source with this kvspec version")
    text, body = envelope_texts(data)
    want, got = data.get("sha256"), sha256_text(text)
    if not isinstance(want, str):
        raise ArtifactError("the artifact has no sha256: it was edited or corrupted",
                            file=origin, expected=f"sha256: {got} (over the rest)",
                            found="no sha256" if want is None else repr(want)[:80],
                            hint=_RECOMPILE)
    if want != got:
        raise ArtifactError("the artifact does not match its sha256: it was edited or "
                            "corrupted", file=origin, expected=str(want), found=got,
                            hint=_RECOMPILE)
    return body


def _schema_problem(data: dict[str, Any], origin: str, cause: str) -> ArtifactError:
    from kvspec.artifact.schema import schema_problems
    problems = schema_problems(data)
    if problems:
        return ArtifactError(
            f"does not match the artifact schema ({len(problems)} problem(s))", file=origin,
            found="; ".join(problems[:5]) + ("; ..." if len(problems) > 5 else ""),
            hint=_RECOMPILE)
    return ArtifactError(f"its body cannot be read back: {cause}", file=origin, hint=_RECOMPILE)


def replan(data: dict[str, Any], origin: str = "<artifact>"):
    """The Layout this compiler plans from the body's inputs."""
    from kvspec.planner import build_layout, plan_layers, size_plan

    try:
        inputs = decode_inputs(data["body"])
        plan = plan_layers(inputs.engine, inputs.stage_specs)
        sizing = size_plan(plan, memory=inputs.memory) \
            if inputs.memory is not None else None
        return build_layout(inputs.name, inputs.model, plan, sizing, _quantization(inputs))
    except KvspecError as err:
        raise ArtifactError(f"its layers do not plan: {err.message}", file=origin,
                            hint=_RECOMPILE) from None
    except Exception as exc:  # noqa: BLE001 - whatever a malformed body makes the planner raise
        raise _schema_problem(data, origin, f"{type(exc).__name__}: {exc}") from None


def _quantization(inputs: Inputs) -> dict[str, Quantized | None]:
    """Each layer's quantization, as the expand pass decides it from its spec and mode."""
    memo: dict[tuple[int, str | None], Quantized | None] = {}
    out = {}
    for stage in inputs.stage_specs:
        for name, spec in stage.items():
            dtype = inputs.kv_cache_dtypes.get(name)
            key = (id(spec), dtype)
            if key not in memo:
                memo[key] = quantized(spec, dtype)
            out[name] = memo[key]
    return out


def _verified_text(text: str, origin: str) -> Artifact | None:
    """The artifact ``text`` holds if it is, to the byte of its canonical form, what
    kvspec writes for the plan it makes of the body's inputs, with the envelope's
    hash right; None otherwise (then the full path, :func:`verified` of ``json``'s
    parse, says what is wrong).

    It accepts exactly what :func:`verified` accepts, in a fraction of the time:
    the text is parsed by orjson, and the envelope without ``sha256`` written
    compact (orjson again) must be the very text the hash covers, which is
    written from the plan (:func:`kvspec.artifact.encoded_text`). orjson's text is
    one-to-one on what its parser returns (no NaN, no infinity: it refuses those
    literals), so equal text means equal data, every value of the same JSON type;
    where orjson parses or writes otherwise than ``json`` (an int past 64 bits read
    as a float, a float under 1e-4, a lone surrogate), the texts differ or orjson
    refuses, and the full path decides. Like :func:`verified`, it does not look at
    the whitespace or the key order of the file."""
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if not (isinstance(data, dict) and data.get("format") == FORMAT
            and isinstance(data.get("body"), dict)):
        return None
    from kvspec.artifact.schema import input_problems
    try:
        if input_problems(data):
            return None
        layout = replan(data, origin)
        planned = {**data, "body": encode(layout)}
        covered = encoded_text(planned)
        if sha256_text(covered) != data.get("sha256"):
            return None
        rest = {k: v for k, v in data.items() if k != "sha256"}
        if orjson.dumps(rest, option=_ORJSON).decode() != covered:
            return None
    except Exception:  # noqa: BLE001 - the full path reports it
        return None
    return Artifact(planned, layout)


def read_text(text: str, origin: str) -> Artifact:
    """The verified artifact ``text`` holds: :func:`_verified_text`, else ``json``'s
    parse through :func:`verified`, which refuses it precisely."""
    fast = _verified_text(text, origin)
    if fast is not None:
        return fast
    data = parse_text(text, origin)
    try:
        return _verified(data, origin, text)
    except RecursionError:  # nesting json reads but the checks cannot walk
        raise _unreadable(text, origin) from None


def verified(data: Any, *, origin: str = "<artifact>") -> Artifact:
    """``data`` (a parsed artifact) as a verified :class:`Artifact`."""
    try:
        return _verified(data, origin)
    except RecursionError:  # nesting no artifact has: the checks cannot walk it
        raise ArtifactError(f"an artifact is nested more than {MAX_DEPTH} levels deep",
                            file=origin, expected="a few levels of nesting",
                            hint=_RECOMPILE) from None


def _verified(data: Any, origin: str, text: str | None = None) -> Artifact:
    stored = _envelope(data, origin)
    from kvspec.artifact.schema import input_problems
    if input_problems(data):
        raise _schema_problem(data, origin, "")
    layout = replan(data, origin)
    try:
        body = encode(layout)
        same = stored is not None and canonical_json(body) == stored  # one string compare
    except Exception as exc:  # noqa: BLE001 - a body planned from malformed inputs
        raise _schema_problem(data, origin, f"{type(exc).__name__}: {exc}") from None
    diff = None if same else first_difference(data["body"], body)
    if diff is not None:
        err = _schema_problem(data, origin, "")
        if "schema" in err.message:  # the precise message: what is malformed
            raise err
        path, what, stored, planned = diff
        line, column = _where(text, path)
        newer = data.get("compiler") != COMPILER
        raise ArtifactError(
            "the artifact is not what kvspec plans from its own layers and engine: it was "
            "edited, or written by another compiler", file=origin, line=line, column=column,
            path=format_path(path) + what,
            expected=f"{_short(planned)} (as {COMPILER} plans it)", found=_short(stored),
            hint=f"it says it was compiled by {data.get('compiler')}; " + _RECOMPILE
            if newer else _RECOMPILE)
    return Artifact(data, layout)
