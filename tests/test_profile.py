"""``kvspec profile`` without an engine: its grid, a step's terms as vLLM schedules them,
the fit of measured steps, and its errors (the engine runs in tests/serve/test_profile.py)."""

from __future__ import annotations

import random
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvspec.integrations.vllm.profiling import (
    GRIDS,
    Limits,
    fastest,
    fit_steps,
    grid,
    step_terms,
)
from kvspec.model.steptime import LinearStepTime, shape_of
from tests.conftest import ROOT, invoke

LIMITS = Limits(max_model_len=1024, max_num_batched_tokens=4096, max_num_seqs=256,
                block_size=128, capacity_tokens=524288)


def output(new: list[tuple[str, int, int]], cached: list[tuple[str, int, int]]) -> object:
    """A SchedulerOutput as vLLM 0.32/0.33 makes it: (request id, tokens scheduled this
    step, tokens computed before it) for new and for cached requests."""
    return SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id=r, num_computed_tokens=c)
                            for r, _, c in new],
        scheduled_cached_reqs=SimpleNamespace(req_ids=[r for r, _, _ in cached],
                                              num_computed_tokens=[c for _, _, c in cached]),
        num_scheduled_tokens={r: n for r, n, _ in [*new, *cached]})


def test_a_steps_terms_are_what_the_scheduler_scheduled() -> None:
    # a new request with a 256-token prefix-cache hit prefilling 100, one continuing
    # its chunked prefill, two decodes and a one-token chunk (a decode's cost)
    out = output(new=[("a", 100, 256)], cached=[("b", 512, 512), ("c", 1, 40),
                                                ("d", 1, 9), ("e", 1, 700)])
    prefill, decode, context, pairs = step_terms(out)
    assert prefill == 100 + 512
    assert decode == 3
    assert context == (256 + 100) + (512 + 512) + 41 + 10 + 701
    assert pairs == (100 * 256 + 100 * 101 // 2) + (512 * 512 + 512 * 513 // 2)


def test_terms_sum_as_the_step_time_model_sums_each_request() -> None:
    """Random batches: the four sums give the model's seconds that the requests'
    own costs add up to (fixed once, then each request's share)."""
    model = LinearStepTime(0.003, 2e-5, 6e-5, 2e-7, 3e-8)
    rng = random.Random(49)
    for _ in range(200):
        reqs = [(f"r{i}", rng.choice([1, 1, rng.randrange(2, 600)]), rng.randrange(0, 900))
                for i in range(rng.randrange(1, 40))]
        cut = rng.randrange(len(reqs) + 1)
        terms = step_terms(output(reqs[:cut], reqs[cut:]))
        assert terms == shape_of([(n, c) for _, n, c in reqs])
        own = model.fixed + sum(
            model.decode_request + model.context_token * (c + 1) if n == 1 else
            model.prefill_token * n + model.context_token * (c + n)
            + model.prefill_pair * (n * c + n * (n + 1) // 2) for _, n, c in reqs)
        assert model.seconds(*terms) == pytest.approx(own, rel=1e-12)


def test_the_quick_grid_is_the_one_the_docs_describe() -> None:
    page = (ROOT / "docs" / "latency.md").read_text()
    table = page.split("## Profiling your engine", 1)[1].split("\n\n| grid", 1)[1]
    rows = {line.split("|")[1].strip(): line for line in table.splitlines()
            if line.startswith("| `")}
    for name, g in GRIDS.items():
        row = rows[f"`{name}`"]
        for key in ("prefill_tokens", "prefill_batch", "decode_batch", "mixed_decodes",
                    "mixed_prefill"):
            assert ", ".join(map(str, g[key])) in row, (name, key)
        assert f"{g['decode_steps']} steps" in row and f"{g['repeats']} repeats" in row


def test_the_grid_covers_prefill_decode_and_mixed_within_the_engines_limits() -> None:
    scenarios = grid("quick", LIMITS)
    kinds = {s.kind for s in scenarios}
    assert kinds == {"prefill", "decode", "mixed"}
    for s in scenarios:
        for phase in s.phases:
            assert len(phase.requests) <= LIMITS.max_num_seqs
            for r in phase.requests:
                assert r.prompt_tokens + r.max_tokens <= LIMITS.max_model_len
    # contexts: a prefix-cache hit is whole blocks
    contexts = {int(m.group(1)) for s in scenarios if s.kind == "prefill"
                for m in [re.search(r"at (\d+)$", s.name)] if m}
    assert contexts == {0, 256, 512}
    # a small KV cache keeps the decode batches that would not fit out
    small = grid("quick", Limits(1024, 4096, 256, 128, capacity_tokens=4096))
    assert max(len(s.phases[0].requests) for s in small if s.kind == "decode") == 64
    assert not [s for s in small if s.name == "decode 64 at 512"]


def test_a_fit_of_measured_steps_recovers_the_model_and_leaves_interruptions_out() -> None:
    truth = LinearStepTime(0.0027, 2.1e-5, 6.2e-5, 1.6e-7, 2.4e-8)
    rng = random.Random(7)
    shapes = [shape_of([(p, c)]) for p in (16, 64, 256, 768) for c in (0, 256, 512)]
    shapes += [shape_of([(1, c)] * d) for d in (1, 4, 16, 64) for c in (32, 300, 512)]
    shapes += [shape_of([(1, 256)] * d + [(p, 0)]) for d in (4, 32) for p in (64, 512)]
    samples = []
    for _ in range(2):
        for s in shapes:
            seconds = truth.seconds(*s) * rng.uniform(0.98, 1.04)
            if rng.random() < 0.2 or s[1] == 64:   # (64 decodes: interrupted every time)
                seconds += rng.uniform(0.05, 0.4)   # another process took the core
            samples.append((*s, seconds))
    trimmed = fit_steps(samples)
    assert trimmed.steps == len(samples)
    assert len(fastest(samples)) == len(shapes)
    for got, want in zip(trimmed.fit.model.coefficients, truth.coefficients, strict=True):
        assert got == pytest.approx(want, rel=0.25)
    assert trimmed.fit.relative(trimmed.measured) < 0.05
    assert all(s[4] > truth.seconds(*s[:4]) * 1.2 for s in trimmed.dropped)
    assert {s[1] for s in trimmed.dropped} >= {64}
    # the measured range is every shape's, the interrupted ones' too
    assert trimmed.fit.bounds[1] == (0, 64) and trimmed.fit.model.bounds == trimmed.fit.bounds


def test_profile_without_vllm_says_what_to_install(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import kvspec.cli.profile as cmd

    find = cmd.importlib.util.find_spec
    monkeypatch.setattr(cmd.importlib.util, "find_spec",
                        lambda name, *a: None if name == "vllm" else find(name, *a))
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    code, out, err = invoke(["profile", "layouts/llama-3.1-8b.kvlayout.json", "--model",
                             str(model), "-o", str(tmp_path / "p.profile.yaml")])
    assert code == 2 and out == ""
    assert "measures a running vLLM, which is not installed" in err
    assert "scripts/install-cpu-engine.sh" in err and "Traceback" not in err
    assert not (tmp_path / "p.profile.yaml").exists()


@pytest.mark.parametrize(("make", "message"), [
    (lambda p: p / "missing", "no such directory"),
    (lambda p: (p / "file").write_text("x") and p / "file", "not a model directory"),
    (lambda p: (p / "empty").mkdir() or p / "empty", "not a model directory"),
])
def test_a_model_that_is_not_a_model_directory_is_named(tmp_path: Path, make: object,
                                                        message: str) -> None:
    model = make(tmp_path)  # type: ignore[operator]
    code, _, err = invoke(["profile", "layouts/llama-3.1-8b.kvlayout.json", "--model",
                             str(model), "-o", str(tmp_path / "p.profile.yaml")])
    assert code == 2, err
    assert f"--model {model}: {message}" in err and "Traceback" not in err


def test_an_output_that_is_not_a_profile_is_refused_before_anything_runs(
        tmp_path: Path) -> None:
    code, _, err = invoke(["profile", "layouts/llama-3.1-8b.kvlayout.json", "--model",
                           str(tmp_path), "-o", str(tmp_path / "p.json")])
    assert code == 2 and "p.json" in err and "Traceback" not in err


def test_the_latency_benchmark_measures_what_the_simulator_reports() -> None:
    """bench_latency's served metrics use kvspec.sim.latency's definitions: TTFT from
    arrival to the first token, TPOT over the tokens after the first, e2e to the last,
    throughput over the first arrival to the last token."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_latency",
                                                  ROOT / "benchmarks" / "bench_latency.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    requests = [{"arrival_s": 0.0, "first_s": 0.1, "last_s": 0.5, "output_tokens": 5},
                {"arrival_s": 1.0, "first_s": 1.3, "last_s": 1.3, "output_tokens": 1},
                {"arrival_s": 2.0, "first_s": 2.2, "last_s": 3.0, "output_tokens": 9}]
    got = bench.live_metrics(requests)
    assert got["ttft"] == pytest.approx(0.2)
    assert got["tpot"] == pytest.approx((0.1 + 0.1) / 2)   # the one-token request has none
    assert got["e2e"] == pytest.approx(0.5)
    assert got["throughput"] == pytest.approx(3 / 3.0)
