"""The package layout holds (docs/architecture.md): imports point down the pipeline
and form no cycle, between modules or between folders; downstream of freeze
nothing imports the planner; a function-level import defers a heavy dependency and
says which; modules and functions stay small; and each vocabulary (layer kinds,
axis orders, engine settings) is declared once."""

from __future__ import annotations

import ast
import functools
import itertools
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvspec.model import axes, engine, kinds
from kvspec.source import schema as source_schema
from tests.conftest import ROOT

PACKAGE = ROOT / "kvspec"
MODULES = sorted(PACKAGE.rglob("*.py"))

#: Modules every package may import.
COMMON = ("_version", "errors", "files", "collector", "jsonpos", "notes", "interrupts")
#: What each package may import from kvspec (besides itself and :data:`COMMON`).
ALLOWED = {
    "model": {"model"},
    "source": {"model", "source"},
    "planner": {"model", "planner", "artifact.format", "artifact.sizing"},
    "passes": {"model", "source", "planner", "artifact", "passes"},
    "pooling": {"model", "artifact", "passes", "pooling", "runtime.manager", "sim"},
    "compiler": {"model", "source", "planner", "artifact", "passes", "pooling"},
    "artifact": {"model", "artifact"},
    # the runtime reads artifacts, never plans them (``load(replan=True)`` defers
    # the compiler to kvspec.compiled, imported only when asked); it describes a
    # loaded cache for connectors with the torch-free descriptor
    "runtime": {"model", "artifact", "runtime", "compiled", "connectors.describe",
                "connectors.descriptor"},
    "compiled": {"model", "artifact", "planner", "passes"},
    "reports": {"model", "artifact", "planner", "source", "passes", "compiler", "compiled",
                "reports", "connectors.descriptor"},
    "integrations": {"model", "source", "passes", "compiler", "compiled", "artifact", "runtime",
                     "planner", "reports", "integrations", "cli.common", "sim",
                     "runtime.manager"},
    "sim": {"model", "artifact", "runtime.manager", "sim"},
    "connectors": {"model", "artifact", "runtime", "connectors"},
    # the sweep drives the whole pipeline from above (CONTRIBUTING.md 17): it compiles each
    # point, simulates it, and renders its report with explain's templates
    "sweep": {"model", "source", "passes", "compiler", "pooling", "runtime.manager", "sim",
              "integrations", "reports", "sweep"},
    "cli": {"*"},
}
#: Third-party packages no compiler module may import.
HEAVY = ("torch", "vllm", "numpy")
COMPILER_SIDE = ("model", "source", "planner", "passes", "artifact", "reports", "compiler",
                 "compiled")


def _package(path: Path) -> str:
    rel = path.relative_to(PACKAGE).with_suffix("")
    return rel.parts[0]  # a package's name, or a top-level module's


def _kvspec_imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "kvspec":
            names = [f"kvspec.{a.name}" for a in node.names]  # from kvspec import notes
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
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
        if inner == "" or inner.split(".")[0] in COMMON:
            continue
        if not any(inner == a or inner.startswith(a + ".") for a in allowed):
            pytest.fail(f"{path.relative_to(ROOT)}:{line} imports {name}; package "
                        f"{pkg!r} may import only {sorted(allowed)} (docs/architecture.md)")


def test_loading_an_artifact_imports_nothing_of_the_compiler() -> None:
    """``import kvspec.runtime`` and ``kvspec.load(path)`` import neither the planner
    nor the source package, nor PyYAML, Jinja2, click or pydantic (issue 29)."""
    pytest.importorskip("torch", reason="loading an artifact maps it with torch")
    code = ("import sys, kvspec.runtime, kvspec; "
            "c = kvspec.load('layouts/gemma-3-27b-it.kvlayout.json', device='meta'); "
            "assert c.views; "
            "p = kvspec.load('layouts/pooling-auto.kvlayout.json', device='meta'); "
            "assert len(p.pool_blocks) == 2; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('yaml', 'jinja2', 'click', 'pydantic') or m.startswith(('kvspec.planner', "
            "'kvspec.source', 'kvspec.compiler', 'kvspec.compiled', 'kvspec.reports', "
            "'kvspec.integrations', 'kvspec.cli'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_compiler_loads_no_torch_and_the_cli_no_schema_models() -> None:
    code = ("import sys, kvspec.cli, kvspec.compiler, kvspec.reports.explain; "
            "kvspec.compiler.compile('layouts/llama-3.1-8b.yaml'); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'vllm', 'numpy')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "[]"


#: The line near a module's top that says why a module over 400 lines is one idea.
ONE_IDEA = re.compile(r"^# one idea: \S", re.MULTILINE)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_modules_and_functions_stay_small(path: Path) -> None:
    """A module over 400 lines says at its top (``# one idea: why``, in its first 40
    lines) why it is one idea that splitting would scatter."""
    text = path.read_text()
    lines = text.splitlines()
    if len(lines) > 400:
        assert ONE_IDEA.search("\n".join(lines[:40])), (
            f"{path.name}: over 400 lines; split it, or say at its top why it is one idea "
            "(# one idea: ...)")
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


# ---------------------------------------------------------------------------
# imports: no cycles, and a function-level import only to defer a heavy dependency
# ---------------------------------------------------------------------------

#: What a function-level import may defer; its comment names one of them.
DEFERRABLE = ("torch", "vllm", "nixl", "ray", "jinja2", "markupsafe", "pydantic", "pyyaml",
              "the compiler", "click", "orjson", "msgspec", "cbor2", "command module")

#: Modules exempt from the cycle and deferral rules (none: keep it so).
PENDING_REWRITE: set[str] = set()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULE_NAMES = {_module_name(p): p for p in MODULES}


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """The kvspec modules an import statement loads (the module itself, or the
    package when a name is not a module of it)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = module.split(".")[:len(module.split(".")) - node.level + is_package]
            base = ".".join(parts + ([node.module] if node.module else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULE_NAMES else base
                 for a in node.names]
    out = []
    for imported in names:
        name = imported
        while name and name not in MODULE_NAMES:
            name = name.rpartition(".")[0]
        if name:
            out.append(name)
    return out


@functools.cache
def _import_graph() -> dict[str, set[str]]:
    """Which kvspec module imports which: at the top, inside functions and under
    ``TYPE_CHECKING`` alike (a function-level import is still a dependency)."""
    graph: dict[str, set[str]] = {}
    for name, path in MODULE_NAMES.items():
        deps = graph.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                deps.update(t for t in _targets(node, name, path.name == "__init__.py")
                            if t != name)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_import_graph_has_no_cycles() -> None:
    """Counted with function-level and type-checking imports: a module that imports
    another only inside a function still depends on it."""
    graph = _import_graph()
    assert len(graph) > 100 and graph["kvspec.compiler"]
    pending = {_module_name(ROOT / p) for p in PENDING_REWRITE}
    cycles = [c for c in _cycles(graph) if not set(c) <= pending]
    assert cycles == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "c"]]


def _blocks(tree: ast.AST) -> list[list[ast.stmt]]:
    """Every list of statements inside a function, nested blocks included."""
    out = []
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                for name in ("body", "orelse", "finalbody"):
                    body = getattr(node, name, None)
                    if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
                        out.append(body)
                for handler in getattr(node, "handlers", []):
                    out.append(handler.body)
    return out


def _unexplained_imports(path: Path) -> list[str]:
    """Function-level imports whose comment (on their lines, or on the comment lines
    just above their run of imports) names no deferred heavy dependency."""
    text = path.read_text()
    lines = text.splitlines()
    missing = []
    seen: set[int] = set()
    for body in _blocks(ast.parse(text)):
        run: list[ast.stmt] = []
        for stmt in body + [None]:  # type: ignore[operator]
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                run.append(stmt)
                continue
            if not run:
                continue
            first = run[0].lineno - 1
            above = []
            while first - 1 >= 0 and lines[first - 1].strip().startswith("#"):
                first -= 1
                above.append(lines[first])
            words = " ".join(above + [lines[n - 1] for s in run
                                      for n in range(s.lineno, s.end_lineno + 1)])
            comment = " ".join(part.split("#", 1)[1] for part in words.split("\n")
                               if "#" in part).lower() if "#" in words else ""
            for s in run:
                if s.lineno not in seen and not any(d in comment for d in DEFERRABLE):
                    missing.append(f"{path.relative_to(ROOT)}:{s.lineno}")
                seen.add(s.lineno)
            run = []
    return missing


def test_function_level_imports_name_the_heavy_dependency_they_defer() -> None:
    missing = [m for p in MODULES if str(p.relative_to(ROOT)) not in PENDING_REWRITE
               for m in _unexplained_imports(p)]
    assert missing == [], ("import at the top, or say which heavy dependency the "
                           "function-level import defers (# deferred: torch): "
                           + ", ".join(missing))


# ---------------------------------------------------------------------------
# each vocabulary declared once
# ---------------------------------------------------------------------------


def _literal_sets(path: Path, names: set[str]) -> list[tuple[int, set[str]]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
            items = node.keys if isinstance(node, ast.Dict) else node.elts
            found = {e.value for e in items if isinstance(e, ast.Constant) and e.value in names}
            if len(found) >= 3:
                out.append((node.lineno, found))
        elif isinstance(node, ast.Subscript) and getattr(node.value, "id", "") == "Literal":
            elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            found = {e.value for e in elts if isinstance(e, ast.Constant) and e.value in names}
            if len(found) >= 3:
                out.append((node.lineno, found))
    return out


def test_the_axis_orders_are_listed_once() -> None:
    """Only kvspec.model.axes spells out several axis orders: the schemas derive
    their choices from it (``AxisOrderName``)."""
    names = set(axes.AXIS_ORDER_NAMES)
    assert len(names) == 6 and axes.AXIS_ORDER_NAMES[0] == axes.DEFAULT_AXIS_ORDER.name
    found = [f"{p.relative_to(ROOT)}:{line} {sorted(s)}" for p in MODULES
             if p != PACKAGE / "model" / "axes.py" for line, s in _literal_sets(p, names)]
    assert found == [], "derive axis orders from kvspec.model.axes: " + "; ".join(found)


def _source_keys(model: type, prefix: str) -> dict[str, object]:
    """Every leaf key of a source section and its default (``...``: required)."""
    out: dict[str, object] = {}
    for name, f in model.model_fields.items():
        sub = f.annotation
        if isinstance(sub, type) and issubclass(sub, source_schema.BaseModel):
            out.update(_source_keys(sub, f"{prefix}.{name}"))
        else:
            out[f"{prefix}.{name}"] = ... if f.is_required() else f.get_default()
    return out


def test_the_engine_settings_are_the_source_schemas_engine_fields() -> None:
    """Every engine setting read from a source has its key in the source schema,
    with the setting's own default; every key of the engine, parallel and
    quantization sections is a setting's (or one of the few that are none)."""
    keys = {**_source_keys(source_schema.EnginePolicy, "engine"),
            **_source_keys(source_schema.Parallelism, "parallel"),
            **_source_keys(source_schema.Quantization, "quantization")}
    settings = {s.source_key: s for s in engine.SETTINGS if s.source_key is not None}
    assert set(keys) == set(settings) | set(engine.SOURCE_ONLY_KEYS)
    differ = [key for key, s in settings.items() if keys[key] is not ... and
              s.from_data(keys[key]) != s.default]
    assert differ == [], f"source defaults differ from the engine's: {differ}"


@pytest.mark.parametrize("source", sorted((ROOT / "layouts").glob("*.yaml"))[:6],
                         ids=lambda p: p.stem)
def test_the_artifacts_engine_record_derives_from_the_declaration(source: Path) -> None:
    """:func:`kvspec.model.engine.artifact_values` writes what the committed
    artifacts hold, and reads back the engine they were planned for."""
    import json

    from kvspec.artifact.format import Engine
    from kvspec.compiled import read

    artifact = source.with_suffix(".kvlayout.json")
    record = json.loads(artifact.read_text())["body"]["engine"]
    layout = read(artifact).layout
    settled = set(engine.ARTIFACT_SETTLED_KEYS)
    assert set(Engine.__struct_fields__) == {s.artifact_key for s in engine.SETTINGS} | settled
    assert engine.artifact_values(layout.plan.engine, layout.engine) == record
    planned = engine.engine_from_artifact(record)
    assert engine.artifact_values(planned, layout.engine) == record


# ---------------------------------------------------------------------------
# folders: no cycle between them
# ---------------------------------------------------------------------------


def _folder(module: str) -> str:
    """``kvspec.passes.pool`` -> ``passes``; a top-level module is its own folder."""
    return module.split(".")[1] if "." in module else module


def _top_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """The imports a module runs when it is loaded: at its top, under ``if`` (also
    ``TYPE_CHECKING``) or ``try``, never inside a function or class."""
    out: list[ast.Import | ast.ImportFrom] = []
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        stmt = todo.pop()
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            out.append(stmt)
        elif isinstance(stmt, (ast.If, ast.Try)):
            todo += stmt.body + stmt.orelse + getattr(stmt, "finalbody", []) + [
                s for h in getattr(stmt, "handlers", []) for s in h.body]
    return out


@functools.cache
def _folder_graph(deferred: bool) -> dict[str, dict[str, set[str]]]:
    """``graph[a][b]``: the modules of folder ``a`` that import folder ``b``, by
    their top-level imports, and their function-level ones too when ``deferred``."""
    graph: dict[str, dict[str, set[str]]] = {}
    for name, path in MODULE_NAMES.items():
        tree = ast.parse(path.read_text())
        nodes = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))] \
            if deferred else _top_level_imports(tree)
        edges = graph.setdefault(_folder(name), {})
        for node in nodes:
            for target in _targets(node, name, path.name == "__init__.py"):
                if _folder(target) != _folder(name):
                    edges.setdefault(_folder(target), set()).add(name)
    return graph


def _cycle_path(graph: dict[str, dict[str, set[str]]], component: list[str]) -> str:
    """One shortest cycle through the component's first folder, each step with a
    module that makes it: ``passes -(kvspec.passes.pool)-> pooling -(...)-> passes``."""
    start, inside = component[0], set(component)
    paths = {start: [start]}
    todo = [start]
    while todo:
        folder = todo.pop(0)
        for nxt in sorted(set(graph.get(folder, {})) & inside):
            if nxt == start:
                steps = paths[folder] + [start]
                return " ".join(f"{a} -({min(graph[a][b])})->" for a, b in
                                itertools.pairwise(steps)) + f" {start}"
            if nxt not in paths:
                paths[nxt] = paths[folder] + [nxt]
                todo.append(nxt)
    raise AssertionError(f"no cycle through {start}")


@functools.cache
def _folder_cycles(deferred: bool) -> dict[tuple[str, ...], str]:
    """Each cycle between folders (a strongly connected component), with one path
    through it. With ``deferred``, only those the top-level imports do not make."""
    graph = _folder_graph(deferred)
    plain = {n: set(e) for n, e in graph.items()}
    found = {tuple(c): _cycle_path(graph, c) for c in _cycles(plain)}
    return {c: p for c, p in found.items() if c not in _folder_cycles(False)} \
        if deferred else found


def _known(reason: str) -> pytest.MarkDecorator:
    """A known offender: its check fails today, and once it passes the entry must go."""
    return pytest.mark.xfail(strict=True, raises=AssertionError, reason=reason)


@pytest.mark.parametrize("imports", ["top-level", "deferred"])
def test_folders_form_no_cycle(imports: str) -> None:
    """Folders (``kvspec/<folder>/`` and top-level modules) import one another
    without a cycle: by the imports a module runs when loaded, and again counting
    the function-level imports that defer a heavy dependency (a deferred import
    still depends: it only loads later)."""
    found = _folder_cycles(imports == "deferred")
    assert found == {}, "folder cycles: " + "; ".join(found.values())


def test_the_folder_graph_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert [sorted(c) for c in _cycles(graph)] == [["a", "b", "c"]]


def test_the_folder_graph_counts_top_level_and_deferred_imports() -> None:
    top, deferred = _folder_graph(False), _folder_graph(True)
    assert "kvspec.compiler" in top["compiler"]["pooling"]  # auto drives the compiler
    assert "pooling" not in top["passes"]
    assert "compiled" not in top["runtime"]  # load(replan=True) defers it
    assert "kvspec.runtime.loader" in deferred["runtime"]["compiled"]


# ---------------------------------------------------------------------------
# the format boundary: downstream of freeze, read the frozen format (CONTRIBUTING.md 16)
# ---------------------------------------------------------------------------

#: What only the compiler side may import: the planner, the passes, the planner's
#: internal plan, and the bridge that re-plans an artifact into it.
PLANNING = ("kvspec.planner", "kvspec.passes", "kvspec.model.plan", "kvspec.compiled")
#: Where proving the plan is the point: re-planning stays there (issue 37).
PROVING = ("kvspec.reports.diff", "kvspec.reports.refview", "kvspec.integrations.vllm.verify",
           *(f"kvspec.cli.{c}" for c in ("compile", "validate", "check", "verify", "diff",
                                         "init", "import_")))


def _plugin_path() -> set[str]:
    """The kvspec.integrations modules the vLLM plugin's entry point reaches."""
    graph, seen, todo = _import_graph(), set(), ["kvspec.integrations.vllm.plugin"]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += [m for m in graph[module] if m.startswith("kvspec.integrations.")]
    return seen


def _downstream() -> list[str]:
    """The modules that read an artifact after freeze: the runtime, the simulator,
    the connectors, the vLLM plugin's path and engine-args, SGLang, the reports and
    the CLI commands, but for the proving ones (:data:`PROVING`)."""
    roots = ("kvspec.runtime", "kvspec.sim", "kvspec.connectors", "kvspec.integrations.sglang",
             "kvspec.reports", "kvspec.cli")
    named = {m for m in MODULE_NAMES if m.startswith(roots)} | _plugin_path() | {
        "kvspec.integrations.vllm.engine_args"}
    return sorted(m for m in named if not m.startswith(PROVING))


#: Downstream modules that import the planning side today (issue 37, finding 2).
#: Whoever moves one onto the frozen format removes it here.
BOUNDARY_OFFENDERS = {
    "kvspec.cli.plan", "kvspec.cli.simulate", "kvspec.reports.explain.subject",
    "kvspec.reports.plan", "kvspec.runtime.loader",
}


@pytest.mark.parametrize("module", [
    pytest.param(m, marks=_known("reads the internal plan")) if m in BOUNDARY_OFFENDERS else m
    for m in _downstream()])
def test_downstream_of_freeze_nothing_imports_the_planner(module: str) -> None:
    """At the top or inside a function alike: a deferred import of the planner is
    still a second plan vocabulary downstream of the artifact."""
    planning = sorted(m for m in _import_graph()[module] if m.startswith(PLANNING))
    assert planning == [], f"{module} imports {planning}: read kvspec.artifact.format"


def test_the_boundary_knows_its_downstream() -> None:
    downstream = set(_downstream())
    assert BOUNDARY_OFFENDERS.issubset(downstream)
    assert {"kvspec.integrations.vllm.guard", "kvspec.runtime.loader",
            "kvspec.sim.engine"} <= downstream
    assert not downstream & {"kvspec.cli.check", "kvspec.reports.diff", "kvspec.compiler"}
