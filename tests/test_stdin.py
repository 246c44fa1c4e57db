"""``-`` as an input: every command that reads a source, an artifact, a dump or a
config reads stdin for it, names it ``<stdin>`` in messages, and reads it once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import CONFORMANCE, ROOT, invoke

LLAMA = ROOT / "layouts" / "llama-3.1-8b.yaml"
LLAMA_ART = ROOT / "layouts" / "llama-3.1-8b.kvlayout.json"
HF_LLAMA = ROOT / "tests" / "data" / "hf" / "llama-3.1-8b.json"
BAD = ROOT / "tests" / "errors" / "unknown-field.yaml"


def test_validate_reads_stdin_and_names_it() -> None:
    code, out, err = invoke(["validate", "-"], LLAMA.read_text())
    assert (code, out, err) == (0, "<stdin>: ok\n", "")


def test_validate_places_errors_in_stdin() -> None:
    code, _, err = invoke(["validate", "-"], BAD.read_text())
    _, _, from_file = invoke(["validate", str(BAD)])
    assert code == 1
    assert err == from_file.replace(str(BAD), "<stdin>")
    assert err.startswith("<stdin>:")


def test_validate_json_names_stdin_beside_files() -> None:
    code, out, _ = invoke(["validate", "--format", "json", str(LLAMA), "-"], BAD.read_text())
    results = json.loads(out)
    assert code == 1
    assert [(r["file"], r["ok"]) for r in results] == [(str(LLAMA), True), ("<stdin>", False)]
    assert results[1]["errors"][0]["file"] == "<stdin>"


def test_compile_of_stdin_is_a_filter_with_the_same_bytes() -> None:
    code, out, _ = invoke(["compile", "-"], LLAMA.read_text())
    assert code == 0
    assert out == LLAMA_ART.read_text()


def test_compile_of_stdin_to_a_file(tmp_path: Path) -> None:
    out = tmp_path / "m.kvlayout.json"
    code, stdout, err = invoke(["compile", "-", "-o", str(out)], LLAMA.read_text())
    assert code == 0
    assert out.read_text() == LLAMA_ART.read_text()
    assert stdout.startswith("llama-3.1-8b: 32 layers")
    assert err == f"wrote {out}\n"


@pytest.mark.parametrize("piped", [LLAMA, LLAMA_ART])
def test_explain_tells_a_piped_source_from_a_piped_artifact(piped: Path) -> None:
    code, out, _ = invoke(["explain", "-"], piped.read_text())
    kind = "artifact" if piped.suffix == ".json" else "source"
    assert code == 0
    assert out.splitlines()[1].startswith(f"{kind} <stdin>, kvspec ")


def test_plan_and_diff_read_stdin() -> None:
    code, out, _ = invoke(["plan", "-", "--memory", "40GiB"], LLAMA_ART.read_text())
    assert code == 0 and "20,480" in out
    code, out, _ = invoke(["diff", "-", str(LLAMA)], LLAMA_ART.read_text())
    assert code == 0
    assert out.startswith("a: <stdin> (artifact, llama-3.1-8b)\n")


@pytest.mark.parametrize("args", [["validate", "-", "-"], ["diff", "-", "-"]])
def test_stdin_is_read_once(args: list[str]) -> None:
    code, out, err = invoke(args, LLAMA.read_text())
    assert (code, out) == (2, "")
    assert "- (stdin) is given for more than one input" in err
    assert "hint: pipe one input in" in err


def test_check_needs_files() -> None:
    code, _, err = invoke(["check", "-"], LLAMA.read_text())
    assert code == 2
    assert "check takes files, not stdin (-)" in err and "hint:" in err


def test_import_reads_a_piped_dump() -> None:
    dump = CONFORMANCE / "cases" / "llama-3.1-8b-tp1.json"
    code, out, _ = invoke(["import", "-"], dump.read_text())
    _, from_file, _ = invoke(["import", str(dump)])
    assert code == 0
    assert out == from_file


def test_init_reads_a_piped_config(tmp_path: Path) -> None:
    config = tmp_path / "config.json"  # named from the config itself, as a piped one is
    config.write_text(HF_LLAMA.read_text())
    code, out, _ = invoke(["init", "--from-hf", "-"], HF_LLAMA.read_text())
    _, from_file, _ = invoke(["init", "--from-hf", str(config)])
    assert code == 0
    # a file named config.json is named for its directory too (a piped one cannot be)
    assert f"\nmodel: {tmp_path.name}\n" in from_file
    assert out == from_file.replace(str(config), "-").replace(f"model: {tmp_path.name}\n", "")
    assert "#   kvspec init --from-hf -\n" in out and "\nname: llama\n" in out


def test_init_places_a_piped_config_error() -> None:
    config = HF_LLAMA.read_text().replace('"num_key_value_heads": 8', '"num_key_value_heads": "8"')
    code, _, err = invoke(["init", "--from-hf", "-"], config)
    assert code == 1
    assert err.startswith("<stdin>:")
    assert "num_key_value_heads" in err and "hint:" in err


def test_from_vllm_is_no_stdin() -> None:
    code, _, err = invoke(["init", "--from-vllm", "-"])
    assert code == 2
    assert "--from-vllm takes a model directory, not stdin" in err


def test_bytes_that_are_not_utf8_are_placed() -> None:
    code, _, err = invoke(["validate", "-"], b"kvspec: 1\nname: \xff\n")
    assert code == 1
    assert err.startswith("<stdin>:2:7: error: the source is not UTF-8 text: byte 0xff")


def test_a_real_pipe_and_a_closed_stdin() -> None:
    kvspec = [sys.executable, "-m", "kvspec.cli"]
    piped = subprocess.run([*kvspec, "validate", "-"], input=LLAMA.read_bytes(),
                           capture_output=True, cwd=ROOT, check=False)
    assert (piped.returncode, piped.stdout) == (0, b"<stdin>: ok\n")
    closed = subprocess.run([*kvspec, "validate", "-"], stdin=subprocess.DEVNULL,
                            capture_output=True, cwd=ROOT, check=False)
    assert closed.returncode == 1  # empty: nothing to validate
    assert closed.stderr.startswith(b"<stdin>:1:1: error: the file is empty")
    shut = subprocess.run([*kvspec, "validate", "-"], capture_output=True, cwd=ROOT, check=False,
                          preexec_fn=lambda: __import__("os").close(0))
    assert shut.returncode == 1
    assert b"cannot read the source from stdin" in shut.stderr
    assert b"Traceback" not in shut.stderr
