"""Pooling plans against the real vLLM 0.33.0: what ``engine-args`` prints for a plan
``pooling: auto`` chose makes vLLM's own planner plan it (through the plugin), and a
plan of separate pools is refused by the plugin in every mode, in-process and by
its entry point in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvspec.compiled import read
from kvspec.integrations.vllm.guard import EngineDrift, Expectation, PluginError
from kvspec.planner import size_plan
from tests.conftest import ROOT, invoke
from tests.vllm.compare_init import HF

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

SEPARATE = ROOT / "layouts" / "pooling-separate.kvlayout.json"
SOURCE = ROOT / "tests" / "data" / "pooling" / "llama-auto-vllm.yaml"


@pytest.fixture(scope="module")
def adapter():
    from kvspec.integrations import vllm as bridge
    return bridge.adapter()


@pytest.fixture(scope="module")
def chosen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An artifact whose auto-chosen plan (16-token blocks) is not the source's (128)."""
    out = tmp_path_factory.mktemp("pooling") / "llama-auto-vllm.kvlayout.json"
    code, _, err = invoke(["compile", str(SOURCE), "-o", str(out)])
    assert code == 0, err
    record = read(out).body.pooling
    assert record is not None and record.candidates[record.chosen].block_size == 16
    assert record.candidates[0].block_size == 128
    return out


def _settings_from_flags(argv: list[str], model: Path) -> dict[str, Any]:
    """The printed flags through vLLM's own argument parser and config stage."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from kvspec.integrations.vllm.v0_33 import gpu
    from kvspec.integrations.vllm.v0_33.config import settings_of

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    ns = parser.parse_args(["--model", str(model), "--load-format", "dummy",
                            "--skip-tokenizer-init", *argv[3:]])
    with gpu.config_stage():
        vc = EngineArgs.from_cli_args(ns).create_engine_config()
    gpu.undo_cpu_config(vc, {"enable_prefix_caching": ns.enable_prefix_caching})
    return settings_of(vc)


def _plan(adapter: Any, art_path: Path, mode: str, settings: dict[str, Any]) -> dict[str, Any]:
    """vLLM's planning of Llama-3.1-8B's own layers (built on meta at these settings)
    with the plugin installed for the artifact in ``mode``."""
    built = adapter.build(HF / "llama-3.1-8b.json", {
        k: settings[k] for k in ("block_size", "tensor_parallel_size", "pipeline_parallel_size",
                                 "decode_context_parallel_size", "enable_prefix_caching",
                                 "kv_cache_dtype", "max_model_len")})
    adapter.install(Expectation.read(art_path, mode))
    try:
        return adapter.plan(settings, built["stages"], read(art_path).layout.budget.memory)
    finally:
        adapter.uninstall()


def test_the_printed_flags_make_vllm_plan_the_chosen_plan(chosen: Path, adapter,
                                                          tmp_path: Path) -> None:
    data = json.loads(invoke(["engine-args", str(chosen), "--format", "json"])[1])
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text((HF / "llama-3.1-8b.json").read_text())
    settings = _settings_from_flags(data["argv"], model)
    assert settings["block_size"] == 16
    art = read(chosen)
    Expectation(art, str(chosen), "verify").check_engine({**settings, "kv_cache_layout": None})
    sizing = size_plan(art.layout.plan, memory=art.layout.budget.memory)
    want = [(r.num_blocks, list(r.tensors)) for r in sizing.stages]
    for mode in (data["env"]["KVSPEC_MODE"], "enforce"):
        out = _plan(adapter, chosen, mode, settings)
        assert out["ok"], out["error"]
        assert [(w["num_blocks"], w["kv_cache_tensors"]) for w in out["workers"]] == want


def test_the_sources_own_settings_are_refused_for_the_chosen_plan(chosen: Path,
                                                                 adapter) -> None:
    """Served with the source's block size (128) instead of the printed flags, the
    engine stops: the flags are what makes vLLM run the chosen plan."""
    settings = {**Expectation(read(chosen), "-", "verify").settings(), "block_size": 128}
    for mode in ("verify", "enforce"):
        out = _plan(adapter, chosen, mode, settings)
        assert not out["ok"] and out["error"]["type"] == EngineDrift.__name__
        assert "block_size: engine 128, artifact 16" in out["error"]["message"]


@pytest.mark.parametrize("mode", ["verify", "enforce"])
def test_the_plugin_refuses_separate_pools(mode: str) -> None:
    with pytest.raises(PluginError, match="one shared pool") as info:
        Expectation.read(SEPARATE, mode)
    assert "--engine sglang" in (info.value.hint or "")


def test_the_entry_point_refuses_separate_pools_in_a_fresh_process() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KVSPEC_LAYOUT": str(SEPARATE),
           "KVSPEC_MODE": "enforce"}
    run = subprocess.run([sys.executable, "-m", "tests.vllm.engine_core", "llama-3.1-8b-tp1"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
                         check=False)
    assert run.returncode != 0
    assert "vLLM cannot serve this artifact in any KVSPEC_MODE" in run.stderr
