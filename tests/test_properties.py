"""Property tests: for any model the source format can describe, compiling either
fails with a clear KvspecError or gives an artifact that satisfies every invariant."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kvspec.artifact import Artifact
from kvspec.compiler import Planned, SourceText, compile_source, run_until
from kvspec.errors import KvspecError
from kvspec.planner import size_plan
from tests.invariants import check_artifact

KINDS = {
    "full": lambda d: {"kind": "full_attention"},
    "swa": lambda d: {"kind": "sliding_window",
                      "sliding_window": d(st.sampled_from([128, 1024, 4096]))},
    "chunk": lambda d: {"kind": "chunked_local",
                        "attention_chunk_size": d(st.sampled_from([1024, 8192]))},
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
        "max_model_len": draw(st.sampled_from([2048, 8192, 32768, "auto"])),
        "model_max_len": 32768,
        "layout": draw(st.sampled_from(["LBNHC", "LBHNC", "BLHNC", "BLNHC", "LHBNC", "BHLNC"])),
        "hybrid": draw(st.booleans()),
        "mamba_cache_mode": draw(st.sampled_from(["none", "align", "all"])),
        "mamba_block_size": 256,
        "async_scheduling": draw(st.sampled_from([None, True, False])),
    }
    budget = draw(st.sampled_from([None, "256MiB", "2GiB", "16GiB", "blocks"]))
    if budget == "blocks":
        engine["num_blocks"] = draw(st.integers(1, 5000))
    elif budget is not None:
        engine["memory"] = budget
    if draw(st.booleans()):
        engine["prefix_match_unit"] = draw(st.sampled_from([8, 16, 32]))
    doc = {"kvspec": 1, "name": "prop", "engine": engine,
           "parallel": {"tensor": draw(st.sampled_from([1, 2])),
                        "pipeline": draw(st.sampled_from([1, 1, 2])),
                        "decode_context": draw(st.sampled_from([1, 1, 2]))},
           "defaults": {"dtype": draw(st.sampled_from(["bfloat16", "float16", "float32"]))},
           "quantization": {"kv_cache_dtype": draw(st.sampled_from(
               ["auto", "auto", "fp8", "int8_per_token_head", "fp8_ds_mla"])),
               "skip_layers": draw(st.lists(st.integers(0, 8), max_size=2))},
           "layer_types": types, "layers": [{"repeat": repeat, "pattern": pattern}]}
    return json.dumps(doc)   # JSON is YAML


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sources())
# inputs that once crashed the compiler: DCP with sliding windows, packing that cannot
# split a bucket evenly, a pipeline stage owning none of a packed group's layers
@example('{"kvspec": 1, "name": "prop", "engine": {"block_size": 32, "max_model_len": 8192, "model_max_len": 32768, "layout": "LBHNC", "hybrid": false, "mamba_cache_mode": "align", "mamba_block_size": 256, "async_scheduling": true, "prefix_match_unit": 32}, "parallel": {"tensor": 1, "pipeline": 2, "decode_context": 2}, "defaults": {"dtype": "float32"}, "quantization": {"kv_cache_dtype": "fp8", "skip_layers": [4]}, "layer_types": {"swa": {"kind": "sliding_window", "sliding_window": 128, "num_kv_heads": 1, "head_size": 256}}, "layers": [{"repeat": 6, "pattern": ["swa", "swa"]}]}')  # noqa: E501 - a found input, verbatim
@example('{"kvspec": 1, "name": "prop", "engine": {"block_size": 64, "max_model_len": 2048, "model_max_len": 32768, "layout": "BLHNC", "hybrid": true, "mamba_cache_mode": "align", "mamba_block_size": 256, "async_scheduling": true, "memory": "256MiB"}, "parallel": {"tensor": 2, "pipeline": 2, "decode_context": 1}, "defaults": {"dtype": "bfloat16"}, "quantization": {"kv_cache_dtype": "int8_per_token_head", "skip_layers": [8, 2]}, "layer_types": {"chunk": {"kind": "chunked_local", "attention_chunk_size": 8192, "num_kv_heads": 2, "head_size": 128}, "swa": {"kind": "sliding_window", "sliding_window": 1024, "num_kv_heads": 8, "head_size": 256}}, "layers": [{"repeat": 4, "pattern": ["chunk", "chunk", "swa", "swa"]}]}')  # noqa: E501 - a found input, verbatim
@example('{"kvspec": 1, "name": "prop", "engine": {"block_size": 32, "max_model_len": 2048, "model_max_len": 32768, "layout": "BLNHC", "hybrid": true, "mamba_cache_mode": "align", "mamba_block_size": 256, "async_scheduling": true, "memory": "2GiB", "prefix_match_unit": 16}, "parallel": {"tensor": 1, "pipeline": 2, "decode_context": 1}, "defaults": {"dtype": "bfloat16"}, "quantization": {"kv_cache_dtype": "auto", "skip_layers": []}, "layer_types": {"chunk": {"kind": "chunked_local", "attention_chunk_size": 8192, "num_kv_heads": 4, "head_size": 128}, "mamba": {"kind": "mamba", "shapes": [[3, 1024], [8, 64, 64]], "dtypes": ["bfloat16", "float32"], "mamba_type": "mamba2", "layer_name": "model.layers.{index}.mixer"}}, "layers": [{"repeat": 2, "pattern": ["chunk", "mamba", "mamba", "mamba", "mamba"]}]}')  # noqa: E501 - a found input, verbatim
def test_compile_is_sound_or_rejects_clearly(text: str) -> None:
    try:
        art = compile_source(text, "prop.yaml")
    except KvspecError as err:  # sound or rejected clearly: each outcome is checked
        assert err.message and err.file == "prop.yaml" and "Traceback" not in err.render()  # noqa: PT017
        return
    assert check_artifact(art) == []  # block ids never share bytes, every view in its pool
    from kvspec.reports.summary import summary
    assert summary(art)
    assert compile_source(text, "prop.yaml").text() == art.text(), "deterministic"
    assert Artifact.from_text(art.text()).text() == art.text(), "it reads back verified"


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sources())
def test_every_plan_that_compiles_loads(text: str) -> None:
    """On meta, for its smallest block count and several larger ones."""
    pytest.importorskip("torch")
    from kvspec.runtime.loader import load

    try:
        art = compile_source(text, "prop.yaml")
    except KvspecError:
        return
    need = art.min_num_blocks()
    for n in (need, need + 1, 3 * need + 5):
        cache = load(art, device="meta", num_blocks=n)
        assert set(cache.views) == set(art.layout.stage(0).layer_names)


@settings(max_examples=60, deadline=None)
@given(sources(), st.integers(1, 64), st.integers(1, 64))
def test_blocks_grow_with_memory_and_tensors_are_affine(text: str, a: int, b: int) -> None:
    try:
        plan = run_until(SourceText(text=text, file="p.yaml"), Planned).plan
    except KvspecError:
        return
    lo, hi = sorted((a, b))
    try:
        r_lo = size_plan(plan, memory=lo << 28)
    except KvspecError:
        return
    r_hi = size_plan(plan, memory=hi << 28)
    assert r_lo.num_blocks <= r_hi.num_blocks
    assert r_lo.kv_cache_size_tokens <= r_hi.kv_cache_size_tokens
    st0 = plan.stages[0]
    for r in (r_lo, r_hi):
        for t, concrete in zip(st0.tensors, r.stages[0].tensors):
            assert t.at(r.num_blocks) == concrete
        used = st0.bytes_per_block * r.num_blocks + st0.fixed_bytes
        if plan.engine.num_gpu_blocks_override is None:  # a fixed count may exceed it
            assert used <= r.available
