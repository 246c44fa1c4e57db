"""Bad inputs are refused early and clearly (issue 36): bounds before work, finite
numbers, unservable workloads, pooling overrides, and a representative subset of
``benchmarks/bad_inputs.py``'s cases through the real command line.

The error goldens in ``tests/errors`` hold the source-side messages; these tests
hold the command-line side (options, traces, artifacts) and the figures."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, invoke

SMALL = """kvspec: 1
name: small
engine: {block_size: 16, max_model_len: 8192, memory: 8GiB, max_num_seqs: 64}
defaults: {num_kv_heads: 8, head_size: 128, dtype: bfloat16}
layer_types:
  attn: {kind: full_attention}
  swa: {kind: sliding_window, sliding_window: 1024}
layers:
  - {repeat: 2, pattern: [attn, swa, swa, swa]}
"""
TRACE = "".join(f'{{"arrival": {i}, "prompt_tokens": {300 + i}, "output_tokens": 20}}\n'
                for i in range(10))


def _bench() -> object:
    spec = importlib.util.spec_from_file_location("bad_inputs",
                                                  ROOT / "benchmarks" / "bad_inputs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bad_inputs"] = module
    spec.loader.exec_module(module)
    return module


# -- the table's cases, a representative subset ---------------------------------------

#: The surfaces issue 48 added: sweep grids, rows files, --ray addresses, trace import.
NEW_SURFACES = ("sweep", "rows", "ray", "trace-import")


def test_the_table_has_at_least_300_cases_on_every_surface() -> None:
    bench = _bench()
    cases = bench.cases()  # type: ignore[attr-defined]
    assert len(cases) >= 300
    assert {c.surface for c in cases} == set(bench.SURFACES)  # type: ignore[attr-defined]
    names = [(c.surface, c.name) for c in cases]
    assert len(names) == len(set(names)), "two cases of a surface share a name"


def test_the_new_surfaces_have_at_least_200_cases_and_say_what_is_right() -> None:
    bench = _bench()
    new = [c for c in bench.cases() if c.surface in NEW_SURFACES]  # type: ignore[attr-defined]
    assert len(new) >= 200
    for surface in NEW_SURFACES:
        assert sum(c.surface == surface for c in new) >= 15, surface
    # cases whose right answer is success, and cases guarding the user's files
    assert sum(c.ok is not None for c in new) >= 50
    assert sum(c.must_run for c in new) >= 5
    assert sum(bool(c.keep) for c in new) >= 20
    assert all(c.keep_failed == ("r.jsonl",) for c in new if c.surface == "sweep"
               and c.argv[:2] == ("sweep", "g.yaml"))
    # --ray names loopback addresses only (never a real cluster, never a local instance)
    for c in new:
        if "--ray" in c.argv:
            address = c.argv[c.argv.index("--ray") + 1]
            assert "." not in address.replace("127.0.0.1", ""), address  # no other host
            assert address not in ("", "local", "auto"), address


def test_a_subset_of_the_bad_inputs_are_clear_errors_or_right_answers() -> None:
    bench = _bench()
    cases = bench.cases()  # type: ignore[attr-defined]
    subset = cases[::17]  # every surface, about 70 cases
    assert {c.surface for c in subset} == set(bench.SURFACES)  # type: ignore[attr-defined]
    results = bench.run_all(subset, 2, 30.0, quiet=True)  # type: ignore[attr-defined]
    bad = [(r.case.surface, r.case.name, r.kind, bench.shown(r))  # type: ignore[attr-defined]
           for r in results if r.kind in bench.BAD  # type: ignore[attr-defined]
           or (r.kind == "unclear" and r.case.surface in NEW_SURFACES)]
    assert not bad


def test_the_classifier_tells_the_classes_apart() -> None:
    bench = _bench()
    case = bench.Case("trace", "x", ("trace", "--rate", "nan"))  # type: ignore[attr-defined]
    classify = bench.classify  # type: ignore[attr-defined]
    assert classify(case, 2, "kvspec: error: invalid value for --rate: 'nan'", False) == "clear"
    assert classify(case, 1, "s.yaml:3:4: error: bad", False) == "clear"
    assert classify(case, 1, "kvspec: error: cannot convert float NaN to integer",
                    False) == "unclear"
    assert classify(case, 1, "Traceback (most recent call last):\n  ...", False) == "traceback"
    assert classify(case, 0, "", False) == "silent wrong"
    assert classify(case, None, "", True) == "runaway"
    assert classify(case, None, "simulating: 100 of 1,000", True) == "slow"
    assert classify(case, None, "[2026-12-07 W 1] rpc_client.h:153: Failed to connect",
                    True) == "runaway"  # a log line is no progress
    # pydantic's internal names are never a clear message
    assert classify(case, 1, "g.yaml:5:33: error: invalid value for target.step_ms."
                    "constrained-float", False) == "unclear"
    # a lost file outranks every answer but a traceback or a hang
    assert classify(case, 0, "", False, lost=("u.jsonl truncated",), right=True) == "lost file"
    assert classify(case, 1, "s.yaml:3:4: error: bad", False, lost=("u.jsonl deleted",)) \
        == "lost file"
    # a case that says what a right success is
    ok = bench.Case("sweep", "x", ("sweep",), ok=lambda o: True)  # type: ignore[attr-defined]
    assert classify(ok, 0, "", False, right=True) == "right"
    assert classify(ok, 0, "", False, right=False) == "silent wrong"
    assert classify(ok, 1, "g.yaml:4:3: error: duplicate", False) == "clear"
    must = bench.Case("rows", "x", ("sweep",), must_run=True)  # type: ignore[attr-defined]
    assert classify(must, 1, "g.yaml:4:3: error: no", False) == "refused"
    # a case that asks where the error is placed, and what it says
    placed = bench.Case("sweep", "x", ("sweep", "g.yaml"),  # type: ignore[attr-defined]
                        at=bench._grid_at(2), says=("artifact",))  # type: ignore[attr-defined]
    assert classify(placed, 1, "g.yaml:2:7: error: a.kvlayout.json is an artifact",
                    False) == "clear"
    assert classify(placed, 1, "a.kvlayout.json:1:1: error: missing field 'kvspec' "
                    "(an artifact)", False) == "unclear"
    assert classify(placed, 1, "g.yaml:2:7: error: missing field 'kvspec'", False) == "unclear"
    said = bench.Case("sweep", "x", ("sweep",), not_says=(r"did you mean '1'\?",))  # type: ignore[attr-defined]
    assert classify(said, 1, "g.yaml:1:15: error: bad\n  hint: did you mean '1'?",
                    False) == "unclear"


def test_run_finds_a_lost_file_and_kills_what_the_command_left_running(tmp_path: Path) -> None:
    """``run`` through a stand-in for Python: it truncates the user's file, leaves an
    output behind and a child running in its process group, and exits 1."""
    bench = _bench()
    fake = tmp_path / "fake-python"
    fake.write_text("#!/bin/sh\n: > u.jsonl\necho partial > r.jsonl\nsleep 300 &\n"
                    "echo $! > child.pid\ncp child.pid ../child.pid\n"
                    "echo 'u.jsonl:1:1: error: bad' >&2\nexit 1\n")
    fake.chmod(0o755)
    case = bench.Case("rows", "x", ("sweep",), {"u.jsonl": "mine\n"},  # type: ignore[attr-defined]
                      keep=("u.jsonl",), keep_failed=("r.jsonl",))
    root = tmp_path / "root"
    root.mkdir()
    result = bench.run(case, root, 20.0, python=str(fake))  # type: ignore[attr-defined]
    assert result.kind == "lost file", result
    assert "u.jsonl truncated from 5 to 0 bytes" in result.detail
    assert "r.jsonl left behind (8 bytes)" in result.detail
    pid = int((root / "child.pid").read_text())
    status = Path(f"/proc/{pid}/status")
    assert not status.exists() or "zombie" in status.read_text()


def test_the_right_answers_are_checked(tmp_path: Path) -> None:
    bench = _bench()
    outcome = bench.Outcome  # type: ignore[attr-defined]
    row = {"id": "a" * 16, "point": {"model": "m"}, "ok": True}
    (tmp_path / "r.jsonl").write_text(json.dumps(row) + "\n")
    swept = bench.swept  # type: ignore[attr-defined]
    assert swept(1)(outcome(0, '{"points": 1}', "", tmp_path))
    assert not swept(1)(outcome(0, '{"points": 3}', "", tmp_path))  # a duplicate counted
    assert not swept(2)(outcome(0, "", "", tmp_path))
    on_stdout = bench.rows_on_stdout(1)  # type: ignore[attr-defined]
    assert on_stdout(outcome(0, json.dumps(row) + "\n", "", tmp_path))
    (tmp_path / "-").write_text(json.dumps(row) + "\n")
    assert not on_stdout(outcome(0, "", "", tmp_path))
    valid = bench.valid_trace  # type: ignore[attr-defined]
    assert valid(TRACE) == 10
    assert valid('{"arrival": 0, "prompt_tokens": 1000000000000000, "output_tokens": 5}') is None
    assert valid('{"arrival": 0, "prompt_tokens": NaN, "output_tokens": 5}') is None
    assert valid('{"arrival": 3, "prompt_tokens": 5, "output_tokens": 5}\n'
                 '{"arrival": 2, "prompt_tokens": 5, "output_tokens": 5}') is None
    blocks = ('{"arrival": 0, "prompt_tokens": 600, "output_tokens": 5, "prefix_blocks": %s, '
              '"prefix_block_tokens": 512}')
    assert valid(blocks % "[1, 2]") == 1
    assert valid(blocks % "[1, 2, 3]") is None  # more blocks than the prompt covers
    assert valid("") is None
    errors = bench._json_errors(json.dumps({"ok": False, "errors": [  # type: ignore[attr-defined]
        {"file": "g.yaml", "line": 4, "column": 3, "message": "bad", "path": "axes.tp"}]}))
    assert errors == "g.yaml:4:3: error: bad\n  at: axes.tp"


# -- item 6: non-finite numbers name their option --------------------------------------

@pytest.mark.parametrize("option,value", [
    ("--prompt-mean", "inf"), ("--output-mean", "inf"), ("--prompt-mean", "nan"),
    ("--prompt-spread", "nan"), ("--rate", "nan"), ("--output-spread", "-inf"),
    ("--prefix-share", "nan")])
def test_trace_refuses_non_finite_numbers_naming_the_option(option: str, value: str) -> None:
    code, out, err = invoke(["trace", "-n", "3", option, value])
    assert code == 2, err
    assert f"invalid value for {option}" in err and "not a finite number" in err
    assert "Traceback" not in err and not out


def test_trace_bounds_its_means_and_rate() -> None:
    for option, value in (("--prompt-mean", "1e30"), ("--rate", "1e-300"),
                          ("--max-prompt-tokens", "3000000000")):
        code, _, err = invoke(["trace", "-n", "3", option, value])
        assert code == 2 and f"invalid value for {option}" in err, (option, err)


# -- item 5: bounds before work ---------------------------------------------------------

@pytest.fixture
def small(tmp_path: Path) -> Path:
    (tmp_path / "s.yaml").write_text(SMALL)
    (tmp_path / "t.jsonl").write_text(TRACE)
    return tmp_path


@pytest.mark.parametrize("args,named", [
    (["--num-blocks", "1000000000000"], "--num-blocks"),
    (["--num-blocks", "1e30"], "--num-blocks"),
    (["--memory", "1000000TiB"], "--memory"),
    (["--memory", "200TiB"], "--memory")])
def test_simulate_refuses_pools_too_large_before_building_them(small: Path, args: list[str],
                                                                named: str) -> None:
    code, _, err = invoke(["simulate", str(small / "s.yaml"), "--workload",
                           str(small / "t.jsonl"), *args])
    assert code == 2, err
    assert named in err and "Traceback" not in err


def test_simulate_refuses_a_layout_whose_own_budget_is_too_large(small: Path) -> None:
    big = SMALL.replace("memory: 8GiB", "memory: 4TiB")
    (small / "big.yaml").write_text(big)
    code, _, err = invoke(["simulate", str(small / "big.yaml"), "--workload",
                           str(small / "t.jsonl")])
    assert code == 1, err
    assert "the simulator holds every block" in err
    assert err.startswith(f"{small / 'big.yaml'}: error: cannot simulate")


def test_compile_refuses_a_budget_of_more_blocks_than_32_bit_ids(tmp_path: Path) -> None:
    # one 8-byte fp8 head in 1-token blocks: 200 TiB is 2^44 blocks
    code, _, err = invoke(["compile", "tests/errors/blocks-too-many.yaml", "-o",
                           str(tmp_path / "b.kvlayout.json")])
    assert code == 1, err
    assert "32-bit block ids" in err and "at: engine.memory" in err
    code, _, err = invoke(["compile", "tests/errors/blocks-too-many.yaml", "--memory",
                           "100TiB", "-o", str(tmp_path / "b.kvlayout.json")])
    assert code == 1 and "32-bit block ids" in err, err
    assert not (tmp_path / "b.kvlayout.json").exists()


# -- item 7: unservable is an error ------------------------------------------------------

def test_simulate_exits_1_when_the_trace_refuses_every_request(small: Path) -> None:
    (small / "long.jsonl").write_text(
        '{"arrival": 0, "prompt_tokens": 9000, "output_tokens": 5}\n' * 3)
    code, out, err = invoke(["simulate", str(small / "s.yaml"), "--workload",
                             str(small / "long.jsonl")])
    assert code == 1 and not out
    assert "all 3 requests of the trace were refused" in err
    assert "max_model_len (8,192 tokens)" in err and "the shortest prompt has 9,000" in err


# -- item 8: pooling overrides are honoured by auto ---------------------------------------

def test_auto_keeps_no_candidate_with_more_groups_than_max_groups() -> None:
    from kvspec.compiler import compile_source

    text = SMALL + ("pooling: {policy: auto, serve_with: kvspec, max_groups: 2, workload: "
                    "{context_tokens: 512, output_tokens: 64, requests: 40}}\n")
    record = compile_source(text).body.pooling
    assert record is not None and record.chosen is not None
    kept = record.candidates[record.chosen]
    assert kept.groups <= 2
    unified = record.candidates[0]
    assert unified.groups > 2
    assert unified.note is not None and "max_groups (2)" in unified.note


# -- item 12: an unknown kv_cache_dtype on opaque cells ------------------------------------

def test_compile_refuses_an_unknown_kv_cache_dtype_on_opaque_cells(tmp_path: Path) -> None:
    text = (ROOT / "layouts" / "example-stride-alignment.yaml").read_text()
    bad = tmp_path / "m.yaml"
    bad.write_text(text.replace("kv_cache_dtype: fp8_ds_mla}", "kv_cache_dtype: '16'}"))
    code, _, err = invoke(["compile", str(bad), "-o", str(tmp_path / "m.kvlayout.json")])
    assert code == 1, err
    assert "unknown kv_cache_dtype '16'" in err and "at: layer_types.mla.kv_cache_dtype" in err
    assert "Traceback" not in err and "ValidationError" not in err


# -- item 10: unclear errors made clear ---------------------------------------------------

def test_a_trace_with_a_byte_order_mark_reads(small: Path) -> None:
    (small / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + TRACE.encode())
    code, out, err = invoke(["simulate", str(small / "s.yaml"), "--workload",
                             str(small / "bom.jsonl")])
    assert code == 0, err
    assert "10 requests" in out


def test_workload_dash_reads_the_trace_from_stdin(small: Path) -> None:
    code, out, err = invoke(["simulate", str(small / "s.yaml"), "--workload", "-"],
                            stdin=TRACE)
    assert code == 0, err
    assert "10 requests" in out
    code, _, err = invoke(["simulate", str(small / "s.yaml"), "--workload", "-"],
                          stdin='{"arrival": 0, "prompt_tokens": NaN, "output_tokens": 1}\n')
    assert code == 1 and err.startswith("<stdin>:1:33: error: not valid JSON: NaN")


def test_a_trace_given_as_an_artifact_or_a_source_is_named_so(small: Path) -> None:
    trace = str(small / "t.jsonl")
    code, _, err = invoke(["descriptor", trace])
    assert code == 1 and "this is a request trace (JSON Lines), not an artifact" in err
    assert "never edit artifacts" not in err
    code, _, err = invoke(["explain", trace])
    assert code == 1 and "this is a request trace (JSON Lines), not a layout source" in err


def test_nan_in_an_artifact_is_placed(tmp_path: Path) -> None:
    text = (ROOT / "layouts" / "llama-3.1-8b.kvlayout.json").read_text()
    bad = tmp_path / "nan.kvlayout.json"
    bad.write_text(text.replace('"max_num_seqs": 256', '"max_num_seqs": NaN', 1))
    code, _, err = invoke(["descriptor", str(bad)])
    assert code == 1
    assert re.match(rf"{re.escape(str(bad))}:\d+:\d+: error: not valid JSON: NaN", err), err


# -- item 9: figures named for what they are ------------------------------------------------

def test_the_limit_is_labelled_at_the_average_request_and_one_share_is_printed() -> None:
    code, out, err = invoke(["plan", "layouts/pooling-auto.kvlayout.json"])
    assert code == 0, err
    assert "limit at avg. request" in out and "physical limit" not in out
    kept = re.search(r"live tokens and states fill (\d+\.\d)%", out)
    assert kept is not None
    code, report, _ = invoke(["explain", "layouts/pooling-auto.kvlayout.json", "--format",
                              "json"])
    data = json.loads(report)
    live = data["pooling"]["waste"][0]
    assert live["kind"] == "live tokens and states"
    assert f"{live['share']:.1%}" == kept.group(1) + "%"  # compile/plan and explain agree


def test_the_json_reports_pooling_rows_are_numbers() -> None:
    code, report, err = invoke(["explain", "layouts/pooling-auto.kvlayout.json", "--format",
                                "json"])
    assert code == 0, err
    pooling = json.loads(report)["pooling"]
    assert "cells" not in pooling and "candidates" not in pooling  # text only
    for row in pooling["rows"]:
        assert isinstance(row["name"], str) and isinstance(row["kept"], bool)
        for key in ("static_requests", "workload_requests", "simulated_mean",
                    "utilization_while_waiting", "limit_at_average_request"):
            assert row[key] is None or isinstance(row[key], (int, float)), key
    assert sum(r["kept"] for r in pooling["rows"]) == 1


# -- item 5: long work says how far it is ----------------------------------------------

def test_long_work_prints_a_progress_line_every_few_seconds_off_a_terminal() -> None:
    import io

    from kvspec import notes
    from kvspec.cli.progress import NOTE_EVERY, Progress

    now = [0.0]
    out = io.StringIO()
    bar = Progress(1000, "simulating", out, enabled=False, delay=0.0, clock=lambda: now[0],
                   notes=True)
    bar.advance("requests finished", 10)
    assert out.getvalue() == ""  # nothing in the first NOTE_EVERY seconds
    now[0] = NOTE_EVERY + 0.1
    bar.advance("requests finished", 10)
    assert out.getvalue() == "simulating: 20 of 1,000 requests finished\n"
    bar.advance("requests finished", 10)  # the next one NOTE_EVERY later
    assert out.getvalue().count("\n") == 1
    heard: list[str] = []
    with notes.listening(heard.append):
        from kvspec.compiler import compile_source
        compile_source(SMALL + "pooling: {policy: auto, serve_with: kvspec, workload: "
                       "{context_tokens: 512, output_tokens: 64, requests: 30}}\n")
    assert heard and heard[0].startswith("pooling: simulating unified, ")


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_a_trace_line_nested_a_hundred_thousand_deep_is_refused_at_once(
        small: Path, suffix: str) -> None:
    """msgspec gives up on deep nesting with a RecursionError, and the strict reader
    that places the problem kept a path per level (memory quadratic in the depth: a
    100,000-deep line was killed for memory); now a line nested past the reader's depth
    is refused at the level it passes."""
    line = ('{"arrival": 0, "prompt_tokens": 5, "output_tokens": ' + "[" * 100_000
            + "]" * 100_000 + "}\n")
    (small / f"deep{suffix}").write_text(line)
    code, _, err = invoke(["simulate", str(small / "s.yaml"), "--workload",
                           str(small / f"deep{suffix}")])
    assert code == 1, err
    assert "nested more than 64 levels deep" in err and f"deep{suffix}:1:" in err
    assert "Traceback" not in err
