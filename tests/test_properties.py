"""Property tests: for any model the source format can describe, compiling either
fails with a clear KvspecError or gives an artifact that satisfies every invariant."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvspec.compiler import compile_source
from kvspec.errors import KvspecError
from kvspec.invariants import check_artifact
from kvspec.planner.plan import resolve
from kvspec.compiler import Unit, expand_pass, load, parse, plan_pass, run

KINDS = {
    "full": lambda d: {"kind": "full_attention"},
    "swa": lambda d: {"kind": "sliding_window", "sliding_window": d(st.sampled_from([128, 1024, 4096]))},
    "chunk": lambda d: {"kind": "chunked_local", "attention_chunk_size": d(st.sampled_from([1024, 8192]))},
    "mla": lambda d: {"kind": "mla", "num_kv_heads": 1, "head_size": 576},
    "mamba": lambda d: {"kind": "mamba", "shapes": [[3, d(st.sampled_from([1024, 4096]))],
                                                    [8, 64, 64]],
                        "dtypes": ["bfloat16", "float32"], "mamba_type": "mamba2",
                        "layer_name": "model.layers.{index}.mixer"},
}


@st.composite
def sources(draw) -> str:
    kinds = draw(st.lists(st.sampled_from(sorted(KINDS)), min_size=1, max_size=3, unique=True))
    types = {}
    for k in kinds:
        t = KINDS[k](draw)
        if t["kind"] not in ("mla", "mamba"):
            t["num_kv_heads"] = draw(st.sampled_from([1, 2, 4, 8]))
            t["head_size"] = draw(st.sampled_from([64, 96, 128, 256]))
        types[k] = t
    pattern = draw(st.lists(st.sampled_from(kinds), min_size=1, max_size=5))
    repeat = draw(st.integers(1, 6))
    engine = {
        "block_size": draw(st.sampled_from([16, 32, 64])),
        "max_model_len": draw(st.sampled_from([2048, 8192, 32768])),
        "layout": draw(st.sampled_from(["LBNHC", "LBHNC", "BLHNC", "BLNHC", "LHBNC"])),
        "hybrid": draw(st.booleans()),
        "memory": draw(st.sampled_from(["256MiB", "2GiB", "16GiB"])),
        "mamba_cache_mode": draw(st.sampled_from(["none", "align", "all"])),
        "mamba_block_size": 256,
    }
    doc = {"kvspec": 1, "name": "prop", "engine": engine,
           "parallel": {"tensor": draw(st.sampled_from([1, 2]))},
           "defaults": {"dtype": draw(st.sampled_from(["bfloat16", "float16", "float32"]))},
           "layer_types": types, "layers": [{"repeat": repeat, "pattern": pattern}]}
    return json.dumps(doc)   # JSON is YAML


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sources())
def test_compile_is_sound_or_rejects_clearly(text: str) -> None:
    try:
        art = compile_source(text, "prop.yaml")
    except KvspecError as err:
        assert err.message and err.file == "prop.yaml"
        return
    assert check_artifact(art) == []
    assert compile_source(text, "prop.yaml").text() == art.text(), "deterministic"


@settings(max_examples=60, deadline=None)
@given(sources(), st.integers(1, 64), st.integers(1, 64))
def test_blocks_grow_with_memory_and_tensors_are_affine(text: str, a: int, b: int) -> None:
    try:
        unit = run(Unit(text=text, file="p.yaml"), (load, parse, expand_pass, plan_pass))
    except KvspecError:
        return
    lo, hi = sorted((a, b))
    try:
        r_lo = resolve(unit.plan, memory=lo << 28)
    except KvspecError:
        return
    r_hi = resolve(unit.plan, memory=hi << 28)
    assert r_lo.num_blocks <= r_hi.num_blocks
    assert r_lo.kv_cache_size_tokens <= r_hi.kv_cache_size_tokens
    st0 = unit.plan.stages[0]
    for r in (r_lo, r_hi):
        for t, concrete in zip(st0.tensors, r.stages[0].tensors):
            assert t.at(r.num_blocks) == concrete
        used = st0.bytes_per_block * r.num_blocks + st0.fixed_bytes
        assert used <= r.available
