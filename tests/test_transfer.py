"""``kvspec transfer`` (kvspec.connectors.transfer): compatible, re-mappable and refused
pairs of compiled artifacts, and every plan executed in this process between caches
loaded with ``kvspec.load`` (tests/connectors/caches.py checks the bytes by the caches'
own views, not by the plan). The same plans cross processes through NIXL in
tests/test_nixl_transfer.py."""

from __future__ import annotations

import random
import re

import pytest

from kvspec.connectors.compat import TransferRefused
from kvspec.connectors.plan import BlockIdError, BlockLists, TransferPlan
from kvspec.connectors.transfer import plan_transfer
from tests.connectors.caches import apply, check_moved, compiled, load, regions

N = 8  # blocks of the dense layouts (one request needs 5)


def _move(src_art, dst_art, blocks: dict, *, src_blocks: int = N, dst_blocks: int = N,
          heads: int | None = 4):
    """Plan, load both sides (every rank), execute the plan in process, check the bytes;
    the transfer and the bytes checked."""
    t = plan_transfer(src_art, dst_art, src_blocks=src_blocks, dst_blocks=dst_blocks)
    plan = TransferPlan.from_json(t.plan.to_json())  # what a connector reads
    assert plan == t.plan
    world = [len(art.body.stages) * art.body.engine.tensor_parallel_size
             for art in (src_art, dst_art)]
    srcs = [load(src_art, src_blocks, r, seed=100 + r) for r in range(world[0])]
    dsts = [load(dst_art, dst_blocks, r, seed=7 + r) for r in range(world[1])]
    before = [{k: v.clone() for k, v in regions(c).items()} for c in dsts]
    apply(plan, blocks, srcs, dsts)
    units = {int(g): u for g, u in plan.units(blocks).items()}
    return t, check_moved(srcs, dsts, before, units, heads)


def _runs(t) -> dict[tuple[int, int, str], int]:
    return {(r.src_rank, r.dst_rank, r.group): len(r.runs) for r in t.plan.routes}


def test_same_layout_is_compatible_one_run_per_layer() -> None:
    art = compiled("dense")
    t, checked = _move(art, art, {"0": [(1, 5), (2, 6), (7, 1)]})
    assert (t.verdict, t.reasons) == ("compatible", ())
    assert _runs(t) == {(0, 0, "0"): 4}
    (c,) = t.counts
    assert (c.descriptors, c.per_layer_kv, c.vllm) == (4, 8, 4)
    assert checked == 3 * 4 * 4 * 16 * 32  # blocks x layers x heads x tokens x (K+V bytes)


@pytest.mark.parametrize("layout, runs, vllm", [("LBNHC", 4 * 16, None), ("LBHNC", 4, 8)])
def test_tp2_to_tp1_gathers_heads(layout: str, runs: int, vllm: int | None) -> None:
    src, dst = compiled("dense", tensor=2, layout=layout), compiled("dense", layout=layout)
    t, _ = _move(src, dst, {"0": [(0, 3), (4, 4), (5, 1)]})
    assert t.reasons == ("tensor_parallel_size 2 -> 1",)
    # LBNHC: a source rank's 2 heads of a token are contiguous on both sides, one run per
    # token; LBHNC: its heads are the first (second) half of the page on both sides
    assert _runs(t) == {(0, 0, "0"): runs, (1, 0, "0"): runs}
    assert (t.counts[0].sources, t.counts[0].vllm) == (2, vllm)


def test_tp1_to_tp2_scatters_heads() -> None:
    t, _ = _move(compiled("dense"), compiled("dense", tensor=2), {"0": [(1, 2), (3, 3)]})
    assert set(_runs(t)) == {(0, 0, "0"), (0, 1, "0")}


def test_mla_latents_are_replicated_so_any_rank_serves() -> None:
    mla = dict(mla="", heads=1, head_size=72)
    t, checked = _move(compiled("dense", tensor=2, **mla), compiled("dense", **mla),
                       {"0": [(1, 2), (3, 4)]}, heads=None)
    assert _runs(t) == {(0, 0, "0"): 4} and t.counts[0].vllm == 4  # one read, not two
    assert checked == 2 * 4 * 16 * 144
    t, _ = _move(compiled("dense", **mla), compiled("dense", tensor=2, **mla),
                 {"0": [(1, 2)]}, heads=None)
    assert set(_runs(t)) == {(0, 0, "0"), (0, 1, "0")}  # each decode rank reads it whole


def test_token_major_to_head_major_moves_cells() -> None:
    t, _ = _move(compiled("dense"), compiled("dense", layout="LBHNC"),
                 {"0": [(3, 2), (6, 7)]})
    assert t.reasons == ("axis_order LBNHC -> LBHNC",)
    assert _runs(t) == {(0, 0, "0"): 4 * 4 * 16}  # a cell (one head's K||V) is the run
    assert t.counts[0].vllm is None               # vLLM needs one layout on both sides


@pytest.mark.parametrize("layout", ["BLHNC", "BLNHC", "LHBNC", "BHLNC"])
def test_every_axis_order_round_trips(layout: str) -> None:
    art, other = compiled("dense", layout="LBHNC"), compiled("dense", layout=layout)
    _move(art, other, {"0": [(1, 2), (2, 3)]})
    _move(other, art, {"0": [(4, 1)]})


def test_block_outermost_to_itself_is_one_run_per_block() -> None:
    art = compiled("dense", layout="BLHNC")
    t, _ = _move(art, art, {"0": [(1, 2), (2, 3)]})
    assert _runs(t) == {(0, 0, "0"): 1}


@pytest.mark.parametrize("src_bs, dst_bs", [(16, 32), (32, 16), (16, 64)])
def test_block_sizes_that_divide_move_units(src_bs: int, dst_bs: int) -> None:
    src, dst = compiled("dense", block=src_bs), compiled("dense", block=dst_bs)
    ks, kd = max(1, dst_bs // src_bs), max(1, src_bs // dst_bs)
    lists = BlockLists(src=[3, 5, 1, 6][:4 // kd], dst=[7, 2, 4, 1][:4 // ks])
    t, checked = _move(src, dst, {"0": lists}, src_blocks=N * 4, dst_blocks=N * 4)
    assert t.reasons == (f"group 0 block_size {src_bs} -> {dst_bs}",)
    assert checked == 4 * 4 * 16 * 32 * min(len(lists.src) * kd, len(lists.dst) * ks)
    with pytest.raises(BlockIdError, match="give each side's block list"):
        t.plan.units({"0": [(1, 1)]})


def test_a_different_block_count_remaps_offsets() -> None:
    art = compiled("dense")
    t, _ = _move(art, art, {"0": [(1, 9), (7, 15)]}, dst_blocks=2 * N)
    assert t.reasons == (f"num_blocks device {N} -> device {2 * N}",)


def test_pipeline_stages_regroup_layers() -> None:
    t, _ = _move(compiled("dense", pipeline=2), compiled("dense"), {"0": [(1, 2)]})
    assert {(r.src_rank, r.dst_rank) for r in t.plan.routes} == {(0, 0), (1, 0)}
    t, _ = _move(compiled("dense"), compiled("dense", pipeline=2), {"0": [(1, 2)]})
    assert {(r.src_rank, r.dst_rank) for r in t.plan.routes} == {(0, 0), (0, 1)}


def test_hybrid_sliding_window_and_state_groups() -> None:
    art = compiled("hybrid")
    pairs = {"0": [(1, 5), (2, 0), (7, 3)], "1": [(4, 4)], "2": [(3, 1), (9, 12)]}
    t, _ = _move(art, art, pairs, src_blocks=16, dst_blocks=20)
    assert _runs(t) == {(0, 0, "0"): 2, (0, 0, "1"): 1, (0, 0, "2"): 2}
    state = next(c for c in t.counts if c.key == "2")
    assert (state.kind, state.bytes_per_block, state.vllm) == ("mamba", 2 * 552, 2 * 4)


def test_random_pairs_of_layouts_move_exactly_their_blocks() -> None:
    """Seeded: random layouts, TP sizes, block counts and block ids, each transfer checked."""
    rng = random.Random(31)
    layouts = ["LBNHC", "LBHNC", "BLHNC", "BLNHC", "LHBNC"]
    for _ in range(6):
        kw = [dict(layout=rng.choice(layouts), tensor=rng.choice([1, 2, 4])) for _ in "ab"]
        counts = [rng.randint(5, 12) for _ in "ab"]
        dst = rng.sample(range(counts[1]), 3)
        pairs = [(rng.randrange(counts[0]), d) for d in dst]
        _move(compiled("dense", **kw[0]), compiled("dense", **kw[1]), {"0": pairs},
              src_blocks=counts[0], dst_blocks=counts[1])


# -- refusals -------------------------------------------------------------------------

@pytest.mark.parametrize("src, dst, message, path", [
    (dict(), dict(dtype="float16"), "dtype differs (bfloat16 in SRC, float16 in DST)",
     "body.stages[0].tensors[0].view.dtype"),
    (dict(), dict(quantization="fp8"), "kv_cache_dtype differs: auto in SRC, fp8 in DST",
     "body.engine.kv_cache_dtype"),
    (dict(), dict(layers=3), "layer model.layers.3.self_attn.attn of SRC is missing from DST",
     "body.layers.model.layers.3.self_attn.attn"),
    (dict(heads=4), dict(heads=8), "num_kv_heads differs", "body.stages[0].tensors[0].view.heads"),
    (dict(heads=2, tensor=2), dict(heads=2, tensor=4), "do not say whether heads are split",
     "body.stages[0].tensors[0].view.heads"),
    (dict(block=32), dict(block=48), "block size 48 of DST and 32 of SRC do not divide",
     "body.groups[0].block_size"),
])
def test_refusals_name_the_field(src: dict, dst: dict, message: str, path: str) -> None:
    with pytest.raises(TransferRefused, match=message.replace("(", r"\(").replace(")", r"\)")
                       ) as err:
        plan_transfer(compiled("dense", **src), compiled("dense", **dst), src_file="SRC",
                      dst_file="DST", src_blocks=32, dst_blocks=32)
    assert err.value.path == path
    assert err.value.file in ("SRC", "DST") and err.value.line and err.value.hint


def test_head_size_differs_is_refused() -> None:
    with pytest.raises(TransferRefused,
                       match=re.escape("head size differs (32 in SRC, 64 in DST)")) as err:
        plan_transfer(compiled("dense"), compiled("dense", head_size=16), src_file="SRC",
                      dst_file="DST", src_blocks=N, dst_blocks=N)
    assert err.value.path == "body.stages[0].tensors[0].view.cell_bytes"


def test_window_and_state_split_are_refused() -> None:
    base = compiled("hybrid")
    with pytest.raises(TransferRefused, match=re.escape("window differs (32 in SRC, 64 in DST)")):
        plan_transfer(base, compiled("hybrid", window=64), src_blocks=16, dst_blocks=16)
    with pytest.raises(TransferRefused, match="is a state layer split across tensor-parallel "
                                              "ranks: its states cannot be re-split from 2 to 1"):
        plan_transfer(compiled("hybrid", tensor=2), base, src_blocks=16, dst_blocks=16)


def test_block_ids_outside_either_pool_are_refused() -> None:
    art = compiled("dense")
    t = plan_transfer(art, art, src_blocks=N, dst_blocks=N // 2 + 1)
    with pytest.raises(BlockIdError, match="block 5 of group '0' is outside the destination"):
        t.plan.spans({"0": [(0, 0), (7, 5)]})
    with pytest.raises(BlockIdError, match="block 8 of group '0' is outside the source"):
        t.plan.spans({"0": [(8, 1)]})
