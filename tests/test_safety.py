"""No two block ids share bytes, and every plan that compiles loads.

The two silent-corruption classes the fuzzer found, and the deviations from the
reference planner that fix them (docs/deviations.md).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvspec.artifact.invariants import block_overlaps, check_layout
from kvspec.compiler import compile, compile_source
from kvspec.errors import PlanError
from tests.conftest import ROOT

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
    text = re.sub(r"layout: \w+", "layout: LHBNC", text) if "layout:" in text else \
        text.replace("engine:\n", "engine:\n  layout: LHBNC\n", 1)
    try:
        layout = compile_source(text, "m.yaml").layout
    except PlanError as err:
        assert "LHBNC" in err.render()
        return
    assert check_layout(layout) == []


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


SOURCES = sorted((ROOT / "layouts").glob("*.yaml")) + sorted((ROOT / "tests" / "golden").glob("*.yaml"))


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_committed_layouts_keep_block_ids_apart(source: Path) -> None:
    layout = compile(source.relative_to(ROOT)).layout
    for st in layout.stages:
        for blocks in (2, 3, 5, 8):
            assert block_overlaps(layout, st, blocks) == []
