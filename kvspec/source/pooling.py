"""The source's ``pooling`` section as the planner's :class:`~kvspec.model.pooling.Pooling`.

Checks what the schema cannot: a workload is a trace or a summary (not both, and a
summary names its lengths); a length is a mean or a histogram; a manual split sums
to 1; ``separate`` is not asked of vLLM, which cannot hold it. A trace's path is
taken relative to the source's directory.

>>> from kvspec.source.document import parse_yaml
>>> from kvspec.source.parse import parse_source
>>> doc = parse_yaml(open("layouts/llama-3.1-8b.yaml").read(), "llama.yaml")
>>> pooling_of(parse_source(doc), doc).policy
'unified'
"""

from __future__ import annotations

import dataclasses
import hashlib
from fractions import Fraction
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from kvspec.errors import ErrorList, KvspecError, raise_all
from kvspec.model.pooling import Lengths, Pooling, ProfileRef, Workload
from kvspec.model.slo import BadLimit, Limit, parse_limit, twice
from kvspec.model.workloads import PRESETS
from kvspec.source.document import Document
from kvspec.source.profile import read_profile
from kvspec.source.schema import Distribution, Source, StepTimeSpec, Tokens, WorkloadSpec

__all__ = ["pooling_of"]

_T = TypeVar("_T")

_WHY_NOT_VLLM = (
    "vLLM 0.33 keeps one shared pool with one page size for every KV-cache group "
    "(its hybrid KV cache manager), so it cannot hold pools of their own")


def _lengths(value: Tokens, doc: Document, path: tuple[str, ...],
             errors: list[KvspecError]) -> Lengths:
    if isinstance(value, int):
        return Lengths(value)
    assert isinstance(value, Distribution)
    if (value.mean is None) == (value.histogram is None):
        errors.append(doc.error("give a mean or a histogram of token counts, one of them",
                                path, expected="mean: 2048 (and spread: 0.5), or "
                                "histogram: [[512, 0.3], [4096, 0.7]]",
                                hint="a histogram's bins are [tokens, weight]"))
        return Lengths(1)
    if value.histogram is not None:
        bins = tuple((int(b[0]), float(b[1])) for b in value.histogram)
        mean = round(sum(t * w for t, w in bins) / sum(w for _, w in bins))
        return Lengths(max(mean, 1), value.spread, bins)
    assert value.mean is not None
    return Lengths(value.mean, value.spread)


def _carried(spec: BaseModel, cls: type[_T], **derived: Any) -> _T:
    """``cls`` of the model from ``spec`` of the source: every field the two declare
    alike (the source schema's fields come from the model's: one declaration), and
    ``derived``, the fields the source spells otherwise."""
    given = type(spec).model_fields
    alike = {f.name: getattr(spec, f.name) for f in dataclasses.fields(cls)  # type: ignore[arg-type]
             if f.name in given}
    return cls(**(alike | derived))


def _check_workload(spec: WorkloadSpec, doc: Document, errors: list[KvspecError]) -> None:
    """A workload is a preset, a trace or a summary, and only a trace is read."""
    at = ("pooling", "workload")
    summary = [k for k in ("context_tokens", "output_tokens", "concurrency")
               if getattr(spec, k) is not None]
    reading = [k for k in ("format", "columns") if getattr(spec, k) is not None]
    if spec.trace is None and reading:
        errors.append(doc.error(f"{reading[0]} describes a trace file, and the workload "
                                "names none", (*at, reading[0]),
                                hint="add trace: FILE, or remove it"))
    if spec.columns is not None and spec.format != "lengths":
        errors.append(doc.error("columns go with format: lengths", (*at, "columns"),
                                found=f"format: {spec.format}" if spec.format else
                                "no format",
                                hint="set format: lengths, or remove columns"))
    if spec.format == "lengths" and spec.columns is None and spec.trace is not None:
        errors.append(doc.error("format lengths needs columns", (*at, "format"),
                                expected="columns: {prompt: NAME, output: NAME}",
                                hint="name the columns holding the prompt and output lengths"))
    if spec.preset is not None:
        other = (["trace"] if spec.trace is not None else []) + summary + (
            ["prefix_sharing"] if spec.prefix_sharing else [])
        if other:
            errors.append(doc.error(f"a workload is a preset, a trace or a summary: "
                                    f"preset with {other[0]}", (*at, other[0]),
                                    found=", ".join(["preset", *other]),
                                    hint="keep preset (with requests, seed, step_ms), or "
                                         "drop it"))
    elif spec.trace is not None and summary:
        errors.append(doc.error("a workload is a trace or a summary, not both",
                                (*at, summary[0]), found=", ".join(["trace", *summary]),
                                hint="keep trace: FILE, or the summary's lengths"))
    missing = [k for k in ("context_tokens", "output_tokens") if getattr(spec, k) is None]
    if spec.preset is None and spec.trace is None and missing:
        errors.append(doc.error(f"a workload summary needs {' and '.join(missing)}", at,
                                expected="context_tokens: 2048, output_tokens: 256 (or "
                                "trace: FILE)",
                                hint="give the mean prompt and output lengths of your "
                                     "traffic, or a JSONL trace of it"))


def _beside(doc: Document, path: str | None) -> str | None:
    """``path`` as the source gives it (relative to its directory), from here."""
    if path is None:
        return None
    base = Path(doc.file).parent if doc.file and not doc.file.startswith("<") else Path(".")
    return str(base / path)


def _workload(spec: WorkloadSpec, doc: Document, errors: list[KvspecError]) -> Workload:
    _check_workload(spec, doc, errors)
    at = ("pooling", "workload")
    context = output = Lengths(1)  # a trace's are read from it
    if spec.preset is not None:
        means = dict(PRESETS[spec.preset].stated)
        context = Lengths(round(means["prompt_mean"]))
        output = Lengths(round(means["output_mean"]))
    elif spec.trace is None and spec.context_tokens is not None \
            and spec.output_tokens is not None:
        context = _lengths(spec.context_tokens, doc, (*at, "context_tokens"), errors)
        output = _lengths(spec.output_tokens, doc, (*at, "output_tokens"), errors)
    c = spec.columns
    return _carried(spec, Workload, context=context, output=output,
                    trace=_beside(doc, spec.trace), trace_format=spec.format,
                    columns=(c.prompt, c.output, c.time, c.time_unit) if c else None)


def _slo(given: dict[str, str | int | float], doc: Document,
         errors: list[KvspecError]) -> tuple[Limit, ...]:
    """``pooling.slo``'s limits, each read by ``--slo``'s rule (:mod:`kvspec.model.slo`);
    a problem at its key, or at its value for a time that does not read."""
    limits: list[Limit] = []
    for key, value in given.items():
        at = ("pooling", "slo", key)
        shown = str(value).lower() if isinstance(value, bool) else str(value)
        try:
            limit = parse_limit(f"{key}={shown}".strip())
        except BadLimit as bad:
            errors.append(doc.error(bad.what, at, key=not bad.in_value,
                                    found=shown if bad.in_value else key,
                                    hint=bad.hint.replace("METRIC_pNN=TIME",
                                                          "METRIC_pNN: TIME")
                                    .replace("=", ": ")))
            continue
        again = twice(limits, limit)
        if again is not None:
            errors.append(doc.error(again, at, key=True, hint="give each limit once"))
            continue
        limits.append(limit)
    return tuple(limits)


def _profile(spec: StepTimeSpec, source: Source, doc: Document,
             errors: list[KvspecError]) -> ProfileRef | None:
    """The profile ``pooling.step_time`` names (relative to the source), read and checked
    against the source's model, parallelism and KV cache dtype; its problems at their
    line in the profile, an unreadable file at ``pooling.step_time.profile``."""
    path = _beside(doc, spec.profile)
    assert path is not None
    at = ("pooling", "step_time", "profile")
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        errors.append(doc.error(f"cannot read the profile {spec.profile}: "
                                f"{exc.strerror or exc}", at, found=spec.profile,
                                hint="give the profile's path relative to the source file "
                                     "(`kvspec profile` writes one, docs/latency.md)"))
        return None
    try:
        profile = read_profile(path)
        profile.check({"model": source.model,
                       "tensor_parallel_size": source.parallel.tensor,
                       "pipeline_parallel_size": source.parallel.pipeline,
                       "kv_cache_dtype": source.quantization.kv_cache_dtype},
                      f"the source {source.name}")
    except ErrorList as many:
        errors.extend(many.errors)
        return None
    except KvspecError as err:
        errors.append(err)
        return None
    model = profile.step_time()
    return ProfileRef(path, hashlib.sha256(data).hexdigest(), model.coefficients, model.bounds)


def pooling_of(source: Source, doc: Document,
               errors: list[KvspecError] | None = None) -> Pooling:
    """The pooling policy ``source`` declares; problems go to ``errors`` (raised
    at once when none is given)."""
    own = errors is None
    found: list[KvspecError] = [] if errors is None else errors
    p = source.pooling
    workload = _workload(p.workload, doc, found) if p.workload is not None else None
    if p.policy == "separate" and p.serve_with == "vllm":
        found.append(doc.error(
            "the separate policy cannot be served by vLLM", ("pooling", "policy"),
            found="policy: separate, serve_with: vllm",
            hint=f"{_WHY_NOT_VLLM}; serve it with kvspec's runtime (serve_with: kvspec), or "
                 "keep vLLM with policy: auto (the plans vLLM can run) or unified"))
    split = None
    if p.split is not None:
        split = tuple((name, Fraction(share).limit_denominator(10_000))
                      for name, share in p.split.items())
        total = sum((s for _, s in split), Fraction(0))
        if abs(total - 1) > Fraction(1, 1000):
            found.append(doc.error(f"the split's shares sum to {float(total):.4g}, not 1",
                                   ("pooling", "split"), expected="shares summing to 1",
                                   hint="e.g. split: {full_attention: 0.6, mamba: 0.4}"))
        if p.policy != "separate":
            found.append(doc.error("a split of the budget applies to the separate policy",
                                   ("pooling", "split"), found=f"policy: {p.policy}",
                                   hint="set policy: separate, or remove split"))
    given = p.model_fields_set
    applies = {"max_groups": ("auto",), "state_block_size": ("separate", "auto"),
               "block_size": ("separate", "auto"), "slo": ("auto",), "step_time": ("auto",)}
    for key, policies in applies.items():
        if key in given and getattr(p, key) is not None and p.policy not in policies:
            found.append(doc.error(
                f"{key} applies to the {' and '.join(policies)} polic"
                f"{'ies' if len(policies) > 1 else 'y'}, not {p.policy}", ("pooling", key),
                found=f"policy: {p.policy}",
                hint=f"set policy: {policies[0]}, or remove {key} (the {p.policy} plan is "
                     "vLLM's, planned by the engine's own settings)"))
    if p.policy == "auto" and workload is None:
        found.append(doc.error("policy auto needs a workload to choose by",
                               ("pooling", "policy"),
                               expected="pooling.workload: {context_tokens: ..., "
                                        "output_tokens: ...} or {trace: FILE}",
                               hint="declare the traffic the plan must serve"))
    slo = _slo(p.slo, doc, found) if p.slo is not None else ()
    profile = _profile(p.step_time, source, doc, found) if p.step_time is not None else None
    if own:
        raise_all(found)
    sizes = sorted(set(p.block_sizes)) if p.block_sizes is not None else Pooling().block_sizes
    return _carried(p, Pooling, workload=workload, split=split, block_sizes=tuple(sizes),
                    slo=slo, profile=profile)
