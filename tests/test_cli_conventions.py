"""What every command shares: results on stdout, notes and warnings on stderr,
``--quiet``, ``--format json``, colour only on a terminal, never losing a file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import CONFORMANCE, ROOT, invoke

LLAMA = "layouts/llama-3.1-8b.yaml"
LLAMA_ART = "layouts/llama-3.1-8b.kvlayout.json"
GEMMA3 = "layouts/gemma-3-27b-it.yaml"  # planning warns: padding layers
BAD = "tests/errors/unknown-field.yaml"


# validate ------------------------------------------------------------------------

def test_validate_checks_every_source_after_a_failure() -> None:
    code, out, err = invoke(["validate", BAD, LLAMA, "missing.yaml"])
    assert code == 1
    assert out == f"{LLAMA}: ok\n"
    assert err.startswith(f"{BAD}:6:3: error: unknown field 'max_num_seq'\n")
    assert "missing.yaml: error: no such file\n" in err
    assert err.endswith("2 of 3 sources have problems\n")


def test_validate_json_one_object_per_source() -> None:
    code, out, err = invoke(["validate", "--format", "json", LLAMA, BAD, GEMMA3])
    assert (code, err) == (1, "")
    data = json.loads(out)
    assert [(d["file"], d["ok"]) for d in data] == [(LLAMA, True), (BAD, False), (GEMMA3, True)]
    (problem,) = data[1]["errors"]
    assert (problem["line"], problem["column"], problem["path"]) == (6, 3, "engine.max_num_seq")
    assert problem["hint"] == "did you mean 'max_num_seqs'?"
    assert data[2]["warnings"] and "padding layers" in data[2]["warnings"][0]


def test_validate_quiet_prints_only_problems() -> None:
    assert invoke(["validate", "-q", LLAMA]) == (0, "", "")
    code, out, err = invoke(["validate", "-q", LLAMA, BAD])
    assert (code, out) == (1, "") and "unknown field" in err
    assert "sources have problems" not in err


# compile / plan / explain: streams -----------------------------------------------

def test_warnings_go_to_stderr_and_quiet_silences_them(tmp_path: Path) -> None:
    code, out, err = invoke(["plan", GEMMA3])
    assert code == 0 and "warning" not in out
    assert err.startswith("warning: Add 8 padding layers")
    code, out_q, err_q = invoke(["plan", "-q", GEMMA3])
    assert (code, out_q, err_q) == (0, out, "")
    art = tmp_path / "g.kvlayout.json"
    code, out, err = invoke(["compile", GEMMA3, "-o", str(art)])
    assert code == 0 and "warning" not in out
    assert err == ("warning: Add 8 padding layers, may waste at most 15.38% KV cache "
                   f"memory\nwrote {art}\n")


def test_plan_reads_artifacts_like_sources() -> None:
    for memory in ("20GiB", "80GiB"):
        from_source = invoke(["plan", LLAMA, "--memory", memory])
        assert from_source[0] == 0
        assert invoke(["plan", LLAMA_ART, "--memory", memory]) == from_source
    assert invoke(["plan", LLAMA_ART, "--json"])[1] == invoke(["plan", LLAMA, "--json"])[1]


@pytest.mark.parametrize("args,message", [
    (["--views"], "--views needs --format json"),
    (["--memory", "1GiB", "--num-blocks", "3"], "--memory and --num-blocks exclude each other"),
    (["--num-blocks", "0"], "0 is not in the range x>=1"),
    (["--memory", "1GiB..100GiB:1MiB"], "--memory range has 101,377 points; at most 1,000"),
    (["--memory", "ten gigs"], "--memory"),
])
def test_plan_usage_errors(args: list[str], message: str) -> None:
    code, out, err = invoke(["plan", LLAMA, *args])
    assert (code, out) == (2, "")
    assert message in err
    assert "Traceback" not in err


@pytest.mark.parametrize("command", ["explain", "diff"])
def test_one_memory_only_where_a_sweep_means_nothing(command: str) -> None:
    args = [LLAMA] if command == "explain" else [LLAMA, LLAMA]
    code, _, err = invoke([command, *args, "--memory", "20GiB..40GiB"])
    assert code == 2
    assert "--memory takes one size here, not a range" in err


def test_explain_json_follows_the_report(tmp_path: Path) -> None:
    code, out, _ = invoke(["explain", LLAMA, "--format", "json", "--memory", "20GiB"])
    assert code == 0
    data = json.loads(out)
    assert data["capacity"]["num_blocks"] == 10240
    assert data["engine"]["layout"] == "LBNHC"
    assert [g["kind"] for g in data["groups"]] == ["full_attention"]
    target = tmp_path / "report.json"
    code, out, err = invoke(["explain", LLAMA, "-o", str(target), "--memory", "20GiB"])
    assert (code, out, err) == (0, "", f"wrote {target}\n")
    assert json.loads(target.read_text()) == data
    assert invoke(["explain", "-q", LLAMA, "-o", str(target), "--force"])[1:] == ("", "")


def test_explain_never_overwrites_without_force(tmp_path: Path) -> None:
    target = tmp_path / "report.md"
    target.write_text("my notes\n")
    code, _, err = invoke(["explain", LLAMA, "-o", str(target)])
    assert code == 2 and f"{target} exists" in err
    assert target.read_text() == "my notes\n"
    src = tmp_path / "m.yaml"
    src.write_text(Path(LLAMA).read_text())
    code, _, err = invoke(["explain", str(src), "-o", str(src), "--force"])
    assert code == 2 and "is the input" in err
    assert src.read_text() == Path(LLAMA).read_text()


# diff / check / schema / import ----------------------------------------------------

def test_diff_quiet_says_it_only_with_the_exit_status() -> None:
    assert invoke(["diff", "-q", LLAMA, LLAMA_ART]) == (0, "", "")
    assert invoke(["diff", "-q", LLAMA, "layouts/qwen3-8b.yaml"]) == (1, "", "")
    code, out, err = invoke(["diff", "-q", LLAMA, BAD])
    assert (code, out) == (2, "") and "unknown field" in err


def test_check_json_lists_every_finding(tmp_path: Path) -> None:
    code, out, err = invoke(["check", "--format", "json", "layouts"])
    assert (code, err) == (0, "")
    data = json.loads(out)
    assert data["ok"] is True
    sources = sorted(str(p) for p in (ROOT / "layouts").glob("*.yaml"))
    assert sorted(str(ROOT / f["source"]) for f in data["findings"]) == sources
    assert {f["status"] for f in data["findings"]} == {"current"}
    assert invoke(["check", "-q", "layouts"]) == (0, "", "")


def test_check_with_nothing_to_check_is_an_error(tmp_path: Path) -> None:
    code, out, err = invoke(["check", str(tmp_path)])
    assert (code, out) == (1, "")
    assert err.startswith(f"{tmp_path}: error: no layout sources or artifacts to check\n")


def test_check_reports_an_unreadable_artifact_as_stale(tmp_path: Path) -> None:
    (tmp_path / "m.yaml").write_text(Path(LLAMA).read_text())
    (tmp_path / "m.kvlayout.json").write_bytes(b"\xff\xfe not utf-8")
    code, out, _ = invoke(["check", "--format", "json", str(tmp_path)])
    assert code == 1
    (finding,) = json.loads(out)["findings"]
    assert finding["status"] == "stale"
    assert finding["detail"].startswith("not a readable artifact")


def test_schema_notes_go_to_stderr(tmp_path: Path) -> None:
    code, out, err = invoke(["schema", "-o", str(tmp_path)])
    assert (code, out) == (0, "")
    assert err == (f"wrote {tmp_path}/source.schema.json\n"
                   f"wrote {tmp_path}/artifact.schema.json\n"
                   f"wrote {tmp_path}/descriptor.schema.json\n"
                   f"wrote {tmp_path}/profile.schema.json\n"
                   f"wrote {tmp_path}/sweep.schema.json\n")
    assert invoke(["schema", "-q", "-o", str(tmp_path)]) == (0, "", "")
    assert invoke(["schema", "--check", "-o", str(tmp_path)]) == (
        0, "", f"{tmp_path}: schemas are current\n")


def test_import_never_writes_over_its_dump(tmp_path: Path) -> None:
    dump = tmp_path / "d.json"
    dump.write_text((CONFORMANCE / "cases" / "gemma-2-9b-tp1.json").read_text())
    before = dump.read_text()
    code, _, err = invoke(["import", str(dump), "-o", str(dump), "--force"])
    assert code == 2 and "is the input" in err
    assert dump.read_text() == before
    out = tmp_path / "m.yaml"
    code, stdout, stderr = invoke(["import", "-q", str(dump), "-o", str(out)])
    assert (code, stdout, stderr) == (0, "", "")
    assert "\nkvspec: 1\n" in "\n" + out.read_text()


# --help and colour -----------------------------------------------------------------

def test_top_level_help_is_not_truncated() -> None:
    code, out, _ = invoke(["--help"])
    assert code == 0
    commands = out.split("Commands:\n", 1)[1].splitlines()
    assert len(commands) >= 9
    assert not [line for line in commands if line.rstrip().endswith("...")]


def _stderr_on_a_terminal(args: list[str], **extra_env: str) -> str:
    """stderr of ``kvspec ARGS`` run with a pseudo-terminal as its stderr."""
    import pty

    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"} | extra_env
    proc = subprocess.Popen([sys.executable, "-m", "kvspec", *args], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=60)
    os.close(master)
    return b"".join(chunks).decode()


@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")
def test_colour_on_a_terminal_only() -> None:
    tty = _stderr_on_a_terminal(["compile", "missing.yaml"])
    assert "\x1b[31m\x1b[1merror:\x1b[0m" in tty
    assert "\x1b[36mhint:\x1b[0m" in tty
    assert "\x1b[" not in _stderr_on_a_terminal(["--no-color", "compile", "missing.yaml"])
    assert "\x1b[" not in _stderr_on_a_terminal(["compile", "missing.yaml"], NO_COLOR="1")
    code, _, err = invoke(["compile", "missing.yaml"])  # not a terminal: plain
    assert code == 1 and "\x1b[" not in err


def test_init_quiet_and_never_over_its_config(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text((ROOT / "tests" / "data" / "hf" / "qwen3-8b.json").read_text())
    out = tmp_path / "m.yaml"
    assert invoke(["init", "-q", "--from-hf", str(config), "-o", str(out)]) == (0, "", "")
    assert "\nkvspec: 1\n" in out.read_text()
    before = config.read_text()
    code, _, err = invoke(["init", "--from-hf", str(config), "-o", str(config), "--force"])
    assert code == 2 and "is the input" in err
    assert config.read_text() == before
    code, _, err = invoke(["init", "--from-hf", str(config), "--memory", "20GiB..40GiB"])
    assert code == 2 and "--memory takes one size here" in err
