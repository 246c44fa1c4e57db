"""TransferPlan (kvspec.connectors.plan): JSON, instantiation, and its errors; and the
checks the NIXL endpoint makes before any byte moves (no NIXL needed here)."""

from __future__ import annotations

import json
import re

import pytest

from kvspec.connectors.nixl import Memory, NixlError, _fits
from kvspec.connectors.plan import (
    RUN_COLUMNS,
    BlockIdError,
    BlockLists,
    PlanFormatError,
    PlanMismatchError,
    Region,
    Route,
    Run,
    RunOutsideRegionError,
    Side,
    Span,
    TransferPlan,
)
from kvspec.connectors.transfer import plan_transfer
from tests.connectors.caches import compiled

_RUN = Run(0, 0, 1024, 0, 0, 1024, 512)


def _plan(length: int = 4096, blocks: int = 4, run: Run = _RUN) -> TransferPlan:
    side = Side("sha256:s", (Region(0, 0, "device", length),), {"full": blocks})
    dst = Side("sha256:d", (Region(0, 0, "device", length),), {"full": blocks})
    return TransferPlan(side, dst, (Route(0, 0, "full", (run, Run(0, 512, 1024, 0, 512,
                                                                  1024, 512))),))


def test_json_round_trip_and_text() -> None:
    plan = plan_transfer(compiled("dense", tensor=2), compiled("dense"), src_blocks=6,
                         dst_blocks=6).plan  # TP 2 -> 1
    text = plan.to_json()
    assert TransferPlan.from_json(text) == plan
    assert text.count("\n") == len(plan.routes) + 2  # one route per line
    assert json.loads(text)["run_columns"] == list(RUN_COLUMNS)


def test_units_of_blocks_of_different_sizes() -> None:
    """A source block of 32 tokens holds two destination blocks of 16: unit ``i`` of a
    block is ``i * sub_stride`` bytes in."""
    side = lambda d, n: Side(d, (Region(0, 0, "device", 4096),), {"g": n})  # noqa: E731
    route = Route(0, 0, "g", (Run(0, 0, 1024, 0, 0, 512, 256, 512, 0),), 2, 1)
    plan = TransferPlan(side("sha256:s", 4), side("sha256:d", 8), (route,))
    assert plan.units({"g": BlockLists(src=[3, 1], dst=[5, 6, 0])}) == {
        "g": [(3, 0, 5, 0), (3, 1, 6, 0), (1, 0, 0, 0)]}
    assert plan.spans({"g": {"src": [3], "dst": [5, 6]}}) == {(0, 0): [
        Span(0, 3072, 0, 2560, 256), Span(0, 3584, 0, 3072, 256)]}
    with pytest.raises(BlockIdError, match="moves blocks of different sizes"):
        plan.units({"g": [(3, 5)]})
    wide = Route(0, 0, "g", (Run(0, 0, 1024, 0, 0, 512, 256, 800, 0),), 2, 1)
    with pytest.raises(RunOutsideRegionError, match="block 3 of group 'g' ends at byte 4128"):
        TransferPlan(side("sha256:s", 4), side("sha256:d", 8), (wide,))


def test_spans_are_affine_in_block_ids_and_merged() -> None:
    plan = _plan()
    # one block: its two runs are adjacent on both sides, so one span
    assert plan.spans([(1, 2)]) == {(0, 0): [Span(0, 1024, 0, 2048, 1024)]}
    # consecutive blocks on both sides merge too; a gap starts a new span
    assert plan.spans({"full": [(0, 1), (1, 2), (3, 0)]}) == {(0, 0): [
        Span(0, 0, 0, 1024, 2048), Span(0, 3072, 0, 0, 1024)]}
    assert plan.spans([2]) == {(0, 0): [Span(0, 2048, 0, 2048, 1024)]}
    assert plan.spans([], dst_rank=1) == {}


@pytest.mark.parametrize("blocks, message", [
    ([(4, 0)], "block 4 of group 'full' is outside the source pool"),
    ([(0, 9)], "block 9 of group 'full' is outside the destination pool"),
    ([-1], "block -1 of group 'full' is outside the source pool"),
    ([(0, 1), (2, 1)], "destination block 1 of group 'full' is given twice"),
    ({"window": [0]}, "the plan moves no group 'window'"),
    ([(0, 1, 2)], "not a block id or a"),
    (["0"], "not a block id or a"),
])
def test_block_ids_are_checked(blocks, message: str) -> None:
    with pytest.raises(BlockIdError, match=message) as err:
        _plan().spans(blocks)
    assert err.value.hint


def test_a_run_outside_its_region_is_refused() -> None:
    with pytest.raises(RunOutsideRegionError, match="block 3 of group 'full' ends at byte "
                                                    "4608, past the end of region 'device'"):
        _plan(run=Run(0, 0, 1024, 0, 1024, 1024, 512))
    with pytest.raises(RunOutsideRegionError):
        _plan(length=4000)


@pytest.mark.parametrize("edit, message, path, line", [
    (lambda d: d.pop("routes"), "missing 'routes'", "<document>", 1),
    (lambda d: d.update(kvspec_transfer_plan=3), "format 3 is not one this kvspec reads",
     "kvspec_transfer_plan", 1),
    (lambda d: d["routes"][0]["runs"][1].__setitem__(6, -1), "non-negative integer",
     "routes[0].runs[1][6]", 3),
    (lambda d: d["routes"][0]["runs"].append([0, 0, 0, 7, 0, 0, 8, 0, 0]),
     "the destination rank 0 has no region 7", "routes[0].runs[2]", 3),
    (lambda d: d["source"]["num_blocks"].pop("full"), "no block count for group 'full'",
     "routes[0].group", 3),
    (lambda d: d["source"].update(extra=1), "unknown field 'extra'", "source.extra", 1),
    (lambda d: d.update(run_columns=["length"]), "other columns", "run_columns", 1),
])
def test_format_errors_point_at_the_field(edit, message: str, path, line: int) -> None:
    data = json.loads(_plan().to_json())
    edit(data)
    text = json.dumps(data, indent=None).replace('"routes": [', '"routes": [\n\n', 1)
    with pytest.raises(PlanFormatError, match=message) as err:
        TransferPlan.from_json(text, file="p.json")
    assert (err.value.path, err.value.file, err.value.line) == (path, "p.json", line)
    assert err.value.hint


def test_not_json_is_a_format_error() -> None:
    with pytest.raises(PlanFormatError, match="not valid JSON") as err:
        TransferPlan.from_json('{"a": \n nope}')
    assert err.value.line == 2


def test_an_endpoint_refuses_a_plan_for_other_caches() -> None:
    plan = _plan()
    ok = {"device": Memory(0x1000, 4096)}
    _fits(plan.source, 0, "sha256:s", ok, "peer 'p'")
    with pytest.raises(PlanMismatchError, match=re.escape("made for sha256:s, and peer 'p' "
                                                          "(rank 0) holds sha256:x")):
        _fits(plan.source, 0, "sha256:x", ok, "peer 'p'")
    with pytest.raises(PlanMismatchError, match="region 'device' of rank 0 is 4096 B, and "
                                                "this endpoint registered 8192 B"):
        _fits(plan.source, 0, "sha256:s", {"device": Memory(0, 8192)}, "this endpoint")
    with pytest.raises(PlanMismatchError, match="registered none"):
        _fits(plan.source, 0, "sha256:s", {"host": Memory(0, 4096)}, "this endpoint")


def test_a_region_must_be_a_tensor_a_memory_or_a_triple() -> None:
    assert Memory.of((0x1000, 64, 0), "device") == Memory(0x1000, 64, 0, "DRAM")
    with pytest.raises(NixlError, match="region 'device' is not a tensor") as err:
        Memory.of((0x1000, 64), "device")
    assert err.value.hint
