"""Every example of the README and of every docs/*.md page runs exactly as shown.

The conventions (what runs, how output is compared, where, and how a block opts out)
are in docs/architecture.md, "Examples in the docs"; the runner is tests/docexamples.py.
A new page is picked up by the glob; a new block must follow the conventions (the
lint below fails otherwise).
"""

from __future__ import annotations

import importlib.util
import itertools
import re
import shlex
import shutil
from pathlib import Path

import pytest

from tests import docexamples as dx
from tests.conftest import ROOT

PAGES = {str(p.relative_to(ROOT)): p for p in dx.PAGES}
#: How many blocks may opt out in all the pages together: raising it is a decision to
#: review (an example that does not run can go stale unseen).
MAX_SKIPPED = 6


def _ids() -> list[str]:
    return list(PAGES)


@pytest.mark.parametrize("name", _ids())
def test_blocks_follow_the_conventions(name: str) -> None:
    problems = dx.lint(dx.parse(PAGES[name]))
    assert not problems, "\n".join(map(str, problems))


def test_few_blocks_opt_out_and_each_says_why() -> None:
    skipped = [b for p in PAGES.values() for b in dx.parse(p).blocks if b.skipped]
    listing = "\n".join(f"  {b.where}: {b.directive[1]}" for b in skipped)  # type: ignore[index]
    assert len(skipped) <= MAX_SKIPPED, f"{len(skipped)} blocks opt out:\n{listing}"
    assert all(b.directive and b.directive[1] for b in skipped), listing


def test_every_page_is_covered() -> None:
    on_disk = {str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")}
    assert on_disk | {"README.md"} == set(PAGES)


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("git") is None,
                    reason="the console examples need bash and git")
@pytest.mark.parametrize("name", _ids())
def test_examples_print_exactly_what_the_page_shows(name: str, tmp_path: Path) -> None:
    page = dx.parse(PAGES[name])
    if any(b.lang == "python" and not b.skipped for b in page.blocks) \
            and importlib.util.find_spec("torch") is None:
        pytest.skip("the page's Python examples need the runtime extra (torch)")
    problems = dx.run_page(PAGES[name], tmp_path)
    assert not problems, "\n\n".join(map(str, problems))


def _kvspec_lines(page: dx.Page) -> list[tuple[str, str]]:
    """``kvspec ...`` command lines shown (not run) in text blocks, to their first shell
    operator; usage synopses (``[OPTIONS]``) aside."""
    out = []
    for b in page.blocks:
        if b.lang != "text":
            continue
        for text in b.body.splitlines():
            line = re.split(r"\s(?:;|\||>|&&)\s|\s#\s", text.strip(), maxsplit=1)[0]
            if line.startswith("kvspec ") and "[OPTIONS]" not in line:
                out.append((b.where, line))
    return out


@pytest.mark.parametrize("name", _ids())
def test_a_command_shown_but_not_run_still_parses(name: str) -> None:
    """A command synopsis in a text block cannot run (it names files a reader has), but
    its options must be the command's: click parses it."""
    import click

    from kvspec.cli import cli, common

    problems = []
    for where, line in _kvspec_lines(dx.parse(PAGES[name])):
        words = shlex.split(line)[1:]
        ctx = click.Context(cli, info_name="kvspec")
        command = cli.get_command(ctx, words[0]) if words else None
        if command is None:
            problems.append(f"{where}: {line}: no such command")
            continue
        try:
            command.make_context(words[0], words[1:], parent=ctx)
        except click.ClickException as exc:
            problems.append(f"{where}: {line}: {exc.format_message()}")
        finally:
            common.reset()
    assert not problems, "\n".join(problems)


# -- the runtime's API, listed in full ---------------------------------------------------

def _listed(page: Path, heading: str) -> set[str]:
    """The names in the first column of the first table under ``heading``:
    ``views[layer]`` and ``allocate(n)`` list ``views`` and ``allocate``."""
    lines = page.read_text(encoding="utf-8").split(heading + "\n", 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    table = list(itertools.takewhile(lambda line: line.startswith("|"), lines[start:]))
    cells = [line.split("|")[1] for line in table[2:]]
    return {m for cell in cells for m in re.findall(r"`(\w+)", cell)}


def test_the_runtime_docs_list_every_public_attribute_and_method() -> None:
    pytest.importorskip("torch")
    import kvspec
    from kvspec.runtime.block_pool import BlockPool

    cache = kvspec.load(str(ROOT / "layouts" / "llama-3.1-8b.kvlayout.json"), device="meta")
    page = ROOT / "docs" / "runtime.md"
    for heading, obj in (
        ("## What you get: `LoadedCache`", cache),
        ("## Block pool", BlockPool(4)),
    ):
        public = {n for n in dir(obj) if not n.startswith("_")}
        listed = _listed(page, heading)
        assert not public - listed, f"{heading}: not documented: {sorted(public - listed)}"
        assert not listed - public, (f"{heading}: documented, no such attribute: "
                                     f"{sorted(listed - public)}")


# -- the runner can fail ---------------------------------------------------------------

def _page(tmp_path: Path, text: str) -> Path:
    page = tmp_path / "page.md"
    page.write_text(text, encoding="utf-8")
    return page


@pytest.mark.parametrize("shown,ok", [
    (["a", "b", "c"], True),
    (["a", "...", "c"], True),
    (["...", "c"], True),
    (["a", "b"], False),          # a line printed that the page does not show
    (["a", "b", "c", "d"], False),
    (["a", "c"], False),          # no `...`: nothing may be left out
    (["a", "", "b", "c"], False),  # blank lines count
    (["a", "...", "b", "...", "c"], True),
    (["...", "x", "..."], False),
])
def test_output_is_compared_line_for_line(shown: list[str], ok: bool) -> None:
    assert dx.matches(shown, ["a", "b", "c"]) is ok


def test_a_stale_console_example_is_caught(tmp_path: Path) -> None:
    page = _page(tmp_path, "```console\n$ echo one; echo two\none\n$ echo three\nthree\n```\n")
    (problem,) = dx.run_page(page, tmp_path)
    assert problem.what == "$ echo one; echo two" and "+two" in problem.detail


def test_stderr_is_shown_where_it_was_printed(tmp_path: Path) -> None:
    page = _page(tmp_path, "```console\n$ echo a; echo b >&2; echo c\na\nb\nc\n"
                 "$ kvspec validate layouts/llama-3.1-8b.yaml nope.yaml\n"
                 "layouts/llama-3.1-8b.yaml: ok\nnope.yaml: error: no such file\n"
                 "...\n```\n")
    assert dx.run_page(page, tmp_path) == []


def test_python_comments_are_what_it_prints(tmp_path: Path) -> None:
    page = _page(tmp_path, "```python\nx = 2\nprint(x + 1)\n# 3\nprint(x)\n# 3\n"
                 "print('a', 'b')\n```\n")
    problems = dx.run_page(page, tmp_path)
    assert [p.what for p in problems] == ["prints something else than its comments show",
                                          "prints, and the page does not show what"]


def test_python_runs_in_page_order_and_an_output_block_is_compared(tmp_path: Path) -> None:
    page = _page(tmp_path, "```python\nx = 5\n```\n\nprose\n\n```python\nprint(x)\n"
                 "print(x * 2)\n```\n```output\n5\n11\n```\n")
    (problem,) = dx.run_page(page, tmp_path)
    assert problem.what == "is not what the block before it prints"


def test_a_python_error_is_reported_at_its_line(tmp_path: Path) -> None:
    page = _page(tmp_path, "text\n\n```python\nimport kvspec\nkvspec.no_such_thing\n```\n")
    (problem,) = dx.run_page(page, tmp_path)
    assert problem.where.endswith("page.md:3+2") and "AttributeError" in problem.what


def test_the_lint_refuses_what_would_not_run(tmp_path: Path) -> None:
    page = dx.parse(_page(tmp_path, "```\nuntagged\n```\n```bash\nls\n```\n"
                          "```text\n$ kvspec plan x\n```\n<!-- doc-test: skip -->\n"
                          "```console\n$ ls\n```\n```python\n>>> 1\n```\n"))
    assert len(dx.lint(page)) == 5
