"""Output files (``-o``): the suffixes a command writes, ``--parents``, regenerating a
command's own earlier output without ``--force``; and progress bars, on a terminal
only (docs/cli.md, "Conventions")."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvspec.cli.progress import Progress, progress
from tests.conftest import CONFORMANCE, ROOT, invoke

LLAMA = "layouts/llama-3.1-8b.yaml"
QWEN_CONFIG = "tests/data/hf/qwen3-8b.json"
DUMP = str(CONFORMANCE / "cases" / "gemma-2-9b-tp1.json")

#: (command line without -o, a suffix it writes, the suffixes its refusal names)
WRITERS = [
    (["compile", LLAMA], ".kvlayout.json", ".kvlayout.json or .json"),
    (["explain", LLAMA], ".html", ".html, .md, .json, .txt, .htm, .markdown or .text"),
    (["explain", LLAMA, "--format", "md"], ".md", ".md or .markdown"),
    (["init", "--from-hf", QWEN_CONFIG], ".yaml", ".yaml or .yml"),
    (["import", DUMP], ".yaml", ".yaml or .yml"),
]
IDS = [" ".join(a[:1] + a[2:]) for a, _, _ in WRITERS]


@pytest.mark.parametrize("args,good,named", WRITERS, ids=IDS)
def test_a_suffix_the_command_does_not_write_is_refused(args: list[str], good: str,
                                                        named: str, tmp_path: Path) -> None:
    for bad in ("report.pdf", "notes"):
        code, out, err = invoke([*args, "-o", str(tmp_path / bad)])
        assert (code, out) == (2, ""), err
        assert f"this command writes {named} files, not " in err and "\n  hint: name" in err
    assert list(tmp_path.iterdir()) == []
    assert invoke([*args, "-o", str(tmp_path / f"out{good}")])[0] == 0


@pytest.mark.parametrize("args,good,named", WRITERS, ids=IDS)
def test_a_missing_directory_needs_parents(args: list[str], good: str, named: str,
                                           tmp_path: Path) -> None:
    out = tmp_path / "no" / "such" / f"out{good}"
    code, _, err = invoke([*args, "-o", str(out)])
    assert code == 2 and f"the directory {out.parent} does not exist" in err
    assert "pass --parents" in err and not (tmp_path / "no").exists()
    assert invoke([*args, "-o", str(out), "--parents"])[0] == 0 and out.is_file()


def test_schema_needs_parents_for_a_missing_parent(tmp_path: Path) -> None:
    assert invoke(["schema", "-o", str(tmp_path / "a" / "b")])[0] == 2
    assert invoke(["schema", "-q", "-o", str(tmp_path / "a")]) == (0, "", "")
    assert invoke(["schema", "-q", "-o", str(tmp_path / "x" / "y"), "--parents"])[0] == 0


@pytest.mark.parametrize("args,good,named", WRITERS, ids=IDS)
def test_own_earlier_output_is_replaced_without_force(args: list[str], good: str,
                                                      named: str, tmp_path: Path) -> None:
    out = tmp_path / f"out{good}"
    assert invoke([*args, "-o", str(out)])[0] == 0
    first = out.read_text()
    code, _, err = invoke([*args, "-o", str(out)])
    assert code == 0, err
    assert out.read_text() == first
    out.write_text("my notes\n")
    code, _, err = invoke([*args, "-o", str(out)])
    assert code == 2 and "exists and is not a file kvspec wrote" in err
    assert out.read_text() == "my notes\n"
    assert invoke([*args, "-o", str(out), "--force"])[0] == 0


@pytest.mark.parametrize("fmt", ["text", "md", "html", "json"])
def test_explain_replaces_its_report_in_any_format(fmt: str, tmp_path: Path) -> None:
    suffix = {"text": ".txt", "md": ".md", "html": ".html", "json": ".json"}[fmt]
    out = tmp_path / f"r{suffix}"
    assert invoke(["explain", LLAMA, "-o", str(out)])[0] == 0
    assert invoke(["explain", "layouts/gemma-2-9b-it.yaml", "-o", str(out)])[0] == 0
    assert "gemma-2-9b-it" in out.read_text()


def test_a_reviewed_source_is_not_init_output_any_more(tmp_path: Path) -> None:
    out = tmp_path / "m.yaml"
    assert invoke(["init", "--from-hf", QWEN_CONFIG, "-o", str(out)])[0] == 0
    text = out.read_text()
    assert "# Review it before use:" in text
    reviewed = text.replace("# Review it before use:", "# Reviewed (was: review it):")
    out.write_text(reviewed)
    code, _, err = invoke(["init", "--from-hf", QWEN_CONFIG, "-o", str(out)])
    assert code == 2 and "pass --force" in err and out.read_text() == reviewed


def test_the_repositorys_reviewed_layouts_are_safe_from_init() -> None:
    from kvspec.cli.common import written_by
    for src in sorted((ROOT / "layouts").glob("*.yaml")):
        assert not written_by("init")(src.read_text()), src.name
        assert not written_by("import")(src.read_text()), src.name


# -- control characters in layer names ---------------------------------------------------

@pytest.mark.parametrize("name,char", [(r"model.layers.{index}.\e[31mattn", r"\x1b"),
                                       (r"model.layers.{index}.a\u202etta", r"\u202e"),
                                       (r"model.layers.{index}.\x07", r"\x07")])
def test_a_control_character_in_a_layer_name_is_refused_at_its_place(
        name: str, char: str, tmp_path: Path) -> None:
    text = Path(LLAMA).read_text()
    src = tmp_path / "m.yaml"
    assert 'layer_name: "model.layers.{index}.self_attn.attn"' in text
    src.write_text(text.replace('layer_name: "model.layers.{index}.self_attn.attn"',
                                f'layer_name: "{name}"'))
    code, out, err = invoke(["validate", str(src)])
    line = next(i for i, s in enumerate(src.read_text().splitlines(), 1)
                if s.startswith("layer_name:"))
    assert (code, out) == (1, "")
    assert err.startswith(f"{src}:{line}:13: error: layer_name template holds a control "
                          f"character ({char}) at character ")
    assert "\x1b" not in err and "\u202e" not in err and "  hint: " in err


def test_an_explicit_layer_name_is_checked_too(tmp_path: Path) -> None:
    src = tmp_path / "m.yaml"
    src.write_text(Path(LLAMA).read_text().rstrip("\n")
                   + '\n  - {name: "mtp\\e]0;pwned\\a", type: attn}\n')
    code, _, err = invoke(["validate", str(src)])
    assert code == 1 and "layer name holds a control character (\\x1b)" in err
    assert "  at: layers[1].name" in err


# -- progress ------------------------------------------------------------------------------

class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_bar_shows_on_a_terminal_after_the_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERM", "xterm")
    clock = iter([0.0, 0.5, 2.0, 2.5, 3.0])
    tty = _Terminal()
    bar = Progress(3, "work", tty, enabled=True, delay=1.0, clock=lambda: next(clock))
    bar.advance("read")
    assert not bar.shown and tty.getvalue() == ""    # quick work draws nothing
    bar.advance("plan")
    assert bar.shown and "work" in tty.getvalue()
    bar.advance("write")
    bar.close()


@pytest.mark.parametrize("stream,quiet,term", [(io.StringIO(), False, "xterm"),
                                               (_Terminal(), True, "xterm"),
                                               (_Terminal(), False, "dumb")])
def test_no_bar_off_a_terminal_quiet_or_dumb(stream: io.StringIO, quiet: bool, term: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERM", term)
    with progress(2, label="work", stream=stream, quiet=quiet, delay=0) as bar:
        bar.advance("a")
        bar.advance("b")
    assert not bar.shown and stream.getvalue() == ""


def _stderr(args: list[str], tty: bool) -> str:
    env = {**os.environ, "KVSPEC_PROGRESS_DELAY": "0", "TERM": "xterm"}
    env.pop("NO_COLOR", None)
    if not tty:
        proc = subprocess.run([sys.executable, "-m", "kvspec", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120, check=False)
        return proc.stderr
    import pty

    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "kvspec", *args], cwd=ROOT, env=env,
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
@pytest.mark.parametrize("command", ["explain", "compile"])
def test_long_commands_draw_a_bar_on_a_terminal_only(command: str, tmp_path: Path) -> None:
    out = tmp_path / ("r.html" if command == "explain" else "a.kvlayout.json")
    args = [command, str(ROOT / LLAMA), "-o", str(out)]
    on_tty = _stderr(args, tty=True)
    assert f"\r\x1b[?25l{command}  [" in on_tty and f"wrote {out}" in on_tty
    assert _stderr([*args, "-q"], tty=True) == ""
    piped = _stderr(args, tty=False)
    assert piped == f"wrote {out}\n"
