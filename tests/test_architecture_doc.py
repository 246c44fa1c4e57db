"""docs/architecture.md describes the package as it is: every module it names
exists, every package is named, and its table of what each package may import
is ``ALLOWED`` in tests/test_architecture.py."""

from __future__ import annotations

import ast
import functools
import re

import pytest

from tests.conftest import ROOT
from tests.test_architecture import ALLOWED, COMMON, PACKAGE

DOC = ROOT / "docs" / "architecture.md"
TEXT = DOC.read_text(encoding="utf-8")
#: Everything the page writes as code: `...`.
CODE = re.findall(r"`([^`\n]+)`", TEXT)
FOLDERS = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and any(p.glob("*.py")))
TOP_MODULES = sorted(p.name for p in PACKAGE.glob("*.py"))


def _paths() -> list[str]:
    """The module and folder paths the page names: ``kvspec/x/y.py``, ``x/y.py``
    (``x/y.py:name`` too), ``x/`` with ``x`` a folder of kvspec, a bare ``y.py``
    (found anywhere in kvspec/); ``runtime/block_pool_*.py`` is a pattern."""
    out = []
    for code in CODE:
        path = code.removeprefix("kvspec/").split(":")[0]
        if not re.fullmatch(r"[\w/*.]+(\.py|/)", path):
            continue
        if "/" not in path:
            out.append("**/" + path)
        elif path.split("/")[0] in FOLDERS:
            out.append(path)
    return sorted(set(out))


@functools.cache
def _top_names(module: str) -> set[str]:
    """The names a module defines or imports at its top."""
    rel = module.removeprefix("kvspec").removeprefix(".").replace(".", "/")
    path = PACKAGE / f"{rel}.py" if (PACKAGE / f"{rel}.py").exists() else \
        PACKAGE / rel / "__init__.py"
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def _is_module(dotted: str) -> bool:
    rel = dotted.removeprefix("kvspec").removeprefix(".").replace(".", "/")
    return (PACKAGE / f"{rel}.py").exists() or (PACKAGE / rel / "__init__.py").exists()


def _dotted() -> list[str]:
    """The dotted names the page writes: ``kvspec.x.y`` (a module, or a name in one)."""
    return sorted({m for code in CODE for m in re.findall(r"\bkvspec(?:\.\w+)+", code)})


@pytest.mark.parametrize("path", _paths())
def test_every_module_the_page_names_exists(path: str) -> None:
    found = list(PACKAGE.glob(path.rstrip("/")))
    assert found, f"docs/architecture.md names {path}, which kvspec/ does not hold"


@pytest.mark.parametrize("name", _dotted())
def test_every_dotted_name_the_page_writes_exists(name: str) -> None:
    """``kvspec.compiled`` is a module; ``kvspec.compiled.replan`` a name in one."""
    module, _, attr = name.rpartition(".")
    assert _is_module(name) or (_is_module(module) and attr in _top_names(module)), \
        f"docs/architecture.md writes {name}, which is neither a module nor a name in one"


def test_the_page_names_every_package_and_top_level_module() -> None:
    missing = [f"{f}/" for f in FOLDERS if f"{f}/" not in CODE] + \
        [m for m in TOP_MODULES if m not in CODE]
    assert missing == [], f"docs/architecture.md does not name {missing}"


def _import_table() -> dict[str, set[str]]:
    """The page's table: package -> the packages its last column says it may import."""
    rows = {}
    for line in TEXT.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and re.fullmatch(r"`\w+(/|\.py)`", cells[0]):
            name = cells[0].strip("`").removesuffix("/").removesuffix(".py")
            rows[name] = {"*"} if cells[2] == "anything" else set(re.findall(r"`([\w.]+)`",
                                                                             cells[2]))
    return rows


def test_the_page_says_what_each_package_may_import_as_the_test_does() -> None:
    table = _import_table()
    assert table == ALLOWED
    assert all(f"`{m}`" in TEXT.split("## Packages")[1][:400] for m in COMMON)


def test_the_checks_find_what_they_look_for() -> None:
    assert {"runtime/manager/", "artifact/format.py", "**/errors.py"} <= set(_paths())
    assert "kvspec.model.plan" in _dotted() and len(FOLDERS) >= 13
