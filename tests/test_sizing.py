"""The capacity rules read from a frozen artifact (``kvspec.artifact.sizing``), each
with a table of cases, and checked against the planner that made the artifact: a
pool's bytes of a budget (``share_of``), the blocks and requests a budget holds
(``capacity_for``) and each pool's count (``counts_for``) agree with re-planning
every committed artifact for the same budget (issue 37, finding 4)."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest

from kvspec.artifact.sizing import capacity_for, counts_for, share_of
from kvspec.compiled import read
from kvspec.errors import KvspecError
from kvspec.planner import resize, size_plan
from tests.conftest import ROOT

ARTIFACTS = sorted([*(ROOT / "layouts").glob("*.kvlayout.json"),
                    *(ROOT / "tests" / "golden").glob("*.kvlayout.json")])
BUDGETS = (2**30, 20 * 2**30, 200 * 2**30)


@pytest.mark.parametrize("memory,share,expected", [
    (100, None, 100),                         # no share: all of it
    (100, [1, 3], 33),                        # floored, never rounded up
    (100, Fraction(2, 3), 66),                # a Fraction as the compiler holds it
    (40 * 2**30, [9697, 16704], 24933128513),  # the separate example's full_attention
    (7, [], 7),                               # an empty share: all of it
])
def test_a_pools_bytes_are_its_share_of_the_budget_floored(memory: int, share: object,
                                                           expected: int) -> None:
    assert share_of(memory, share) == expected  # type: ignore[arg-type]


def _planned(layout: object, memory: int) -> tuple[int, float] | None:
    try:
        b = resize(layout, memory=memory)  # type: ignore[arg-type]
    except KvspecError:
        return None
    return b.num_blocks, b.max_concurrency if b.max_concurrency is not None else float("inf")


def _frozen(body: object, memory: int, pool: str | None = None) -> tuple[int, float] | None:
    try:
        return capacity_for(body, memory, pool)  # type: ignore[arg-type]
    except KvspecError:
        return None


@pytest.mark.parametrize("path", ARTIFACTS, ids=lambda p: p.name)
def test_the_frozen_capacity_is_the_planners(path: Path) -> None:
    art = read(path)
    for memory in BUDGETS:
        if art.pools:
            for p in art.pools:
                assert _frozen(art.body, memory, p.name) == _planned(p.layout, memory), \
                    (p.name, memory)
        else:
            assert _frozen(art.body, memory) == _planned(art.layout, memory), memory


@pytest.mark.parametrize("name", ["pooling-separate", "pooling-auto"])
def test_each_pools_count_is_the_planners_for_its_share(name: str) -> None:
    art = read(ROOT / "layouts" / f"{name}.kvlayout.json")
    assert art.pools, "a separate plan"
    for memory in BUDGETS:
        try:
            want = {p.name: size_plan(p.layout.plan, memory=share_of(memory, p.share)).num_blocks
                    for p in art.pools}
        except KvspecError:
            with pytest.raises(KvspecError):
                counts_for(art.body, 0, memory=memory)
            continue
        got = counts_for(art.body, 0, memory=memory)
        assert {n: got[n] for n in want} == want, memory
