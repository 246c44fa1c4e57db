"""No two block ids share bytes, and every plan that compiles loads.

The two silent-corruption classes the fuzzer found, and the deviations from the
reference planner that fix them (docs/deviations.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvspec.compiler import compile, compile_source
from kvspec.errors import PlanError
from tests.conftest import ROOT
from tests.invariants import block_overlaps, check_layout

ORDERS = ("LBNHC", "LBHNC", "LHBNC", "BLHNC", "BLNHC", "BHLNC")

LHBNC_ALIAS = """kvspec: 1
name: lhbnc-alias
engine: {block_size: 16, max_model_len: 64, layout: LHBNC}
defaults: {num_kv_heads: 2, head_size: 64, dtype: bfloat16}
layer_types:
  full: {kind: full_attention}
  swa: {kind: sliding_window, sliding_window: 16, num_kv_heads: 1, head_size: 128}
layers:
  - {pattern: [full, swa]}
"""


def test_lhbnc_slot_aliasing_is_refused() -> None:
    with pytest.raises(PlanError) as info:
        compile_source(LHBNC_ALIAS, "alias.yaml")
    err = info.value
    assert "model.layers.0.self_attn.attn (group 0: 2 head slot(s)" in err.message
    assert "model.layers.1.self_attn.attn (group 1: 1 head slot(s)" in err.message
    assert "block ids of one group would write the bytes of other block ids" in err.message
    assert err.path == "engine.layout" and err.line == 3 and err.found == "LHBNC"
    assert "LBNHC" in err.hint


@pytest.mark.parametrize("order", ORDERS)
def test_the_same_model_is_safe_in_every_other_order(order: str) -> None:
    text = LHBNC_ALIAS.replace("layout: LHBNC", f"layout: {order}")
    if order == "LHBNC":
        pytest.skip("refused above")
    layout = compile_source(text, "alias.yaml").layout
    assert check_layout(layout, probe_blocks=(2, 3, 4, 7)) == []


def test_a_mamba_hybrid_under_lhbnc_is_refused_not_corrupted() -> None:
    text = (ROOT / "layouts" / "example-mamba-cache-all.yaml").read_text()
    assert "layout:" not in text  # the default order: LHBNC is added below
    text = text.replace("engine:\n", "engine:\n  layout: LHBNC\n", 1)
    with pytest.raises(PlanError) as info:
        compile_source(text, "m.yaml")
    err = info.value
    assert err.message == "layout LHBNC puts head slots outside a padded page"
    assert err.file == "m.yaml" and err.path == "layers"
    assert "L and B as the outermost axes" in err.hint


def _drafter(order: str, pool: bool) -> str:
    text = (ROOT / "layouts" / "example-glm5-next-drafter.yaml").read_text()
    text = text.replace("engine:\n", f"engine:\n  layout: {order}\n", 1)
    if not pool:
        text = text.replace("engine:\n", "engine:\n  draft: {pool: false}\n", 1)
    return text


@pytest.mark.parametrize("pool", [True, False], ids=["draft-pool", "shared-pool"])
@pytest.mark.parametrize("order", ORDERS)
def test_state_slot_layout_loads_in_every_axis_order(order: str, pool: bool) -> None:
    torch = pytest.importorskip("torch")
    from kvspec.runtime.loader import load

    art = compile_source(_drafter(order, pool), f"glm5-{order}.yaml")
    assert check_layout(art.layout) == []
    need = art.min_num_blocks()
    for n in (need, need + 1, 2 * need + 17):
        cache = load(art, device="meta", num_blocks=n)
        assert cache.num_blocks == n and all(v.device == torch.device("meta")
                                             for v in cache.views.values())


def test_tail_larger_than_its_indexer_is_refused() -> None:
    text = (ROOT / "layouts" / "example-glm5-next-drafter.yaml").read_text()
    assert "  tail: {kind: kpool_tail, head_size: 132" in text
    bigger = text.replace("  tail: {kind: kpool_tail, head_size: 132",
                          "  tail: {kind: kpool_tail, num_kv_heads: 64, head_size: 132")
    with pytest.raises(PlanError, match="does not fit the indexer page"):
        compile_source(bigger, "tail.yaml")


SOURCES = sorted((ROOT / "layouts").glob("*.yaml")) + sorted(
    (ROOT / "tests" / "golden").glob("*.yaml")
)


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_committed_layouts_keep_block_ids_apart(source: Path) -> None:
    layout = compile(source.relative_to(ROOT)).layout
    for st in layout.stages:
        for blocks in (2, 3, 5, 8):
            assert block_overlaps(layout, st, blocks) == []


# ---------------------------------------------------------------------------
# planner and import fixes (issue 13, section 3)
# ---------------------------------------------------------------------------


def test_a_stage_without_the_drafter_does_not_count_its_blocks() -> None:
    """The drafter draws from its own pool: a request's blocks on stage 0 (which
    holds none of its layers) are the target groups' only (the reference counts the
    drafter's 73 window blocks there too, and reads a lower max concurrency)."""
    text = (ROOT / "layouts" / "example-glm5-next-drafter.yaml").read_text().replace(
        "parallel: {tensor: 1, pipeline: 1,", "parallel: {tensor: 1, pipeline: 2,")
    layout = compile_source(text, "pp.yaml").layout
    st0 = layout.stage(0)
    assert not st0.draft_layer_names and layout.stage(1).draft_layer_names
    target = 256 + 1 + 4 * 2            # MLA+indexer, tail, four state groups
    assert layout.budget.max_concurrency == layout.budget.num_blocks / target
    assert layout.budget.max_concurrency > layout.budget.num_blocks / (target + 73)


def _v32_dump(**indexer: object) -> dict:
    layer = {"kind": "mla", "num_kv_heads": 1, "head_size": 576, "dtype": "uint8",
             "cache_dtype_str": "fp8_ds_mla"}
    idx = {"kind": "mla", "num_kv_heads": 1, "head_size": 132, "dtype": "uint8", **indexer}
    layers = []
    for i in range(4):
        layers.append({"name": f"model.layers.{i}.self_attn.attn", **layer})
        layers.append({"name": f"model.layers.{i}.self_attn.indexer.k_cache", **idx})
    return {"name": "v32", "config": {"block_size": 64, "max_model_len": 4096,
                                      "available_memory_bytes": 1 << 30,
                                      "kv_cache_dtype": "fp8_ds_mla"}, "layers": layers}


def test_import_keeps_each_layers_own_cache_mode() -> None:
    """DeepSeek-V3.2-style indexer layers name no cache_dtype_str: they are auto
    layers (uint8, head 132 as given), not the model's fp8_ds_mla."""
    from kvspec.integrations.dump.importer import dump_to_yaml, import_dump

    source = import_dump(_v32_dump())
    types = source["layer_types"]
    assert any(t.get("kv_cache_dtype") == "auto" and t.get("head_size") == 132
               for t in types.values()), types
    layout = compile_source(dump_to_yaml(_v32_dump()), "v32.yaml").layout
    idx = [e for n, e in layout.layers.items() if "indexer" in n]
    assert all(e.kv_cache_dtype == "auto" and e.spec.page_size_bytes == 64 * 132 for e in idx)
    assert all(e.kv_cache_dtype == "fp8_ds_mla" and e.spec.state_content_size_bytes == 656
               for n, e in layout.layers.items() if "indexer" not in n)


def test_a_source_may_override_the_global_mode_per_layer() -> None:
    text = """kvspec: 1
name: v32
engine: {block_size: 64, max_model_len: 4096, memory: 1GiB}
quantization: {kv_cache_dtype: fp8_ds_mla}
defaults: {num_kv_heads: 1, head_size: 576, dtype: bfloat16}
layer_types:
  mla: {kind: mla}
  indexer: {kind: mla, head_size: 132, dtype: uint8, kv_cache_dtype: auto,
            layer_name: 'model.layers.{index}.self_attn.indexer.k_cache'}
layers:
  - {repeat: 4, pattern: [mla+indexer]}
"""
    layout = compile_source(text, "v32.yaml").layout
    modes = {e.kv_cache_dtype for e in layout.layers.values()}
    assert modes == {"fp8_ds_mla", "auto"}


def test_import_of_a_dump_that_does_not_fit_still_writes_the_source(tmp_path: Path) -> None:
    import json

    from tests.conftest import CONFORMANCE, invoke

    case = json.loads((CONFORMANCE / "cases" / "syn-not-enough-memory.json").read_text())
    dump = tmp_path / "d.json"
    dump.write_text(json.dumps(case))
    out = tmp_path / "m.yaml"
    code, _, stderr = invoke(["import", str(dump), "-o", str(out)])
    assert code == 1 and out.exists()
    assert "estimated maximum model length is 8176" in stderr
    assert "wrote" in stderr and "Traceback" not in stderr
    code, _, stderr = invoke(["validate", str(out)])
    assert code == 1 and "set engine.max_model_len to 8176 or less" in stderr
