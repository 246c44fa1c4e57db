"""The output contract every command keeps (docs/cli.md, "Conventions"): ``--format
text|json``; under json, errors as JSON on stdout with the text message's fields; one
full message format for every error, usage errors included; exit codes 0/1/2/130;
vLLM's flag names; "did you mean"; ``--no-color`` anywhere, ``NO_COLOR`` and
``TERM=dumb``. The commands are found by introspection, so a new one is held to it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import click
import pytest

from kvspec.cli import docs as cli_docs
from kvspec.errors import KvspecError
from tests.conftest import CONFORMANCE, ROOT, invoke

LLAMA = "layouts/llama-3.1-8b.yaml"
LLAMA_ART = "layouts/llama-3.1-8b.kvlayout.json"
#: A source whose error has every part: position, path, expected, found and hint.
BAD = "tests/errors/unknown-field.yaml"
COMMANDS = dict(cli_docs.commands())


def _option(command: click.Command, name: str) -> click.Option | None:
    return next((p for p in command.params if isinstance(p, click.Option) and name in p.opts),
                None)


# -- --format on every command ------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_takes_format_text_and_json(name: str) -> None:
    fmt = _option(COMMANDS[name], "--format")
    assert fmt is not None and isinstance(fmt.type, click.Choice), name
    assert {"text", "json"} <= set(fmt.type.choices), (name, fmt.type.choices)
    assert _option(COMMANDS[name], "--no-color") is not None, name


def test_json_is_an_alias_of_format_json() -> None:
    assert invoke(["plan", LLAMA, "--json"]) == invoke(["plan", LLAMA, "--format", "json"])
    code, out, _ = invoke(["plan", LLAMA, "--json", "--format", "md"])
    assert code == 2 and "invalid value for --format: 'md'" in out


# One failing command line per command (a missing file where it reads one), and what its
# text-mode exit code is.
FAILING = [
    (["validate", "missing.yaml", "missing2.yaml"], 1),
    (["compile", "missing.yaml"], 1),
    (["plan", "missing.yaml"], 1),
    (["explain", "missing.yaml"], 1),
    (["diff", LLAMA, "missing.yaml"], 2),
    (["check", "missing.yaml"], 1),
    (["schema", "-o", "no/such/dir"], 2),
    (["init", "--from-hf", "missing.json"], 1),
    (["import", "missing.json"], 1),
    (["engine-args", "missing.kvlayout.json", "--engine", "vllm"], 1),
    (["descriptor", "missing.kvlayout.json"], 1),
    (["transfer", LLAMA_ART, "missing.kvlayout.json"], 1),
    (["verify", "missing.yaml", "--against", "vllm"], 2),
    (["plan", LLAMA, "--memroy", "1GiB"], 2),
    (["explain", LLAMA, "--memory", "lots"], 2),
    (["compile", BAD], 1),
    (["diff", BAD, LLAMA], 2),
    (["init"], 2),
    (["nosuch"], 2),
]


def _rendered(doc: dict) -> str:
    """The text message of a JSON error document's errors."""
    out = []
    for e in doc["errors"]:
        fields = {k: e[k] for k in ("file", "line", "column", "path", "expected", "found",
                                    "hint")}
        out.append(KvspecError(e["message"], **fields).render())
    return "\n".join(out)


@pytest.mark.parametrize("args,code", FAILING, ids=[" ".join(a) for a, _ in FAILING])
def test_an_error_under_format_json_is_json_on_stdout_with_the_text_fields(
        args: list[str], code: int, tmp_path: Path) -> None:
    text_code, text_out, text_err = invoke(args)
    assert text_code == code and text_err, (text_out, text_err)
    json_args = [*args, "--format", "json"] if args[0] != "nosuch" else ["--format", "json"]
    json_code, out, err = invoke(json_args if args[0] != "nosuch" else ["nosuch", "--json"])
    assert json_code == code, (out, err)
    doc = json.loads(out)
    if args[0] == "validate" and json_code == 1:  # one result per source, each with its errors
        assert [d["ok"] for d in doc] == [False, False]
        doc = {"ok": False, "errors": [e for d in doc for e in d["errors"]]}
    assert doc["ok"] is False and doc["errors"]
    for e in doc["errors"]:
        assert set(e) == {"type", "message", "file", "line", "column", "path", "expected",
                          "found", "hint"}
        assert e["hint"], e
    expected = _rendered(doc)
    lines = [line for line in text_err.splitlines() if "sources have problems" not in line]
    assert "\n".join(lines) == expected
    assert err == ""


def test_a_budget_error_of_plan_json_keeps_the_reference_view_and_the_fields() -> None:
    code, out, _ = invoke(["plan", LLAMA, "--memory", "1GiB", "--format", "json"])
    view = json.loads(out)
    assert code == 1 and view["ok"] is False and view["num_blocks"] is None
    (error,) = view["errors"]
    assert error["path"] == "engine.max_model_len" and error["line"] and error["hint"]


@pytest.mark.parametrize("args", [["compile", BAD], ["plan", BAD], ["explain", BAD],
                                  ["diff", BAD, LLAMA], ["diff", LLAMA, BAD]],
                         ids=" ".join)
def test_every_command_gives_the_full_error(args: list[str]) -> None:
    _, _, full = invoke(["validate", BAD])
    assert "  at: " in full and "  expected: " in full and "  hint: " in full
    _, _, err = invoke(args)
    assert err == full


def test_a_field_error_in_diff_has_its_position() -> None:
    code, out, err = invoke(["diff", LLAMA, "tests/errors/bool-as-int.yaml"])
    assert (code, out) == (2, "")
    assert err == invoke(["validate", "tests/errors/bool-as-int.yaml"])[2]


# -- exit codes ----------------------------------------------------------------------------

def test_one_exit_code_table_documents_0_1_2_130() -> None:
    from kvspec.cli.common import EXIT_CODES
    assert [c for c, _ in EXIT_CODES] == [0, 1, 2, 130]
    page = (ROOT / "docs" / "cli.md").read_text()
    for code, meaning in EXIT_CODES:
        assert f"| {code} | {meaning} |" in page
    for name in COMMANDS:
        assert 130 in {c for c, _ in cli_docs.exit_codes(name)}


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_ctrl_c_exits_130(fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import kvspec.compiler

    def interrupted(*args: object, **kwargs: object) -> None:
        signal.raise_signal(signal.SIGINT)   # what the terminal sends on Ctrl-C

    monkeypatch.setattr(kvspec.compiler, "compile_until", interrupted)
    code, out, err = invoke(["validate", LLAMA, "--format", fmt])
    assert code == 130
    if fmt == "json":  # (click ends the line the terminal shows ^C on)
        assert json.loads(out)["errors"][0]["message"] == "interrupted" and err.strip() == ""
    else:
        assert err.lstrip("\n").startswith("kvspec: error: interrupted\n  hint: ")


def test_bad_option_values_are_usage_errors_alike() -> None:
    config = "tests/data/hf/qwen3-8b.json"
    for option in (["--kv-cache-dtype", "fp9"], ["--target", "tpu"], ["--tp", "0"]):
        code, out, err = invoke(["init", "--from-hf", config, *option])
        assert (code, out) == (2, ""), option
        assert err.startswith("kvspec: error: invalid value for ") and "\n  hint: " in err


# -- vLLM's flag names, did-you-mean -----------------------------------------------------

def test_vllm_parallel_flags_are_aliases(tmp_path: Path) -> None:
    config = "tests/data/hf/llama-3.1-8b.json"
    base = ["init", "--from-hf", config, "--max-model-len", "8192"]
    ours = invoke([*base, "--tp", "2", "--pp", "2", "--dcp", "2"])
    assert ours[0] == 0, ours[2]
    assert "parallel: {tensor: 2, pipeline: 2, decode_context: 2}" in ours[1]
    for names in (["--tensor-parallel-size", "--pipeline-parallel-size",
                   "--decode-context-parallel-size"], ["-tp", "-pp", "-dcp"]):
        got = invoke([*base, names[0], "2", names[1], "2", names[2], "2"])
        assert got == ours


def test_kv_cache_memory_bytes_is_memory() -> None:
    for command in (["plan", LLAMA], ["explain", LLAMA], ["diff", LLAMA, LLAMA_ART],
                    ["compile", LLAMA, "-o", "-"]):
        assert invoke([*command, "--kv-cache-memory-bytes", "21474836480"]) == \
            invoke([*command, "--memory", "20GiB"]), command
    assert invoke(["plan", LLAMA, "--num-gpu-blocks-override", "9000"]) == \
        invoke(["plan", LLAMA, "--num-blocks", "9000"])


@pytest.mark.parametrize("args,found,hint", [
    (["plan", LLAMA, "--memroy", "1GiB"], "--memroy", "did you mean --memory?"),
    (["plan", LLAMA, "-tp", "2"], "-tp", "-tp is an option of `kvspec init`"),
    (["init", "--tensor-paralel-size", "2"], "--tensor-paralel-size",
     "did you mean --tensor-parallel-size?"),
    (["explain", LLAMA, "--fromat", "md"], "--fromat", "did you mean --format?"),
    (["plann", LLAMA], "plann", "did you mean plan?"),
])
def test_unknown_options_get_a_did_you_mean(args: list[str], found: str, hint: str) -> None:
    code, out, err = invoke(args)
    assert (code, out) == (2, "")
    assert f"\n  found: {found}\n" in err and f"  hint: {hint}" in err
    assert "Usage:" not in err and "Traceback" not in err


# -- colour --------------------------------------------------------------------------------

def _stderr_on_a_terminal(args: list[str], **env: str) -> str:
    """stderr of ``kvspec ARGS`` with a pseudo-terminal as its stderr."""
    import pty

    master, slave = pty.openpty()
    environ = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "TERM")} | env
    proc = subprocess.Popen([sys.executable, "-m", "kvspec", *args], cwd=ROOT, env=environ,
                            stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=120)
    os.close(master)
    return b"".join(chunks).decode()


@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")
def test_no_color_anywhere_no_color_env_and_a_dumb_terminal() -> None:
    assert "\x1b[" in _stderr_on_a_terminal(["compile", "missing.yaml"], TERM="xterm")
    for args in (["compile", "--no-color", "missing.yaml"],
                 ["compile", "missing.yaml", "--no-color"],
                 ["compile", "missing.yaml", "--no-such", "--no-color"]):
        assert "\x1b[" not in _stderr_on_a_terminal(args, TERM="xterm"), args
    assert "\x1b[" not in _stderr_on_a_terminal(["compile", "missing.yaml"], TERM="dumb")
    assert "\x1b[" not in _stderr_on_a_terminal(["compile", "missing.yaml"], TERM="xterm",
                                                 NO_COLOR="1")


def test_import_takes_the_contract_too(tmp_path: Path) -> None:
    dump = str(CONFORMANCE / "cases" / "gemma-2-9b-tp1.json")
    code, out, _ = invoke(["import", dump, "--format", "json"])
    data = json.loads(out)
    assert code == 0 and data["ok"] is True and data["output"] is None
    assert "\nkvspec: 1\n" in data["source"]


def test_load_without_torch_names_the_extra() -> None:
    script = ("import sys; sys.modules['torch'] = None\n"
              "import kvspec\n"
              "try:\n"
              "    kvspec.load('layouts/llama-3.1-8b.kvlayout.json', device='meta')\n"
              "except kvspec.KvspecError as err:\n"
              "    print(err.render())\n")
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, check=True).stdout
    assert out.startswith("kvspec: error: kvspec.load needs the runtime extra, and torch "
                          "is not installed\n")
    assert "  hint: pip install 'kvspec[runtime]'" in out
