"""Request traces: the JSONL reader's errors, the generator, synthetic token ids."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from kvspec.errors import KvspecError
from kvspec.sim import generate_trace, parse_trace, read_trace, write_trace
from kvspec.sim.trace import TraceError, TraceRequest, prefix_codes, token_id, trace_text
from tests.conftest import ROOT, check_golden

TRACES = ROOT / "tests" / "errors" / "traces"
BAD = sorted(TRACES.glob("*.jsonl"))


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.stem)
def test_a_bad_trace_is_an_error_at_its_line(path: Path) -> None:
    """Each bad trace beside the exact message it gets (KVSPEC_REGEN=1 rewrites)."""
    rel = str(path.relative_to(ROOT))
    with pytest.raises(TraceError) as caught:
        read_trace(rel)
    err = caught.value
    assert err.hint, "every trace error says what to do"
    assert err.render().startswith(f"{rel}:"), "every trace error names the file first"
    check_golden(path.with_suffix(".expected"), err.render() + "\n")


def test_every_golden_has_its_trace() -> None:
    assert {p.stem for p in TRACES.glob("*.expected")} == {p.stem for p in BAD}


def test_a_missing_trace_file_is_an_error() -> None:
    with pytest.raises(KvspecError, match="no such trace file"):
        read_trace("no/such/trace.jsonl")


def test_a_trace_reads_back_what_was_written(tmp_path: Path) -> None:
    trace = (TraceRequest(0, 10, 2), TraceRequest(3, 40, 5, "sys", 16),
             TraceRequest(3, 8, 1, 7, 8))
    write_trace(trace, tmp_path / "t.jsonl")
    assert read_trace(tmp_path / "t.jsonl") == trace
    assert trace_text(trace).splitlines()[1] == (
        '{"arrival": 3, "prompt_tokens": 40, "output_tokens": 5, "prefix_id": "sys", '
        '"prefix_tokens": 16}')


def test_blank_lines_are_skipped_and_positions_still_count_them() -> None:
    text = '\n{"arrival": 0, "prompt_tokens": 4, "output_tokens": 1}\n\n{"arrival": 0}\n'
    with pytest.raises(TraceError) as caught:
        parse_trace(text, "t.jsonl")
    assert (caught.value.line, caught.value.message) == (4, "missing key 'prompt_tokens'")


def test_an_integer_longer_than_64_bits_is_read_exactly_and_refused() -> None:
    # issue 36: token counts are bounded (2^31) before any work; the number is read
    # exactly (not orjson's overflow), so the message shows what was written
    with pytest.raises(TraceError) as info:
        parse_trace('{"arrival": 0, "prompt_tokens": 123456789012345678901234, '
                    '"output_tokens": 1}')
    assert info.value.found == "123456789012345678901234"
    assert "from 1 to 2^31" in info.value.message


# -- the generator ---------------------------------------------------------------

def test_the_same_seed_gives_the_same_trace() -> None:
    kw = dict(prompt_mean=700, output_mean=90, rate=1.5, prefix_groups=3, prefix_share=0.5,
              prefix_tokens=200)
    assert generate_trace(300, seed=11, **kw) == generate_trace(300, seed=11, **kw)
    assert generate_trace(300, seed=11, **kw) != generate_trace(300, seed=12, **kw)


def test_generated_lengths_have_the_asked_mean_and_arrivals_the_rate() -> None:
    trace = generate_trace(4000, seed=5, prompt_mean=1000, prompt_spread=0.6, output_mean=200,
                           rate=4.0)
    prompt = sum(r.prompt_tokens for r in trace) / len(trace)
    output = sum(r.output_tokens for r in trace) / len(trace)
    assert 900 < prompt < 1100 and 180 < output < 220
    assert 900 < trace[-1].arrival < 1100  # 4000 requests at 4 per step
    assert all(a.arrival <= b.arrival for a, b in itertools.pairwise(trace))


def test_spread_zero_gives_every_request_the_mean() -> None:
    trace = generate_trace(5, seed=1, prompt_mean=64, prompt_spread=0, output_mean=8,
                           output_spread=0)
    assert {(r.arrival, r.prompt_tokens, r.output_tokens) for r in trace} == {(0, 64, 8)}


def test_prefix_groups_share_a_capped_prefix() -> None:
    trace = generate_trace(200, seed=2, prompt_mean=300, prefix_groups=2, prefix_share=1.0,
                           prefix_tokens=256)
    assert {r.prefix_id for r in trace} == {0, 1}
    assert all(r.prefix_tokens == min(256, r.prompt_tokens) for r in trace)


def test_max_prompt_tokens_caps_prompts() -> None:
    trace = generate_trace(500, seed=3, prompt_mean=2000, prompt_spread=1.0,
                           max_prompt_tokens=2500)
    assert max(r.prompt_tokens for r in trace) == 2500


def test_bad_generator_arguments_are_an_error() -> None:
    with pytest.raises(TraceError, match="cannot generate a trace: num_requests 0"):
        generate_trace(0)
    with pytest.raises(TraceError, match="rate -1"):
        generate_trace(3, rate=-1)


# -- token ids ---------------------------------------------------------------------

def test_token_ids_are_shared_inside_a_prefix_and_unique_outside() -> None:
    trace = (TraceRequest(0, 8, 1, "a", 6), TraceRequest(0, 8, 1, "a", 4),
             TraceRequest(0, 8, 1, "b", 6), TraceRequest(0, 8, 1))
    codes = prefix_codes(trace)
    assert codes == [1, 1, 2, 0]
    ids = [[token_id(i, p, codes[i], r.prefix_tokens, 2) for p in range(8)]
           for i, r in enumerate(trace)]
    assert ids[0][:4] == ids[1][:4] and ids[0][4] != ids[1][4]
    assert not set(ids[0]) & set(ids[2]) and not set(ids[3]) & set(ids[0] + ids[1] + ids[2])
    assert len(set(ids[3])) == 8


def test_prefix_ids_of_different_types_are_different_prefixes() -> None:
    trace = (TraceRequest(0, 4, 1, "1", 2), TraceRequest(0, 4, 1, 1, 2))
    assert prefix_codes(trace) == [1, 2]
