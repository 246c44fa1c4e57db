"""Run the examples of the README and of every ``docs/*.md`` page as a reader would, and
compare what they print with what the page shows, exactly.

The conventions a page follows are in docs/architecture.md ("Examples in the docs");
in short:

* every fenced block names its language; ``console`` and ``python`` blocks run,
  ``output`` is the printed output of the ``python`` block right before it, and
  ``yaml``, ``json`` and ``text`` are shown, not run (a complete ``yaml`` source is
  compiled by tests/test_docs.py);
* a ``console`` block is a shell session: ``$ `` starts a command (a line ending in
  ``\\`` continues on the next, which starts with ``> ``); the lines up to the next
  command are its output, stdout and stderr together in the order printed, compared
  line for line (trailing blanks aside); a line ``...`` stands for any number of lines;
* a ``python`` block runs in one namespace per page, in page order; the comment lines
  right after a statement that prints are what it prints (``# ...`` elides), or a
  following ``output`` block is what the whole block prints;
* each page runs in a scratch directory of its own holding copies of ``layouts/``,
  ``schemas/`` and ``tests/data/``, so commands read as from the repository root and
  never touch it; ``cd`` carries over to the next command;
* ``<!-- doc-test: skip: REASON -->`` right before a block opts it out;
  ``<!-- doc-test: serve -->`` marks a block that needs vLLM's CPU engine: it runs only
  where the page runs in the engine's environment (tests/serve/test_serving_doc.py);
  ``<!-- doc-test: file NAME -->`` writes the block to NAME instead (run in the engine's
  environment, a block naming a file an earlier command wrote is compared with it);
  ``<!-- doc-test: setup: COMMAND -->`` (anywhere in a page) runs COMMAND first.
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import ROOT

#: Every page whose examples run: new pages are picked up by the glob.
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
#: What the scratch directory of a page holds (copies), as from the repository root.
COPIED = ("layouts", "schemas", "tests/data", "scripts")

RUN = {"console", "python"}
SHOWN = {"yaml", "json", "text"}
LANGUAGES = RUN | SHOWN | {"output"}
ELIDED = "..."

_FENCE = re.compile(r"^```(?P<lang>\S*)\s*$")
_DIRECTIVE = re.compile(
    r"^<!-- doc-test: (?P<what>skip|file|setup|serve)(?::\s*|\s+)?(?P<arg>.*?)\s*-->$")


@dataclass
class Block:
    """One fenced block of a page."""

    page: Path
    line: int             # the opening fence's line, 1-based
    lang: str
    body: str
    #: ``(what, argument)`` of a ``<!-- doc-test: ... -->`` line right before it
    directive: tuple[str, str] | None = None
    #: only blank lines between this block and the one before it
    follows_directly: bool = False

    @property
    def where(self) -> str:
        return f"{shown(self.page)}:{self.line}"

    @property
    def skipped(self) -> bool:
        return self.directive is not None and self.directive[0] == "skip"

    @property
    def serve(self) -> bool:
        """Needs vLLM's CPU engine: run only in its environment."""
        return self.directive is not None and self.directive[0] == "serve"


def shown(path: Path) -> str:
    """A page as problems name it: from the repository root where it is in it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


@dataclass
class Page:
    path: Path
    blocks: list[Block] = field(default_factory=list)
    setup: list[str] = field(default_factory=list)


def parse(path: Path) -> Page:
    """The fenced blocks and setup commands of a Markdown page."""
    page = Page(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    i, between = 0, []
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            d = _DIRECTIVE.match(lines[i].strip())
            if d is not None and d["what"] == "setup":
                page.setup.append(d["arg"])
            between.append(lines[i])
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].rstrip() == "```"),
                   len(lines))
        previous = next((s.strip() for s in reversed(between) if s.strip()), "")
        d = _DIRECTIVE.match(previous)
        page.blocks.append(Block(
            path, i + 1, m["lang"], "".join(s + "\n" for s in lines[i + 1:end]),
            (d["what"], d["arg"]) if d is not None and d["what"] != "setup" else None,
            follows_directly=bool(page.blocks) and not any(s.strip() for s in between)))
        between = []
        i = end + 1
    return page


# -- comparing -------------------------------------------------------------------------

def matches(shown: list[str], actual: list[str]) -> bool:
    """``shown`` equals ``actual`` line for line, where a line ``...`` stands for any
    number of lines (trailing blanks are ignored on both sides)."""
    shown = [s.rstrip() for s in shown]
    actual = [a.rstrip() for a in actual]
    memo: dict[tuple[int, int], bool] = {}

    def at(i: int, j: int) -> bool:
        if (i, j) not in memo:
            if i == len(shown):
                memo[i, j] = j == len(actual)
            elif shown[i] == ELIDED:
                memo[i, j] = at(i + 1, j) or (j < len(actual) and at(i, j + 1))
            else:
                memo[i, j] = j < len(actual) and shown[i] == actual[j] and at(i + 1, j + 1)
        return memo[i, j]

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 4 * (len(shown) + len(actual)) + 100))
    return at(0, 0)


def difference(shown: list[str], actual: list[str]) -> str:
    return "\n".join(difflib.unified_diff([s.rstrip() for s in shown],
                                          [a.rstrip() for a in actual],
                                          "shown", "printed", lineterm="", n=2))


@dataclass
class Problem:
    where: str
    what: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.where}: {self.what}" + (f"\n{self.detail}" if self.detail else "")


# -- console blocks --------------------------------------------------------------------

@dataclass
class Command:
    line: int
    text: str
    shown: list[str] = field(default_factory=list)


def commands(block: Block) -> list[Command]:
    """The ``$`` commands of a console block and the output shown for each."""
    out: list[Command] = []
    lines = block.body.splitlines()
    i = 0
    while i < len(lines):
        raw = lines[i]
        if raw.startswith("$ "):
            text, first = raw[2:], i
            while text.endswith("\\") and i + 1 < len(lines) and lines[i + 1].startswith("> "):
                i += 1
                text = text[:-1] + "\n" + lines[i][2:]
            out.append(Command(block.line + 1 + first, text))
        elif out:
            out[-1].shown.append(raw)
        i += 1
    return out


class Session:
    """A shell over one scratch directory: ``cd`` carries over; ``kvspec ...`` runs
    in-process (the same code as the console script), anything else in bash, where
    ``kvspec`` is this interpreter's ``-m kvspec.cli``."""

    def __init__(self, cwd: Path, *, isolated: bool = False) -> None:
        self.cwd = cwd
        self.rc = 0
        #: every command in a child process (vLLM never imported into this one), with
        #: this interpreter's environment first on PATH, as after activating it
        self.isolated = isolated
        self.pwd = cwd.parent / f".{cwd.name}.pwd"
        self.env = {**os.environ, "KVSPEC_PY": sys.executable, "PYTHONUNBUFFERED": "1",
                    "NO_COLOR": "1", "COLUMNS": "100",
                    "GIT_AUTHOR_NAME": "you", "GIT_AUTHOR_EMAIL": "you@example.com",
                    "GIT_COMMITTER_NAME": "you", "GIT_COMMITTER_EMAIL": "you@example.com",
                    "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
        if isolated:
            self.env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{self.env['PATH']}"

    def run(self, command: str) -> list[str]:
        if command == "echo $?":
            return [str(self.rc)]
        words = shlex.split(command, comments=True) \
            if not re.search(r"[|;&<>$`()*?\n\\]", command) else None
        if words and words[0] == "kvspec" and not self.isolated:
            return self._kvspec(words[1:])
        script = (f'kvspec() {{ "$KVSPEC_PY" -m kvspec.cli "$@"; }}\n{command}\n'
                  f'__rc=$?; pwd > {shlex.quote(str(self.pwd))}; exit $__rc\n')
        proc = subprocess.run(["bash", "-c", script], cwd=self.cwd, env=self.env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=300, check=False)
        self.rc = proc.returncode
        if self.pwd.exists():
            self.cwd = Path(self.pwd.read_text().strip())
            self.pwd.unlink()
        return proc.stdout.splitlines()

    def _kvspec(self, args: list[str]) -> list[str]:
        """``kvspec ARGS`` in this process: stdout and stderr into one buffer, in the
        order written (as on a terminal), stdin empty."""
        from kvspec.cli import main

        buffer, saved_stdin, saved_env = io.StringIO(), sys.stdin, dict(os.environ)
        sys.stdin = io.TextIOWrapper(io.BytesIO(b""), encoding="utf-8")
        os.environ.update({"NO_COLOR": "1", "COLUMNS": "100"})
        os.chdir(self.cwd)
        try:
            with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
                try:
                    main(args)
                    self.rc = 0
                except SystemExit as exc:
                    self.rc = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        finally:
            os.chdir(ROOT)
            sys.stdin = saved_stdin
            os.environ.clear()
            os.environ.update(saved_env)
        return buffer.getvalue().splitlines()


# -- python blocks ---------------------------------------------------------------------

def _statements(source: str) -> list[tuple[ast.stmt, list[str]]]:
    """Each top-level statement and the comment lines right after it (``# `` taken
    off: what the page says it prints)."""
    lines = source.splitlines()
    out = []
    for stmt in ast.parse(source).body:
        shown, j = [], stmt.end_lineno or stmt.lineno
        while j < len(lines) and lines[j].startswith("#"):
            shown.append(lines[j][2:] if lines[j].startswith("# ") else lines[j][1:])
            j += 1
        out.append((stmt, shown))
    return out


def run_python(block: Block, namespace: dict, cwd: Path, output: Block | None) -> list[Problem]:
    """Run a python block statement by statement in ``namespace``; compare what each
    statement prints with the comments after it, or (``output``) what the block
    prints with that block."""
    problems, printed_all = [], []
    os.chdir(cwd)
    try:
        for stmt, shown in _statements(block.body):
            buffer = io.StringIO()
            code = compile(ast.Module([stmt], []), f"{block.where}", "exec")
            try:
                with contextlib.redirect_stdout(buffer):
                    exec(code, namespace)  # the page's own example
            except Exception as exc:  # noqa: BLE001 - reported with the page's line
                problems.append(Problem(f"{block.where}+{stmt.lineno}",
                                        f"raises {type(exc).__name__}: {exc}"))
                break
            printed = buffer.getvalue().splitlines()
            printed_all += printed
            if output is not None or not printed:
                continue
            if not shown:
                problems.append(Problem(f"{block.where}+{stmt.lineno}",
                                        "prints, and the page does not show what",
                                        difference([], printed)))
            elif not matches(shown, printed):
                problems.append(Problem(f"{block.where}+{stmt.lineno}",
                                        "prints something else than its comments show",
                                        difference(shown, printed)))
    finally:
        os.chdir(ROOT)
    if output is not None and not problems:
        shown = output.body.splitlines()
        if not matches(shown, printed_all):
            problems.append(Problem(output.where, "is not what the block before it prints",
                                    difference(shown, printed_all)))
    return problems


# -- a page ----------------------------------------------------------------------------

def scratch(tmp: Path) -> Path:
    """A directory holding copies of what the examples read (``COPIED``)."""
    work = tmp / "work"
    for part in COPIED:
        shutil.copytree(ROOT / part, work / part,
                        ignore=shutil.ignore_patterns("__pycache__", ".kvspec-tmp-*"))
    return work


def _written(block: Block, path: Path) -> list[Problem]:
    """A ``file`` block against the file an earlier command wrote."""
    lines = path.read_text(encoding="utf-8").splitlines()
    shown_lines = block.body.splitlines()
    if [s.rstrip() for s in shown_lines] == [s.rstrip() for s in lines]:
        return []
    return [Problem(block.where, f"is not the {path.name} the commands before it wrote",
                    difference(shown_lines, lines))]


def run_page(path: Path, tmp: Path, *, serve: bool = False) -> list[Problem]:
    """Run every example of the page at ``path`` in a scratch directory under ``tmp``;
    ``serve``: in vLLM's CPU engine's environment, the ``serve`` blocks too."""
    page = parse(path)
    session = Session(scratch(tmp), isolated=serve)
    problems: list[Problem] = []
    for command in page.setup:
        out = session.run(command)
        if session.rc != 0:
            return [Problem(str(shown(path)), f"setup {command!r} failed",
                            "\n".join(out))]
    namespace: dict = {"__name__": "__main__"}
    for i, block in enumerate(page.blocks):
        if block.skipped or (block.serve and not serve):
            continue
        if block.directive is not None and block.directive[0] == "file":
            target = session.cwd / block.directive[1]
            if serve and target.exists():
                problems += _written(block, target)
            else:
                target.write_text(block.body, encoding="utf-8")
        elif block.lang == "console":
            for cmd in commands(block):
                actual = session.run(cmd.text)
                if not matches(cmd.shown, actual):
                    problems.append(Problem(f"{shown(path)}:{cmd.line}",
                                            f"$ {cmd.text}", difference(cmd.shown, actual)))
        elif block.lang == "python":
            after = page.blocks[i + 1] if i + 1 < len(page.blocks) else None
            output = after if after is not None and after.lang == "output" else None
            problems += run_python(block, namespace, session.cwd, output)
    return problems


def lint(page: Page) -> list[Problem]:
    """What a page's blocks must be for the examples to mean what they show."""
    out = []
    for i, b in enumerate(page.blocks):
        lines = b.body.splitlines()
        if b.lang not in LANGUAGES:
            out.append(Problem(b.where, f"a ```{b.lang} block: name one of "
                               f"{sorted(LANGUAGES)} (shell sessions are `console`)"))
        if b.lang == "console" and not (lines and lines[0].startswith("$ ")):
            out.append(Problem(b.where, "a console block starts with a `$ ` command"))
        if b.lang in SHOWN and any(s.startswith("$ ") for s in lines):
            out.append(Problem(b.where, f"a ```{b.lang} block holds `$ ` commands: "
                               "make it a console block, which runs"))
        if b.lang == "python" and any(s.startswith(">>>") for s in lines):
            out.append(Problem(b.where, "`>>>` in a python block: write the statements "
                               "and show what they print in `# ` comments after them"))
        if b.lang == "output" and not (i and page.blocks[i - 1].lang == "python"
                                       and b.follows_directly):
            out.append(Problem(b.where, "an output block directly follows a python block"))
        if b.directive is not None:
            what, arg = b.directive
            if what == "skip" and (b.lang not in RUN or not arg):
                out.append(Problem(b.where, "skip a console or python block, and say why: "
                                   "<!-- doc-test: skip: REASON -->"))
            if what == "file" and (b.lang not in SHOWN | {"python"} or not arg):
                out.append(Problem(b.where, "<!-- doc-test: file NAME --> writes a yaml, "
                                   "json, text or python block to NAME"))
            if what == "serve" and (b.lang not in RUN or arg):
                out.append(Problem(b.where, "<!-- doc-test: serve --> marks a console or "
                                   "python block that needs vLLM's CPU engine"))
    return out
