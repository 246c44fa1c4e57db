"""The compiled simulator (mypyc, ``kvspec/_native.py``): the same results as its
source, its doctests run from source, and the rules for using it.

The rest of the suite runs whichever build is in use (the compiled one after
``pip install -e .`` with a C compiler); these tests run the other beside it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvspec import _native

ROOT = Path(__file__).resolve().parents[1]

#: One simulation's step records, digested: a hybrid layout (sliding windows and full
#: attention in one pool), a small pool (preemptions), shared prefixes (hits).
RUN = """
import hashlib, json, sys
import kvspec, kvspec._native as native
from kvspec.compiled import read
from kvspec.sim import generate_trace, run_artifact
art = read(sys.argv[1])
trace = list(generate_trace(300, seed=3, prompt_mean=900, output_mean=120, rate=1.5,
                            max_prompt_tokens=4000, prefix_groups=3, prefix_share=0.5,
                            prefix_tokens=256))
result = run_artifact(art, trace, None if sys.argv[2] == "None" else int(sys.argv[2]))[0]
digest = hashlib.sha256("\\n".join(map(repr, map(tuple, result.steps))).encode()).hexdigest()
import kvspec.sim.schedule as schedule
print(json.dumps({"state": native.STATE, "file": schedule.__file__, "digest": digest,
                  "summary": result.as_dict()}))
"""


def _run(code: str, *args: str, pure: bool) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("KVSPEC_PURE_PYTHON", None)
    if pure:
        env["KVSPEC_PURE_PYTHON"] = "1"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, check=False)


def test_the_state_names_the_build_in_use() -> None:
    import kvspec.sim.schedule as schedule

    state = _native.install()
    assert state == "compiled" or state.startswith("source: ")
    assert schedule.__file__.endswith(".py") == (state != "compiled")


def test_pure_python_is_chosen_by_the_environment() -> None:
    out = _run(RUN.split("from kvspec.compiled")[0]
               + "print(native.STATE)\nimport kvspec.sim.schedule as s\nprint(s.__file__)",
               pure=True)
    assert out.returncode == 0, out.stderr
    state, file = out.stdout.split("\n")[:2]
    assert state == "source: KVSPEC_PURE_PYTHON is set" and file.endswith("schedule.py")


@pytest.mark.parametrize(("layout", "blocks"), [
    ("layouts/llama-3.1-8b.kvlayout.json", 600),  # one group, full attention
    ("layouts/gemma-3-27b-it.kvlayout.json", 2000),  # sliding windows beside full attention
    ("layouts/jamba-v0.1.kvlayout.json", 2000),  # Mamba states
    ("layouts/pooling-separate.kvlayout.json", None),  # pools of their own
])
def test_compiled_and_source_simulate_the_same_steps(layout: str, blocks: int | None) -> None:
    pure, native = (_run(RUN, layout, str(blocks), pure=p) for p in (True, False))
    assert pure.returncode == 0, pure.stderr
    assert native.returncode == 0, native.stderr
    a, b = json.loads(pure.stdout), json.loads(native.stdout)
    assert a["state"].startswith("source: ")
    if b["state"] != "compiled":
        pytest.skip(f"the compiled build is not in use here ({b['state']})")
    assert b["file"].endswith(_so_suffix())
    assert a["summary"]["hit_tokens"] > 0
    assert (a["digest"], a["summary"]) == (b["digest"], b["summary"])


def _so_suffix() -> str:
    import importlib.machinery

    return importlib.machinery.EXTENSION_SUFFIXES[0]


def test_the_compiled_modules_doctests_run_from_source() -> None:
    """Their doctests (skipped by collection while the compiled build is in use)."""
    paths = [m.replace(".", "/") + ".py" for m in _native.MODULES]
    env = {**os.environ, "KVSPEC_PURE_PYTHON": "1"}
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "--doctest-modules", *paths], capture_output=True, text=True,
                         env=env, cwd=ROOT, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert " passed" in out.stdout


def test_an_edited_source_is_never_shadowed_by_its_build(tmp_path: Path) -> None:
    """A module whose source differs from what was compiled: all are imported from
    source (they call each other natively, so all or none)."""
    manifest = tmp_path / "_native.json"
    module = _native.MODULES[3]
    source = ROOT.joinpath(*module.split(".")).with_suffix(".py")
    digests = {m: _native.source_digest(ROOT.joinpath(*m.split(".")).with_suffix(".py"))
               for m in _native.MODULES}
    digests[module] = "0" * 64
    manifest.write_text(json.dumps(digests))
    code = ("import kvspec._native as n, pathlib\n"
            f"n.MANIFEST_PATH = pathlib.Path({str(manifest)!r})\n"
            "print(n._decide())")
    out = _run(code, pure=False)
    assert out.returncode == 0, out.stderr
    if _native.install() != "compiled":
        assert out.stdout.startswith("source: ")
        return
    assert out.stdout.strip() == (f"source: {source.name} changed since it was compiled "
                                  "(pip install -e . again to rebuild)")
