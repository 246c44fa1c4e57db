"""The core CLI commands, as a user runs them: exit codes and output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvspec.artifact import Artifact
from tests.conftest import CONFORMANCE, ROOT, invoke

LLAMA = "layouts/llama-3.1-8b.yaml"


def test_compile_writes_artifact_and_summary(tmp_path: Path) -> None:
    out = tmp_path / "llama.kvlayout.json"
    code, stdout, stderr = invoke(["compile", LLAMA, "-o", str(out)])
    assert code == 0, stderr
    assert "32 layers in 1 group(s), layout LBNHC" in stdout
    assert "bytes per block: 2.00 MiB (2097152 B)" in stdout
    assert "for 40.00 GiB: 20,480 blocks, 327,680 tokens" in stdout
    art = Artifact.read(out)
    assert art.data["body"]["budget"]["num_blocks"] == 20480


def test_compile_failure_leaves_existing_output_untouched(tmp_path: Path) -> None:
    out = tmp_path / "x.kvlayout.json"
    assert invoke(["compile", "-q", LLAMA, "-o", str(out)])[0] == 0
    previous = out.read_bytes()
    code, _, _ = invoke(["compile", "tests/errors/unknown-field.yaml", "-o", str(out)])
    assert code == 1
    assert out.read_bytes() == previous
    assert list(tmp_path.iterdir()) == [out]


def test_compile_replaces_its_own_artifact_but_nothing_else(tmp_path: Path) -> None:
    out = tmp_path / "notes.json"
    out.write_text('{"mine": true}\n')
    code, _, stderr = invoke(["compile", LLAMA, "-o", str(out)])
    assert code == 2
    assert stderr == (f"kvspec: error: {out} exists and is not a file kvspec wrote\n"
                      "  hint: pass --force to overwrite it\n")
    assert out.read_text() == '{"mine": true}\n'
    assert invoke(["compile", "-q", LLAMA, "-o", str(out), "--force"])[0] == 0
    assert invoke(["compile", "-q", LLAMA, "-o", str(out), "--memory", "20GiB"])[0] == 0
    assert Artifact.read(out).data["body"]["budget"]["num_blocks"] == 10240


def test_compile_never_writes_over_its_source(tmp_path: Path) -> None:
    src = tmp_path / "m.yaml"
    src.write_text(Path(LLAMA).read_text())
    code, _, stderr = invoke(["compile", str(src), "-o", str(src), "--force"])
    assert code == 2 and "is the input" in stderr
    assert src.read_text() == Path(LLAMA).read_text()


def test_compile_streams(tmp_path: Path) -> None:
    out = tmp_path / "a.kvlayout.json"
    code, stdout, stderr = invoke(["compile", LLAMA, "-o", str(out)])
    assert code == 0
    assert "wrote" not in stdout and stdout.startswith("llama")
    assert stderr == f"wrote {out}\n"
    assert invoke(["compile", "-q", LLAMA, "-o", str(out)])[1:] == ("", "")


def test_validate_ok() -> None:
    code, stdout, _ = invoke(["validate", LLAMA])
    assert (code, stdout) == (0, f"{LLAMA}: ok\n")


def test_plan_text() -> None:
    code, stdout, _ = invoke(["plan", LLAMA, "--memory", "80GiB"])
    assert code == 0
    assert "blocks:               40,960" in stdout
    assert "KV capacity:          655,360 tokens" in stdout
    assert "max concurrency:      5.00x at 131,072 tokens" in stdout


def test_plan_json_reference_view_bytes_and_gib_agree() -> None:
    a = json.loads(invoke(["plan", LLAMA, "--memory", "40GiB", "--json"])[1])
    b = json.loads(invoke(["plan", LLAMA, "--memory", "42949672960", "--json"])[1])
    assert a == b
    assert a["ok"] and a["num_blocks"] == 20480 and a["pool_bytes_per_block"] == 2097152
    assert a["kv_cache_tensors"][0]["layer_stride"] == 65536 * 20480
    assert a["workers"][0]["num_blocks"] == 20480


def test_plan_json_matches_conformance_fields(tmp_path: Path) -> None:
    src = tmp_path / "gemma.yaml"
    assert invoke(["import", str(CONFORMANCE / "cases" / "gemma-2-9b-tp1.json"),
                   "-o", str(src)])[0] == 0
    view = json.loads(invoke(["plan", str(src), "--json", "--views"])[1])
    expected = json.loads((CONFORMANCE / "expected" / "gemma-2-9b-tp1.json").read_text())
    for field in ("num_blocks", "scheduler_block_size", "hash_block_size", "max_concurrency",
                  "kv_cache_size_tokens", "kv_cache_tensors", "views"):
        assert view[field] == expected[field], field
    assert [g["layer_names"] for g in view["groups"]] == \
        [g["layer_names"] for g in expected["groups"]]


def test_plan_json_rejection_exits_1_with_error_view() -> None:
    code, stdout, _ = invoke(["plan", LLAMA, "--memory", "1GiB", "--json"])
    assert code == 1
    view = json.loads(stdout)
    assert view["ok"] is False and view["error"]["type"] == "NotEnoughMemoryError"
    assert view["estimated_max_model_len"] == 8176


def test_plan_sweep() -> None:
    code, stdout, _ = invoke(["plan", LLAMA, "--memory", "10GiB..40GiB:10GiB"])
    assert code == 0
    lines = stdout.splitlines()
    assert lines[0].split() == ["memory", "blocks", "KV", "tokens", "concurrency",
                                "max_model_len"]
    assert "does not fit one request" in lines[2]   # 10 GiB < 16 GiB for one request
    assert "40.00 GiB" in lines[-1] and "327,680" in lines[-1]


def test_plan_without_budget_is_a_usage_hint(tmp_path: Path) -> None:
    src = tmp_path / "m.yaml"
    src.write_text(Path(LLAMA).read_text().replace("  memory: 40GiB\n", ""))
    code, _, stderr = invoke(["plan", str(src)])
    assert code == 1
    assert "no memory budget" in stderr and "hint: e.g. --memory 40GiB" in stderr


def test_import_round_trip_and_replaces_only_its_own_output(tmp_path: Path) -> None:
    out = tmp_path / "jamba.yaml"
    dump = str(CONFORMANCE / "cases" / "jamba-v0.1-tp1.json")
    code, _, stderr = invoke(["import", dump, "-o", str(out)])
    assert code == 0, stderr
    text = out.read_text()
    assert text.startswith("# yaml-language-server: $schema=")
    assert "- {repeat: 4, pattern: [mamba, mamba, mamba, mamba, full, mamba, mamba, mamba]}" in text
    assert invoke(["import", dump, "-o", str(out)])[0] == 0  # its own output: replaced
    assert invoke(["validate", str(out)])[0] == 0
    out.write_text("# reviewed by hand\n" + text.split("\nkvspec: 1\n", 1)[1])
    code, _, stderr = invoke(["import", dump, "-o", str(out)])
    assert code == 2 and "exists and is not a file kvspec wrote" in stderr


def test_import_unsupported_kind(tmp_path: Path) -> None:
    dump = tmp_path / "d.json"
    dump.write_text(json.dumps({"config": {"block_size": 16, "max_model_len": 1024},
                                "layers": [{"name": "a", "kind": "hisparse_hot"}]}))
    code, _, stderr = invoke(["import", str(dump)])
    assert code == 1
    assert "kind 'hisparse_hot' is not supported yet" in stderr


def test_import_bad_json(tmp_path: Path) -> None:
    dump = tmp_path / "d.json"
    dump.write_text("{not json")
    code, _, stderr = invoke(["import", str(dump)])
    assert code == 1
    assert stderr.startswith(f"{dump}:1:2: error: not valid JSON")


def test_an_argument_with_a_nul_is_a_usage_error(tmp_path: Path) -> None:
    # only a Python caller can pass one (a process's argv cannot hold NUL)
    code, out, err = invoke(["import", "-o", str(tmp_path / "a\x00b"), str(ROOT / "tests" /
                             "conformance" / "cases" / "synthetic-uniform.json")])
    assert (code, out) == (2, "")
    assert err.startswith("kvspec: error: an argument holds a NUL character\n")
    assert "\\x00" in err and "  hint: " in err and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["2**40.txt", "[a].json", "a?.json"])
def test_an_output_name_with_glob_characters_is_written(tmp_path: Path, name: str) -> None:
    out = tmp_path / name
    code, _, err = invoke(["explain", "-o", str(out), str(ROOT / "layouts" /
                                                         "llama-3.1-8b.kvlayout.json")])
    assert code == 0, err
    assert out.is_file() and [p.name for p in tmp_path.iterdir()] == [name]


@pytest.mark.parametrize("path", ["", "/", ".."])
def test_compile_of_no_file_name_is_a_usage_error(path: str) -> None:
    code, out, err = invoke(["compile", path])
    assert (code, out) == (2, "") and "is no layout source file" in err and "hint:" in err


@pytest.mark.parametrize("memory,message,hint", [
    ("80GiB..40GiB", "--memory range must go from small to large", "swap the ends: 40GiB..80GiB"),
    ("20GiB..80GiB:0", "--memory range step must be positive", "leave the step out"),
])
def test_a_backwards_memory_range_says_how_to_write_it(memory: str, message: str,
                                                       hint: str) -> None:
    code, out, err = invoke(["plan", LLAMA, "--memory", memory])
    assert (code, out) == (2, "")
    assert err.startswith(f"kvspec: error: {message}\n") and f"  hint: {hint}" in err
