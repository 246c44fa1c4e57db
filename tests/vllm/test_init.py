"""``init --from-vllm`` on every config in tests/data/hf, with the real vLLM.

A standing check of the hand-kept family table: where ``init --from-hf`` knows the
family, both sources must give the same layer names, per-rank specs (as planned)
and engine settings, at several tensor-parallel sizes; where vLLM refuses a
deployment, the table must refuse it too. Every source ``init --from-vllm`` writes
is itself checked against vLLM's own specs (``check_reproduces``).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from tests.conftest import invoke
from tests.vllm.compare_init import HF, compare_config

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

CONFIGS = sorted(p.stem for p in HF.glob("*.json"))
RESULTS: dict[tuple[str, int], object] = {}


@pytest.fixture(scope="module")
def adapter():
    from kvspec.integrations import vllm as bridge
    return bridge.adapter()


@pytest.mark.parametrize("tp", [1, 2, 8])
@pytest.mark.parametrize("config", CONFIGS)
def test_vllm_and_the_family_table_give_the_same_layers(config, tp, adapter):
    outcome = compare_config(HF / f"{config}.json", tp, adapter)
    RESULTS[(config, tp)] = outcome
    if outcome.vllm != "ok":
        # vLLM refuses this deployment (heads that do not split): so must the table.
        assert outcome.hf.startswith("refused") or outcome.hf == "", outcome
        from kvspec.errors import KvspecError
        from kvspec.integrations.hf.init import init_source
        from tests.vllm.compare_init import options

        with pytest.raises(KvspecError):
            init_source(json.loads((HF / f"{config}.json").read_text()), options(config, tp))
        return
    assert outcome.differences == [], "\n".join(outcome.differences[:20])


def test_at_least_ten_families_build(adapter):
    archs = set()
    for config in CONFIGS:
        data = json.loads((HF / f"{config}.json").read_text())
        outcome = RESULTS.get((config, 1)) or compare_config(HF / f"{config}.json", 1, adapter)
        if outcome.vllm == "ok":
            archs.add(data.get("model_type") or (data.get("architectures") or ["?"])[0])
    assert len(archs) >= 10, archs


def test_the_command_writes_a_source_that_compiles(tmp_path: Path):
    model = tmp_path / "Qwen3-Next"
    model.mkdir()
    shutil.copy(HF / "qwen3-next-80b-a3b-thinking.json", model / "config.json")
    out = tmp_path / "qwen3-next.yaml"
    start = time.monotonic()
    code, stdout, stderr = invoke(["init", "--from-vllm", str(model), "--tp", "4",
                                   "--max-model-len", "32768", "--memory", "40GiB",
                                   "-o", str(out)])
    assert code == 0, stderr
    assert stdout == "" and stderr.strip() == f"wrote {out}"  # no progress off a terminal
    text = out.read_text()
    assert "kvspec init --from-vllm" in text and "vLLM 0.33.0" in text
    assert "mamba_cache_mode: align" in text
    code, _, err = invoke(["compile", str(out)])
    assert code == 0, err
    assert time.monotonic() - start < 120


def test_a_target_changes_what_depends_on_the_gpu(tmp_path: Path):
    args = ["init", "--from-vllm", str(HF / "qwen3-next-80b-a3b-thinking.json"),
            "--max-model-len", "32768"]
    common = invoke(args)[1]
    hopper = invoke(args + ["--target", "hopper"])[1]
    assert "block_size: 544" in common and "block_size: 576" in hopper
    assert "prefill_checkpoint_alignment" in hopper
    code, _, err = invoke(args + ["--target", "pascal"])
    assert code == 2 and "--target" in err


def test_a_refused_deployment_names_vllms_reason():
    code, out, err = invoke(["init", "--from-vllm", str(HF / "phi-4.json"), "--tp", "8"])
    assert code == 1 and out == ""
    assert "total_num_kv_heads % tp_size" in err


def test_a_directory_without_a_config_is_a_usage_error(tmp_path: Path):
    code, _, err = invoke(["init", "--from-vllm", str(tmp_path)])
    assert code == 2 and "no config.json" in err


def test_engine_args_flags_give_vllm_the_artifacts_settings(tmp_path: Path, adapter):
    """engine-args -> vLLM's own argument parser and config -> the plugin's check."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from kvspec.compiled import read as read_artifact
    from kvspec.integrations.vllm.guard import Expectation
    from kvspec.integrations.vllm.v0_33 import gpu
    from kvspec.integrations.vllm.v0_33.config import settings_of

    for config, tp in (("llama-3.1-8b", 2), ("nemotron-h-56b-base-8k", 2),
                       ("gemma-3-27b-it", 1)):
        src = tmp_path / f"{config}.yaml"
        assert invoke(["init", "--from-vllm", str(HF / f"{config}.json"), "--tp", str(tp),
                       "--max-model-len", "8192", "--memory", "20GiB", "-o", str(src)])[0] == 0
        assert invoke(["compile", str(src)])[0] == 0
        artifact = src.with_name(f"{config}.kvlayout.json")
        data = json.loads(invoke(["engine-args", str(artifact), "--engine", "vllm",
                                  "--format", "json"])[1])
        model = tmp_path / config
        model.mkdir()
        shutil.copy(HF / f"{config}.json", model / "config.json")
        parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
        ns = parser.parse_args(["--model", str(model), "--load-format", "dummy",
                                "--skip-tokenizer-init", *data["argv"][3:]])
        with gpu.config_stage():
            vc = EngineArgs.from_cli_args(ns).create_engine_config()
        gpu.undo_cpu_config(vc, {"enable_prefix_caching": True})
        Expectation(read_artifact(artifact), str(artifact), "verify").check_engine(
            {**settings_of(vc), "kv_cache_layout": None})


def test_mla_keeps_the_block_size_and_prefix_caching_asked_for():
    """The CPU platform forces MLA models to block size 16 without prefix caching."""
    code, out, err = invoke(["init", "--from-vllm", str(HF / "deepseek-v3.json"), "--tp", "8",
                             "--block-size", "64", "--kv-cache-dtype", "fp8_ds_mla"])
    assert code == 0, err
    assert "block_size: 64" in out and "prefix_caching: true" in out
    assert "fp8_ds_mla" in out and "state_content_bytes" not in out  # kvspec derives 656
