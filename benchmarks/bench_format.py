"""The artifact format's one declaration, validated by msgspec and by pydantic.

    python benchmarks/bench_format.py [--layers 100 1000] [--repeat R]

The format is declared once, as msgspec structs (kvspec/artifact/format.py). To
compare the two libraries on exactly the same declaration, this benchmark turns
every struct into a pydantic model field for field (msgspec's own type
information: the same types, ranges, literals, tags and closed objects), then
times, for a compiled 100- and 1,000-layer artifact (best of ``--repeat``):

- parse + validate: the file's text to typed records (msgspec ``Decoder.decode``;
  pydantic ``TypeAdapter.validate_json``), both refusing unknown fields;
- cold import: a fresh ``python -c`` that imports the library and builds the
  validator for the format (msgspec's decoder; pydantic's ``TypeAdapter``), minus
  a bare ``python -c pass`` (median of 5).

Numbers are reported as ratios in one run, never asserted.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any, Literal, Union

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import msgspec
import msgspec.inspect as mi
from pydantic import ConfigDict, Field, TypeAdapter, create_model

from kvspec.artifact.format import Envelope
from kvspec.compiler import compile_source

SOURCE = """\
kvspec: 1
name: bench-{layers}
engine: {{block_size: 16, max_model_len: 1024, max_num_batched_tokens: 1024, max_num_seqs: 4,
          memory: 1GiB}}
defaults: {{num_kv_heads: 2, head_size: 64, dtype: bfloat16}}
layer_types:
  local: {{kind: sliding_window, sliding_window: 128}}
  attn: {{kind: full_attention}}
layers:
  - {{repeat: {repeat}, pattern: [local, local, local, attn]}}
"""

_models: dict[type, Any] = {}


def _constrained(base: type, t: Any, names: tuple[str, ...]) -> Any:
    limits = {n: getattr(t, n) for n in names if getattr(t, n, None) is not None}
    return Annotated[base, Field(**limits)] if limits else base


def pydantic_type(t: Any) -> Any:
    """The pydantic annotation of a msgspec type (msgspec.inspect)."""
    if isinstance(t, mi.IntType):
        return _constrained(int, t, ("ge", "le", "gt", "lt"))
    if isinstance(t, mi.StrType):
        return _constrained(str, t, ("pattern",))
    simple = {mi.BoolType: bool, mi.FloatType: float, mi.NoneType: type(None), mi.AnyType: Any}
    if type(t) in simple:
        return simple[type(t)]
    if isinstance(t, mi.LiteralType):
        return Literal[tuple(t.values)]
    if isinstance(t, mi.ListType):
        return list[pydantic_type(t.item_type)]  # type: ignore[misc]
    if isinstance(t, mi.TupleType):
        return tuple[tuple(pydantic_type(m) for m in t.item_types)]  # type: ignore[misc]
    if isinstance(t, mi.DictType):
        return dict[pydantic_type(t.key_type), pydantic_type(t.value_type)]  # type: ignore[misc]
    if isinstance(t, mi.UnionType):
        members = tuple(pydantic_type(m) for m in t.types)
        if all(isinstance(m, mi.StructType) for m in t.types) and t.types[0].tag_field:
            # Union over a tuple built at run time: no `X | Y` spelling
            return Annotated[Union[members], Field(  # noqa: UP007
                discriminator=t.types[0].tag_field)]
        return Union[members]  # noqa: UP007
    if isinstance(t, mi.StructType):
        return _model(t)
    raise TypeError(f"no pydantic type for {t!r}")


def _model(t: Any) -> Any:
    if t.cls in _models:
        return _models[t.cls]
    fields: dict[str, Any] = {}
    if t.tag_field is not None:
        fields[t.tag_field] = (Literal[t.tag], ...)
    for f in t.fields:
        ann = pydantic_type(f.type)
        name = f.name if f.name == f.encode_name else f.name + "_"
        fields[name] = (ann, Field(..., alias=f.encode_name))
    model = create_model(t.cls.__name__, __config__=ConfigDict(
        extra="forbid", strict=True, populate_by_name=True), **fields)
    _models[t.cls] = model
    return model


def best_ms(run: Any, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def cold_ms(code: str, runs: int = 5) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True,
                       cwd=Path(__file__).resolve().parents[1])
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    adapter = TypeAdapter(pydantic_type(mi.type_info(Envelope)))
    decoder = msgspec.json.Decoder(Envelope)
    print(f"msgspec {msgspec.__version__}; best of {args.repeat}, milliseconds")
    print(f"{'layers':>7}{'KiB':>8}{'msgspec':>9}{'pydantic':>10}{'pydantic/msgspec':>18}")
    for layers in args.layers:
        text = compile_source(SOURCE.format(layers=layers, repeat=layers // 4), "b.yaml").text()
        ours = decoder.decode(text)
        theirs = adapter.validate_json(text)
        assert msgspec.json.encode(ours) and theirs is not None
        m = best_ms(lambda: decoder.decode(text), args.repeat)
        p = best_ms(lambda: adapter.validate_json(text), args.repeat)
        print(f"{layers:>7}{len(text) / 1024:>8.0f}{m:>9.2f}{p:>10.2f}{p / m:>18.1f}")
    bare = cold_ms("pass")
    m = cold_ms("import msgspec; from kvspec.artifact.format import Envelope; "
                "msgspec.json.Decoder(Envelope)") - bare
    p = cold_ms("import sys; sys.path.insert(0, 'benchmarks'); import bench_format as b; "
                "import msgspec.inspect as mi; from kvspec.artifact.format import Envelope; "
                "b.TypeAdapter(b.pydantic_type(mi.type_info(Envelope)))") - bare
    print(f"cold import + validator, over python -c pass ({bare:.0f} ms): msgspec {m:.0f} ms, "
          f"pydantic {p:.0f} ms (includes msgspec, to read the declaration), {p / m:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
