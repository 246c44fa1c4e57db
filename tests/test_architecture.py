"""The package layout holds (docs/architecture.md): imports point down the pipeline,
modules and functions stay small, and the list of layer kinds exists once."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from kvspec.model import kinds
from tests.conftest import ROOT

PACKAGE = ROOT / "kvspec"
MODULES = sorted(PACKAGE.rglob("*.py"))

#: What each package may import from kvspec (besides itself, errors, files, collector,
#: jsonpos).
ALLOWED = {
    "model": {"model"},
    "source": {"model", "source", "planner.stages"},
    "planner": {"model", "planner"},
    "artifact": {"model", "artifact", "planner", "source.schema"},
    "runtime": {"model", "artifact", "runtime"},
    "reports": {"model", "artifact", "planner", "source", "compiler", "reports"},
    "sim": {"model", "artifact", "runtime.manager", "sim"},
    "integrations": {"model", "source", "compiler", "artifact", "planner", "reports",
                     "integrations", "cli.common", "sim"},
    "cli": {"*"},
}
#: Third-party packages no compiler module may import.
HEAVY = ("torch", "vllm", "numpy")
COMPILER_SIDE = ("model", "source", "planner", "artifact", "reports", "compiler")


def _package(path: Path) -> str:
    rel = path.relative_to(PACKAGE).with_suffix("")
    return rel.parts[0] if len(rel.parts) > 1 else rel.parts[0]


def _kvspec_imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        out += [(node.lineno, n) for n in names]
    return out


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_point_down_the_pipeline(path: Path) -> None:
    pkg = _package(path)
    allowed = ALLOWED.get(pkg, {"*"})
    for line, name in _kvspec_imports(path):
        top = name.split(".")[0]
        if pkg in COMPILER_SIDE and top in HEAVY:
            pytest.fail(f"{path.relative_to(ROOT)}:{line} imports {name}: the compiler "
                        "never imports torch or vLLM")
        if top != "kvspec" or "*" in allowed:
            continue
        inner = name.removeprefix("kvspec").removeprefix(".")
        if inner in ("", "errors", "files", "collector", "jsonpos") or \
                inner.startswith(("errors", "files", "collector", "jsonpos")):
            continue
        if not any(inner == a or inner.startswith(a + ".") for a in allowed):
            pytest.fail(f"{path.relative_to(ROOT)}:{line} imports {name}; package "
                        f"{pkg!r} may import only {sorted(allowed)} (docs/architecture.md)")


def test_the_compiler_loads_no_torch_and_the_cli_no_schema_models() -> None:
    code = ("import sys, kvspec.cli, kvspec.compiler, kvspec.reports.explain; "
            "kvspec.compiler.compile('layouts/llama-3.1-8b.yaml'); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'vllm', 'numpy') or m == 'kvspec.artifact.schema'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_modules_and_functions_stay_small(path: Path) -> None:
    text = path.read_text()
    assert len(text.splitlines()) <= 400, f"{path.name}: split modules over 400 lines"
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1  # type: ignore[operator]
            assert length <= 60, f"{path.name}:{node.lineno} {node.name} has {length} lines"


def test_the_list_of_layer_kinds_exists_once() -> None:
    """No module but the registry spells out several kind names in one literal."""
    names = {k.name for k in kinds.KINDS}
    for path in MODULES:
        if path == PACKAGE / "model" / "kinds.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
                items = node.keys if isinstance(node, ast.Dict) else node.elts
                found = {e.value for e in items if isinstance(e, ast.Constant)
                         and e.value in names}
                assert len(found) < 3, (f"{path.relative_to(ROOT)}:{node.lineno} lists layer "
                                        f"kinds {sorted(found)}: derive it from kvspec.model.kinds")


def _error_classes() -> set[str]:
    """The names of KvspecError and of every class in kvspec derived from it."""
    bases: dict[str, set[str]] = {}
    for path in MODULES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases.setdefault(node.name, set()).update(
                    b.id if isinstance(b, ast.Name) else getattr(b, "attr", "")
                    for b in node.bases)
    found = {"KvspecError"}
    while True:
        more = {name for name, of in bases.items() if of & found} - found
        if not more:
            return found
        found |= more


def test_every_error_kvspec_raises_carries_a_hint() -> None:
    """Each ``raise SomeKvspecError(...)`` gives ``hint=`` (or passes keywords on):
    what to do next is part of every message, also of checks no source should reach."""
    classes = _error_classes() - {"ErrorList"}  # it carries each error with its own hint
    missing = []
    for path in MODULES:
        for node in ast.walk(ast.parse(path.read_text())):
            call = node.exc if isinstance(node, ast.Raise) else None
            if not isinstance(call, ast.Call):
                continue
            name = call.func.id if isinstance(call.func, ast.Name) else getattr(
                call.func, "attr", "")
            keywords = {k.arg for k in call.keywords}
            if name in classes and "hint" not in keywords and None not in keywords:
                missing.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")
    assert len(classes) > 10 and not missing, missing
