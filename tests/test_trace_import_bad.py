"""``kvspec trace import`` held to ``simulate``'s rule, and the extremes a new user
tried (issue 48): one bound rule for every reader of traces, gzip'ed files and stdin,
a file's format told from its first line whatever its extension, nothing of the
user's lost or half-written, duplicate keys and escaped quotes told apart. Each bad
row's exact message is a golden in tests/errors/traces/formats/."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvspec.sim import trace as trace_module
from kvspec.sim.formats import Reader, detect, read_requests
from kvspec.sim.trace import MAX_ARRIVAL, MAX_TOKENS, TraceError, parse_trace, read_trace
from tests.conftest import ROOT, invoke

SAMPLES = ROOT / "tests" / "data" / "traces"
LLAMA = ROOT / "layouts" / "llama-3.1-8b.kvlayout.json"
AZURE_HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def _moon(tmp_path: Path, rows: list[dict[str, object]]) -> Path:
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _imported(path: Path, fmt: str, **kw: object) -> str | None:
    """None when the importer takes the file, else its error's message."""
    try:
        read_requests(path, fmt, **kw)  # type: ignore[arg-type]
    except TraceError as err:
        return err.message
    return None


def _simulated(line: dict[str, object]) -> str | None:
    """None when simulate's reader (kvspec's JSONL) takes the line, else its message."""
    try:
        parse_trace(json.dumps(line) + "\n", "t.jsonl")
    except TraceError as err:
        return err.message
    return None


@pytest.mark.parametrize("tokens", [1, MAX_TOKENS, MAX_TOKENS + 1, 10**15])
def test_import_and_simulate_agree_on_a_token_count(tokens: int, tmp_path: Path) -> None:
    """Issue 48: 10^15-token rows imported with exit 0, then simulate refused the file."""
    moon = _moon(tmp_path, [{"timestamp": 0, "input_length": tokens, "output_length": 1}])
    azure = tmp_path / "a.csv"
    azure.write_text(f"{AZURE_HEAD}2023-11-16 18:15:46.6805900,1,{tokens}\n")
    simulate = _simulated({"arrival": 0, "prompt_tokens": tokens, "output_tokens": tokens})
    assert (_imported(moon, "mooncake") is None) == (simulate is None)
    assert (_imported(azure, "azure-2023") is None) == (simulate is None)


@pytest.mark.parametrize("steps", [0, MAX_ARRIVAL - 1, MAX_ARRIVAL, MAX_ARRIVAL + 1])
def test_import_and_simulate_agree_on_the_last_arrival(steps: int, tmp_path: Path) -> None:
    """The importer cut at 10^12 steps, simulate at 2^40: a trace simulate takes was
    refused. At 1 ms a step, Mooncake's time in ms is the step."""
    moon = _moon(tmp_path, [{"timestamp": 0, "input_length": 8, "output_length": 1},
                            {"timestamp": steps, "input_length": 8, "output_length": 1}])
    imported = _imported(moon, "mooncake", step_ms=1.0)
    assert (imported is None) == (_simulated({"arrival": steps, "prompt_tokens": 8,
                                              "output_tokens": 1}) is None), imported
    if imported is None:
        assert read_requests(moon, "mooncake", step_ms=1.0)[-1].arrival == steps


def test_the_importers_read_simulates_bounds_not_copies_of_them(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """One rule: narrowing kvspec.sim.trace.BOUNDS narrows every importer with it."""
    monkeypatch.setitem(trace_module.BOUNDS, "prompt_tokens", (1, 100))
    moon = _moon(tmp_path, [{"timestamp": 0, "input_length": 101, "output_length": 1}])
    azure = tmp_path / "a.csv"
    azure.write_text(f"{AZURE_HEAD}2023-11-16 18:15:46.6805900,101,1\n")
    assert _imported(moon, "mooncake") == ("input_length must be a whole number of tokens "
                                           "from 1 to 100")
    assert _imported(azure, "azure-2023") == ("ContextTokens must be a whole number of "
                                              "tokens from 1 to 100")
    assert _simulated({"arrival": 0, "prompt_tokens": 101, "output_tokens": 1}) == \
        "prompt_tokens must be an integer from 1 to 100"


def test_block_tokens_past_2_31_is_refused_at_the_option() -> None:
    code, _, err = invoke(["trace", "import", "mooncake", str(SAMPLES / "mooncake.jsonl"),
                           "--block-tokens", str(MAX_TOKENS + 1)])
    assert code == 2 and "--block-tokens" in err and "Traceback" not in err


def test_simulate_refuses_a_row_it_cannot_hold_at_its_row_and_column(tmp_path: Path) -> None:
    """simulate read Azure's 3e9-token row and reported 'every request refused'; the
    same row in kvspec's JSONL was an error at its line: now both are."""
    path = tmp_path / "a.csv"
    path.write_text(f"{AZURE_HEAD}2023-11-16 18:15:46.6805900,374,44\n"
                    "2023-11-16 18:15:47.6805900,3000000000,44\n")
    code, _, err = invoke(["simulate", str(LLAMA), "--workload", str(path)])
    assert code == 1, err
    assert err.startswith(f"{path}:3:29: error: ContextTokens must be a whole number of "
                          "tokens from 1 to 2^31")


def test_a_mooncake_row_may_fill_its_last_block_partly(tmp_path: Path) -> None:
    """ceil(input_length / 512) blocks is the most, and fewer is fine (the rest of the
    prompt is the request's own)."""
    moon = _moon(tmp_path, [
        {"timestamp": 0, "input_length": 1025, "output_length": 1, "hash_ids": [1, 2, 3]},
        {"timestamp": 1, "input_length": 1024, "output_length": 1, "hash_ids": [1]}])
    assert [len(r.prefix_blocks) for r in read_requests(moon, "mooncake")] == [3, 1]
    moon.write_text(json.dumps({"timestamp": 0, "input_length": 1024, "output_length": 1,
                                "hash_ids": [1, 2, 3]}) + "\n")
    assert _imported(moon, "mooncake") == ("hash_ids has 3 blocks of 512 tokens: more than "
                                           "the prompt's 1,024 tokens (input_length) fill (2)")
    # another block size: the same rule, in its blocks
    assert _imported(moon, "mooncake", block_tokens=256) is None


def test_a_gzipped_trace_reads_as_the_plain_one(tmp_path: Path) -> None:
    plain = SAMPLES / "azure-2023.csv"
    packed = tmp_path / "azure.csv.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert detect(packed) == "azure-2023"
    assert read_requests(packed) == read_requests(plain)
    code, out, err = invoke(["trace", "import", "azure-2023", str(packed), "-q"])
    assert code == 0, err
    assert out == invoke(["trace", "import", "azure-2023", str(plain), "-q"])[1]
    # kvspec's own trace, compressed, for simulate
    trace = tmp_path / "t.jsonl.gz"
    trace.write_bytes(gzip.compress(out.encode()))
    assert read_requests(trace) == read_requests(plain)


def test_a_truncated_gzip_file_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    packed = tmp_path / "azure.csv.gz"
    data = gzip.compress((AZURE_HEAD + "2023-11-16 18:15:46.6805900,374,44\n" * 5000).encode())
    packed.write_bytes(data[: len(data) // 2])
    code, _, err = invoke(["trace", "import", "azure-2023", str(packed), "-o",
                           str(tmp_path / "t.jsonl")])
    assert code == 1 and "Traceback" not in err
    assert "cannot read the trace past line" in err and "hint:" in err
    assert not (tmp_path / "t.jsonl").exists()


def test_stdin_is_read_for_dash() -> None:
    """`trace import FORMAT -` said "-: no such trace file"."""
    data = (SAMPLES / "burstgpt.csv").read_bytes()
    code, out, err = invoke(["trace", "import", "burstgpt", "-", "-q"], stdin=data)
    assert code == 0, err
    assert out == invoke(["trace", "import", "burstgpt", str(SAMPLES / "burstgpt.csv"),
                          "-q"])[1]
    code, _, err = invoke(["trace", "import", "burstgpt", "-"], stdin=b"Timestamp\n")
    assert code == 1 and err.startswith("<stdin>:1:1: error: the header has no column")


@pytest.mark.parametrize(("sample", "name"), [("azure-2023.csv", "trace.txt"),
                                              ("mooncake.jsonl", "trace"),
                                              ("burstgpt.csv", "burst.log")])
def test_the_format_is_told_from_the_first_line_whatever_the_extension(
        sample: str, name: str, tmp_path: Path) -> None:
    path = tmp_path / name
    path.write_bytes((SAMPLES / sample).read_bytes())
    assert read_requests(path) == read_requests(SAMPLES / sample)


def test_an_undetectable_file_points_at_trace_import(tmp_path: Path) -> None:
    """The sweep's {trace: FILE} reads through read_requests too, with no format
    option: the hint names the one command that converts any format."""
    path = tmp_path / "lengths.csv"
    path.write_text("in,out\n5,6\n")
    with pytest.raises(TraceError) as caught:
        read_requests(path)
    assert "kvspec trace import FORMAT FILE -o trace.jsonl" in (caught.value.hint or "")
    path = tmp_path / "rows.json"
    path.write_text('[{"arrival": 0, "prompt_tokens": 5, "output_tokens": 1}]\n')
    with pytest.raises(TraceError, match="is a JSON array") as caught:
        read_requests(path)
    assert "jq -c" in (caught.value.hint or "")


def test_a_failed_import_leaves_the_existing_output_as_it_was(tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    code, _, err = invoke(["trace", "import", "azure-2023", str(SAMPLES / "azure-2023.csv"),
                           "-o", str(out)])
    assert code == 0, err
    before = out.read_bytes()
    bad = tmp_path / "bad.csv"
    bad.write_text(AZURE_HEAD + "2023-11-16 18:15:46.6805900,374,44\n" * 3000
                   + "2023-11-16 18:15:47.6805900,3000000000,44\n")
    code, _, err = invoke(["trace", "import", "azure-2023", str(bad), "-o", str(out)])
    assert code == 1 and f"{bad}:3002:29:" in err
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.csv", "t.jsonl"], \
        "no temporary file is left beside it"


def test_escaped_quotes_and_nested_strings_are_not_a_key_twice(tmp_path: Path) -> None:
    """The key-twice check counts quotes: a line whose strings hold quotes, or whose
    extra keys hold arrays of strings, is read as it is."""
    rows = [{"timestamp": 0, "input_length": 8, "output_length": 1, "note": 'say "hi"'},
            {"timestamp": 1, "input_length": 8, "output_length": 1, "tags": ["a", "b\"c"]},
            {"timestamp": 2, "input_length": 8, "output_length": 1, 'k"ey': {"x": "y"}}]
    moon = _moon(tmp_path, rows)
    assert [r.arrival for r in read_requests(moon, "mooncake", step_ms=1.0)] == [0, 1, 2]
    moon.write_text('{"timestamp": 0, "input_length": 8, "output_length": 1, '
                    '"tags": ["a"], "input_length": 9}\n')
    assert _imported(moon, "mooncake") == ("the trace line has the key 'input_length' "
                                           "twice in one object")


def test_azure_times_on_a_step_boundary_land_on_that_step(tmp_path: Path) -> None:
    """Azure's times were seconds since 1970 as floats: 0.3 s after the first, at 100 ms a
    step, came out 0.29999995 s, step 2 (and 0.6 s step 5). They are subtracted in whole
    microseconds now."""
    path = tmp_path / "a.csv"
    path.write_text(AZURE_HEAD + "".join(f"2023-11-16 18:15:{s},1,1\n" for s in (
        "46.0", "46.0", "46.3", "46.6", "46.6999990", "47.0")))
    assert [r.arrival for r in read_requests(path, step_ms=100)] == [0, 0, 3, 6, 6, 10]


def test_reader_counts_rows_and_skips_only_burstgpts_failures(tmp_path: Path) -> None:
    path = tmp_path / "b.csv"
    path.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                    "1,ChatGPT,10,0,10,x\n2,ChatGPT,0,5,5,x\n\n3,ChatGPT,3,4,7,x\n")
    reader = Reader(path, "burstgpt")
    assert len(list(reader)) == 1 and (reader.rows, reader.skipped) == (3, 2)


def test_a_line_past_the_limit_is_an_error_before_it_is_held_whole(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A file with no newline (a binary file, a JSON array over one huge line) was held
    whole: a row is read up to MAX_LINE_BYTES (64 MiB; here 64 bytes)."""
    from kvspec.sim import formats

    monkeypatch.setattr(formats, "MAX_LINE_BYTES", 64)
    path = tmp_path / "m.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 8, "output_length": 1}\n'
                    '{"timestamp": 0, "input_length": 8, "output_length": 1, "x": "'
                    + "y" * 200 + '"}\n')
    with pytest.raises(TraceError) as caught:
        read_requests(path, "mooncake")
    assert (caught.value.line, caught.value.message) == (2, "the line is longer than 64 bytes")


def test_read_trace_still_refuses_an_unreadable_gzip(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"\x1f\x8b" + b"not gzip at all")
    with pytest.raises(TraceError, match="cannot read the trace"):
        read_trace(path)


def test_an_empty_csv_is_not_told_to_write_json(tmp_path: Path) -> None:
    """simulate --workload empty.csv answered "write one JSON object per line"."""
    path = tmp_path / "empty.csv"
    path.write_text("\n")
    with pytest.raises(TraceError) as caught:
        read_requests(path)
    assert caught.value.message == "the trace has no requests: the file is empty"
    assert "JSON" not in (caught.value.hint or "")


def test_a_tiny_step_is_an_error_at_the_row_not_an_overflow(tmp_path: Path) -> None:
    """--step-ms 1e-300: a second is some 1e303 steps, past any float."""
    path = tmp_path / "b.csv"
    path.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                    "0,ChatGPT,10,5,15,x\n1000000,ChatGPT,3,4,7,x\n")
    code, _, err = invoke(["trace", "import", "burstgpt", str(path), "--step-ms", "1e-300"])
    assert code == 1 and "Traceback" not in err
    assert f"{path}:3:1: error: the request arrives 1e+06 s after the first" in err


_CELLS = st.sampled_from(["0", "1", "-5", "2147483648", "2147483649", "1e3", "nan", "inf",
                          "1.5", "", " 7 ", '"3"', '"4', "x", "\uff11\uff12", "1,200", "+1",
                          "2023-11-16 18:15:46.6805900", "2024-05-10 00:00:00.009930+00:00",
                          "9999-12-31 23:59:59", "0001-01-01", "1e300", "-0", "0x10"])
_HEADERS = {"azure-2023": "TIMESTAMP,ContextTokens,GeneratedTokens",
            "burstgpt": "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type",
            "lengths": "p,o,t"}
_VALUES = st.one_of(st.integers(-3, 2**41), st.floats(allow_nan=False), st.text(max_size=4),
                    st.booleans(), st.none(), st.lists(st.integers(-1, 3), max_size=4))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fmt=st.sampled_from(sorted(_HEADERS)), rows=st.lists(
    st.lists(_CELLS, min_size=1, max_size=7).map(",".join), max_size=5))
def test_any_csv_rows_give_requests_or_a_positioned_error(fmt: str, rows: list[str]) -> None:
    """No row, however odd, raises anything but a TraceError at its line; and what is
    read, simulate's reader reads back the same."""
    _read_back(fmt, _HEADERS[fmt] + "\n" + "\n".join(rows) + "\n", ".csv")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(st.dictionaries(st.sampled_from(
    ["timestamp", "input_length", "output_length", "hash_ids", "p", "o", "t"]), _VALUES),
    max_size=4))
def test_any_json_rows_give_requests_or_a_positioned_error(rows: list[dict]) -> None:
    text = "".join(json.dumps(r) + "\n" for r in rows)
    _read_back("mooncake", text, ".jsonl")
    _read_back("lengths", text, ".jsonl")


def _read_back(fmt: str, text: str, suffix: str) -> None:
    import tempfile

    from kvspec.sim.formats import Columns
    from kvspec.sim.trace import trace_text

    columns = Columns.parse("prompt=p,output=o,time=t", "ms") if fmt == "lengths" else None
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"t{suffix}"
        path.write_text(text)
        try:
            got = read_requests(path, fmt, columns=columns)
        except TraceError as err:
            problem = err
        else:
            assert parse_trace(trace_text(got), "t.jsonl") == got
            return
    assert problem.file == str(path) and problem.hint, problem.render()


@pytest.mark.parametrize("command", ["import", "simulate"])
@pytest.mark.parametrize("args, option", [
    (["--step-ms", "nan"], "--step-ms nan"),
    (["--columns", "foo"], "--columns 'foo'"),
    (["--columns", "prompt=input_len"], "--columns 'prompt=input_len'"),
    (["--columns", ""], "--columns ''"),
])
def test_a_bad_reading_option_is_named(tmp_path: Path, command: str, args: list[str],
                                       option: str) -> None:
    # the message named neither option: "the step time must be a positive number of ms,
    # not nan", "cannot read the column map 'foo' at 'foo'"
    lengths = tmp_path / "l.csv"
    lengths.write_text("input_len,output_len\n5,6\n")
    argv = (["trace", "import", "lengths", str(lengths)] if command == "import" else
            ["simulate", str(LLAMA), "--workload", str(lengths), "--workload-format", "lengths"])
    if "--columns" not in args:
        args = [*args, "--columns", "prompt=input_len,output=output_len"]
    code, out, err = invoke([*argv, *args])
    assert code == 2 and out == "", err
    assert err.startswith(f"kvspec: error: {option}"), err
    assert "Traceback" not in err
