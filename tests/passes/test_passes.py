"""Per-pass fixture tables, as sqlglot keeps its optimizer rules' fixtures: each
``fixtures/<pass>.yaml`` lists small sources, and each row runs through exactly
that pass (the passes before it make its input) and is compared with the row's
``expect`` -- a compact rendering of what the pass gives -- or with its ``error``,
the message the pass raises, located as ``kvspec validate`` prints it.

``KVSPEC_REGEN=1`` rewrites the renderings from the code; read the diff: a row is
right when it says what the pass should do, not only what it does today.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from kvspec.compiler import PASSES, SourceText, run
from kvspec.errors import KvspecError
from kvspec.model.affine import Affine
from kvspec.model.engine import Engine
from tests.conftest import REGEN

FIXTURES = Path(__file__).parent / "fixtures"
#: The file name errors are located in.
FILE = "source.yaml"


def _json(value: Any) -> str:
    return json.dumps(value, separators=(", ", ": "))


def _affine(a: Affine) -> str:
    """``a * N + b`` as ``8192N``, ``8192``, ``8192N+16``."""
    return "+".join([f"{a.a}N"] * bool(a.a) + [str(a.b)] * bool(a.b or not a.a))


def _composed(v: Any) -> list[str]:
    """Each top-level key at its line and column, and its data as YAML read it."""
    return [f"{key} {':'.join(map(str, v.doc.key_position((key,))))} {_json(value)}"
            for key, value in v.doc.data.items()]


def _parsed(v: Any) -> list[str]:
    """The source model, each top-level field given (defaults left out)."""
    data = v.source.model_dump(mode="json", exclude_defaults=True)
    return [f"{key} {_json(value)}" for key, value in data.items()]


def _spec(spec: Any) -> str:
    """A layer's spec on its rank: kind, KV heads x head size, dtype, block size."""
    window = getattr(spec, "sliding_window", None)
    return (f"{spec.kind} {getattr(spec, 'num_kv_heads', None)}x"
            f"{getattr(spec, 'head_size', None)} {spec.dtype} block {spec.block_size}"
            + (f" window {window}" if window else ""))


def _expanded(v: Any) -> list[str]:
    """The engine's settings but its defaults, the pooling policy, and each layer:
    its index, name and type, its stage, its spec on its rank, its quantization
    (the cell's parts: name, dtype x count @ byte offset)."""
    e = v.expansion
    default = Engine()
    engine = [f"{f}={getattr(e.engine, f)}" for f in Engine.__dataclass_fields__
              if getattr(e.engine, f) != getattr(default, f)]
    out = ["engine " + " ".join(engine), f"pooling {e.pooling.policy}"]
    stage_of = {n: (i, spec) for i, specs in enumerate(e.stage_specs)
                for n, spec in specs.items()}
    for layer in e.layers:
        stage, spec = stage_of[layer.name]
        q = e.quantization.get(layer.name)
        parts = "none" if q is None else q.kv_cache_dtype + " " + " ".join(
            f"{p.name}:{p.dtype}x{p.count}@{p.byte_offset}" for p in q.cell_parts or ())
        out.append(f"{layer.index} {layer.name} ({layer.type_name}) stage {stage} "
                   f"{_spec(spec)} quant {parts}")
    return out


def _validated(v: Any) -> list[str]:
    return [f"valid: {len(v.expansion.layers)} layers"]


def _planned(v: Any) -> list[str]:
    """Each group (its layers' indices, kind, block size, strategy) and each
    stage's tensors as affine forms of the block count N."""
    index = {layer.name: layer.index for layer in v.expansion.layers}
    out = []
    for i, g in enumerate(v.plan.groups):
        out.append(f"group {i} {g.spec.kind} block {g.spec.block_size} layers "
                   f"{[index[n] for n in g.layer_names]} {g.strategy}"
                   + (f" role {g.role}" if g.role else ""))
    for s in v.plan.stages:
        out.append(f"stage {s.index} {s.bytes_per_block} bytes per block")
        out += [f"  tensor group {t.group} layers {[index[n] for n in t.layers]} size "
                f"{_affine(t.size)} offset {_affine(t.offset)} layer_stride "
                f"{_affine(t.layer_stride)} block_stride {_affine(t.block_stride)}"
                for t in s.tensors]
    return out


def _sized(v: Any) -> list[str]:
    """The budget it was sized for and each stage's blocks."""
    layout = v.layout
    out = [f"budget_bytes {v.budget_bytes} max_model_len {layout.engine.max_model_len}",
           "budget " + (msgspec.json.encode(layout.budget).decode() if layout.budget else
                        "none")]
    out += [f"stage {i} memory_per_request {f.memory_per_request} min_num_blocks "
            f"{f.min_num_blocks}" for i, f in enumerate(layout.stage_figures)]
    return out


def _pooled(v: Any) -> list[str]:
    """The pools the policy keeps (none: the unified plan) and its decision."""
    out = [f"pool {p.name} share {p.share} state {p.state} blocks "
           f"{p.layout.budget.num_blocks if p.layout.budget else None}" for p in v.pools]
    d = v.decision
    if d is None:
        return out + ["decision none"]
    out.append(f"decision asked {d.asked} policy {d.policy} serve_with {d.serve_with} "
               f"chosen {d.chosen}")
    out += [f"  candidate {c.name} {c.policy} block {c.block_size} groups {c.groups} "
            f"static {c.static_requests}" for c in d.candidates]
    return out


def _frozen(v: Any) -> list[str]:
    """The artifact's hash and what its body holds."""
    body = v.body
    return [f"sha256 {v.sha256[:16]}",
            f"groups {len(body.groups)} stages {len(body.stages)} layers {len(body.layers)}",
            "budget " + (msgspec.json.encode(body.budget).decode() if body.budget else "none"),
            f"pooling {body.pooling.policy if body.pooling else None}"]


RENDER: dict[str, Callable[[Any], list[str]]] = {
    "compose": _composed, "parse": _parsed, "expand": _expanded, "validate": _validated,
    "plan": _planned, "size": _sized, "pool": _pooled, "freeze": _frozen}


def _table(name: str) -> dict[str, Any]:
    table: dict[str, Any] = yaml.safe_load((FIXTURES / f"{name}.yaml").read_text())
    return table


def _rows() -> list[Any]:
    return [pytest.param(p.name, row, id=f"{p.name}-{row['name']}")
            for p in PASSES for row in _table(p.name)["rows"]]


def _outcome(name: str, row: dict[str, Any]) -> tuple[str, str]:
    """``("expect", rendering)`` or ``("error", message)`` of the row's pass."""
    i = next(i for i, p in enumerate(PASSES) if p.name == name)
    before = run(SourceText(text=row["source"], file=FILE), PASSES[:i])
    try:
        return "expect", "\n".join(RENDER[name](run(before, PASSES[i:i + 1]))) + "\n"
    except KvspecError as err:
        return "error", err.render() + "\n"


@pytest.mark.parametrize(("name", "row"), _rows())
def test_a_pass_gives_what_its_table_says(name: str, row: dict[str, Any]) -> None:
    key, got = _outcome(name, row)
    if REGEN:
        _regenerate(name, row["name"], key, got)
        return
    assert {key: got} == {k: row[k] for k in ("expect", "error") if k in row}


def test_every_pass_has_a_table_with_an_error_row() -> None:
    """Three to six rows a pass, one of them an error; freeze is serialisation and
    cannot fail on a source (``compiler.CHECK_PASSES`` leaves it out)."""
    for p in PASSES:
        rows = _table(p.name)["rows"]
        assert 3 <= len(rows) <= 6, p.name
        assert any("error" in r for r in rows) == (p.name != "freeze"), p.name


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(str, lambda d, s: d.represent_scalar(
    "tag:yaml.org,2002:str", s, style="|" if "\n" in s else None))


def _regenerate(name: str, row_name: str, key: str, got: str) -> None:
    table = _table(name)
    for row in table["rows"]:
        if row["name"] == row_name:
            row.pop("expect", None)
            row.pop("error", None)
            row[key] = got
    text = yaml.dump(table, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)
    (FIXTURES / f"{name}.yaml").write_text(text, encoding="utf-8")
