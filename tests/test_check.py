"""``kvspec check``: committed artifacts against their sources, like a lock-file check."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from kvspec import __version__
from kvspec.cli import cli
from kvspec.cli.check import StaleArtifactError, check_paths
from kvspec.compiler import compile as compile_file
from kvspec.errors import KvspecError
from tests.conftest import ROOT, invoke

LLAMA = ROOT / "layouts" / "llama-3.1-8b.yaml"
GEMMA = ROOT / "layouts" / "gemma-2-9b-it.yaml"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A layouts directory with two current source/artifact pairs."""
    d = tmp_path / "layouts"
    d.mkdir()
    for src in (LLAMA, GEMMA):
        shutil.copy(src, d / src.name)
        art = src.with_name(src.name.replace(".yaml", ".kvlayout.json"))
        shutil.copy(art, d / art.name)
    return d


def run(*args: str):
    return CliRunner().invoke(cli, ["check", *args])


def test_all_current(repo: Path) -> None:
    result = run(str(repo))
    assert (result.exit_code, result.output) == (0, "2 artifact(s) checked: all current\n")


def test_verbose_lists_current_artifacts(repo: Path) -> None:
    result = run("-v", str(repo))
    assert result.exit_code == 0
    assert result.output.splitlines() == [
        f"{repo}/gemma-2-9b-it.kvlayout.json: current",
        f"{repo}/llama-3.1-8b.kvlayout.json: current",
        "2 artifact(s) checked: all current"]


def test_default_path_is_layouts(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(repo.parent)
    assert run().output == "2 artifact(s) checked: all current\n"


def _edit_source(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def test_stale_after_a_source_edit_then_fix(repo: Path) -> None:
    src = repo / "llama-3.1-8b.yaml"
    art = repo / "llama-3.1-8b.kvlayout.json"
    _edit_source(src, "memory: 40GiB", "memory: 80GiB")
    result = run(str(repo))
    assert result.exit_code == 1
    assert isinstance(result.exception, StaleArtifactError)
    assert result.output == f"{art}: stale: {src} changed since it was compiled\n"
    err = result.exception.render()
    assert err.splitlines()[0] == f"{repo}: error: 1 of 2 artifact(s) not current: 1 stale"
    assert "hint: run `kvspec check --fix " in err

    fixed = run("--fix", str(repo))
    assert fixed.exit_code == 0
    assert fixed.output.splitlines() == [
        f"{art}: fixed: rewrote it from {src} (was stale)",
        "2 artifact(s) checked: all current (1 rewritten)"]
    assert art.read_text() == compile_file(src).text()
    assert json.loads(art.read_text())["body"]["budget"]["num_blocks"] == 40960
    assert run(str(repo)).exit_code == 0


def test_stale_when_another_compiler_wrote_it(repo: Path) -> None:
    art = repo / "llama-3.1-8b.kvlayout.json"
    art.write_text(art.read_text().replace(f'"kvspec {__version__}"', '"kvspec 0.0.1"'))
    result = run(str(art))
    assert result.exit_code == 1
    assert result.output == (f"{art}: stale: compiled by kvspec 0.0.1; this is kvspec "
                             f"{__version__}\n")


def test_stale_when_compiled_with_another_budget(repo: Path) -> None:
    src = repo / "llama-3.1-8b.yaml"
    art = repo / "llama-3.1-8b.kvlayout.json"
    assert invoke(["compile", "-q", str(src), "--memory", "20GiB"])[0] == 0
    result = run(str(src))
    assert result.exit_code == 1
    assert result.output.startswith(f"{art}: stale: the plan differs from what this compiler "
                                    "makes of the same source")


def test_unreadable_artifact_is_stale(repo: Path) -> None:
    art = repo / "llama-3.1-8b.kvlayout.json"
    art.write_text("{not json")
    assert run(str(repo)).output.startswith(f"{art}: stale: not a readable artifact")


def test_missing_artifact_then_fix(repo: Path) -> None:
    art = repo / "gemma-2-9b-it.kvlayout.json"
    art.unlink()
    result = run(str(repo))
    assert result.exit_code == 1
    assert result.output == f"{art}: missing: compile {repo}/gemma-2-9b-it.yaml\n"
    assert "1 missing" in result.exception.message
    assert run("--fix", str(repo)).exit_code == 0
    assert art.read_text() == compile_file(repo / "gemma-2-9b-it.yaml").text()


def test_orphaned_artifact_is_not_fixable(repo: Path) -> None:
    (repo / "gemma-2-9b-it.yaml").unlink()
    art = repo / "gemma-2-9b-it.kvlayout.json"
    for args in ((str(repo),), ("--fix", str(repo))):
        result = run(*args)
        assert result.exit_code == 1
        assert result.output.startswith(f"{art}: orphaned: no source beside it")
        assert "delete orphaned artifacts" in result.exception.render()
    assert art.exists()  # --fix never deletes


def test_source_that_does_not_compile(repo: Path) -> None:
    src = repo / "gemma-2-9b-it.yaml"
    _edit_source(src, "block_size: 16", "blok_size: 16")
    result = run(str(repo))
    assert result.exit_code == 1
    line = result.output.splitlines()[0]
    assert re.fullmatch(rf"{re.escape(str(src))}: invalid: does not compile: "
                        rf"{re.escape(str(src))}:\d+:\d+: error: unknown field 'blok_size'", line)


def test_yml_sources_and_explicit_files(repo: Path) -> None:
    src = repo / "gemma-2-9b-it.yaml"
    src.rename(repo / "gemma-2-9b-it.yml")
    findings = check_paths([repo / "gemma-2-9b-it.kvlayout.json", repo / "llama-3.1-8b.yaml"])
    assert [(f.source.name, f.status) for f in findings] == [
        ("gemma-2-9b-it.yml", "current"), ("llama-3.1-8b.yaml", "current")]


def test_a_pair_named_twice_is_checked_once(repo: Path) -> None:
    result = run(str(repo), str(repo / "llama-3.1-8b.yaml"),
                 str(repo / "llama-3.1-8b.kvlayout.json"))
    assert result.output == "2 artifact(s) checked: all current\n"


def test_bad_paths(repo: Path, tmp_path: Path) -> None:
    code, _, stderr = invoke(["check", str(tmp_path / "nope.yaml")])
    assert code == 1 and stderr.startswith(f"{tmp_path}/nope.yaml: error: no such file")
    other = tmp_path / "notes.txt"
    other.write_text("x")
    code, _, stderr = invoke(["check", str(other)])
    assert code == 2 and "neither a layout source (.yaml) nor an artifact" in stderr
    result = run(str(tmp_path / "missing-dir"))
    assert isinstance(result.exception, KvspecError)


def test_exit_codes_through_main(repo: Path) -> None:
    assert invoke(["check", str(repo)])[0] == 0
    _edit_source(repo / "gemma-2-9b-it.yaml", "memory: 40GiB", "memory: 20GiB")
    code, stdout, stderr = invoke(["check", str(repo)])
    assert code == 1
    assert stdout.endswith(f"{repo}/gemma-2-9b-it.yaml changed since it was compiled\n")
    assert stderr.startswith(f"{repo}: error: 1 of 2 artifact(s) not current: 1 stale")
    assert invoke(["check", "--fix", str(repo)])[0] == 0
    assert invoke(["check", str(repo)])[0] == 0


def test_pre_commit_hook() -> None:
    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    assert hooks == [{
        "id": "kvspec-check", "name": "kvspec artifacts are current",
        "description": "Every X.kvlayout.json is what its X.yaml source compiles to "
        "(kvspec check).",
        "entry": "kvspec check", "language": "python",
        "files": r"\.(ya?ml|kvlayout\.json)$", "pass_filenames": False}]
    files = re.compile(hooks[0]["files"])
    assert all(files.search(p) for p in ("layouts/a.yaml", "b.yml", "layouts/a.kvlayout.json"))
    assert not any(files.search(p) for p in ("config.json", "a.yaml.bak", "README.md"))
