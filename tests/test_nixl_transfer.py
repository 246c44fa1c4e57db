"""Blocks move between processes through real NIXL agents (kvspec.connectors.nixl).

A prefill side (one or two ranks) and a decode side each run in their own process
(``spawn``) with their own CPU caches; they exchange endpoint metadata over a pipe
only, and the decode side pulls (``READ``) or the prefill side pushes (``WRITE``) the
blocks a hand-built plan names. After each transfer, every destination layer's bytes of
the moved blocks equal the source's (heads gathered across source ranks), and no other
destination byte changed. The caches and plans come from tests/connectors/caches.py; a
later test can load them from compiled artifacts and ``kvspec transfer`` instead and
keep these checks.

Skipped only where the NIXL wheel cannot load (the reason is shown).
"""

from __future__ import annotations

import importlib.util

import pytest

from kvspec.connectors.nixl import PeerError
from kvspec.connectors.plan import BlockIdError, PlanMismatchError, TransferPlan
from tests.connectors.caches import CacheSpec, LayerGeo, check_moved, plan_between, stacked
from tests.connectors.peers import Peer

pytestmark = pytest.mark.skipif(importlib.util.find_spec("nixl") is None,
                                reason="nixl is not installed: pip install 'kvspec[nixl]'")

BLOCKS = 8
SHAPE = {"layers": 4, "tokens": 16, "head_bytes": 8}


def uniform(name: str, order: str, heads: int = 4, num_blocks: int = BLOCKS) -> CacheSpec:
    layers, size = stacked(order, heads=heads, num_blocks=num_blocks, **SHAPE)
    return CacheSpec(name, (("device", size),), layers, (("full", num_blocks),))


def hybrid(name: str, sw_blocks: int, state_blocks: int) -> CacheSpec:
    """Three sliding-window layers in one pool, two state layers (one 600-byte state
    per block: neither token- nor head-factorable) in another."""
    sw, sw_size = stacked("LBNHC", layers=3, heads=4, tokens=16, head_bytes=8,
                          num_blocks=sw_blocks, group="sliding_window", region="sw")
    state = 600
    states = tuple(LayerGeo(f"state.{i}", "state", "state", i * state_blocks * state,
                            (state_blocks, 1, 1, 1, state), (state, state, state, state))
                   for i in range(2))
    return CacheSpec(name, (("sw", sw_size), ("state", 2 * state_blocks * state)),
                     sw + states, (("sliding_window", sw_blocks), ("state", state_blocks)))


@pytest.fixture(scope="module")
def peers():
    started = [Peer() for _ in range(3)]  # prefill rank 0, prefill rank 1, decode
    try:
        for p in started:
            p.ready()
        if started[0].unavailable:
            pytest.skip(f"the NIXL wheel cannot load here: {started[0].unavailable}")
        yield started
    finally:
        for p in started:
            p.close()


def _connect(peers, src: CacheSpec, src_ranks: int, dst: CacheSpec):
    prefill, decode = peers[:src_ranks], peers[2]
    metas = [p.call("setup", src, rank, 100 + rank) for rank, p in enumerate(prefill)]
    decode_meta = decode.call("setup", dst, 0, 7)
    for p in prefill:
        p.call("add_peer", decode_meta)
    for meta in metas:
        decode.call("add_peer", meta)
    return prefill, decode


def _move(peers, src: CacheSpec, src_ranks: int, dst: CacheSpec, pairs: dict,
          op: str = "READ") -> tuple[TransferPlan, list]:
    """Set up the caches, move ``pairs`` with ``op``, check the bytes; the plan and
    the transfer stats of each initiator."""
    prefill, decode = _connect(peers, src, src_ranks, dst)
    plan = plan_between(src, src_ranks, dst, 1)
    text = plan.to_json()  # the plan crosses to the initiators as JSON
    before, sources = decode.call("dump"), [p.call("dump") for p in prefill]
    decode_name = decode.call("name")
    if op == "READ":
        stats = [decode.call("read", text, pairs, 20.0, b"moved")]
        for p in prefill:  # the sources learn they may free their blocks
            p.call("wait", decode_name, b"moved", 20.0)
    else:
        for p in prefill:
            p.send("write", text, pairs, 20.0, b"")
        stats = [p.result() for p in prefill]
    after = decode.call("dump")
    assert check_moved(src, sources, dst, before, after, pairs) > 0
    assert sum(s.bytes for s in stats) == sum(
        route.bytes_per_block * len(pairs.get(route.group, ())) for route in plan.routes)
    return plan, stats


def _runs(plan: TransferPlan) -> dict[tuple[int, int, str], int]:
    return {(r.src_rank, r.dst_rank, r.group): len(r.runs) for r in plan.routes}


@pytest.mark.parametrize("op", ["READ", "WRITE"])
def test_same_geometry(peers, op: str) -> None:
    spec = uniform("same", "LBNHC")
    plan, (stats,) = _move(peers, spec, 1, spec, {"full": [(1, 5), (2, 6), (7, 0)]}, op)
    # one run per layer per block (a layer's page is contiguous on both sides),
    # against 2 per layer for per-layer K/V descriptors
    assert _runs(plan) == {(0, 0, "full"): 4}
    assert stats.descriptors == 3 * 4


def test_tp2_to_tp1_gathers_heads(peers) -> None:
    src, dst = uniform("tp2", "LBNHC", heads=2), uniform("tp1", "LBNHC", heads=4)
    plan, _ = _move(peers, src, 2, dst, {"full": [(0, 3), (4, 4), (5, 1)]})
    # a source rank's heads of one token are contiguous on both sides: one run per token
    assert _runs(plan) == {(0, 0, "full"): 4 * 16, (1, 0, "full"): 4 * 16}


def test_token_major_to_head_major(peers) -> None:
    src, dst = uniform("nh", "LBNHC"), uniform("hn", "LBHNC")
    plan, _ = _move(peers, src, 1, dst, {"full": [(3, 2), (6, 7)]})
    # a cell (one head's K and V of one token) is contiguous on both sides, no more
    assert _runs(plan) == {(0, 0, "full"): 4 * 4 * 16}


def test_hybrid_sliding_window_and_state(peers) -> None:
    src, dst = hybrid("hy-prefill", 8, 4), hybrid("hy-decode", 6, 3)
    pairs = {"sliding_window": [(1, 5), (2, 0), (7, 3)], "state": [(3, 1)]}
    plan, _ = _move(peers, src, 1, dst, pairs)
    assert _runs(plan) == {(0, 0, "sliding_window"): 3, (0, 0, "state"): 2}


def test_a_plan_for_other_caches_moves_nothing(peers) -> None:
    spec, other = uniform("held", "LBNHC"), uniform("other", "LBHNC")
    prefill, decode = _connect(peers, spec, 1, spec)
    before = decode.call("dump")
    wrong_source = plan_between(other, 1, spec, 1).to_json()
    with pytest.raises(PlanMismatchError, match="the plan was made for sha256:.*and peer"):
        decode.call("read", wrong_source, [1], 5.0, b"")
    wrong_destination = plan_between(spec, 1, other, 1).to_json()
    with pytest.raises(PlanMismatchError, match="and this endpoint"):
        decode.call("read", wrong_destination, [1], 5.0, b"")
    with pytest.raises(PlanMismatchError, match="and this endpoint"):
        prefill[0].call("write", wrong_source, [1], 5.0, b"")
    after = decode.call("dump")
    assert all(before[k].equal(after[k]) for k in before)


def test_block_ids_outside_either_pool_move_nothing(peers) -> None:
    src, dst = uniform("big", "LBNHC", num_blocks=BLOCKS), uniform("small", "LBNHC",
                                                                    num_blocks=4)
    _, decode = _connect(peers, src, 1, dst)
    before = decode.call("dump")
    plan = plan_between(src, 1, dst, 1).to_json()
    with pytest.raises(BlockIdError, match="block 4 of group 'full' is outside the "
                                           "destination pool"):
        decode.call("read", plan, [(0, 0), (7, 4)], 5.0, b"")
    with pytest.raises(BlockIdError, match="block 8 of group 'full' is outside the source"):
        decode.call("read", plan, [(8, 1)], 5.0, b"")
    after = decode.call("dump")
    assert all(before[k].equal(after[k]) for k in before)


def test_a_peer_that_does_not_answer_is_named(peers) -> None:
    """The source stops before the decode side connects: the connection cannot be set
    up (once it is, READ through ``cma`` needs nothing from a stopped source)."""
    spec = uniform("stall", "LBNHC")
    prefill, decode = peers[:1], peers[2]
    meta, name = prefill[0].call("setup", spec, 0, 100), None
    decode.call("setup", spec, 0, 7)
    name = prefill[0].call("name")
    prefill[0].pause()
    try:
        decode.call("add_peer", meta)
        with pytest.raises(PeerError, match=f"NIXL agent '{name}' did not answer within 1 s"):
            decode.call("read", plan_between(spec, 1, spec, 1).to_json(), [0, 1], 1.0, b"")
    finally:
        prefill[0].resume()


def test_a_dead_peer_is_named(peers) -> None:
    """Last: it ends a prefill process (the fixture's teardown copes)."""
    spec = uniform("dead", "LBNHC")
    prefill, decode = _connect(peers, spec, 1, spec)
    plan, name = plan_between(spec, 1, spec, 1).to_json(), prefill[0].call("name")
    decode.call("read", plan, [0], 20.0, b"")
    prefill[0].process.kill()
    prefill[0].process.join(10)
    with pytest.raises(PeerError, match=f"'{name}'"):
        decode.call("read", plan, [1, 2], 3.0, b"")
