"""The chooser's rules (kvspec.pooling.choose), on small hand-built candidates and
figures: the tie band, never below vLLM's plan, the tie-break order, max_groups and
the separate plan's tuned split."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from types import SimpleNamespace
from typing import Any

import pytest

import kvspec.pooling.choose as chooser
from kvspec.errors import KvspecError
from kvspec.model.pooling import Pooling
from kvspec.passes.pool import PoolLayout
from kvspec.pooling.choose import SPLIT_FACTORS, TIE, choose, tiebreak, tune_separate
from kvspec.pooling.evaluate import Evaluation


@dataclass(frozen=True)
class Cand:
    """What the chooser reads of a candidate."""

    name: str
    groups: int = 1
    hash_block_size: int = 16
    caching: bool = True
    note: str | None = None
    pools: tuple[PoolLayout, ...] = ()
    pooled: Any = None

    @property
    def layouts(self) -> tuple[Any, ...]:
        return (SimpleNamespace(engine=SimpleNamespace(enable_prefix_caching=self.caching)),)


def ev(running: float | None, waste: float | None = None, used: float | None = None,
       static: float | None = None) -> Evaluation:
    """Figures: simulated (``running`` requests on average), else static only."""
    sim = None if running is None else {"mean_running": running, "layout_waste": waste,
                                        "utilization_while_memory_bound": used}
    return Evaluation(static, static, None, simulated=sim)


def test_the_highest_capacity_wins_outside_the_tie_band() -> None:
    cands = [Cand("unified"), Cand("separate", groups=2)]
    assert choose(cands, [ev(100.0), ev(100.0 * (1 + 2 * TIE))]) == 1


def test_within_the_tie_band_the_tiebreak_decides() -> None:
    """2 groups running 0.5% more tie with 1 group: fewer groups win."""
    cands = [Cand("unified"), Cand("separate", groups=2)]
    assert choose(cands, [ev(100.0), ev(100.5)]) == 0


def test_never_below_the_unified_plans_capacity_inside_the_band() -> None:
    """The best runs 100.5; the unified plan 100; a candidate at 99.6 is inside the
    band of the best but below vLLM's plan, so its finer unit does not count."""
    cands = [Cand("unified", hash_block_size=32), Cand("best", groups=3, hash_block_size=32),
             Cand("finer", hash_block_size=16)]
    assert choose(cands, [ev(100.0), ev(100.5), ev(99.6)]) == 0
    # the same finer candidate at the unified plan's capacity is chosen
    assert choose(cands, [ev(100.0), ev(100.5), ev(100.0)]) == 2


def test_noted_candidates_are_never_chosen() -> None:
    cands = [Cand("unified"), Cand("separate", note="vLLM 0.33 holds one shared pool")]
    assert choose(cands, [ev(10.0), ev(50.0)]) == 0


def test_a_noted_unified_plan_sets_no_floor() -> None:
    cands = [Cand("unified", note="not simulated: too large"), Cand("a"), Cand("b", groups=2)]
    assert choose(cands, [ev(None, static=500.0), ev(10.0), ev(10.05)]) == 1


def test_without_a_simulation_the_static_workload_figure_counts() -> None:
    cands = [Cand("unified"), Cand("separate", groups=2)]
    assert choose(cands, [ev(None, static=10.0), ev(None, static=20.0)]) == 1


def test_no_servable_candidate_is_an_error_at_the_workload() -> None:
    cands = [Cand("unified", note="not simulated: x"), Cand("separate", note="cannot plan: y")]
    with pytest.raises(KvspecError, match="no plan can serve this workload") as caught:
        choose(cands, [ev(None), ev(None)])
    err = caught.value
    assert err.ref.path == ("pooling", "workload")
    assert "unified: not simulated: x; separate: cannot plan: y" in err.message
    assert err.hint


#: Each row: two candidates that tie on capacity, and the one that wins, by the
#: first rule of the tie-break that tells them apart.
TIEBREAK = [
    # the finer prefix-match unit
    ((Cand("a", hash_block_size=32), ev(100.0)), (Cand("b", hash_block_size=16), ev(100.0)),
     "b"),
    # prefix caching off is the coarsest unit of all, even with less waste and fewer groups
    ((Cand("a", caching=False, hash_block_size=1), ev(100.0, 0.0)),
     (Cand("b", groups=4, hash_block_size=64), ev(100.0, 0.5)), "b"),
    # then the smaller layout waste while memory binds (rounded to 0.001)
    ((Cand("a"), ev(100.0, 0.20)), (Cand("b", groups=3), ev(100.0, 0.10)), "b"),
    ((Cand("a"), ev(100.0, 0.1002)), (Cand("b", groups=3), ev(100.0, 0.1004)), "a"),
    # then fewer groups
    ((Cand("a", groups=2), ev(100.0)), (Cand("b"), ev(100.0)), "b"),
    # then capacity
    ((Cand("a"), ev(100.2)), (Cand("b"), ev(100.4)), "b"),
    # then the utilisation while memory binds
    ((Cand("a"), ev(100.0, used=0.9)), (Cand("b"), ev(100.0, used=0.8)), "a"),
]


@pytest.mark.parametrize("first,second,winner", TIEBREAK)
def test_the_tiebreak_order(first: tuple[Cand, Evaluation], second: tuple[Cand, Evaluation],
                            winner: str) -> None:
    assert max((first, second), key=lambda ce: tiebreak(*ce))[0].name == winner
    base = Cand("unified", groups=9, hash_block_size=1024)
    cands, evs = [base, first[0], second[0]], [ev(1.0), first[1], second[1]]
    assert cands[choose(cands, evs)].name == winner


def test_max_groups_notes_the_larger_candidates() -> None:
    pooling = Pooling(policy="auto", serve_with="kvspec", max_groups=2)
    out = chooser.within_max_groups([Cand("unified"), Cand("separate", groups=3)], pooling)
    assert [c.note for c in out] == [None, "3 groups, more than max_groups (2)"]


def test_max_groups_applies_to_auto_only() -> None:
    cands = [Cand("unified", groups=3), Cand("separate", groups=4)]
    pooling = Pooling(policy="separate", serve_with="kvspec", max_groups=2)
    assert chooser.within_max_groups(cands, pooling) == cands


def test_max_groups_that_leaves_none_is_an_error_at_max_groups() -> None:
    pooling = Pooling(policy="auto", serve_with="kvspec", max_groups=1)
    cands = [Cand("unified", groups=3), Cand("separate", groups=2),
             Cand("other", groups=1, note="cannot plan: x")]
    with pytest.raises(KvspecError, match=r"no candidate plan has at most max_groups \(1\)") \
            as caught:
        chooser.within_max_groups(cands, pooling)
    assert caught.value.ref.path == ("pooling", "max_groups")
    assert caught.value.hint == "raise max_groups to 1 or more, or remove it"


def pools(*shares: tuple[str, Fraction, bool]) -> tuple[PoolLayout, ...]:
    return tuple(PoolLayout(n, None, s, st) for n, s, st in shares)  # type: ignore[arg-type]


def test_the_split_scales_the_state_pools_share() -> None:
    split = chooser.scaled(pools(("mamba", Fraction(1, 5), True),
                                 ("full_attention", Fraction(4, 5), False)), 2.0)
    assert split == (("mamba", Fraction(2, 5)), ("full_attention", Fraction(3, 5)))


def test_without_state_pools_the_windowed_pools_share_is_scaled() -> None:
    split = chooser.scaled(pools(("sliding_window_1024", Fraction(1, 2), False),
                                 ("full_attention", Fraction(1, 2), False)), 0.5)
    assert split == (("sliding_window_1024", Fraction(1, 4)), ("full_attention", Fraction(3, 4)))


def test_a_scaled_share_stops_at_95_percent() -> None:
    split = chooser.scaled(pools(("mamba", Fraction(3, 5), True),
                                 ("full_attention", Fraction(2, 5), False)), 2.0)
    assert split is not None and dict(split)["mamba"] == Fraction(95, 100)
    assert sum(s for _, s in split) == 1


def test_no_split_to_tune_without_a_pool_to_scale_or_with_only_such_pools() -> None:
    assert chooser.scaled(pools(("full_attention", Fraction(1), False)), 2.0) is None
    assert chooser.scaled(pools(("mamba", Fraction(1), True)), 2.0) is None


def _tuning(monkeypatch: pytest.MonkeyPatch, running: dict[float, float | None]) -> list:
    """Tune a two-pool plan whose split at each factor runs ``running[factor]``
    requests (None: the split does not plan); the splits tried, in order."""
    start = pools(("mamba", Fraction(1, 5), True), ("full_attention", Fraction(4, 5), False))
    by_split = {chooser.scaled(start, f): f for f in SPLIT_FACTORS}
    tried = []

    def separated(name: str, sized: Any, pooling: Pooling, tokens: int) -> Cand:
        factor = by_split[pooling.split]
        tried.append(factor)
        if running[factor] is None:
            raise KvspecError("does not plan", hint="-")
        return Cand(name, pools=start, pooled=factor)

    def evaluate(c: Cand, *args: Any) -> Evaluation:
        return ev(running[c.pooled])

    monkeypatch.setattr(chooser, "separated", separated)
    monkeypatch.setattr(chooser, "evaluate", evaluate)
    c, e = tune_separate(Cand("separate", pools=start, pooled=1.0), ev(100.0),
                         Pooling(policy="auto", serve_with="kvspec"), 2048,
                         None, None, 1 << 30)  # type: ignore[arg-type]
    return [tried, c.pooled, e.simulated["mean_running"] if e.simulated else None]


def test_tuning_keeps_the_split_that_runs_the_most(monkeypatch: pytest.MonkeyPatch) -> None:
    tried, kept, running = _tuning(monkeypatch, {0.5: 90.0, 0.7: 120.0, 1.4: 110.0, 2.0: 80.0})
    assert tried == list(SPLIT_FACTORS)
    assert (kept, running) == (0.7, 120.0)


def test_tuning_keeps_the_plan_when_no_split_runs_more(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    tried, kept, running = _tuning(monkeypatch, {0.5: 90.0, 0.7: 100.0, 1.4: None, 2.0: 99.0})
    assert tried == list(SPLIT_FACTORS)  # a split that does not plan is skipped
    assert (kept, running) == (1.0, 100.0)


# -- auto in time (docs/pooling.md#auto-in-time) ------------------------------------------

def timed(running: float, per_s: float, good: float | None = None) -> Evaluation:
    """Figures of a timed run: ``running`` on average, ``per_s`` requests/s, ``good``
    requests/s meeting the SLO."""
    sim: dict[str, Any] = {"mean_running": running, "requests_per_s": per_s}
    if good is not None:
        sim["goodput_requests_per_s"] = good
    return Evaluation(None, None, None, simulated=sim)


def test_goodput_throughput_or_mean_running_decides_as_the_pooling_says() -> None:
    """The candidate running the most on average is not the one finishing the most a
    second, nor the one meeting the SLO the most: each judge keeps its own."""
    cands = [Cand("unified"), Cand("unified, block 32", hash_block_size=32),
             Cand("unified, no prefix caching", caching=False)]
    evals = [timed(10.0, 5.0, 1.0), timed(9.0, 6.0, 4.0), timed(14.0, 7.0, 2.0)]
    assert choose(cands, evals) == 2  # today's rule: the most running
    assert choose(cands, evals, "throughput") == 2
    assert choose(cands, evals, "goodput") == 1
    evals[2] = timed(14.0, 5.5, 2.0)
    assert choose(cands, evals, "throughput") == 1


def test_in_time_the_tie_band_and_the_unified_floor_hold() -> None:
    # 0.5% more goodput ties: the finer prefix-match unit wins
    cands = [Cand("unified", hash_block_size=16), Cand("coarser", hash_block_size=32)]
    assert choose(cands, [timed(1, 1, 100.0), timed(1, 1, 100.5)], "goodput") == 0
    assert choose(cands, [timed(1, 1, 100.0), timed(1, 1, 102.0)], "goodput") == 1
    # inside the band of the best but below vLLM's plan: not kept
    cands = [Cand("unified", hash_block_size=32), Cand("finer", hash_block_size=16),
             Cand("best", hash_block_size=32, groups=2)]
    evals = [timed(1, 100.0), timed(1, 99.6), timed(1, 100.5)]
    assert choose(cands, evals, "throughput") == 0


def test_a_judged_pooling_names_its_judge() -> None:
    from kvspec.model.pooling import ProfileRef
    from kvspec.model.slo import parse_slo

    ref = ProfileRef("p.yaml", "0" * 64, (1e-3, 0.0, 0.0, 0.0, 0.0))
    assert Pooling(policy="auto").judged_by == "mean_running"
    assert Pooling(policy="auto", profile=ref).judged_by == "throughput"
    assert Pooling(policy="auto", slo=parse_slo("ttft_p99=1s")).judged_by == "goodput"
    assert Pooling(policy="auto", profile=ref, slo=parse_slo("ttft_p99=1s")).judged_by \
        == "goodput"


def test_tuning_in_time_keeps_the_split_with_the_most_goodput(monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    from kvspec.model.slo import parse_slo

    start = pools(("mamba", Fraction(1, 5), True), ("full_attention", Fraction(4, 5), False))
    by_split = {chooser.scaled(start, f): f for f in SPLIT_FACTORS}
    # mean running, and goodput, per factor: they disagree
    figures = {0.5: (130.0, 1.0), 0.7: (90.0, 3.0), 1.4: (80.0, 2.0), 2.0: (70.0, 0.5)}

    def separated(name: str, sized: Any, pooling: Pooling, tokens: int) -> Cand:
        return Cand(name, pools=start, pooled=by_split[pooling.split])

    def evaluate(c: Cand, *args: Any) -> Evaluation:
        running, good = figures[c.pooled]
        return timed(running, 1.0, good)

    monkeypatch.setattr(chooser, "separated", separated)
    monkeypatch.setattr(chooser, "evaluate", evaluate)
    slo = Pooling(policy="auto", serve_with="kvspec", slo=parse_slo("ttft_p99=1s"))
    c, _ = tune_separate(Cand("separate", pools=start, pooled=1.0), timed(100.0, 1.0, 1.5),
                         slo, 2048, None, None, 1 << 30)  # type: ignore[arg-type]
    assert c.pooled == 0.7
    plain = Pooling(policy="auto", serve_with="kvspec")
    c, _ = tune_separate(Cand("separate", pools=start, pooled=1.0), timed(100.0, 1.0, 1.5),
                         plain, 2048, None, None, 1 << 30)  # type: ignore[arg-type]
    assert c.pooled == 0.5
