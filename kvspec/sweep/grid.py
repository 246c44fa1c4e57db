"""The grid file of ``kvspec sweep`` (docs/sweep.md): its schema and reading it.

A grid names the models (a layout source, or a Hugging Face ``config.json`` that
``kvspec init --from-hf`` turns into one for each tensor and pipeline size), the
axes and their values, constraints over the axes, and the traffic every point
must serve (``target``). Reading checks the file against :class:`Grid` and
reports every problem at once, each at its line and column, with a hint, and
"did you mean" for an unknown axis.

>>> grid = parse_grid('''
... kvspec_sweep: 1
... base: layouts/llama-3.1-8b.yaml
... axes: {tensor: [1, 2], workload: [{name: chat, context_tokens: 512, output_tokens: 64}]}
... target: {rate: 20, step_ms: 30}
... ''', "grid.yaml")
>>> grid.model.axes.tensor, grid.model.target.rate
([1, 2], 20.0)
"""

# one idea: the grid's model and every check of what a grid file says, each error in
# the grid's own words at its position (numbers, repeated values, versions, keys)

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PlainValidator,
    Tag,
    ValidationError,
    WithJsonSchema,
    field_validator,
)
from pydantic_core import PydanticCustomError

from kvspec.errors import ErrorList, KvspecError, SourceError, format_path
from kvspec.files import MAX_MEMORY, SIZE_EXPECTED, SIZE_PATTERN, read_text, size_bytes
from kvspec.integrations import rules
from kvspec.model.pooling import Policy, TimeUnit, Workload, declared
from kvspec.model.slo import SLO_METRICS, BadLimit, Limit, parse_limit
from kvspec.model.workloads import TraceFormat
from kvspec.source.document import Document, parse_yaml
from kvspec.source.parse import clean_loc, schema_error, yaml_repr
from kvspec.source.schema import (
    MaxLen,
    PositiveInt,
    Ranks,
    Size,
    Tokens,
    version_not_a_bool,
)

__all__ = ["AXES", "Grid", "GridFile", "HfBase", "SourceBase", "WorkloadEntry", "grid_schema",
           "parse_grid", "read_grid"]

#: The axes a grid may sweep, in the order a point lists them.
AXES = ("memory", "gpu_memory", "tensor", "pipeline", "kv_cache_dtype", "block_size",
        "pooling.policy", "max_num_seqs", "workload")
#: Names users write for an axis, and the axis they mean.
AXIS_SYNONYMS = {"tp": "tensor", "pp": "pipeline", "tensor_parallel_size": "tensor",
                 "pipeline_parallel_size": "pipeline", "cache_dtype": "kv_cache_dtype",
                 "policy": "pooling.policy", "pooling": "pooling.policy",
                 "kv_cache_memory_bytes": "memory", "gpu": "gpu_memory",
                 "trace": "workload", "workloads": "workload", "seqs": "max_num_seqs"}


#: The largest target rate, requests per second (a million GPUs' worth of traffic),
#: and the smallest: one request in some eleven days (a rate of 1e-300 is a typo, and
#: a trace drawn at it would arrive past any clock); a workload's rate per step shares
#: it with the trace generator (kvspec.sim.trace.MIN_RATE).
MAX_RATE, MIN_RATE = 1e9, 1e-6
#: An engine step's milliseconds: from a microsecond to a thousand seconds.
MIN_STEP_MS, MAX_STEP_MS = 1e-3, 1e6


class _Strict(BaseModel):
    # strict: YAML's types are the values' types ('8' is not 8); no .inf or .nan: no
    # figure of a grid is infinite, and NaN compares to nothing
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, populate_by_name=True,
                              allow_inf_nan=False)


def _bytes(value: Any) -> int:
    n = size_bytes(value)
    if n is None:
        raise PydanticCustomError("size", SIZE_EXPECTED)
    if n == 0:
        raise PydanticCustomError("size_zero", "more than 0 bytes")
    if n > MAX_MEMORY:
        raise PydanticCustomError("memory_max", "at most 256TiB per rank")
    return n


#: Bytes, more than none (a memory, a model's weights): an int or a size (``80GB``).
PositiveSize = Annotated[int, PlainValidator(_bytes), WithJsonSchema(
    {"anyOf": [{"type": "integer", "minimum": 1, "maximum": MAX_MEMORY},
               {"type": "string", "pattern": SIZE_PATTERN}]})]
StepMs = Annotated[float, Field(ge=MIN_STEP_MS, le=MAX_STEP_MS)]


def _as_float(value: Any) -> Any:
    """An integer as a float (YAML's 30 for 30.0); one too large for a float stays
    as it is, for its field's bound to refuse."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**1000:
        return float(value)
    return value


def _step_ms_kind(value: Any) -> str:
    return "per_tensor" if isinstance(value, dict) else "one"


def _step_time_kind(value: Any) -> str:
    return "one" if isinstance(value, dict) and "profile" in value else "per_tensor"


class ProfileRef(_Strict):
    """One step-time profile for every tensor size (its path relative to the grid)."""

    profile: str = Field(min_length=1, description="A step-time profile (docs/latency.md).")


#: An SLO's limits as a grid writes them: ``{ttft_p99: 2s, tpot_p50: 50ms}``.
Slo = Annotated[dict[str, Any], WithJsonSchema({
    "type": "object", "minProperties": 1,
    "propertyNames": {"pattern": f"^({'|'.join(SLO_METRICS)})_p[0-9]+(\\.[0-9]+)?$"},
    "additionalProperties": {"type": "string",
                             "pattern": "^\\s*[0-9]+(\\.[0-9]*)?([eE][-+]?[0-9]+)?\\s*"
                                        "(s|ms|us|ns|ps)\\s*$"}})]


class SourceBase(_Strict):
    """A layout source (its path relative to the grid file)."""

    source: str = Field(min_length=1)
    name: str | None = Field(None, min_length=1, description="Default: the source's name.")
    weights: PositiveSize | None = Field(None, description="Bytes of the model's weights "
                                         "(for gpu_memory: what they leave each rank).")


class HfBase(_Strict):
    """A Hugging Face config.json: ``kvspec init --from-hf`` makes the source of each
    point, for its tensor and pipeline size."""

    hf: str = Field(min_length=1)
    name: str | None = Field(None, min_length=1, description="Default: the file's stem.")
    model: str | None = None
    target: str | None = Field(None, description="kvspec init's --target (hopper, ...).")
    max_model_len: MaxLen | None = None
    weights: PositiveSize | None = None

    @field_validator("target")
    @classmethod
    def _target(cls, value: str | None) -> str | None:
        # refused here, at the grid's line, not when the first point runs init
        if value is not None:
            try:
                rules.target(value)
            except ValueError:
                raise PydanticCustomError(
                    "target_name", f"a GPU class ({', '.join(rules.GPU_TARGETS)}) or a GDN "
                    f"prefill backend ({', '.join(rules.GDN_PREFILL_BACKENDS)})") from None
        return value


Base = Annotated[str, Field(min_length=1)] | SourceBase | HfBase


class TraceColumns(_Strict):
    """Where a ``lengths`` trace keeps each figure (docs/traces.md)."""

    prompt: str = Field(min_length=1)
    output: str = Field(min_length=1)
    time: str | None = Field(None, min_length=1)
    time_unit: TimeUnit = "s"


def _default(name: str) -> Any:
    """A workload field's default, declared once in :class:`kvspec.model.pooling.Workload`."""
    return declared(Workload, name).default


class WorkloadEntry(_Strict):
    """One workload: a trace (any format ``kvspec simulate --workload`` reads), a
    preset, or a summary a seeded trace is drawn from (every request arriving at
    step 0 unless ``rate`` is given)."""

    name: str | None = Field(None, min_length=1)
    trace: str | None = Field(None, min_length=1)
    format: TraceFormat | None = Field(None, description="The trace's format "
                                       "(docs/traces.md); default: from its extension and "
                                       "first line.")
    columns: TraceColumns | None = Field(None, description="format lengths: its columns.")
    step_ms: StepMs | None = Field(None, description="Milliseconds one engine step stands "
                                   "for when a trace's arrival times become steps (default: "
                                   "kvspec simulate's).")
    preset: str | None = Field(None, min_length=1)
    context_tokens: Tokens | None = None
    output_tokens: Tokens | None = None
    requests: Annotated[int, Field(gt=0, le=1_000_000)] = _default("requests")
    seed: int = Field(0, ge=0, lt=2**64)
    rate: float | None = Field(None, ge=MIN_RATE, le=MAX_RATE, description="Arrivals per engine "
                               "step (Poisson); default: all at step 0.")
    prefix_sharing: Annotated[float, Field(ge=0, le=1)] = 0.0
    prefix_tokens: PositiveInt = _default("prefix_tokens")


class Axes(_Strict):
    """The values of each axis swept (an axis left out keeps the source's value)."""

    memory: list[PositiveSize] | None = Field(None, min_length=1, description="KV cache "
                                              "memory per rank (the source's engine.memory).")
    gpu_memory: list[PositiveSize] | None = Field(None, min_length=1, description="GPU "
                                                  "memory per rank: the KV cache gets "
                                                  "gpu_memory x gpu_memory_utilization - "
                                                  "reserve - weights/ranks.")
    tensor: list[Ranks] | None = Field(None, min_length=1)
    pipeline: list[Ranks] | None = Field(None, min_length=1)
    kv_cache_dtype: list[Annotated[str, Field(min_length=1)]] | None = Field(None,
                                                                             min_length=1)
    block_size: list[PositiveInt] | None = Field(None, min_length=1)
    pooling_policy: list[Policy] | None = Field(
        None, min_length=1, alias="pooling.policy")
    max_num_seqs: list[PositiveInt] | None = Field(None, min_length=1)
    workload: list[WorkloadEntry] = Field(min_length=1)

    @field_validator("*", mode="before")
    @classmethod
    def _given(cls, value: Any) -> Any:
        # `tensor:` with nothing after it is YAML's null: an axis with no values, not
        # "keep the source's" (that is leaving the axis out)
        if value is None:
            raise PydanticCustomError("axis_null", "a list of the axis's values")
        return value


class Target(_Strict):
    """The traffic to serve: ``rate`` requests per second; an engine step taking
    ``step_ms`` milliseconds, or what a step-time profile gives for its batch
    (``step_time``); optionally an SLO every request is held to (``slo``)."""

    rate: float = Field(ge=MIN_RATE, le=MAX_RATE, description="Requests per second (or '20 "
                        "requests/s').")
    step_ms: Annotated[Annotated[StepMs, Tag("one")] | Annotated[
        dict[Ranks, StepMs], Tag("per_tensor")], Discriminator(_step_ms_kind)] | None = Field(
        None, description="Milliseconds one engine step takes (the constant model): one "
        "figure, or one per tensor size ({2: 30, 4: 18, 8: 11}). Excludes step_time.")
    step_time: Annotated[Annotated[ProfileRef, Tag("one")] | Annotated[
        dict[Ranks, Annotated[str, Field(min_length=1)]], Tag("per_tensor")],
        Discriminator(_step_time_kind)] | None = Field(
        None, description="Step-time profiles (docs/latency.md): {profile: FILE} for every "
        "tensor size, or one per tensor size ({2: tp2.profile.yaml, 4: tp4.profile.yaml}); "
        "each point's run is timed in seconds. Excludes step_ms.")
    slo: Slo | None = Field(None, description="Limits every request is held to, each "
                            "METRIC_pNN: TIME with its unit ({ttft_p99: 2s, tpot_p50: 50ms}; "
                            "metrics queue, ttft, tpot, e2e).")

    def step_ms_at(self, tensor: int) -> float | None:
        """The step time at ``tensor`` ranks (None: the grid gives none for it)."""
        if isinstance(self.step_ms, dict):
            return self.step_ms.get(tensor)
        return self.step_ms

    def profile_at(self, tensor: int) -> tuple[str, tuple[str | int, ...]] | None:
        """The profile written for ``tensor`` ranks and where (None: none for it)."""
        if isinstance(self.step_time, ProfileRef):
            return self.step_time.profile, ("target", "step_time", "profile")
        if isinstance(self.step_time, dict) and tensor in self.step_time:
            return self.step_time[tensor], ("target", "step_time", tensor)
        return None

    @field_validator("rate", mode="before")
    @classmethod
    def _rate(cls, value: Any) -> Any:
        if isinstance(value, str):
            m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?)\s*"
                             r"(?:requests?\s*/\s*s)?\s*", value)
            if m and math.isfinite(float(m.group(1))):
                return float(m.group(1))
        return _as_float(value)

    @field_validator("step_ms", mode="before")
    @classmethod
    def _ms(cls, value: Any) -> Any:
        return {k: _as_float(v) for k, v in value.items()} if isinstance(value, dict) \
            else _as_float(value)


class Grid(_Strict):
    """A sweep's grid file, format version 1."""

    kvspec_sweep: Literal[1] = Field(description="Grid format version.")

    base: Base | list[Base] = Field(description="The model(s): a source path, "
                                    "{source: PATH}, or {hf: config.json}.")

    @field_validator("kvspec_sweep", mode="before")
    @classmethod
    def _version(cls, value: Any) -> Any:
        return version_not_a_bool(value)
    axes: Axes
    constraints: list[str] = Field(default_factory=list, description="Expressions over "
                                   "the axes that every point must meet: tensor * "
                                   "pipeline <= 8.")
    target: Target
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.9
    reserve: Size = Field(0, description="Bytes per rank beside weights and KV cache "
                          "(activations, CUDA graphs), for gpu_memory.")

    @field_validator("gpu_memory_utilization", mode="before")
    @classmethod
    def _float(cls, value: Any) -> Any:
        return _as_float(value)


#: The models whose fields an unknown key is looked up in.
_FIELDS: dict[tuple[str, ...], type[BaseModel]] = {
    (): Grid, ("axes",): Axes, ("target",): Target, ("base",): SourceBase}


@dataclass(frozen=True)
class GridFile:
    """A grid, read: its model and its document (every value's position), and its
    target's SLO read (:func:`kvspec.model.slo.parse_limit`)."""

    model: Grid
    doc: Document
    slo: tuple[Limit, ...] = ()

    @property
    def file(self) -> str:
        return self.doc.file

    @property
    def bases(self) -> list[str | SourceBase | HfBase]:
        b = self.model.base
        return list(b) if isinstance(b, list) else [b]


def _allowed(parent: tuple) -> list[str]:
    if parent == ("axes",):
        return list(AXES)
    if parent[:1] == ("axes",) and "workload" in parent:
        return list(WorkloadEntry.model_fields)
    if parent[:1] == ("base",):
        return sorted(set(SourceBase.model_fields) | set(HfBase.model_fields))
    model = _FIELDS.get(parent)
    return list(model.model_fields) if model else []


#: Union tags pydantic puts in a location (``target.step_ms``'s two shapes).
_TAGS = ("one", "per_tensor")
#: The pydantic error types of a number's type or range.
_NUMBER_ERRORS = ("int_type", "int_parsing", "int_from_float", "float_type", "float_parsing",
                  "finite_number", "greater_than", "greater_than_equal", "less_than",
                  "less_than_equal", "size", "size_zero", "memory_max")
#: A number with an exponent that YAML 1.1 (PyYAML) reads as a string: its floats
#: need a dot and a signed exponent (1.0e-300, 1.0e+9).
_YAML_STRING_NUMBER = re.compile(r"\s*[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+\s*")


def _clean(loc: tuple) -> tuple[tuple, bool]:
    """A grid error's location without union tags; whether it is about a key."""
    loc = clean_loc(loc)
    key = bool(loc) and loc[-1] == "[key]"
    loc = loc[:-1] if key else loc
    return tuple(p for i, p in enumerate(loc)
                 if not (p in _TAGS and i > 0 and loc[i - 1] in ("step_ms", "step_time"))), key


def _bound(ctx: dict[str, Any], integer: bool) -> str:
    """What a number out of range should have been, from its bounds."""
    def n(v: Any) -> str:
        if isinstance(v, float) and v.is_integer() and abs(v) < 1e16:
            v = int(v)
        return f"{v:,}" if isinstance(v, int) else f"{v:g}"
    low = f"above {n(ctx['gt'])}" if "gt" in ctx else \
        f"{n(ctx['ge'])} or more" if "ge" in ctx else None
    high = f"at most {n(ctx['le'])}" if "le" in ctx else \
        f"below {n(ctx['lt'])}" if "lt" in ctx else None
    what = "an integer" if integer else "a number"
    return f"{what} {low or high}"


def _yaml_hint(found: str, integer: bool) -> str:
    """How to write a number that YAML read as a string (``1e-300``)."""
    text = found.strip()
    mantissa, _, exponent = text.lower().partition("e")
    value = float(text)
    if not math.isfinite(value):
        return f"{text} is beyond any number a grid takes: check it for a typo"
    if integer and value.is_integer() and abs(value) < 1e18:
        written = f"{int(value)}"
    else:
        dot = mantissa if "." in mantissa else mantissa + ".0"
        sign = exponent if exponent[:1] in "+-" else "+" + exponent
        written = f"{dot}e{sign}"
    return (f"YAML reads {text} as a string (its numbers with an exponent need a dot and "
            f"a signed exponent): write {written}")


def _digits(n: int) -> str:
    """A whole number as found, shortened when it is long."""
    text = str(n)
    return text if len(text) <= 24 else f"{text[:12]}... ({len(text):,} digits)"


def _number_error(doc: Document, loc: tuple, err: Any) -> SourceError:
    """A number's type or range error, in the grid's words (no pydantic names)."""
    kind, found, ctx = err["type"], err.get("input"), err.get("ctx") or {}
    integer = kind.startswith("int_") or (isinstance(found, int) and kind in (
        "greater_than", "greater_than_equal", "less_than", "less_than_equal"))
    sized = kind in ("size", "size_zero", "memory_max")
    if isinstance(found, str) and _YAML_STRING_NUMBER.fullmatch(found):
        hint = _yaml_hint(found, integer or sized)
        expected = SIZE_EXPECTED if sized else "an integer" if integer else "a number"
        return doc.error(f"invalid value for {format_path(loc)}", loc, expected=expected,
                         found=yaml_repr(found), hint=hint)
    if kind == "float_type" and isinstance(found, int) and not isinstance(found, bool):
        return doc.error(f"invalid value for {format_path(loc)}", loc,
                         expected="a finite number", found=_digits(found),
                         hint="that is far beyond any deployment: check the number for a "
                              "typo")
    if kind == "size_zero":
        return doc.error(f"invalid value for {format_path(loc)}", loc,
                         expected="more than 0 bytes", found=yaml_repr(found),
                         hint="a memory or a model's weights of 0 bytes is no deployment: "
                              "give the bytes, e.g. 80GB")
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        big = kind.startswith("less")
        return doc.error(f"invalid value for {format_path(loc)}", loc,
                         expected=_bound(ctx, integer), found=_digits(found) if isinstance(
                             found, int) and not isinstance(found, bool) else yaml_repr(found),
                         hint="that is far beyond any deployment: check the number for a "
                              "typo" if big else f"write {_bound(ctx, integer)}")
    found_doc = schema_error(doc, {**err, "loc": loc})
    return found_doc.replace(  # type: ignore[return-value]
        hint=(found_doc.hint or "").replace("docs/format.md", "docs/sweep.md"))


def _error(doc: Document, err: Any, at: tuple = ()) -> SourceError:
    loc, key = _clean(at + tuple(err["loc"]))
    kind, found = err["type"], err.get("input")
    if kind == "axis_null":
        return doc.error(f"the axis {loc[-1]!r} has no values", loc,
                         expected=f"{loc[-1]}: [VALUE, ...]", found="null",
                         hint="give its values, or leave the axis out to keep the source's "
                              "value")
    if kind == "literal_error" and loc == ("kvspec_sweep",):
        return doc.error("invalid value for 'kvspec_sweep'", loc, expected="1",
                         found=yaml_repr(found),
                         hint="write 1, not '1': the version is a number, and a quoted "
                              "value is a string" if found == "1" else
                              "this kvspec reads grid format 1: write kvspec_sweep: 1")
    if key:
        return doc.error(f"invalid key {format_path(loc)}", loc, key=True,
                         expected="a tensor size: 1 to 4,096", found=yaml_repr(loc[-1]),
                         hint="give each tensor size's profile, e.g. step_time: {2: "
                              "tp2.profile.yaml, 4: tp4.profile.yaml}, or one for every "
                              "size: step_time: {profile: FILE}" if "step_time" in loc else
                              "give each tensor size's step time, e.g. step_ms: {2: 30, 4: 18}")
    if kind in _NUMBER_ERRORS:
        return _number_error(doc, loc, err)
    if kind != "extra_forbidden":
        found_doc = schema_error(doc, {**err, "loc": loc})
        hint = (found_doc.hint or "").replace("docs/format.md", "docs/sweep.md")
        return found_doc.replace(hint=hint)  # type: ignore[return-value]
    key_name, parent = loc[-1], tuple(p for p in loc[:-1] if not isinstance(p, int))
    allowed = _allowed(parent)
    what = "axis" if parent == ("axes",) else "field"
    close = [AXIS_SYNONYMS[key_name]] if what == "axis" and key_name in AXIS_SYNONYMS else \
        difflib.get_close_matches(str(key_name), allowed, n=1)
    return doc.error(f"unknown {what} {key_name!r}", loc, key=True,
                     expected="one of " + ", ".join(allowed),
                     hint=f"did you mean {close[0]!r}?" if close else
                     "remove it, or check the indentation (docs/sweep.md)")


def _unique(errors: list[KvspecError]) -> list[KvspecError]:
    seen, out = set(), []
    for e in errors:
        key = (e.line, e.column, e.message)
        if key not in seen:
            seen.add(key)
            out.append(e)
    return out


def _base(value: Any, at: tuple, doc: Document, errors: list[KvspecError]) -> Any:
    """A base entry as the model its keys say it is (so an error speaks of that one)."""
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, dict):
        model = HfBase if "hf" in value else SourceBase
        try:
            return model.model_validate(value)
        except ValidationError as exc:
            errors += [_error(doc, e, at) for e in exc.errors(include_url=False)]
            return "-"
    errors.append(doc.error("a base is a layout source or a Hugging Face config.json", at,
                            expected="layouts/m.yaml, {source: layouts/m.yaml}, or "
                            "{hf: config.json}", found=yaml_repr(value),
                            hint="give the model's source path, or its config.json"))
    return "-"


def _duplicates(doc: Document, axes: Axes) -> list[KvspecError]:
    """Each axis value given again (``tensor: [1, 1]``, ``memory: [1GiB, 1073741824]``):
    an error at the repeat, naming the first; a value swept twice would be two
    points of one deployment."""
    out: list[KvspecError] = []
    raw = doc.data.get("axes") if isinstance(doc.data, dict) else None
    for axis in AXES[:-1]:
        values = getattr(axes, axis.replace(".", "_"))
        first: dict[Any, int] = {}
        for j, value in enumerate(values or ()):
            if value not in first:
                first[value] = j
                continue
            i = first[value]
            written = raw[axis] if isinstance(raw, dict) else None
            shown = [yaml_repr(written[k]) if isinstance(written, list) else repr(value)
                     for k in (i, j)]
            same = "" if shown[0] == shown[1] else f" ({shown[0]} first)"
            line, col = doc.position(("axes", axis, i)) or (None, None)
            out.append(doc.error(
                f"{axis} {shown[1]} is given twice{same}", ("axes", axis, j),
                found=shown[1], hint=f"the first is axes.{axis}[{i}]" +
                (f" (line {line}, column {col})" if line is not None else "") +
                ": give each value once (a value given twice would be swept as two points)"))
    return out


def parse_grid(text: str, file: str = "<grid>") -> GridFile:
    """The grid in ``text``; raise every problem at once, each at its position."""
    doc = parse_yaml(text, file)
    if not isinstance(doc.data, dict):
        raise SourceError("a grid file is a mapping", file=file, line=1, column=1,
                          expected="kvspec_sweep: 1, base: ..., axes: ..., target: ...",
                          hint="see docs/sweep.md for a complete grid")
    data = dict(doc.data)
    errors: list[KvspecError] = []
    if "base" in data:
        raw = data["base"]
        data["base"] = [_base(b, ("base", i), doc, errors) for i, b in enumerate(raw)] \
            if isinstance(raw, list) and raw else _base(raw, ("base",), doc, errors)
    limits: tuple[Limit, ...] = ()
    try:
        model = Grid.model_validate(data)
    except ValidationError as exc:
        errors += [_error(doc, e) for e in exc.errors(include_url=False)]
    else:
        errors += _duplicates(doc, model.axes)
        errors += _clock(doc, model.target)
        limits = _slo(doc, model.target, errors)
    if errors:
        errors = _unique(errors)
        raise (errors[0] if len(errors) == 1 else ErrorList(errors))
    return GridFile(model, doc, limits)


def _clock(doc: Document, target: Target) -> list[KvspecError]:
    """The target's step time: ``step_ms`` (the constant model) or ``step_time``
    (profiles), one of them."""
    if target.step_ms is not None and target.step_time is not None:
        return [doc.error("step_ms and step_time exclude each other", ("target", "step_time"),
                          key=True, hint="step_ms holds every step to that many "
                          "milliseconds; step_time times each step by a profile "
                          "(docs/sweep.md, \"In time\"): keep one")]
    if target.step_ms is None and target.step_time is None:
        # `step_ms:` (or `step_time:`) written with no value is placed at that key
        raw = doc.data.get("target") if isinstance(doc.data, dict) else None
        given = [k for k in ("step_ms", "step_time") if isinstance(raw, dict) and k in raw]
        at = ("target", given[0]) if given else ("target",)
        return [doc.error("the target gives no step time", at, key=True,
                          found="null" if given else None,
                          expected="step_ms: 30 (milliseconds a step), or step_time: "
                          "{profile: FILE} (a step-time profile)",
                          hint="give the engine step's milliseconds, or a profile of your "
                               "engine (kvspec profile writes one; docs/latency.md)")]
    return []


def _slo(doc: Document, target: Target, errors: list[KvspecError]) -> tuple[Limit, ...]:
    """The target's SLO, each limit read by the rule ``--slo`` reads by; an error at
    the key or the value a limit cannot be read from."""
    if target.slo is None:
        return ()
    if not target.slo:
        errors.append(doc.error("the SLO gives no limit", ("target", "slo"),
                                expected="{ttft_p99: 2s, tpot_p50: 50ms}",
                                hint="give each limit as METRIC_pNN: TIME, or leave slo out"))
        return ()
    limits: list[Limit] = []
    for key, value in target.slo.items():
        at = ("target", "slo", key)
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            errors.append(doc.error(f"invalid value for {format_path(at)}", at,
                                    expected="a time with its unit: 2s, 50ms, 800us",
                                    found=yaml_repr(value),
                                    hint="write the limit as METRIC_pNN: TIME, e.g. "
                                         "ttft_p99: 2s"))
            continue
        item = f"{key}={value}"
        try:
            limit = parse_limit(item)
        except BadLimit as exc:
            on_key = exc.offset < len(str(key)) + 1
            errors.append(doc.error(f"target.slo: {exc.what}", at, key=on_key,
                                    found=yaml_repr(key if on_key else value),
                                    hint=exc.hint.replace("METRIC_pNN=TIME", "METRIC_pNN: "
                                                          "TIME").replace("=", ": ")))
            continue
        if any(x.metric == limit.metric and x.percent == limit.percent for x in limits):
            errors.append(doc.error(f"target.slo: {limit.key} is limited twice", at, key=True,
                                    found=yaml_repr(key), hint="give each limit once"))
            continue
        limits.append(limit)
    return tuple(limits)


def read_grid(path: str) -> GridFile:
    """The grid file at ``path``."""
    text = read_text(path, what="the grid file",
                     hint="give the path of a sweep grid, e.g. sweep.yaml (docs/sweep.md)")
    return parse_grid(text, str(path))


def grid_schema() -> dict[str, Any]:
    """The JSON Schema of a grid file (``schemas/sweep.schema.json``)."""
    schema = Grid.model_json_schema(mode="validation", by_alias=True)
    schema.update({"$schema": "https://json-schema.org/draft/2020-12/schema",
                   "$id": "urn:kvspec:schema:sweep:1", "title": "kvspec sweep grid (format 1)",
                   "$comment": "Generated by `kvspec schema` from kvspec.sweep.grid.Grid; do not "
                   "edit."})
    return schema
