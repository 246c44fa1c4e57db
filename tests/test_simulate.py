"""The scheduler simulator: hand-computed steps, the summary, lazy decoding."""

from __future__ import annotations

import pytest

from kvspec.compiled import read as read_artifact
from kvspec.runtime.manager import ManagedGroup, ManagedLayout, ManagedPool, from_artifact
from kvspec.sim import (
    SUMMARY_KEYS,
    StepRecord,
    TraceRequest,
    generate_trace,
    run,
    run_artifact,
    simulate,
)
from kvspec.sim.engine import SimulationError


def tiny(blocks: int = 10) -> ManagedLayout:
    group = ManagedGroup("g", kind="full", block_size=4, pool="p", full_like=True,
                         useful_bytes_per_block=40)
    return ManagedLayout("tiny", (group,), (ManagedPool("p", blocks, hash_block_size=4,
                                                        bytes_per_block=40),),
                         scheduler_block_size=4, max_model_len=64)


def counts(records: tuple[StepRecord, ...]) -> list[tuple]:
    return [(r.step, r.running, r.waiting, r.free, r.scheduled_tokens) for r in records]


def test_one_request_step_by_step_synchronous() -> None:
    result = simulate(tiny(), [TraceRequest(0, 20, 3)], async_scheduling=False)
    # prefill 20 tokens (5 blocks), two decode steps (a 6th block), then a step that
    # reports the finished request to the workers
    assert counts(result.steps) == [(0, 1, 0, (4,), 20), (1, 1, 0, (3,), 1),
                                      (2, 1, 0, (3,), 1), (3, 0, 0, (9,), 0)]
    assert result.num_steps == 4


def test_one_request_step_by_step_async() -> None:
    """With async scheduling a step is scheduled before the last one's token is
    known, and no step is scheduled past the request's last token."""
    result = simulate(tiny(), [TraceRequest(0, 20, 3)], async_scheduling=True)
    assert counts(result.steps) == [(0, 1, 0, (4,), 20), (1, 1, 0, (3,), 1),
                                      (2, 1, 0, (3,), 1), (3, 1, 0, (3,), 0),
                                      (4, 0, 0, (9,), 0)]
    assert result.num_steps == 6


def test_the_summary_has_exactly_its_keys() -> None:
    result = simulate(tiny(20), [TraceRequest(0, 20, 3), TraceRequest(0, 20, 3)])
    summary = result.as_dict()
    assert tuple(summary) == SUMMARY_KEYS
    assert summary["peak_running"] == 2 and summary["preemptions"] == 0
    assert 0 < summary["mean_utilization"] <= summary["peak_utilization"] <= 1


def test_a_shared_prefix_is_a_hit_one_block_short_of_the_prompt() -> None:
    trace = [TraceRequest(0, 20, 2, "sys", 20), TraceRequest(5, 20, 2, "sys", 20)]
    result = simulate(tiny(20), trace)
    assert result.hit_tokens == 16


def test_blocks_running_out_preempt_the_last_admitted() -> None:
    trace = [TraceRequest(0, 14, 12), TraceRequest(0, 14, 12)]
    result = simulate(tiny(9), trace, async_scheduling=False)
    assert result.preemptions >= 1
    assert any(r.preempted for r in result.steps)
    assert result.as_dict()["utilization_while_waiting"] is not None


def test_a_prompt_longer_than_max_model_len_is_refused() -> None:
    result = simulate(tiny(), [TraceRequest(0, 64, 2), TraceRequest(0, 8, 2)])
    assert (result.rejected, result.num_requests) == (1, 1)


def test_a_request_that_never_fits_is_an_error_not_a_hang() -> None:
    with pytest.raises(SimulationError) as caught:
        simulate(tiny(5), [TraceRequest(0, 8, 1), TraceRequest(0, 40, 1)])
    assert caught.value.message == ("step 2: nothing can be scheduled: request #2 (40 tokens) "
                                    "does not fit the free blocks (4) of an idle engine")


def test_an_idle_engine_jumps_to_the_next_arrival() -> None:
    result = simulate(tiny(), [TraceRequest(0, 4, 1), TraceRequest(100, 4, 1)],
                      async_scheduling=False)
    assert [r.step for r in result.steps] == [0, 1, 100, 101]


def test_progress_is_reported_until_every_request_is_done() -> None:
    seen: list[tuple[int, int]] = []
    simulate(tiny(40), generate_trace(30, seed=1, prompt_mean=12, output_mean=4),
             progress=lambda done, total: seen.append((done, total)))
    assert seen[-1] == (30, 30)


def test_a_layout_with_a_drafter_pool_simulates_both_pools() -> None:
    art = read_artifact("layouts/example-glm5-next-drafter.kvlayout.json")
    trace = generate_trace(20, seed=4, prompt_mean=3000, output_mean=40, rate=0.5)
    result = run_artifact(art, trace, 400)[0]
    assert len(result.steps[0].free) == 2 and result.as_dict()["steps"] > 0


# -- lazy decoding gives the same steps and blocks as stepping ------------------------

CASES = [("llama-3.1-8b", 300), ("gpt-oss-20b", 300), ("gemma-3-27b-it", 1400),
         ("jamba-v0.1", 300), ("llama-4-scout-17b-16e-instruct", 9000),
         ("nemotron-h-56b-base-8k", 2700), ("example-hidden-state", 1400)]


@pytest.mark.parametrize("name,prompt", CASES)
@pytest.mark.parametrize("asynchronous", [True, False], ids=["async", "sync"])
def test_lazy_decoding_matches_stepping(name: str, prompt: int, asynchronous: bool) -> None:
    art = read_artifact(f"layouts/{name}.kvlayout.json")
    lay = from_artifact(art, 10)
    biggest = prompt * 3 + 400
    need = sum(-(-min(biggest, (g.sliding_window or 1 << 30) + lay.max_in_flight_tokens)
                 // g.block_size) + 1 for g in lay.groups)
    trace = generate_trace(25, seed=7, prompt_mean=prompt, output_mean=100, rate=0.4,
                           max_prompt_tokens=prompt * 3, prefix_groups=2, prefix_share=0.5,
                           prefix_tokens=int(prompt * 0.8))
    kw = dict(async_scheduling=asynchronous, log_blocks=True)
    stepped, a = run(from_artifact(art, int(need * 1.6)), trace, lazy=False, **kw)
    counted, b = run(from_artifact(art, int(need * 1.6)), trace, lazy=True, **kw)
    assert counted.steps == stepped.steps
    assert b.block_log == a.block_log, "the same block ids and free queue at every step"
    assert counted.as_dict() == stepped.as_dict()


def chunked(chunk: int = 64) -> ManagedLayout:
    local = ManagedGroup("local", kind="local", block_size=16, pool="p",
                         attention_chunk_size=chunk, spec_key="local", useful_bytes_per_block=32)
    full = ManagedGroup("full", kind="full", block_size=16, pool="p", full_like=True,
                        spec_key="full", useful_bytes_per_block=32)
    return ManagedLayout("chunked", (local, full), (ManagedPool("p", 400, hash_block_size=16,
                                                               bytes_per_block=64),),
                         scheduler_block_size=16, max_model_len=4096)


@pytest.mark.parametrize("subject,output", [("chunked", 300), ("gpt-oss-20b", 400)])
def test_lazy_decoding_matches_stepping_across_windows_and_chunks(subject: str,
                                                                  output: int) -> None:
    """Decoding past a chunk boundary or filling a window changes how live bytes grow:
    a lazy request stops there."""
    lay = chunked() if subject == "chunked" else from_artifact(
        read_artifact(f"layouts/{subject}.kvlayout.json"), 300)
    trace = generate_trace(12, seed=3, prompt_mean=200, output_mean=output, rate=1.0)
    for asynchronous in (True, False):
        kw = dict(async_scheduling=asynchronous, log_blocks=True)
        stepped, a = run(lay, trace, lazy=False, **kw)
        counted, b = run(lay, trace, lazy=True, **kw)
        assert counted.steps == stepped.steps and b.block_log == a.block_log
