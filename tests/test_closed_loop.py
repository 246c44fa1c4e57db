"""Closed-loop clients (``simulate --concurrency N``) and the fixed-length workload
(``--isl``, ``--osl``, ``-n``): docs/latency.md#closed-loop-clients."""

from __future__ import annotations

import json
import random

import pytest

from kvspec.compiled import read as read_artifact
from kvspec.model.steptime import ConstantStepTime, LinearStepTime
from kvspec.runtime.manager import ManagedLayout, from_artifact
from kvspec.sim import SimResult, TraceRequest, generate_trace, run, simulate
from tests.conftest import ROOT, check_golden, invoke

LAYOUT = "layouts/llama-3.1-8b.kvlayout.json"
PROFILE = "tests/data/profiles/llama-3.1-8b-example.profile.yaml"
#: 1 ms a step, 10 us a prefill token, 100 us a decode; context and pairs free.
SIMPLE = LinearStepTime(1e-3, 1e-5, 1e-4, 0.0, 0.0)


def layout(blocks: int = 400) -> ManagedLayout:
    return from_artifact(read_artifact(LAYOUT), blocks)


def in_flight(result: SimResult) -> int:
    """The most requests sent and not finished at once, from the run's times (a
    request finishing at t frees its slot for one sent at t)."""
    lat = result.latency
    assert lat is not None
    events = sorted([(t, 1) for t in lat.arrival] +
                    [(a + e, -1) for a, e in zip(lat.arrival, lat.e2e, strict=True)],
                    key=lambda x: (x[0], x[1]))
    most = now = 0
    for _, d in events:
        now += d
        most = max(most, now)
    return most


@pytest.mark.parametrize("concurrency", [1, 3, 8])
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_closed_loop_never_has_more_than_n_in_flight(concurrency: int,
                                                       async_scheduling: bool) -> None:
    trace = generate_trace(60, seed=5, prompt_mean=300, output_mean=40)
    result, engine = run(layout(300), trace, concurrency=concurrency, step_time=SIMPLE,
                         async_scheduling=async_scheduling)
    lat = result.latency
    assert len(lat.e2e) == 60 and engine.finished == 60
    assert in_flight(result) == concurrency
    assert max(r.running for r in result.steps) <= concurrency
    # sent in trace order: the send times never go back
    sent = [lat.arrival[i] for i in range(60)]
    assert sent == sorted(sent) and sent[:concurrency] == [0.0] * concurrency
    # each one sent after the first N is sent when one before it finishes
    ends = sorted(a + e for a, e in zip(lat.arrival, lat.e2e, strict=True))
    for i in range(concurrency, 60):
        assert sent[i] == pytest.approx(ends[i - concurrency])


def test_a_request_sent_later_than_its_slot_frees_is_sent_when_it_arrives() -> None:
    """With arrivals, a client sends a request at its arrival or when a slot frees,
    whichever is later (``vllm bench serve --request-rate R --max-concurrency N``)."""
    trace = [TraceRequest(0, 10, 3), TraceRequest(0, 10, 3), TraceRequest(500, 10, 3)]
    result = simulate(layout(), trace, concurrency=1, step_time=SIMPLE, step_ms=1,
                      async_scheduling=False)
    lat = result.latency
    assert lat.arrival[1] == pytest.approx(lat.e2e[0])  # waited for the slot
    assert lat.arrival[2] == pytest.approx(0.5)  # the slot was free before it arrived


@pytest.mark.parametrize("model", [SIMPLE, ConstantStepTime(20)], ids=["linear", "constant"])
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_n_at_least_the_requests_is_the_open_loop_with_every_arrival_at_0(
        model: object, async_scheduling: bool) -> None:
    rng = random.Random(3)
    trace = [TraceRequest(0, rng.randint(20, 900), rng.randint(1, 60)) for _ in range(40)]
    open_loop = simulate(layout(200), trace, step_time=model, latency=True,  # type: ignore[arg-type]
                         async_scheduling=async_scheduling)
    for n in (40, 41, 1000):
        closed = simulate(layout(200), trace, step_time=model,  # type: ignore[arg-type]
                          concurrency=n, async_scheduling=async_scheduling)
        assert closed.as_dict() == open_loop.as_dict()
        a, b = closed.latency, open_loop.latency
        # (the step clock multiplies, the timed clock adds: equal to rounding)
        for field in ("arrival", "queue", "ttft", "e2e", "duration"):
            assert getattr(a, field) == pytest.approx(getattr(b, field), abs=1e-9)
        assert a.tpot == pytest.approx(b.tpot, abs=1e-9) and a.outputs == b.outputs
        assert [c for _, c in a.itl] == [c for _, c in b.itl] or \
            sum(c for _, c in a.itl) == sum(c for _, c in b.itl)


def test_a_closed_loop_timeline_by_hand() -> None:
    """Two clients, three requests of 10 prompt and 3 output tokens, synchronous:
    step 0 prefills two (1 ms + 20 x 10 us = 1.2 ms), steps 1 and 2 decode them
    (1 ms + 2 x 100 us = 1.2 ms each): both finish at 3.6 ms, and the third request is
    sent then; it prefills in step 3 (1.1 ms) and decodes in steps 4 and 5 (1.1 ms
    each), finishing at 6.9 ms."""
    trace = [TraceRequest(0, 10, 3) for _ in range(3)]
    result = simulate(layout(), trace, concurrency=2, step_time=SIMPLE,
                      async_scheduling=False)
    lat = result.latency
    assert lat.arrival == pytest.approx((0.0, 0.0, 3.6e-3))
    assert lat.queue == pytest.approx((0.0, 0.0, 0.0))
    assert lat.ttft == pytest.approx((1.2e-3, 1.2e-3, 1.1e-3))
    assert lat.e2e == pytest.approx((3.6e-3, 3.6e-3, 3.3e-3))
    assert lat.tpot == pytest.approx((1.2e-3, 1.2e-3, 1.1e-3))
    assert lat.duration == pytest.approx(6.9e-3)
    # (the last step reports the finish: nothing runs in it)
    assert [r.running for r in result.steps] == [2, 2, 2, 1, 1, 1, 0]
    # one client: every request waits for the one before
    one = simulate(layout(), trace, concurrency=1, step_time=SIMPLE, async_scheduling=False)
    assert one.latency.arrival == pytest.approx((0.0, 3.3e-3, 6.6e-3))
    assert one.latency.duration == pytest.approx(9.9e-3)


def test_the_constant_model_clock_is_steps_times_step_ms() -> None:
    """Without a profile a closed loop runs on the constant model: every step
    ``step_ms``, so the run lasts its steps times ``step_ms``."""
    trace = [TraceRequest(0, 100, 7) for _ in range(12)]
    result = simulate(layout(), trace, concurrency=4, step_ms=10, async_scheduling=False)
    for t in result.latency.arrival + result.latency.e2e:
        assert t / 0.010 == pytest.approx(round(t / 0.010))
    # 3 waves of 4 requests, 7 steps each (and a last step that reports the finish)
    assert result.latency.duration == pytest.approx(21 * 0.010)
    assert result.as_dict()["steps"] == 22
    assert result.latency.arrival[4:8] == pytest.approx((0.07,) * 4)


# -- the command ------------------------------------------------------------------------


def test_simulate_a_fixed_length_workload_in_a_closed_loop_json() -> None:
    code, out, err = invoke(["simulate", LAYOUT, "--isl", "500", "--osl", "20", "-n", "30",
                             "--concurrency", "4", "--profile", PROFILE, "--format", "json",
                             "--slo", "ttft_p99=1s"])
    assert code == 0, err
    data = json.loads(out)
    assert data["requests"] == 30 and data["concurrency"] == 4
    assert data["workload"] == {"isl": 500, "osl": 20}
    lat = data["kvspec"]["latency"]
    assert data["kvspec"]["peak_running"] == 4
    assert lat["requests_per_s"] > 0 and lat["slo"]["requests_meeting"] == 30


def test_simulate_a_closed_loop_text_names_its_clients() -> None:
    code, out, err = invoke(["simulate", LAYOUT, "--isl", "500", "--osl", "20", "-n", "8",
                             "--concurrency", "2", "--step-ms", "10"])
    assert code == 0, err
    assert "timed on the step clock, 10 ms a step; 2 closed-loop clients" in out
    assert "8 requests" in out


def test_without_concurrency_a_fixed_length_workload_all_arrives_at_once() -> None:
    code, out, err = invoke(["simulate", LAYOUT, "--isl", "100", "--osl", "5", "-n", "6",
                             "--format", "json"])
    assert code == 0, err
    data = json.loads(out)
    assert "latency" not in data["kvspec"] and "concurrency" not in data
    assert data["kvspec"]["peak_running"] == 6


#: (arguments, the option the error names first).
BAD = [
    (["--concurrency", "0"], "--concurrency"), (["--concurrency", "-2"], "--concurrency"),
    (["--concurrency", "2.5"], "--concurrency"), (["--concurrency", "1e30"], "--concurrency"),
    (["--concurrency", "99999999999"], "--concurrency"),
    (["--isl", "10"], "--isl"), (["--osl", "10"], "--osl"), (["-n", "5"], "-n"),
    (["--isl", "0", "--osl", "1"], "--isl"), (["--isl", "10", "--osl", "-1"], "--osl"),
    (["--isl", "10", "--osl", "5", "-n", "0"], "-n"),
    (["--isl", "10", "--osl", "5", "-n", "1.5"], "-n"),
    (["--isl", "10", "--osl", "5", "-n", "100000000"], "-n"),
    (["--isl", "10", "--osl", "5", "--workload", "tests/data/profiles/short.trace.jsonl"],
     "--workload"),
    (["--isl", "131072", "--osl", "5"], "--isl"),
    (["--isl", "99999999999", "--osl", "5"], "--isl"),
]


def test_bad_closed_loop_and_fixed_length_options_name_the_option() -> None:
    shown = []
    for args, option in BAD:
        code, out, err = invoke(["simulate", LAYOUT, *args])
        assert code == 2 and not out and "Traceback" not in err, (args, err)
        first = err.splitlines()[0]
        assert first.startswith("kvspec: error:") and option in first.split(":")[2], (args, err)
        shown.append(f"$ kvspec simulate LAYOUT {' '.join(args)}\n{err}")
    check_golden(ROOT / "tests/errors/simulate-closed-loop.expected", "\n".join(shown))
