"""Workload presets (kvspec.sim.presets): each reproduces the statistics it states
within 2% on 100,000 seeded draws, and the source and the CLI take them."""

from __future__ import annotations

import itertools
import random
import statistics
from pathlib import Path

import pytest

from kvspec.model.workloads import PRESETS, Preset
from kvspec.sim.generate import gap
from kvspec.sim.presets import chains, draw, preset_named, preset_trace
from kvspec.sim.trace import TraceError
from tests.conftest import ROOT, invoke

DRAWS = 100_000
#: The Azure code trace's inter-arrival CV is 13.2: the mean and the spread of 100,000
#: such gaps scatter by CV / sqrt(n) ~ 4% and more from seed to seed (the heavy tail),
#: so its rate and CV are measured over this many gaps instead (~0.9%).
BURSTY_DRAWS = 2_000_000


def _reuse(preset: Preset, prompts: tuple[int, ...]) -> float:
    """The share of drawn blocks seen before (an unlimited cache): ids are numbered in
    order, so a block is one seen before when its id is at most the largest so far."""
    seen = total = 0
    top = -1
    for blocks in chains(preset, prompts, seed=0):
        seen += sum(1 for b in blocks if b <= top)
        total += len(blocks)
        top = max(top, *blocks)
    return seen / total


def _measured(preset: Preset, name: str, d: object) -> float:
    prompts, outputs, gaps = d.prompts, d.outputs, d.gaps  # type: ignore[attr-defined]
    return {"block_reuse": lambda: _reuse(preset, prompts),
            "prompt_mean": lambda: statistics.fmean(prompts),
            "prompt_p50": lambda: statistics.median(prompts),
            "output_mean": lambda: statistics.fmean(outputs),
            "output_p50": lambda: statistics.median(outputs),
            "rate": lambda: 1 / statistics.fmean(gaps),
            "arrival_cv": lambda: statistics.pstdev(gaps) / statistics.fmean(gaps)}[name]()


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_a_preset_reproduces_its_stated_statistics(name: str) -> None:
    preset = PRESETS[name]
    d = draw(preset, DRAWS, seed=0)
    for stat, stated in preset.stated:
        if stat in ("rate", "arrival_cv") and preset.arrival_cv > 5:
            continue  # below, over more gaps
        got = _measured(preset, stat, d)
        assert abs(got / stated - 1) <= 0.02, (name, stat, stated, got)


def test_the_bursty_preset_reproduces_its_rate_and_variation() -> None:
    preset = PRESETS["azure-code-2023"]
    rng = random.Random(0)
    gaps = [gap(rng, preset.rate, preset.arrival_cv) for _ in range(BURSTY_DRAWS)]
    mean = statistics.fmean(gaps)
    assert abs(1 / mean / preset.rate - 1) <= 0.02
    assert abs(statistics.pstdev(gaps) / mean / preset.arrival_cv - 1) <= 0.02


def test_every_preset_states_its_means_and_rate() -> None:
    for preset in PRESETS.values():
        assert {"prompt_mean", "output_mean", "rate"} <= dict(preset.stated).keys()
        assert preset.source and preset.fit


def test_a_mooncake_preset_draws_prefix_blocks() -> None:
    trace = preset_trace("mooncake-conversation", 300, seed=1)
    assert all(r.prefix_blocks[0] == 0 and r.prefix_block_tokens == 512 for r in trace)
    assert all(len(r.prefix_blocks) == -(-r.prompt_tokens // 512) for r in trace)
    assert not any(r.prefix_blocks for r in preset_trace("azure-code-2023", 30))


def test_a_preset_trace_is_seeded_and_in_steps() -> None:
    a = preset_trace("mooncake-conversation", 200, seed=3, step_ms=50)
    assert a == preset_trace("mooncake-conversation", 200, seed=3, step_ms=50)
    assert a != preset_trace("mooncake-conversation", 200, seed=4, step_ms=50)
    assert a[0].arrival == 0 and all(x.arrival <= y.arrival for x, y in itertools.pairwise(a))
    # a tenth of the step time: ten times the steps (up to the flooring)
    b = preset_trace("mooncake-conversation", 200, seed=3, step_ms=5)
    assert abs(b[-1].arrival - 10 * a[-1].arrival) <= 10
    capped = preset_trace("mooncake-conversation", 200, seed=3, max_prompt_tokens=4095)
    assert max(r.prompt_tokens for r in capped) == 4095


def test_an_unknown_preset_gets_a_did_you_mean() -> None:
    with pytest.raises(TraceError) as caught:
        preset_named("azure-conversation")
    assert caught.value.hint == "did you mean 'azure-conversation-2023'?"


def test_trace_draws_a_preset() -> None:
    code, out, err = invoke(["trace", "-n", "5", "--preset", "azure-code-2023"])
    assert code == 0, err
    assert len(out.splitlines()) == 5
    code, _, err = invoke(["trace", "--preset", "azure-code-2023", "--rate", "2"])
    assert code == 2 and "--preset azure-code-2023 decides --rate" in err
    code, _, err = invoke(["trace", "--preset", "azure-code-2032"])
    assert code == 2 and "azure-code-2023" in err


def test_gamma_arrivals_have_the_declared_variation() -> None:
    from kvspec.sim import generate_trace

    trace = generate_trace(100_000, seed=2, prompt_mean=10, output_mean=2, rate=0.01,
                           arrival_cv=3.0)
    steps = [r.arrival for r in trace]
    gaps = [b - a for a, b in itertools.pairwise(steps)]
    mean = statistics.fmean(gaps)
    assert abs(mean / 100 - 1) < 0.02
    assert abs(statistics.pstdev(gaps) / mean / 3.0 - 1) < 0.03
    poisson = generate_trace(3, seed=2, prompt_mean=10, output_mean=2, rate=0.5)
    assert poisson == generate_trace(3, seed=2, prompt_mean=10, output_mean=2, rate=0.5,
                                     arrival_cv=1.0), "cv 1 keeps the Poisson traces"


def test_the_source_takes_a_preset(tmp_path: Path) -> None:
    src = (ROOT / "tests" / "data" / "pooling" / "llama-auto-vllm.yaml").read_text()
    head, _ = src.split("pooling:\n")
    (tmp_path / "p.yaml").write_text(head + "pooling:\n  policy: unified\n  workload: "
                                     "{preset: azure-conversation-2023, requests: 50}\n")
    code, out, err = invoke(["simulate", str(tmp_path / "p.yaml"), "--format", "json"])
    assert code == 0, err
    assert '"requests": 50' in out
