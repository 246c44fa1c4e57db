"""What a serving process imports: the vLLM plugin and its checks read the frozen
format and load none of the compiler (issue 37, "Measured").

A fresh interpreter loads the plugin's entry point (``pyproject.toml``'s
``vllm.general_plugins``), reads a committed artifact into the plugin's
expectation as ``register()`` does, and runs the checks an engine process runs;
then it reports every module it loaded. ``engine-args`` reads the same way.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib

import pytest

from tests.conftest import ROOT

#: Folders and modules of kvspec a serving process must not load.
COMPILER = ("kvspec.planner", "kvspec.passes", "kvspec.compiler", "kvspec.compiled",
            "kvspec.pooling", "kvspec.sim", "kvspec.model.plan")
#: Third-party packages it must not load.
THIRD_PARTY = ("pydantic", "yaml", "jinja2", "click")
#: kvspec modules the plugin path loads (39 when this was written; 41 since the budget
#: record moved to kvspec.model.budget and the longest-request search to
#: kvspec.model.fit, shared with the planner; 42 with kvspec._native, which every
#: `import kvspec` loads to choose the compiled simulator or its source; 44 since the
#: pooling record names what judged `auto` (kvspec.model.slo's limits and
#: kvspec.model.steptime's units, both standard library only)): more is a prompt to
#: look at what came in.
MOST_KVSPEC_MODULES = 44

_PLUGIN = """
import json, sys
from importlib import import_module
entry, attr = sys.argv[2].split(":")
getattr(import_module(entry), attr)
from kvspec.integrations.vllm.guard import Expectation
exp = Expectation.read(sys.argv[1], "enforce")
exp.check_servable()
exp.check_engine(exp.settings())
exp.check_layers(exp.layers)
names = list(exp.layers)
exp.check_groups(exp.expected_groups(names), names)
memory = exp.body.budget.memory
length, blocks = exp.sized(memory)
exp.check_final(memory, [{"num_blocks": blocks, "kv_cache_tensors": exp.tensors(names, blocks),
                          "groups": [names]}], length)
exp.check_block_sizes(exp.body.scheduler_block_size, exp.body.hash_block_size)
print(json.dumps(sorted(sys.modules)))
"""

_ENGINE_ARGS = """
import json, sys
from kvspec.artifact import Artifact
from kvspec.integrations.vllm.engine_args import engine_args, render_shell
render_shell(engine_args(Artifact.read(sys.argv[1]), sys.argv[1]))
print(json.dumps(sorted(sys.modules)))
"""


def _entry_point() -> str:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    entry: str = meta["project"]["entry-points"]["vllm.general_plugins"]["kvspec"]
    return entry


def _loaded(code: str, *args: str) -> list[str]:
    run = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True,
                         text=True, check=False,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr[-2000:]
    loaded: list[str] = json.loads(run.stdout.splitlines()[-1])
    return loaded


def _forbidden(loaded: list[str]) -> list[str]:
    return [m for m in loaded if any(m == p or m.startswith(p + ".")
                                     for p in COMPILER + THIRD_PARTY)]


@pytest.mark.parametrize("name", ["llama-3.1-8b", "jamba-v0.1", "gemma-3-27b-it"])
def test_the_plugin_checks_an_artifact_without_the_compiler(name: str) -> None:
    path = ROOT / "layouts" / f"{name}.kvlayout.json"
    loaded = _loaded(_PLUGIN, str(path), _entry_point())
    assert _forbidden(loaded) == []
    ours = [m for m in loaded if m == "kvspec" or m.startswith("kvspec.")]
    assert len(ours) <= MOST_KVSPEC_MODULES, ours


def test_engine_args_reads_the_artifact_without_the_compiler() -> None:
    path = ROOT / "layouts" / "nemotron-h-56b-base-8k.kvlayout.json"
    assert _forbidden(_loaded(_ENGINE_ARGS, str(path))) == []
