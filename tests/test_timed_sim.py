"""The simulator in seconds: step-time models, the clock, per-request latency, SLOs."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from kvspec.compiled import read as read_artifact
from kvspec.errors import UsageError
from kvspec.model.steptime import ConstantStepTime, LinearStepTime, shape_of
from kvspec.model.steptime_fit import fit_linear, nnls
from kvspec.runtime.manager import ManagedGroup, ManagedLayout, ManagedPool, from_artifact
from kvspec.sim import SUMMARY_KEYS, TraceRequest, generate_trace, parse_trace, run, simulate
from kvspec.sim.latency import parse_slo, percentile, weighted_percentile
from kvspec.source.profile import fit_profile, parse_profile, profile_schema, profile_text
from tests.conftest import ROOT, check_golden, invoke

#: 1 s a step, 0.1 s a prefill token, 0.5 s a decode, 0.01 s a context token, 1 ms a pair.
MODEL = LinearStepTime(1.0, 0.1, 0.5, 0.01, 0.001)


def tiny(blocks: int = 20) -> ManagedLayout:
    group = ManagedGroup("g", kind="full", block_size=4, pool="p", full_like=True,
                         useful_bytes_per_block=40)
    return ManagedLayout("tiny", (group,), (ManagedPool("p", blocks, hash_block_size=4,
                                                        bytes_per_block=40),),
                         scheduler_block_size=4, max_model_len=64)


def test_a_constant_model_changes_no_figure() -> None:
    art = read_artifact("layouts/llama-3.1-8b.kvlayout.json")
    trace = generate_trace(80, seed=2, prompt_mean=600, output_mean=80, rate=0.5)
    layout = from_artifact(art, 300)
    plain = simulate(layout, trace)
    timed = simulate(layout, trace, step_time=ConstantStepTime(20), latency=True)
    assert timed.steps == plain.steps and timed.as_dict() == plain.as_dict()
    lat = timed.latency
    # on the step clock every time is a whole number of 20 ms steps
    for t in lat.ttft + lat.e2e + lat.queue:
        assert abs(t / 0.02 - round(t / 0.02)) < 1e-9


def test_one_request_on_a_linear_model_step_by_step() -> None:
    result = simulate(tiny(), [TraceRequest(0, 20, 3)], async_scheduling=False,
                      step_time=MODEL)
    lat = result.latency
    # prefill of 20 tokens: 1 + 20 x 0.1 + 20 x 0.01 + 210 pairs x 0.001 = 3.41 s;
    # decodes at 21 and 22 tokens of context: 1.71 s, 1.72 s
    assert lat.ttft == pytest.approx((3.41,))
    assert lat.e2e == pytest.approx((3.41 + 1.71 + 1.72,))
    assert lat.tpot == pytest.approx(((1.71 + 1.72) / 2,))
    assert lat.queue == (0.0,)
    assert [c for _, c in lat.itl] == [1, 1]


def test_a_request_joins_the_first_step_that_starts_after_it_arrives() -> None:
    trace = parse_trace('{"arrival_s": 0, "prompt_tokens": 20, "output_tokens": 3}\n'
                        '{"arrival_s": 4.0, "prompt_tokens": 4, "output_tokens": 1}\n')
    result = simulate(tiny(), trace, async_scheduling=False, step_time=MODEL)
    # steps start at 0, 3.41, 5.12: the one arriving at 4 s waits for the third
    assert result.latency.queue[1] == pytest.approx(5.12 - 4.0)
    assert [r.running for r in result.steps[:3]] == [1, 1, 2]


def test_async_scheduling_schedules_a_step_while_the_one_before_runs() -> None:
    """Depth 2: step k+1 is scheduled when step k starts, so it runs after step k
    with the arrivals until step k started."""
    trace = parse_trace('{"arrival_s": 0, "prompt_tokens": 20, "output_tokens": 3}\n'
                        '{"arrival_s": 1.0, "prompt_tokens": 4, "output_tokens": 1}\n')
    result = simulate(tiny(), trace, async_scheduling=True, step_time=MODEL)
    # step 0 (the prefill, 3.41 s) and step 1 are scheduled at 0; at 3.41 s step 2 is
    # scheduled with the second request, to run after step 1 (a decode, 1.71 s)
    assert result.latency.queue[1] == pytest.approx(3.41 + 1.71 - 1.0)
    assert result.latency.ttft[0] == pytest.approx(3.41)


def test_an_idle_engine_waits_for_the_next_arrival_in_seconds() -> None:
    trace = parse_trace('{"arrival_s": 0, "prompt_tokens": 4, "output_tokens": 1}\n'
                        '{"arrival_s": 100.5, "prompt_tokens": 4, "output_tokens": 1}\n')
    result = simulate(tiny(), trace, async_scheduling=False, step_time=MODEL)
    assert result.latency.queue == (0.0, 0.0)
    assert result.latency.duration == pytest.approx(100.5 + 1 + 0.4 + 0.04 + 0.01)
    assert [r.step for r in result.steps] == [0, 1, 2, 3]  # numbered one by one


def test_steps_in_a_trace_of_steps_are_step_ms_apart_on_a_timed_run() -> None:
    trace = [TraceRequest(0, 4, 1), TraceRequest(150, 4, 1)]
    result = simulate(tiny(), trace, async_scheduling=False, step_time=MODEL, step_ms=20)
    assert result.latency.arrival == (0.0, 3.0)


@pytest.mark.parametrize("name,blocks", [("llama-3.1-8b", 60), ("gpt-oss-20b", 120),
                                         ("jamba-v0.1", 400)])
@pytest.mark.parametrize("asynchronous", [True, False], ids=["async", "sync"])
def test_lazy_decoding_times_every_step_as_stepping_does(name: str, blocks: int,
                                                         asynchronous: bool) -> None:
    """Lazy requests' context is summed, not walked: the same step times, the same
    latencies; and the inter-token gaps add up to each request's first-to-last time."""
    art = read_artifact(f"layouts/{name}.kvlayout.json")
    trace = generate_trace(40, seed=7, prompt_mean=300, output_mean=100, rate=0.4,
                           max_prompt_tokens=900, prefix_groups=2, prefix_share=0.5,
                           prefix_tokens=240)
    model = LinearStepTime(0.004, 2e-5, 1e-4, 1e-8, 1e-10)
    out = []
    for lazy in (False, True):
        result, _ = run(from_artifact(art, blocks), trace, lazy=lazy, step_time=model,
                        async_scheduling=asynchronous)
        out.append(result)
    stepped, counted = out
    assert counted.steps == stepped.steps and counted.latency == stepped.latency
    lat = counted.latency
    assert sum(c for _, c in lat.itl) == sum(n - 1 for n in lat.outputs)
    assert math.fsum(v * c for v, c in lat.itl) == pytest.approx(
        math.fsum(e - t for e, t in zip(lat.e2e, lat.ttft, strict=True)))
    if name == "llama-3.1-8b":
        assert counted.preemptions > 0  # (the gaps of a preempted request counted too)


def test_shape_of_sums_the_terms() -> None:
    assert shape_of([(1, 10), (30, 2)]) == (30, 1, 11 + 32, 30 * 2 + 30 * 31 // 2)


def test_a_batch_outside_the_measured_range_is_recorded_once() -> None:
    model = LinearStepTime(1.0, 0.0, 0.0, 0.0, 0.0, bounds=((0, 8), (0, 4), (0, 100), (0, 99)))
    simulate(tiny(), [TraceRequest(0, 20, 2)], step_time=model)
    assert model.outside == ("prefill_tokens", 20, (0, 8))


def test_percentiles_interpolate_between_ranks() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 90) == pytest.approx(4.6)
    pairs = [(1.0, 2), (3.0, 3)]  # 1, 1, 3, 3, 3
    assert weighted_percentile(pairs, 25) == 1.0
    assert weighted_percentile(pairs, 30) == pytest.approx(percentile([1, 1, 3, 3, 3], 30))


def test_goodput_counts_the_requests_meeting_every_limit() -> None:
    trace = [TraceRequest(0, 20, 3), TraceRequest(0, 20, 1)]
    result = simulate(tiny(), trace, async_scheduling=False, step_time=MODEL)
    lat = result.latency
    slo = parse_slo(f"ttft_p50={lat.ttft[0] * 1000 + 1:.0f}ms,tpot_p99=10s")
    summary = lat.as_dict(slo)["slo"]
    assert summary["requests_meeting"] == sum(t <= slo[0].seconds for t in lat.ttft)
    assert summary["goodput_requests_per_s"] == pytest.approx(
        summary["requests_meeting"] / lat.duration, rel=1e-5)


@pytest.mark.parametrize("text,message", [
    ("ttft_p99=2", "--slo: cannot read the time '2' (column 10)"),
    ("ttft_p99=2s,speed_p50=1s", "--slo: unknown metric 'speed' (column 13)"),
    ("ttft_p0=1s", "--slo: percentile p0 (column 7)"),
    ("ttft=1s", "--slo: cannot read 'ttft=1s' (column 1)"),
    ("ttft_p99=1s,,", "--slo: an empty limit (column 13)"),
    ("ttft_p99=1s,ttft_p99=2s", "--slo: ttft_p99 is limited twice (column 13)"),
])
def test_a_bad_slo_is_a_usage_error_at_its_column(text: str, message: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_slo(text)
    assert caught.value.message == message and caught.value.hint


def test_a_trace_in_seconds_joins_the_step_clock_at_its_floor() -> None:
    trace = parse_trace('{"arrival_s": 0.05, "prompt_tokens": 4, "output_tokens": 1}\n'
                        '{"arrival_s": 0.3, "prompt_tokens": 4, "output_tokens": 1}\n',
                        step_ms=100)
    assert [(r.arrival, r.arrival_s) for r in trace] == [(0, 0.05), (3, 0.3)]
    assert trace[1].as_dict() == {"arrival_s": 0.3, "prompt_tokens": 4, "output_tokens": 1}


# -- profiles ---------------------------------------------------------------------------

PROFILE = "tests/data/profiles/llama-3.1-8b-example.profile.yaml"
SHORT = "tests/data/profiles/short.trace.jsonl"
LAYOUT = "layouts/llama-3.1-8b.kvlayout.json"
BAD_PROFILES = sorted((ROOT / "tests" / "errors" / "profiles").glob("*.yaml"))


@pytest.mark.parametrize("path", BAD_PROFILES, ids=lambda p: p.stem)
def test_a_bad_profile_is_refused_at_its_line(path: Path) -> None:
    rel = str(path.relative_to(ROOT))
    code, out, err = invoke(["simulate", LAYOUT, "--workload", SHORT, "--profile", rel])
    check_golden(path.with_suffix(".expected"), f"{code}\n{err}")
    assert code == 1 and err.startswith(rel) and "Traceback" not in err and not out


def test_simulate_with_a_profile_prints_latency_in_text_and_json() -> None:
    code, out, err = invoke(["simulate", LAYOUT, "--workload", SHORT, "--profile", PROFILE,
                             "--slo", "ttft_p99=500ms,tpot_p50=20ms", "--format", "json"])
    assert code == 0, err
    data = json.loads(out)
    assert data["step_time"]["model"] == "linear"
    lat = data["kvspec"]["latency"]
    assert lat["ttft_s"]["p50"] > 0 and lat["slo"]["requests_meeting"] <= 4
    assert set(data["kvspec"]) - {"latency"} == set(SUMMARY_KEYS) | {"layout_waste"}
    code, out, err = invoke(["simulate", LAYOUT, "--workload", SHORT, "--profile", PROFILE])
    assert code == 0 and f"timed on {PROFILE}" in out and "TTFT p99 (ms)" in out


def test_without_a_profile_or_an_slo_the_output_is_unchanged() -> None:
    code, out, _ = invoke(["simulate", LAYOUT, "--workload", SHORT, "--format", "json"])
    assert code == 0 and "latency" not in out and "step_time" not in out


def test_a_batch_outside_the_profiles_range_is_noted_once() -> None:
    code, _, err = invoke(["simulate", LAYOUT, "--workload", SHORT, "--profile", PROFILE,
                           "--num-blocks", "4000", "--max-num-seqs", "2"])
    assert code == 0 and err.count("outside the measured range") == 0
    narrow = ROOT / "tests/data/profiles/llama-3.1-8b-example.profile.yaml"
    text = narrow.read_text().replace("prefill_tokens: [0, 8192]", "prefill_tokens: [0, 512]")
    parsed = parse_profile(text, "narrow.yaml")
    model = parsed.step_time()
    simulate(from_artifact(read_artifact(LAYOUT), 4000), parse_trace(
        (ROOT / SHORT).read_text()), step_time=model)
    assert model.outside is not None and model.outside[0] == "prefill_tokens"


def test_a_fitted_profile_recovers_its_models_coefficients_through_noise() -> None:
    truth = LinearStepTime(0.006, 2.5e-5, 4e-5, 4e-9, 5e-14)
    rng = random.Random(5)
    shapes = []
    for decode in (1, 4, 16, 64, 256):  # decode batches over sizes and contexts
        for context in (128, 1024, 8192):
            shapes.append(shape_of([(1, context)] * decode))
    for chunk in (64, 512, 2048, 8192):  # prefill chunks over contexts
        for context in (0, 4096, 16384):
            shapes.append(shape_of([(chunk, context)]))
    for decode, chunk in ((32, 512), (128, 2048)):  # mixed steps
        shapes.append(shape_of([(1, 2000)] * decode + [(chunk, 1024)]))
    samples = [(*s, truth.seconds(*s) * (1 + rng.gauss(0, 0.02)))
               for s in shapes for _ in range(4)]
    fit = fit_linear(samples)
    for got, want in zip(fit.model.coefficients, truth.coefficients, strict=True):
        assert got == pytest.approx(want, rel=0.15)
    assert fit.relative([s[4] for s in samples]) < 0.03
    profile = fit_profile(fit, [s[4] for s in samples], parse_profile(
        (ROOT / PROFILE).read_text()).model.describes.model_dump(), "pytest", "2025-06-01")
    again = parse_profile(profile_text(profile), "fitted.yaml")
    assert again.model.fit is not None and again.model.fit.samples == len(samples)
    for got, want in zip(again.step_time().coefficients, fit.model.coefficients, strict=True):
        assert got == pytest.approx(want, rel=1e-3)  # (4 significant digits written)


def test_least_squares_without_the_sign_constraint_would_go_negative() -> None:
    """Two collinear terms: the non-negative fit keeps both at 0 or more."""
    rows = [[1.0, x, 2 * x + (0.001 if i % 2 else -0.001)] for i, x in enumerate(range(1, 30))]
    y = [1.0 + 3.0 * r[1] for r in rows]
    x = nnls(rows, y)
    assert all(v >= 0 for v in x)
    assert math.fsum(abs(yi - sum(a * b for a, b in zip(r, x, strict=True)))
                     for r, yi in zip(rows, y, strict=True)) < 1e-6 * len(rows)


def test_the_committed_profile_schema_is_generated() -> None:
    from kvspec.reports.schemas import render

    assert (ROOT / "schemas" / "profile.schema.json").read_text() == render(profile_schema())
