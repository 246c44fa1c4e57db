"""Trace formats (kvspec.sim.formats): the samples of each published layout, their
conversion, the positioned errors, rows read one at a time, and Mooncake's
``hash_ids`` shared block for block in the simulator."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvspec.compiled import read as read_artifact
from kvspec.sim import simulate_artifact
from kvspec.sim.chains import Chains
from kvspec.sim.formats import Columns, Reader, detect, iter_requests, read_requests
from kvspec.sim.trace import TraceError, TraceRequest, read_trace
from tests.conftest import ROOT, check_golden, invoke

SAMPLES = ROOT / "tests" / "data" / "traces"
BAD = ROOT / "tests" / "errors" / "traces" / "formats"
LLAMA = ROOT / "layouts" / "llama-3.1-8b.kvlayout.json"

#: The published column layouts (docs/traces.md cites where each is documented).
LAYOUTS = {
    "azure-2023.csv": "TIMESTAMP,ContextTokens,GeneratedTokens",
    "azure-2024.csv": "TIMESTAMP,ContextTokens,GeneratedTokens",
    "burstgpt.csv": "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type",
}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_each_csv_sample_has_its_published_header(name: str) -> None:
    assert (SAMPLES / name).read_text().splitlines()[0] == LAYOUTS[name]


def test_the_mooncake_sample_has_its_published_keys() -> None:
    for line in (SAMPLES / "mooncake.jsonl").read_text().splitlines():
        assert list(json.loads(line)) == ["timestamp", "input_length", "output_length",
                                          "hash_ids"]


def _rows(path: Path, fmt: str | None = None, **kw: object) -> list[tuple[int, int, int]]:
    return [(r.arrival, r.prompt_tokens, r.output_tokens)
            for r in read_requests(path, fmt, **kw)]  # type: ignore[arg-type]


def test_azure_2023_times_become_steps_of_the_declared_length() -> None:
    # 46.68059 s is the first; 47.00059 s is 0.32 s later: step 3 at 100 ms a step
    assert _rows(SAMPLES / "azure-2023.csv", step_ms=100) == [
        (0, 374, 44), (0, 396, 109), (3, 879, 52), (3, 2116, 13), (18, 1020, 129),
        (43, 4142, 211)]
    # the default step (20 ms): 4.314579 s after the first is step 215
    assert _rows(SAMPLES / "azure-2023.csv")[-1] == (215, 4142, 211)


def test_azure_2024_reads_its_zoned_timestamps() -> None:
    assert _rows(SAMPLES / "azure-2024.csv", "azure-2024", step_ms=10) == [
        (0, 1469, 13), (0, 2048, 28), (1, 110, 27), (2, 7433, 14), (99, 34, 12)]


def test_burstgpt_skips_its_rows_of_zero_tokens() -> None:
    reader = Reader(SAMPLES / "burstgpt.csv", "burstgpt", step_ms=1000)
    assert [(r.arrival, r.prompt_tokens, r.output_tokens) for r in reader] == [
        (0, 472, 18), (40, 1087, 230), (113, 417, 276), (155, 621, 126)]
    assert (reader.rows, reader.skipped) == (6, 2)


def test_mooncake_hash_ids_become_prefix_blocks() -> None:
    trace = read_requests(SAMPLES / "mooncake.jsonl", step_ms=1000)
    assert [r.arrival for r in trace] == [0, 0, 10, 27, 30]
    assert trace[0] == TraceRequest(0, 655, 52, None, 0, (46, 47), 512)
    assert trace[4].prefix_blocks[:12] == trace[3].prefix_blocks[:12]


def test_lengths_files_follow_their_column_map() -> None:
    csv = _rows(SAMPLES / "lengths.csv", "lengths",
                columns=Columns.parse("prompt=input_len,output=output_len"))
    assert csv == [(0, 137, 402), (0, 58, 233), (0, 1202, 87), (0, 611, 1022)]
    jsonl = _rows(SAMPLES / "lengths.jsonl", "lengths", step_ms=50,
                  columns=Columns.parse("prompt=in,output=out,time=t_ms", "ms"))
    assert jsonl == [(0, 512, 128), (5, 2048, 64), (5, 300, 300)]


@pytest.mark.parametrize(("name", "fmt"), [
    ("azure-2023.csv", "azure-2023"), ("azure-2024.csv", "azure-2023"),
    ("burstgpt.csv", "burstgpt"), ("mooncake.jsonl", "mooncake")])
def test_the_format_is_told_from_the_extension_and_first_line(name: str, fmt: str) -> None:
    assert detect(SAMPLES / name) == fmt


def test_a_lengths_file_needs_its_format_named() -> None:
    with pytest.raises(TraceError, match="cannot tell which trace format") as caught:
        detect(SAMPLES / "lengths.csv")
    assert "lengths, with its columns" in (caught.value.hint or "")


def test_a_converted_trace_reads_back_as_kvspec_trace(tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    code, _, err = invoke(["trace", "import", "mooncake", str(SAMPLES / "mooncake.jsonl"),
                           "--step-ms", "1000", "-o", str(out)])
    assert code == 0, err
    assert err == (f"wrote {out}: 5 requests from 5 rows; the last arrives at step 30 "
                   "(1000 ms a step)\n")
    assert read_trace(out) == read_requests(SAMPLES / "mooncake.jsonl", step_ms=1000)
    assert detect(out) == "kvspec"


def test_import_to_stdout_and_its_json_summary(tmp_path: Path) -> None:
    code, out, _ = invoke(["trace", "import", "burstgpt", str(SAMPLES / "burstgpt.csv"),
                           "-q"])
    assert code == 0
    assert out.splitlines()[1] == ('{"arrival": 2000, "prompt_tokens": 1087, '
                                   '"output_tokens": 230}')
    code, out, _ = invoke(["trace", "import", "burstgpt", str(SAMPLES / "burstgpt.csv"),
                           "--format", "json", "-o", str(tmp_path / "b.jsonl")])
    assert code == 0
    doc = json.loads(out)
    assert (doc["requests"], doc["rows"], doc["skipped"]) == (4, 6, 2)


def test_trace_keeps_its_own_options_beside_the_subcommand() -> None:
    code, out, _ = invoke(["trace", "-n", "2", "--seed", "1"])
    assert code == 0 and len(out.splitlines()) == 2
    code, _, err = invoke(["trace", "-n", "2", "import", "mooncake", "x.jsonl"])
    assert code == 2 and "--requests goes with `kvspec trace`" in err


#: Each bad file's format and options (the file's name starts with its format).
OPTIONS = {"lengths-missing-column": ["--columns", "prompt=input_length,output=output_len"],
           "lengths-time-past-2-33-s": ["--columns", "prompt=in,output=out,time=t",
                                        "--time-unit", "ms"],
           "lengths-unclosed-quote": ["--columns", "prompt=in,output=out"],
           "lengths-json-array": ["--columns", "prompt=in,output=out"],
           "lengths-key-twice": ["--columns", "prompt=in,output=out"]}


def _format(path: Path) -> str:
    for fmt in ("azure-2023", "azure-2024", "burstgpt", "mooncake", "lengths"):
        if path.stem.startswith(fmt):
            return fmt
    raise AssertionError(path)


@pytest.mark.parametrize("path", sorted(p for p in BAD.iterdir() if p.suffix != ".expected"),
                         ids=lambda p: p.stem)
def test_a_bad_row_is_an_error_at_its_line_and_column(path: Path, tmp_path: Path) -> None:
    """Each bad file beside the exact message (KVSPEC_REGEN=1 rewrites; review it)."""
    rel = str(path.relative_to(ROOT))
    out = tmp_path / "t.jsonl"
    code, _, err = invoke(["trace", "import", _format(path), rel, "-o", str(out),
                           *OPTIONS.get(path.stem, [])])
    assert code == 1, err
    assert err.startswith(f"{rel}:") and "hint:" in err and "Traceback" not in err
    assert not out.exists(), "a failed conversion leaves no file"
    check_golden(path.with_name(path.stem + ".expected"), err)


def test_rows_are_read_one_at_a_time(tmp_path: Path) -> None:
    """A bad row at the end: every request before it comes first, so a file is never
    read whole (benchmarks/bench_trace_import.py measures the memory)."""
    path = tmp_path / "t.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    + "2023-11-16 18:15:46.6805900,374,44\n" * 1000 + "bad,1,1\n")
    rows = iter_requests(path)
    got = [next(rows) for _ in range(1000)]
    assert got[-1] == TraceRequest(0, 374, 44)
    with pytest.raises(TraceError) as caught:
        next(rows)
    assert (caught.value.line, caught.value.column) == (1002, 1)


def test_chains_follow_the_first_differing_block() -> None:
    chains = Chains(first_code=10)
    a, b, c = chains.codes((1, 2, 3)), chains.codes((1, 2, 4)), chains.codes((2, 2, 3))
    assert a[:2] == b[:2] and a[2] != b[2]
    assert not set(c) & set(a), "the same id after another block is another block"


def _hits(trace: list[TraceRequest]) -> int:
    art = read_artifact(LLAMA)
    return simulate_artifact(art, trace, num_blocks=4096).hit_tokens


def test_mooncake_blocks_are_shared_block_for_block_in_the_simulator() -> None:
    """Requests far apart (the first is done before the next): each hit is what the
    blocks they open with share, in 16-token blocks, short of the prompt's last token."""
    first = TraceRequest(0, 1536, 2, None, 0, (1, 2, 3), 512)
    assert _hits([first, TraceRequest(5000, 1536, 2, None, 0, (1, 2, 4), 512)]) == 1024
    assert _hits([first, TraceRequest(5000, 1536, 2, None, 0, (5, 2, 3), 512)]) == 0
    assert _hits([first, TraceRequest(5000, 1536, 2, None, 0, (1, 2, 3), 512)]) == 1520
    # a prompt shorter than its blocks shares only its own tokens
    assert _hits([first, TraceRequest(5000, 700, 2, None, 0, (1, 2), 512)]) == 688


def test_simulate_reads_a_format_file_directly() -> None:
    code, out, err = invoke(["simulate", str(LLAMA), "--workload",
                             str(SAMPLES / "mooncake.jsonl"), "--format", "json"])
    assert code == 0, err
    doc = json.loads(out)
    assert doc["requests"] == 5 and doc["kvspec"]["hit_tokens"] >= 1024
    code, _, err = invoke(["simulate", str(LLAMA), "--workload", str(SAMPLES / "lengths.csv")])
    assert code == 1 and "name its format: lengths" in err
    code, out, err = invoke(["simulate", str(LLAMA), "--workload", str(SAMPLES / "lengths.csv"),
                             "--workload-format", "lengths", "--columns",
                             "prompt=input_len,output=output_len", "--format", "json"])
    assert code == 0, err
    assert json.loads(out)["requests"] == 4


def test_the_source_reads_a_trace_in_any_format(tmp_path: Path) -> None:
    src = (ROOT / "tests" / "data" / "pooling" / "llama-auto-vllm.yaml").read_text()
    head, _ = src.split("pooling:\n")
    (tmp_path / "b.csv").write_text((SAMPLES / "burstgpt.csv").read_text())
    (tmp_path / "p.yaml").write_text(head + "pooling:\n  policy: unified\n  workload: "
                                     "{trace: b.csv, step_ms: 1000}\n")
    code, out, err = invoke(["simulate", str(tmp_path / "p.yaml"), "--format", "json"])
    assert code == 0, err
    assert json.loads(out)["requests"] == 4
