"""``kvspec sweep`` in time (docs/sweep.md, "In time"): a profile per tensor size times
each point, throughput measured in seconds, an SLO met at the target rate, and bad
``step_time``/``slo`` entries refused at their position (goldens in
``tests/errors/sweep/``; those placed in a profile in ``tests/errors/sweep/time/``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kvspec.sweep.report import UNSATURATED
from tests.conftest import ROOT, check_golden, invoke

EXAMPLE = ROOT / "tests/data/profiles/llama-3.1-8b-example.profile.yaml"
LAYOUT = ROOT / "layouts/llama-3.1-8b.yaml"


def _profile(tmp: Path, name: str, tensor: int, **costs: str) -> str:
    """The example profile at ``tensor`` ranks with ``costs`` (the rest as the example)."""
    text = EXAMPLE.read_text().replace("tensor_parallel_size: 1",
                                       f"tensor_parallel_size: {tensor}")
    head, rest = text.split("measured_range:")
    for term, value in costs.items():  # (step_time's, before measured_range)
        head = "\n".join(f"  {term}: {value}" if line.startswith(f"  {term}:") else line
                         for line in head.splitlines()) + "\n"
    text = head + "measured_range:" + rest
    (tmp / name).write_text(text)
    return name


def _fixed(tmp: Path, name: str, tensor: int, ms: int) -> str:
    """A profile whose every step takes ``ms`` milliseconds, whatever its batch."""
    return _profile(tmp, name, tensor, fixed=f"{ms}ms", prefill_tokens="0",
                    decode_requests="0", context_tokens="0", prefill_pairs="0")


def _sweep(tmp: Path, target: str, *, requests: int = 200, tensor: str = "[1, 2]",
           name: str = "g") -> tuple[int, str, str, dict[int, dict]]:
    grid = tmp / f"{name}.yaml"
    grid.write_text(f"""kvspec_sweep: 1
base: {LAYOUT}
axes:
  tensor: {tensor}
  max_num_seqs: [8]
  workload: [{{name: chat, context_tokens: 256, output_tokens: 32, requests: {requests}}}]
target: {target}
""")
    out = tmp / f"{name}.jsonl"
    code, stdout, err = invoke(["sweep", str(grid), "-o", str(out), "-j", "1"])
    rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    return code, stdout, err, {r["point"]["tensor"]: r for r in rows}


def test_each_tensor_size_is_timed_by_its_own_profile_and_the_answer_changes(tmp_path: Path
                                                                              ) -> None:
    """Every step of tensor 1 takes 10 ms and of tensor 2 5 ms: the timed clock is then
    the step clock at 10 and 5 ms a step, so by hand each point's requests per second
    are its requests per step x 100 and x 200 -- 3 and 6 times what the step clock's
    30 ms gives. At a rate of 2.5 times tensor 1's step-clock throughput the step clock
    needs 3 replicas of tensor 1 (3 GPUs); in time tensor 1 needs 1 (1 GPU)."""
    p1, p2 = _fixed(tmp_path, "tp1.yaml", 1, 10), _fixed(tmp_path, "tp2.yaml", 2, 5)
    code, _, err, step = _sweep(tmp_path, "{rate: 1, step_ms: 30}", name="steps")
    assert code == 0, err
    assert all(r["saturated"] for r in step.values())
    rate = round(2.5 * step[1]["throughput"], 2)
    code, out_step, err, step = _sweep(tmp_path, f"{{rate: {rate}, step_ms: 30}}",
                                       name="steps2")
    assert code == 0, err
    code, out_time, err, timed = _sweep(
        tmp_path, f"{{rate: {rate}, step_time: {{1: {p1}, 2: {p2}}}}}", name="timed")
    assert code == 0, err
    for tp, ms in ((1, 10), (2, 5)):
        row = timed[tp]
        assert row["clock"] == {"model": "linear", "profile": str(tmp_path / f"tp{tp}.yaml")}
        by_hand = step[tp]["requests_per_step"] * 1000 / ms
        assert row["saturated"] and row["throughput"] == pytest.approx(by_hand, rel=0.03)
        assert row["throughput"] == pytest.approx(step[tp]["throughput"] * 30 / ms, rel=0.03)
        assert row["replicas"] == math.ceil(rate / row["throughput"])
        assert row["gpus"] == row["replicas"] * tp
        assert set(row["latency"]) >= {"ttft_s", "tpot_s", "requests_per_s"}
        assert set(row["latency"]["ttft_s"]) == {"mean", "p50", "p90", "p99"}
        assert "clock" not in step[tp] and "latency" not in step[tp]
    assert step[1]["gpus"] == 3 and timed[1]["gpus"] == 1
    assert f"{timed[1]['id']}" in out_time and f"{step[1]['id']}" in out_step


def test_a_profile_for_every_size_refuses_the_points_of_another_size(tmp_path: Path) -> None:
    """{profile: FILE} of a tensor-1 profile: the tensor-2 point is an error row at the
    profile's describes.tensor_parallel_size, the tensor-1 point runs."""
    code, _, err, rows = _sweep(tmp_path, f"{{rate: 20, step_time: {{profile: {EXAMPLE}}}}}",
                                requests=60)
    assert code == 0, err
    assert rows[1]["ok"] and rows[1]["clock"]["profile"] == str(EXAMPLE)
    e = rows[2]["error"]
    assert not rows[2]["ok"] and e["file"] == str(EXAMPLE) and (e["line"], e["column"]) == (9, 25)
    assert e["path"] == "describes.tensor_parallel_size"
    assert "tensor_parallel_size 1; this point's layout has 2" in e["message"]
    assert "tensor=2" in e["point"]


def test_an_unsaturated_timed_best_point_keeps_its_flag(tmp_path: Path) -> None:
    code, out, err, rows = _sweep(tmp_path, f"{{rate: 20, step_time: {{profile: {EXAMPLE}}}}}",
                                  requests=20, tensor="[1]")
    assert code == 0, err
    assert rows[1]["saturated"] is False
    assert f"{rows[1]['requests_per_gpu']:.2f}*" in out and UNSATURATED in out


def test_the_fewest_replicas_that_meet_the_slo(tmp_path: Path) -> None:
    """Every step 10 ms. At 300 requests/s the TTFT p99 limit needs more replicas than
    the throughput does (24 against 13); the answer attains every limit, one replica
    fewer does not."""
    p1 = _fixed(tmp_path, "tp1.yaml", 1, 10)
    target = f"{{rate: 300, step_time: {{1: {p1}}}, slo: {{ttft_p99: 100ms}}}}"
    code, out, err, rows = _sweep(tmp_path, target, tensor="[1]")
    assert code == 0, err
    row = rows[1]
    slo = row["slo"]
    n = slo["replicas"]
    assert slo["met"] and row["gpus"] == n and n > math.ceil(300 / row["throughput"])
    assert all(x["attained"] for x in slo["at"]["slo"]["limits"])
    assert slo["at"]["replicas"] == n and slo["replica_rate"] == pytest.approx(300 / n, 1e-5)
    assert "within the SLO ttft_p99=100ms" in out
    # by hand: one replica offered what each of n gets attains the SLO, one offered
    # what each of n - 1 would get does not (the same arrival pattern, scaled)
    for replicas, one in ((n, True), (n - 1, False)):
        code, _, err, alone = _sweep(tmp_path, target.replace("rate: 300",
                                                              f"rate: {300 / replicas!r}"),
                                     tensor="[1]", name=f"alone{replicas}")
        assert code == 0, err
        assert (alone[1]["slo"]["replicas"] == 1) is one


def test_an_slo_no_point_meets_says_so(tmp_path: Path) -> None:
    """Every step 10 ms: no request's first token comes before 10 ms, at any load."""
    p1 = _fixed(tmp_path, "tp1.yaml", 1, 10)
    code, out, err, rows = _sweep(
        tmp_path, f"{{rate: 20, step_time: {{1: {p1}}}, slo: {{ttft_p99: 5ms, tpot_p50: 1s}}}}",
        tensor="[1]", requests=60)
    assert code == 0, err
    row = rows[1]
    assert row["ok"] and row["slo"]["met"] is False and row["gpus"] is None
    assert row["slo"]["at"]["ttft_s"]["p99"] >= 0.01
    assert "workload chat: no point meets the SLO ttft_p99=5ms, tpot_p50=1s" in out
    assert "best point" not in out


def test_an_slo_on_the_constant_model(tmp_path: Path) -> None:
    """step_ms with an SLO: the step clock's throughput, the SLO timed on it."""
    code, _, err, rows = _sweep(tmp_path, "{rate: 20, step_ms: 10, slo: {tpot_p50: 15ms}}",
                                tensor="[1]", requests=60)
    assert code == 0, err
    row = rows[1]
    assert row["clock"] == {"model": "constant", "step_ms": 10.0}
    assert row["slo"]["met"] and row["requests_per_step"] is not None


TIME_ERRORS = sorted((ROOT / "tests" / "errors" / "sweep" / "time").glob("*.yaml"))


@pytest.mark.parametrize("grid", TIME_ERRORS, ids=lambda p: p.stem)
def test_bad_profiles_of_a_grid_fail_at_their_line(grid: Path, tmp_path: Path) -> None:
    rel = str(grid.relative_to(ROOT))
    out = tmp_path / "never.jsonl"
    code, _, err = invoke(["sweep", rel, "-o", str(out)])
    check_golden(grid.with_suffix(".expected"), f"{code}\n{err}")
    assert code == 1 and "profile" in err.split(":")[0] + err and "Traceback" not in err
    assert not out.exists(), "nothing ran: no results file"
