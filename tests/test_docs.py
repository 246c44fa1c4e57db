"""The examples in the README and docs/ compile as written."""

from __future__ import annotations

import re

import pytest
import yaml

from kvspec.compiler import compile_source
from tests.conftest import ROOT
from tests.invariants import check_layout

BLOCK = re.compile(r"```yaml\n(.*?)```", re.DOTALL)


def _examples() -> list[tuple[str, str]]:
    out = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for i, text in enumerate(BLOCK.findall(path.read_text())):
            if re.search(r"^kvspec: 1", text, re.MULTILINE):
                out.append((f"{path.name}#{i}", text))
    return out


EXAMPLES = _examples()


def test_docs_have_examples() -> None:
    assert len(EXAMPLES) >= 2


@pytest.mark.parametrize("name,text", EXAMPLES, ids=[n for n, _ in EXAMPLES])
def test_example_compiles(name: str, text: str) -> None:
    """Each example compiles as written, to the model it names, with layers, and to
    a sound plan: no two block ids share a byte, every view inside its pool."""
    art = compile_source(text, name)
    assert art.name == yaml.safe_load(text)["name"]
    assert art.layout.layers
    assert check_layout(art.layout) == []


@pytest.mark.parametrize("name,text", EXAMPLES, ids=[n for n, _ in EXAMPLES])
def test_an_example_of_a_reviewed_layout_names_its_layers_as_the_layout_does(
        name: str, text: str) -> None:
    """A complete example named like a source in layouts/ (format.md's Gemma 3) names
    its layers as that source does: a layout copied from the docs must run in the
    engine, not only compile."""
    example = compile_source(text, name)
    reviewed = ROOT / "layouts" / f"{example.name}.yaml"
    if not reviewed.exists():
        pytest.skip(f"no layouts/{example.name}.yaml")
    layout = compile_source(reviewed.read_text(), str(reviewed))
    assert sorted(example.layout.layers) == sorted(layout.layout.layers)


def test_readme_quick_start_matches_ci() -> None:
    """Both quick-start commands run in CI exactly as the README gives them, the first in
    a fresh venv of its own before the second (a module the main job imports from an
    extra fails there), and the first uses the core install alone."""
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    commands = [line.removeprefix("$ ").strip() for line in readme.splitlines()
                if line.startswith("$ python3 -m venv")]
    assert len(commands) == 2, commands
    first, second = commands
    assert "python -m pytest" in second and "python -m pytest" not in first
    assert "pip install -q -e . " in first, "the first command installs the core alone"
    assert first in ci and second in ci
    assert ci.index(first) < ci.index(second)
    between = ci[ci.index(first) + len(first):ci.index(second)]
    assert "rm -rf .venv" in between, "the second command must start in a fresh venv"


def test_the_engine_settings_table_is_current() -> None:
    """docs/vllm.md's table of engine settings is the declaration's own."""
    from kvspec.model.engine import settings_markdown

    text = (ROOT / "docs" / "vllm.md").read_text()
    start = text.index("<!-- generated from kvspec.model.engine.settings_markdown()")
    end = text.index("<!-- end of the generated table -->")
    table = text[text.index("\n", start) + 1:end]
    assert table == settings_markdown(), "regenerate it from settings_markdown()"


#: Where the docs name kvspec's version: ``kvspec --version``'s line, a report's
#: ``kvspec X.Y.Z`` footer, a pre-commit ``rev: vX.Y.Z``.
VERSION_MENTIONS = re.compile(r"kvspec, version (\d+\.\d+\.\d+)|kvspec (\d+\.\d+\.\d+)"
                              r"|rev: v(\d+\.\d+\.\d+)")


def test_the_docs_name_the_version_the_tool_prints() -> None:
    # issue 36: getting-started showed 0.2.0 while the tool printed 0.3.0
    from kvspec import __version__

    stale = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for m in VERSION_MENTIONS.finditer(path.read_text(encoding="utf-8")):
            found = next(g for g in m.groups() if g)
            if found != __version__:
                stale.append(f"{path.name}: {m.group(0)}")
    assert not stale, f"the tool prints {__version__}; the docs say {stale}"


def _tracked_text_files() -> list[tuple[str, str]]:
    import subprocess

    names = subprocess.run(["git", "ls-files", "*.py", "*.md", "*.sh", "*.yaml", "*.toml"],
                           cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    return [(n, (ROOT / n).read_text(encoding="utf-8", errors="replace"))
            for n in names if (ROOT / n).is_file()]


def test_the_conventions_the_code_cites_live_in_the_repository() -> None:
    # a clone has CONTRIBUTING.md, not the planning notes beside the team's checkout: a
    # citation of those is a pointer a user cannot follow
    rules = set(re.findall(r"^(\d+)\. \*\*", (ROOT / "CONTRIBUTING.md").read_text(),
                           re.MULTILINE))
    assert rules == {str(n) for n in range(1, len(rules) + 1)} and len(rules) >= 19
    outside, unknown = [], []
    for name, text in _tracked_text_files():
        if name == "tests/test_docs.py":
            continue
        outside += [name for _ in re.findall(r"\b(?:STYLE|DESIGN)\.md\b", text)]
        unknown += [f"{name}: {n}" for n in re.findall(r"CONTRIBUTING\.md (\d+)", text)
                    if n not in rules]
    assert not outside, f"cite CONTRIBUTING.md, not a file a clone lacks: {outside}"
    assert not unknown, f"no such rule in CONTRIBUTING.md: {unknown}"
