"""A step-time profile: the file that says how long a step takes (docs/latency.md).

A profile is YAML a person reads, diffs and checks in, as a layout source is. It
says what it describes (engine and version, device, model, tensor and pipeline
sizes, dtypes, kvspec's version), the model's form and coefficients (each a
duration with its unit, per unit of its term), the range of batch shapes it was
measured over, its fit's residuals, and where its numbers came from (measured: the
date and the command; or declared by hand). Reading it checks it against
:class:`Profile` and reports every problem at once, each at its line and column.

>>> text = '''
... kvspec_profile: 1
... describes: {engine: vllm, engine_version: 0.33.0, device: NVIDIA H100 80GB HBM3,
...   model: meta-llama/Llama-3.1-8B-Instruct, tensor_parallel_size: 1,
...   pipeline_parallel_size: 1, dtype: bfloat16, kv_cache_dtype: auto,
...   kvspec_version: 0.3.0}
... step_time: {form: linear, fixed: 6ms, prefill_tokens: 20us, decode_requests: 50us,
...   context_tokens: 2ns, prefill_pairs: 0.01ps}
... provenance: {method: declared, date: 2025-06-01, command: written by hand}
... '''
>>> profile = parse_profile(text, "p.yaml")
>>> round(profile.step_time().seconds(0, 10, 10_000, 0), 9)
0.00652
"""

from __future__ import annotations

import datetime
import difflib
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from pydantic_core import PydanticCustomError

from kvspec.errors import ErrorList, KvspecError, SourceError
from kvspec.files import read_text
from kvspec.model.steptime import TERMS, LinearStepTime, duration, shown_duration
from kvspec.model.steptime_fit import Fit
from kvspec.source.document import Document, parse_yaml
from kvspec.source.parse import clean_loc, schema_error, yaml_repr

__all__ = ["CHECKED", "FORMAT", "Profile", "ProfileFile", "fit_profile", "parse_profile",
           "profile_schema", "profile_text", "read_profile"]

#: The profile format's version (``kvspec_profile: 1``).
FORMAT = 1
#: The fields of ``describes`` a layout must match to be simulated with the profile.
CHECKED = ("model", "tensor_parallel_size", "pipeline_parallel_size", "kv_cache_dtype")


def _duration(value: Any) -> Any:
    if value == 0 and not isinstance(value, bool):
        return 0.0
    if isinstance(value, str):
        seconds = duration(value)
        if seconds is not None:
            return seconds
    raise PydanticCustomError("duration", "a duration with its unit: 6.1ms, 20us, 1.5ns")


def _date(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime.date) else value


Duration = Annotated[float, BeforeValidator(_duration), Field(ge=0)]
Count = Annotated[int, Field(ge=0)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Describes(_Strict):
    """What the profile was measured on."""

    engine: str = Field(min_length=1, description="The serving engine, e.g. vllm.")
    engine_version: str = Field(min_length=1)
    device: str = Field(min_length=1, description="The accelerator as the engine names it.")
    model: str = Field(min_length=1, description="The model's name (the layout's model).")
    tensor_parallel_size: int = Field(gt=0)
    pipeline_parallel_size: int = Field(gt=0)
    dtype: str = Field(min_length=1, description="The weights' dtype.")
    kv_cache_dtype: str = Field(min_length=1, description="The engine's kv_cache_dtype.")
    kvspec_version: str = Field(min_length=1)


class StepTimeForm(_Strict):
    """The model: seconds = fixed + the sum of each term's cost times the term."""

    form: Literal["linear"]
    fixed: Duration = Field(description="A step's cost whatever its batch.")
    prefill_tokens: Duration = Field(description="Per token of a chunk of 2 or more.")
    decode_requests: Duration = Field(description="Per request scheduled one token.")
    context_tokens: Duration = Field(description="Per token of context read (all requests).")
    prefill_pairs: Duration = Field(description="Per query-key pair of a chunk's attention.")


def _ordered(value: list[int]) -> list[int]:
    if value[0] > value[1]:
        raise PydanticCustomError("range_order", "[least, most], the least first")
    return value


Range = Annotated[list[Count], Field(min_length=2, max_length=2), AfterValidator(_ordered)]


class MeasuredRange(_Strict):
    """Each term's least and most over the measured steps: [least, most]."""

    prefill_tokens: Range
    decode_requests: Range
    context_tokens: Range
    prefill_pairs: Range


class FitRecord(_Strict):
    """How well the model fits the measured steps (measured minus predicted)."""

    samples: int = Field(gt=0)
    rms_residual: Duration
    max_residual: Duration
    mean_relative_error: float = Field(ge=0)
    #: (kvspec profile) the largest |residual| / measured over the samples.
    max_relative_error: float | None = Field(None, ge=0)


class Provenance(_Strict):
    """Where the numbers came from."""

    method: Literal["measured", "declared"] = Field(description="measured (kvspec profile) "
                                                    "or declared by hand.")
    date: Annotated[str, BeforeValidator(_date), Field(pattern=r"^\d{4}-\d{2}-\d{2}$")]
    command: str = Field(min_length=1, description="The command that measured it (or "
                         "what the declared numbers come from).")
    note: str | None = None


class Profile(_Strict):
    """A step-time profile, format version 1."""

    kvspec_profile: Literal[1] = Field(description="Profile format version.")
    describes: Describes
    step_time: StepTimeForm
    measured_range: MeasuredRange | None = Field(None, description="Required when measured.")
    fit: FitRecord | None = Field(None, description="Required when measured.")
    provenance: Provenance


_FIELDS: dict[tuple[str, ...], type[BaseModel]] = {
    (): Profile, ("describes",): Describes, ("step_time",): StepTimeForm,
    ("measured_range",): MeasuredRange, ("fit",): FitRecord, ("provenance",): Provenance}
_HINTS = {"duration": "write the number and its unit: s, ms, us, ns or ps (0 needs none)",
          "range_order": "write the least first: [0, 8192]"}
_FIELD_HINTS = {"kvspec_profile": "this kvspec reads profiles of format 1: upgrade kvspec "
                                  "to read a newer one",
                "form": "linear is the form this kvspec knows (docs/latency.md)"}


@dataclass(frozen=True)
class ProfileFile:
    """A profile, read: its model and its document (every value's position)."""

    model: Profile
    doc: Document

    @property
    def file(self) -> str:
        return self.doc.file

    def step_time(self) -> LinearStepTime:
        """The model, with the measured range as its bounds."""
        st, rng = self.model.step_time, self.model.measured_range
        bounds = None if rng is None else tuple(
            (int(getattr(rng, t)[0]), int(getattr(rng, t)[1])) for t in TERMS)
        return LinearStepTime(st.fixed, st.prefill_tokens, st.decode_requests,
                              st.context_tokens, st.prefill_pairs, bounds=bounds)

    def check(self, layout: dict[str, Any], what: str) -> None:
        """Refuse the profile for a layout (``layout``: the :data:`CHECKED` fields'
        values, ``what`` naming it) that another model, parallelism or dtype runs."""
        d = self.model.describes
        for name in CHECKED:
            want, have = getattr(d, name), layout.get(name)
            if have is not None and want != have:
                raise self.doc.error(
                    f"the profile describes {name} {want}; {what} has {have}",
                    ("describes", name), found=str(want),
                    hint="a step's time depends on it: profile this deployment "
                         "(docs/latency.md), or simulate the layout the profile was "
                         "measured for")


def _error(doc: Document, err: Any) -> SourceError:
    loc = clean_loc(err["loc"])
    if err["type"] == "extra_forbidden":
        key, parent = loc[-1], tuple(p for p in loc[:-1] if not isinstance(p, int))
        model = _FIELDS.get(parent)
        allowed = list(model.model_fields) if model else []
        close = difflib.get_close_matches(str(key), allowed, n=1)
        return doc.error(f"unknown field {key!r}", loc, key=True,
                         expected="one of " + ", ".join(allowed),
                         hint=f"did you mean {close[0]!r}?" if close else
                         "remove it, or check the indentation (docs/latency.md)")
    found = schema_error(doc, {**err, "loc": loc})
    hint = _HINTS.get(err["type"]) or (loc and _FIELD_HINTS.get(str(loc[-1]))) or (
        found.hint or "").replace("docs/format.md", "docs/latency.md")
    return found.replace(hint=hint)  # type: ignore[return-value]


def parse_profile(text: str, file: str = "<profile>") -> ProfileFile:
    """The profile in ``text``; raise every problem at once, each at its position."""
    doc = parse_yaml(text, file)
    if not isinstance(doc.data, dict):
        raise SourceError("a profile is a mapping", file=file, line=1, column=1,
                          expected="kvspec_profile: 1, describes: ..., step_time: ...",
                          found=yaml_repr(doc.data)[:80],
                          hint="see docs/latency.md for a complete profile")
    try:
        model = Profile.model_validate(doc.data)
    except ValidationError as exc:
        errors: list[KvspecError] = []
        seen = set()
        for e in exc.errors(include_url=False):
            error = _error(doc, e)
            if (error.line, error.column, error.message) not in seen:
                seen.add((error.line, error.column, error.message))
                errors.append(error)
        raise (errors[0] if len(errors) == 1 else ErrorList(errors)) from None
    missing = [k for k in ("measured_range", "fit") if getattr(model, k) is None]
    if model.provenance.method == "measured" and missing:
        raise doc.error(f"a measured profile without {' and '.join(missing)}",
                        ("provenance", "method"), found="method: measured",
                        hint="a measured profile records the range of batch shapes it was "
                             "measured over and its fit's residuals (`kvspec profile` writes "
                             "both); numbers written by hand are method: declared")
    return ProfileFile(model, doc)


def read_profile(path: str) -> ProfileFile:
    """The profile file at ``path``."""
    text = read_text(path, what="the profile",
                     hint="give the path of a step-time profile (docs/latency.md)")
    return parse_profile(text, str(path))


def profile_schema() -> dict[str, Any]:
    """The JSON Schema of a profile (``schemas/profile.schema.json``)."""
    schema = Profile.model_json_schema(mode="validation")
    schema.update({"$schema": "https://json-schema.org/draft/2020-12/schema",
                   "$id": "urn:kvspec:schema:profile:1",
                   "title": "kvspec step-time profile (format 1)",
                   "$comment": "Generated by `kvspec schema` from "
                               "kvspec.source.profile.Profile; do not edit."})
    return schema


def fit_profile(fit: Fit, measured: list[float], describes: dict[str, Any],
                command: str, date: str | None = None) -> Profile:
    """The profile of a fit (:func:`kvspec.model.steptime_fit.fit_linear` of steps that
    took ``measured`` seconds) on the deployment ``describes`` says, measured by
    ``command`` on ``date`` (default: today)."""
    m = fit.model
    return Profile.model_validate({
        "kvspec_profile": FORMAT, "describes": describes,
        "step_time": {"form": "linear", **{k: shown_duration(v) for k, v in zip(
            ("fixed", *TERMS), m.coefficients, strict=True)}},
        "measured_range": {t: list(b) for t, b in zip(TERMS, fit.bounds, strict=True)},
        "fit": {"samples": fit.samples, "rms_residual": shown_duration(fit.rms),
                "max_residual": shown_duration(fit.max_abs),
                "mean_relative_error": round(fit.relative(measured), 4)},
        "provenance": {"method": "measured", "date": date or datetime.date.today().isoformat(),
                       "command": command}})


def profile_text(profile: Profile) -> str:
    """The YAML text of ``profile``: a header comment, durations with their units."""
    import yaml  # (PyYAML: the source's own reader)

    data = profile.model_dump(exclude_none=True)
    st = data["step_time"]
    for k in ("fixed", *TERMS):
        st[k] = shown_duration(st[k])
    if "fit" in data:
        for k in ("rms_residual", "max_residual"):
            data["fit"][k] = shown_duration(data["fit"][k])
    head = ("# yaml-language-server: $schema=schemas/profile.schema.json\n"
            "# A step-time profile (docs/latency.md): seconds per step = fixed + the sum\n"
            "# of each term's cost times the term, for the deployment it describes.\n")
    return head + yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=88)
