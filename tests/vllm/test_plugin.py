"""The plugin's builder in both modes, driven as vLLM's engine core drives it.

Each case's layers are built as vLLM specs independently of kvspec's conversion
(tests/vllm/cases.py); vLLM's planning calls then run with kvspec's builder
installed, exactly as ``EngineCore._initialize_kv_caches`` makes them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvspec.integrations.vllm.guard import Expectation, PluginError
from kvspec.planner import size_plan
from tests.conftest import ROOT
from tests.vllm.cases import BY_DESIGN, CASES, TOO_SMALL, artifact
from tests.vllm.engine_core import plan

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

#: What plans in the engine core once the plugin is installed, per vLLM version: 0.33's
#: KVCacheConfigBuilder, 0.32's kv_cache_utils.get_kv_cache_groups (wrapped).
BUILDERS = {"0.33.0": "kvspec.integrations.vllm.v0_33.builder.KvspecBuilder",
            "0.32.0": "kvspec.integrations.vllm.v0_32.builder.get_kv_cache_groups"}


@pytest.fixture(scope="module")
def adapter():
    from kvspec.integrations import vllm as bridge
    return bridge.adapter()


@pytest.fixture(scope="module")
def builder(adapter):
    return BUILDERS[adapter.VERSION]


@pytest.fixture
def installed(adapter):
    """Install an artifact's expectation for one test (and take it away after)."""
    def install(path: Path, mode: str) -> None:
        adapter.install(Expectation.read(path, mode))
    yield install
    adapter.uninstall()


def _kvspec_workers(art, memory):
    sizing = size_plan(art.layout.plan, memory=memory)
    return [(r.num_blocks, list(r.tensors)) for r in sizing.stages]


@pytest.mark.parametrize("mode", ["verify", "enforce"])
@pytest.mark.parametrize("name", [c for c in CASES if c not in BY_DESIGN and c not in TOO_SMALL])
def test_vllm_returns_the_artifacts_kv_cache_config(name, mode, adapter, installed, builder,
                                                    tmp_path):
    path, art = artifact(name, tmp_path)
    installed(path, mode)
    out = plan(adapter, name, art)
    assert out["ok"], out["error"]
    assert out["builder"] == builder
    got = [(w["num_blocks"], w["kv_cache_tensors"]) for w in out["workers"]]
    assert got == _kvspec_workers(art, art.layout.budget.memory)
    assert out["scheduler_block_size"] == art.layout.scheduler_block_size


def test_stride_alignment_is_refused_by_design_in_verify_and_served_in_enforce(
        adapter, installed, tmp_path):
    path, art = artifact("syn-stride-alignment", tmp_path)
    installed(path, "verify")
    out = plan(adapter, "syn-stride-alignment", art)
    assert not out["ok"] and out["error"]["type"] == "EngineDrift"
    message = out["error"]["message"]
    assert "block_stride: engine 45056, artifact 41984" in message
    assert "differs by design: block-stride-alignment" in message
    adapter.uninstall()
    installed(path, "enforce")
    out = plan(adapter, "syn-stride-alignment", art)
    assert out["ok"], out["error"]
    assert [w["kv_cache_tensors"] for w in out["workers"]] == \
        [t for _, t in _kvspec_workers(art, art.layout.budget.memory)]


def test_mamba_cache_all_places_as_the_artifact_says(adapter, installed, tmp_path):
    """Mode 'all' differs by design only in vLLM's capacity report, not its placement."""
    path, art = artifact("syn-mamba-all", tmp_path)
    for mode in ("verify", "enforce"):
        installed(path, mode)
        out = plan(adapter, "syn-mamba-all", art)
        assert out["ok"] and out["num_blocks"] == art.layout.budget.num_blocks
        adapter.uninstall()


def test_the_state_slot_layout_cannot_be_served_upstream(adapter, installed, tmp_path):
    path, art = artifact("syn-glm5-next", tmp_path)
    with pytest.raises(RuntimeError, match="by design: state-slot-layout"):
        adapter.install(Expectation.read(path, "enforce"))
    installed(path, "verify")
    out = plan(adapter, "syn-glm5-next", art)  # the tail ring as upstream's CircularBufferSpec
    assert not out["ok"] and out["error"]["type"] == "EngineDrift"
    assert "class: engine 'CircularBufferSpec', artifact 'KpoolTailSpec'" in out["error"]["message"]


@pytest.mark.parametrize("mode", ["verify", "enforce"])
def test_a_budget_too_small_is_refused_by_vllm_itself(mode, adapter, installed, tmp_path):
    path, art = artifact("syn-not-enough-memory", tmp_path, budget=False)
    installed(path, mode)
    out = plan(adapter, "syn-not-enough-memory", art, memory=2**30)
    assert not out["ok"] and out["error"]["type"] == "ValueError"
    assert "memory" in out["error"]["message"].lower()


@pytest.mark.parametrize("mode", ["verify", "enforce"])
@pytest.mark.parametrize("changed, field", [
    ({"block_size": 32}, "block_size"),
    ({"kv_cache_dtype": "fp8"}, "kv_cache_dtype"),
    ({"max_num_batched_tokens": 4096}, "max_num_batched_tokens"),
    ({"enable_prefix_caching": False}, "enable_prefix_caching"),
])
def test_a_changed_flag_stops_the_engine(changed, field, mode, adapter, installed, tmp_path):
    path, art = artifact("synthetic-swa-hybrid", tmp_path)
    installed(path, mode)
    out = plan(adapter, "synthetic-swa-hybrid", art, **changed)
    assert not out["ok"] and out["error"]["type"] == "EngineDrift"
    assert f"engine: {field}: engine" in out["error"]["message"]


def test_a_changed_model_stops_the_engine_naming_the_layer(adapter, installed, tmp_path):
    """An artifact of another model (llama 8 KV heads -> 4): the layer, field, values."""
    from kvspec.compiler import compile_source
    from tests.vllm.cases import source

    _, art = artifact("llama-3.1-8b-tp1", tmp_path)
    text = source("llama-3.1-8b-tp1").replace("num_kv_heads: 8", "num_kv_heads: 4")
    mismatched = tmp_path / "mismatched.kvlayout.json"
    compile_source(text, "mismatched.yaml").write(mismatched)
    installed(mismatched, "verify")
    out = plan(adapter, "llama-3.1-8b-tp1", art)
    assert not out["ok"]
    assert "layer model.layers.0.self_attn.attn: num_kv_heads: engine 8, artifact 4" \
        in out["error"]["message"]


def test_a_tampered_artifact_is_refused(tmp_path):
    path, _ = artifact("llama-3.1-8b-tp1", tmp_path)
    data = json.loads(path.read_text())
    data["body"]["stages"][0]["tensors"][0]["block_stride"] = [0, 1024]
    path.write_text(json.dumps(data))
    with pytest.raises(PluginError, match="the artifact is refused"):
        Expectation.read(path)


def _engine_core(case: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    full = {**os.environ, **env, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "tests.vllm.engine_core", case], cwd=ROOT,
                          env=full, capture_output=True, text=True, timeout=600, check=False)


def test_the_entry_point_installs_the_builder_in_a_fresh_process(builder, tmp_path):
    path, art = artifact("synthetic-swa-hybrid", tmp_path)
    run = _engine_core("synthetic-swa-hybrid", {"KVSPEC_LAYOUT": str(path),
                                                "KVSPEC_MODE": "enforce"})
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["ok"] and out["builder"] == builder
    assert out["num_blocks"] == art.layout.budget.num_blocks


def test_the_entry_point_refuses_a_tampered_artifact_in_a_fresh_process(tmp_path):
    path, _ = artifact("synthetic-swa-hybrid", tmp_path)
    data = json.loads(path.read_text())
    data["body"]["budget"]["num_blocks"] += 1
    path.write_text(json.dumps(data))
    run = _engine_core("synthetic-swa-hybrid", {"KVSPEC_LAYOUT": str(path)})
    assert run.returncode != 0
    assert "the artifact is refused" in run.stderr


@pytest.mark.parametrize("mode", ["verify", "enforce"])
@pytest.mark.parametrize("init", ["--from-hf", "--from-vllm"])
@pytest.mark.parametrize("config", ["llama-3.1-8b", "gemma-3-27b-it", "deepseek-v3",
                                    "qwen3-next-80b-a3b-thinking", "nemotron-h-56b-base-8k"])
def test_real_models_layers_plan_to_the_artifact(config, init, mode, adapter, installed,
                                                 tmp_path):
    """The specs vLLM's own model code reports (built on meta, hybrid pages padded by
    the engine) against an artifact made by either init: vLLM plans the artifact."""
    from pathlib import Path as P

    from kvspec.compiled import read as read_artifact
    from kvspec.integrations.vllm.init import settings
    from tests.conftest import invoke
    from tests.vllm.compare_init import HF, options

    src = tmp_path / f"{config}.yaml"
    code, _, err = invoke(["init", init, str(HF / f"{config}.json"), "--tp", "2",
                           "--max-model-len", "8192", "--memory", "24GiB", "-o", str(src)])
    assert code == 0, err
    assert invoke(["compile", str(src)])[0] == 0
    path = P(str(src).removesuffix(".yaml") + ".kvlayout.json")
    art = read_artifact(path)
    built = adapter.build(HF / f"{config}.json",
                          {**settings(options(config, 2, max_model_len=8192))})
    installed(path, mode)
    out = adapter.plan(Expectation(art, "-", "verify").settings(), built["stages"],
                       art.layout.budget.memory)
    assert out["ok"], out["error"]
    assert [(w["num_blocks"], w["kv_cache_tensors"]) for w in out["workers"]] == \
        _kvspec_workers(art, art.layout.budget.memory)
