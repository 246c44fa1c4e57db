"""Inputs a fuzzer or a tired user produces: each gets a clear error with its
position (never a traceback), and nothing the user had is lost.

The error goldens in tests/errors/ hold the source-file cases; this module
holds the ones that need a command line, a dump, an API call, a generated
file or an edited artifact.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

import kvspec
from kvspec.errors import ArtifactError, KvspecError
from tests.conftest import CONFORMANCE, ROOT, invoke

LLAMA = "layouts/llama-3.1-8b.yaml"
BASE = """kvspec: 1
name: t
engine: {block_size: 16, max_model_len: 4096, memory: 8GiB}
defaults: {num_kv_heads: 8, head_size: 128, dtype: bfloat16}
layer_types:
  full: {kind: full_attention}
layers:
  - {type: full, repeat: 4}
"""


# the Python API takes what the command line takes --------------------------------

def test_the_api_reads_sizes_like_the_command_line() -> None:
    by_string = kvspec.compile(LLAMA, memory="20GiB")
    assert by_string.text() == kvspec.compile(LLAMA, memory=20 * 2**30).text()
    assert by_string.data["body"]["budget"]["num_blocks"] == 10240
    assert by_string.num_blocks_for(memory="40GiB") == 20480
    assert by_string.num_blocks_for(memory=40 * 2**30) == 20480


@pytest.mark.parametrize("memory", ["lots", "40GiB,", "40,000,000,000", -5, True, 2.5,
                                    "20GiB..40GiB", [1]])
def test_the_api_refuses_what_is_not_a_size(memory: Any) -> None:
    with pytest.raises(KvspecError, match=r"cannot read .* as a size"):
        kvspec.compile(LLAMA, memory=memory)
    with pytest.raises(KvspecError, match=r"cannot read .* as a size"):
        kvspec.compile(LLAMA).num_blocks_for(memory=memory)


def test_loading_a_source_says_to_compile_it() -> None:
    pytest.importorskip("torch", reason="the loader needs torch")
    with pytest.raises(ArtifactError) as info:
        kvspec.load(LLAMA, device="meta")
    assert (
        str(info.value).splitlines()[0]
        == f"{LLAMA}: error: this is a layout source, not an artifact"
    )
    assert info.value.hint == (f"compile it with `kvspec compile {LLAMA}` and use the "
                               ".kvlayout.json it writes")


# a budget is reported where it came from ----------------------------------------------

def test_a_budget_too_small_is_reported_at_the_flag_not_the_source() -> None:
    code, _, err = invoke(["compile", LLAMA, "--memory", "1MiB", "-o", "never.json"])
    assert code == 1
    assert err == (
        f"{LLAMA}: error: no memory is left for KV cache blocks: 1,048,576 bytes do not "
        "hold the null block and one more block (2,097,152 bytes each; the largest page is "
        "model.layers.0.self_attn.attn's, 65,536 bytes, in a group of 32 layers)\n"
        "  at: --memory\n  found: 1,048,576 bytes\n"
        "  hint: give the KV cache more memory (--memory)\n")
    code, _, plan_err = invoke(["plan", LLAMA, "--memory", "1MiB"])
    assert (code, plan_err) == (1, err)
    with pytest.raises(KvspecError) as info:
        kvspec.compile(LLAMA, memory="1MiB")
    assert (info.value.file, info.value.line, info.value.path) == (LLAMA, None, "memory")
    # the source's own engine.memory is reported at its line
    code, _, err = invoke(["validate", "tests/errors/not-enough-memory.yaml"])
    assert err.startswith("tests/errors/not-enough-memory.yaml:3:41: error:")


def test_a_request_too_long_for_the_flag_points_at_max_model_len() -> None:
    for layout in (LLAMA, "layouts/llama-3.1-8b.kvlayout.json"):
        code, _, err = invoke(["plan", layout, "--memory", "1GiB"])
        assert code == 1
        assert err.startswith(f"{layout}:") and "estimated maximum model length is 8176" in err
        assert "  at: engine.max_model_len\n" in err


# output paths ----------------------------------------------------------------------

@pytest.mark.parametrize(
    "command",
    [
        ["compile", LLAMA],
        ["explain", LLAMA],
        ["init", "--from-hf", "tests/data/hf/qwen3-8b.json"],
        ["import", str(CONFORMANCE / "cases" / "gemma-2-9b-tp1.json")],
    ],
)
def test_an_output_under_a_file_is_a_clear_error(command: list[str], tmp_path: Path) -> None:
    blocker = tmp_path / "afile"
    blocker.write_text("keep me\n")
    code, _, err = invoke([*command, "-o", str(blocker / "x.out")])
    assert code == 2, err
    assert f"cannot write {blocker}/x.out: {blocker} is a file, not a directory" in err
    assert "Traceback" not in err
    assert blocker.read_text() == "keep me\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_stale_temporaries_are_cleaned_on_the_next_write(tmp_path: Path) -> None:
    out = tmp_path / "a.kvlayout.json"
    stale = tmp_path / ".a.kvlayout.json.kvspec-tmp-dead"  # left by a kill -9
    stale.write_text("{")
    import os
    os.utime(stale, (0, 0))
    assert invoke(["compile", "-q", LLAMA, "-o", str(out)])[0] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.kvlayout.json"]


_WRITERS = [["compile", LLAMA], ["explain", LLAMA],
            ["init", "--from-hf", "tests/data/hf/qwen3-8b.json"],
            ["import", str(CONFORMANCE / "cases" / "gemma-2-9b-tp1.json")]]


@pytest.mark.parametrize("command", _WRITERS, ids=lambda c: c[0])
def test_dash_writes_to_stdout_and_no_file(command: list[str], tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)   # a file named "-" would land here
    absolute = [str(ROOT / a) if (ROOT / a).exists() else a for a in command]
    code, out, err = invoke([*absolute, "-o", "-"])
    assert code == 0, err
    assert list(tmp_path.iterdir()) == []
    if command[0] == "compile":   # the artifact itself, byte for byte
        assert out == (ROOT / "layouts" / "llama-3.1-8b.kvlayout.json").read_text()
    else:
        assert out and "wrote" not in err
    if command[0] == "init":
        assert "\nname: qwen3-8b\n" in out   # named from the config, not from "-"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@pytest.mark.parametrize("command", _WRITERS, ids=lambda c: c[0])
def test_a_pipe_is_written_in_place_never_replaced(command: list[str], tmp_path: Path) -> None:
    """As /dev/null or /dev/stdout: with --force, replacing one would turn a device
    into a plain file (as root, /dev/null itself)."""
    import stat
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    code, _, err = invoke([*command, "-o", str(fifo), "--force"])
    reader.join(30)
    assert code == 0, err
    assert stat.S_ISFIFO(fifo.lstat().st_mode) and got and got[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]


def test_a_symlinked_output_keeps_its_link(tmp_path: Path) -> None:
    target, link = tmp_path / "real.kvlayout.json", tmp_path / "link.kvlayout.json"
    target.write_text("{}")   # not an artifact: --force
    link.symlink_to(target.name)
    assert invoke(["compile", "-q", LLAMA, "-o", str(link), "--force"])[0] == 0
    assert link.is_symlink() and target.read_text() == (ROOT / "layouts" /
                                                        "llama-3.1-8b.kvlayout.json").read_text()


def test_a_socket_is_not_written(tmp_path: Path) -> None:
    import socket

    path = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
        code, _, err = invoke(["explain", LLAMA, "-o", str(path), "--force"])
    assert code == 2 and "it is a device or socket, not a file" in err and "hint:" in err


# dumps -------------------------------------------------------------------------------

def _dump() -> dict[str, Any]:
    return json.loads((CONFORMANCE / "cases" / "gemma-2-9b-tp1.json").read_text())


def _config_x(d: dict) -> None:
    d["config"] = "x"


def _layer_number(d: dict) -> None:
    d["layers"][3] = 7


def _tp_word(d: dict) -> None:
    d["config"]["tensor_parallel_size"] = "two"


def _no_layers(d: dict) -> None:
    d["layers"] = []


def _not_object(d: dict) -> None:
    d.clear()
    d["__list__"] = True


@pytest.mark.parametrize("edit,where,message", [
    (_config_x, "config", "invalid value for config"),
    (_layer_number, "layers[3]", "invalid value for layers[3]"),
    (_tp_word, "config.tensor_parallel_size", "invalid value for config.tensor_parallel_size"),
    (_no_layers, "layers", "a dump needs at least one layer"),
], ids=["config-a-string", "layer-a-number", "tp-a-word", "no-layers"])
def test_a_malformed_dump_is_a_clear_error(edit, where: str, message: str,
                                           tmp_path: Path) -> None:
    data = _dump()
    edit(data)
    path = tmp_path / "dump.json"
    path.write_text(json.dumps(data, indent=1))
    code, out, err = invoke(["import", str(path)])
    assert (code, out) == (1, "")
    first = err.splitlines()[0]
    assert first.startswith(f"{path}:") and first.endswith(f"error: {message}")
    assert first.split(":")[1].isdigit(), "a line number"
    assert f"  at: {where}\n" in err


@pytest.mark.parametrize("text,message", [
    ("[1, 2]", "a spec dump must be a JSON object"),
    ('{"layers": [', "not valid JSON"),
    ("", "not valid JSON"),
])
def test_a_dump_that_is_not_a_dump(text: str, message: str, tmp_path: Path) -> None:
    path = tmp_path / "dump.json"
    path.write_text(text)
    code, _, err = invoke(["import", str(path)])
    assert code == 1 and message in err and "Traceback" not in err, err


_HEADS = '"layers": [{"name": "a", "kind": "full_attention", "num_kv_heads": "x"}]'


@pytest.mark.parametrize("text,first,expected", [
    ('{"config": {"block_size": 16,\n  "block_size": 32}}',
     "2:3: error: the dump has the key 'block_size' twice in one object", "each key once"),
    ('{"facts": ' + "[" * 70 + "]" * 70 + "}",
     "1:75: error: the dump is nested more than 64 levels deep",
     "a few levels of nesting"),
    ("[" * 5000 + "]" * 5000,
     "1:66: error: the dump is nested more than 64 levels deep",
     "a few levels of nesting"),
    ('{"config": {"block_size": 1' + "0" * 5000 + "}}",
     "1:27: error: a number with 5,001 digits: more than the dump can hold",
     "a number of at most 4,300 digits"),
    ('{"config": {"block_size": NaN}}',
     "1:27: error: not valid JSON: NaN is not a JSON number", "a finite number, or null"),
    ('{"config": {"max_model_len": -Infinity}}',
     "1:30: error: not valid JSON: -Infinity is not a JSON number",
     "a finite number, or null"),
    ("", "1:1: error: not valid JSON: Expecting value",
     'a JSON object, {"config": {...}, "layers": [...]}'),
], ids=["duplicate-key", "too-deep", "deeper-than-python-recurses", "5001-digits", "nan",
        "infinity", "empty"])
def test_json_that_python_reads_loosely_is_refused_at_its_spot(
        text: str, first: str, expected: str, tmp_path: Path) -> None:
    path = tmp_path / "dump.json"
    path.write_text(text)
    code, out, err = invoke(["import", str(path)])
    assert (code, out) == (1, "")
    assert err.splitlines()[0] == f"{path}:{first}", err
    assert f"  expected: {expected}\n" in err and "  hint: " in err


def test_a_key_twice_does_not_cost_the_other_errors_their_lines(tmp_path: Path) -> None:
    """A duplicate is refused first, at its line; fixed, the rest keep theirs."""
    path = tmp_path / "dump.json"
    path.write_text('{"config": {"block_size": 16, "max_model_len": 64},\n ' + _HEADS + "}\n")
    code, _, err = invoke(["import", str(path)])
    assert code == 1 and err.startswith(f"{path}:2:"), err


def test_an_attention_layer_without_heads_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "dump.json"
    path.write_text('{"config": {"block_size": 16, "max_model_len": 64},\n "layers": '
                    '[{"name": "a", "kind": "full_attention"}]}\n')
    code, out, err = invoke(["import", str(path)])
    assert (code, out) == (1, "") and "Traceback" not in err, err
    assert err.startswith(f"{path}:2:"), err
    assert "num_kv_heads" in err


@pytest.mark.parametrize("value", ["x", "1/0", "auto", "1e3", "-4", "0"])
def test_a_dump_tokens_per_state_that_is_no_number_is_a_clear_error(value: str,
                                                                 tmp_path: Path) -> None:
    path = tmp_path / "dump.json"
    path.write_text('{"config": {"block_size": 16, "max_model_len": 64},\n "layers": [{"name": '
                    '"a", "kind": "mla_attention", "num_kv_heads": 1, "head_size": 576, '
                    f'"dtype": "bfloat16", "tokens_per_state": "{value}"}}]}}\n')
    code, out, err = invoke(["import", str(path)])
    assert (code, out) == (1, "") and "Traceback" not in err, err
    assert err.startswith(f"{path}:2:") and "tokens_per_state" in err, err


# large inputs: refused or planned, never unbounded ---------------------------------------

def test_a_megabyte_of_keys_is_one_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text(BASE + "extra:\n" + "".join(f"  k{i}: {i}\n" for i in range(50_000)))
    assert path.stat().st_size > 700_000
    code, _, err = invoke(["validate", str(path)])
    assert code == 1
    assert err.splitlines()[0] == f"{path}:9:1: error: unknown field 'extra'"


def test_fifty_thousand_layer_types_are_read(tmp_path: Path) -> None:
    types = "".join(f"  t{i}: {{kind: full_attention}}\n" for i in range(50_000))
    path = tmp_path / "types.yaml"
    path.write_text(BASE.replace("  full: {kind: full_attention}\n",
                                 "  full: {kind: full_attention}\n" + types))
    assert path.stat().st_size > 1_000_000
    assert invoke(["validate", str(path)])[:2] == (0, f"{path}: ok\n")


def test_a_lone_surrogate_anywhere_is_refused_at_its_position() -> None:
    from kvspec.compiler import compile_source

    for text in (BASE.replace("name: t", 'name: t\nmodel: "\\ud800"'),
                 BASE.replace("name: t", 'name: t\ndescription: "x\\udfff"')):
        with pytest.raises(KvspecError) as info:
            compile_source(text, "s.yaml")
        assert info.value.line == 3 and info.value.column is not None


def test_a_lone_surrogate_from_a_python_string_is_refused() -> None:
    from kvspec.compiler import compile_source

    with pytest.raises(KvspecError, match="lone surrogate") as info:
        compile_source(BASE.replace("name: t", "name: t\nmodel: 'a\udc80b'"), "s.yaml")
    assert info.value.line == 3


# edited artifacts with their hash recomputed ------------------------------------------------

def test_a_replaced_output_keeps_its_mode(tmp_path: Path) -> None:
    out = tmp_path / "a.kvlayout.json"
    assert invoke(["compile", "-q", LLAMA, "-o", str(out)])[0] == 0
    out.chmod(0o640)
    assert invoke(["compile", "-q", LLAMA, "-o", str(out)])[0] == 0
    assert out.stat().st_mode & 0o777 == 0o640


def test_an_output_is_synced_before_and_after_its_rename(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A crash or power loss leaves the old file or the new one, never an empty one."""
    calls: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (calls.append("replace"),
                                                     real_replace(a, b))[1])
    assert invoke(["compile", "-q", LLAMA, "-o", str(tmp_path / "a.kvlayout.json")])[0] == 0
    assert calls == ["fsync", "replace", "fsync"]
