"""``KVSPEC_MODE=allocate``: kvspec's loader allocates the running engine's KV cache.

For each family the CPU engine serves (tests/serve/families.py), one engine runs
vanilla and one runs with the plugin in allocate mode, on the same tiny checkpoint
(tests/serve/checkpoints.py) and the same token-id prompts. Each engine runs in a
child process of its own (vLLM loads its plugins once per process), in-process there
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``, the ``uni`` executor), so that the child can
look at the model runner it served with:

* the tensor every attention layer reads (``static_forward_context[name].kv_cache``,
  what ``bind_kv_cache`` bound) has the data pointer, shape, strides and dtype of
  kvspec's per-layer view (``LoadedCache.views``) -- or, for a layer that addresses
  its own pages (Mamba), is kvspec's allocation itself;
* the greedy tokens equal vanilla vLLM's, for prompts that share a prefix, prompts
  longer than several blocks and, for sliding-window models, longer than the window;
* the loader's zeroing rule: memory the artifact does not ask to zero is filled with
  0xFF bytes (NaN in bf16) before the engine sees it, and the tokens are still
  vanilla's; memory it asks to zero is all zeros when the engine starts;
* the block-id proof (no two block ids share a byte, every view inside its pool)
  holds for the engine's block count, and fails for an artifact whose block stride
  was shrunk.

Run as a script, this file is the child: ``python test_allocate.py CHILD_ARGS_JSON``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
#: Where the tests keep their checkpoints, artifacts and children's results.
CACHE = ROOT / "build" / "serve"
#: The families allocate mode runs on: dense GQA, sliding window + full, a Mamba-2
#: hybrid (state layers take kvspec's raw allocation; the artifact needs zeroing).
FAMILIES = ("llama", "gemma2", "granitemoehybrid")
#: The CPU engine's block sizes: 128 by default (CpuPlatform); a hybrid's attention
#: block is raised to a multiple of 32 whose page holds one Mamba state.
CPU_BLOCK_SIZE = {"granitemoehybrid": 384}

#: Prompts (token ids < 512, the checkpoints' vocabulary): two sharing a 300-token
#: prefix (prefix caching hits), one of 700 tokens (over 5 blocks of 128, ten
#: 64-token windows), one short.
PREFIX = [(i * 37 + 11) % 500 + 3 for i in range(300)]
PROMPTS = [
    PREFIX + [(i * 13 + 5) % 500 + 3 for i in range(40)],
    PREFIX + [(i * 29 + 7) % 500 + 3 for i in range(90)],
    [(i * 7 + 1) % 500 + 3 for i in range(700)],
    [5, 17, 42, 99, 256],
]
MAX_TOKENS = 24
MAX_MODEL_LEN = 1024


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
        if isinstance(bound, list):     # a Mamba layer unpacks its raw allocation
            row["kind"] = "states"
            row["inside"] = all(
                any(p <= t.data_ptr() < p + n for p, n in buffers.values()) for t in bound)
        elif bound is not None:
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
                       "VLLM_CPU_KVCACHE_SPACE": "1"})
    if args["mode"] == "allocate":
        os.environ.update({"KVSPEC_LAYOUT": args["artifact"], "KVSPEC_MODE": "allocate"})
        if "zero" in args:
            from kvspec.integrations.vllm.v0_32 import allocate
            allocate.ZERO = args["zero"]
        if args.get("poison"):
            _poison()
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=args["model"], skip_tokenizer_init=True, dtype="bfloat16",
              max_model_len=MAX_MODEL_LEN, enforce_eager=True,
              distributed_executor_backend="uni", seed=0, **args.get("engine", {}))
    seen = llm.collective_rpc(_inspect)[0] if args["mode"] == "allocate" else {}
    core = llm.llm_engine.engine_core.engine_core
    seen["engine_needs_zeroing"] = bool(core.scheduler.needs_kv_cache_zeroing)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, detokenize=False,
                            ignore_eos=True)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in PROMPTS], params,
                        use_tqdm=False)
    # the same prompts again: their prefixes are now cached
    again = llm.generate([TokensPrompt(prompt_token_ids=p) for p in PROMPTS], params,
                         use_tqdm=False)
    result = {"tokens": [list(o.outputs[0].token_ids) for o in outs],
              "again": [list(o.outputs[0].token_ids) for o in again],
              "cached": [o.num_cached_tokens for o in again],
              "seen": seen}
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


def checkpoint(family: str) -> Path:
    sys.path.insert(0, str(HERE))
    import checkpoints

    return checkpoints.make(family, CACHE / "checkpoints")


def kvspec(*args: str, cwd: Path = ROOT) -> str:
    done = subprocess.run([sys.executable, "-m", "kvspec", *args], cwd=cwd, check=False,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return done.stdout


def artifact(family: str) -> Path:
    """The artifact the user would serve: ``kvspec init --from-vllm`` of the checkpoint
    (vLLM 0.32's own model code, the CPU engine's settings), compiled for the
    engine's budget (VLLM_CPU_KVCACHE_SPACE=1)."""
    model = checkpoint(family)
    out = CACHE / "allocate" / family
    out.mkdir(parents=True, exist_ok=True)
    source = out / f"{family}.yaml"
    text = kvspec("init", "--from-vllm", str(model), "--max-model-len", str(MAX_MODEL_LEN),
                  "--block-size", str(CPU_BLOCK_SIZE.get(family, 128)), "-q")
    # init describes a GPU deployment; the CPU engine differs in three settings: its
    # attention reads head-major blocks only ("Using LBHNC KV cache layout"), the CPU
    # platform turns async scheduling off and batches 4096 tokens a step
    assert "\n  layout:" not in text and "\n  max_num_batched_tokens: 8192\n" in text
    text = text.replace("\n  max_num_batched_tokens: 8192\n",
                        "\n  max_num_batched_tokens: 4096\n", 1)
    source.write_text(text.replace(
        "\nengine:\n", "\nengine:\n  layout: LBHNC\n  async_scheduling: false\n", 1))
    target = out / f"{family}.kvlayout.json"
    kvspec("compile", str(source), "--memory", "1GiB", "-o", str(target), "-q")
    return target


def run(family: str, mode: str, tag: str = "", **extra: Any) -> dict[str, Any]:
    """One child engine; its tokens and what it saw."""
    out = CACHE / "allocate" / family / f"{mode}{tag}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    args = {"mode": mode, "model": str(checkpoint(family)), "out": str(out), **extra}
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVSPEC_")}
    done = subprocess.run([sys.executable, __file__, json.dumps(args)], env=env, check=False,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0 and out.is_file(), done.stdout[-4000:] + done.stderr[-8000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def vanilla() -> dict[str, dict[str, Any]]:
    return {}


def vanilla_of(cache: dict[str, dict[str, Any]], family: str) -> dict[str, Any]:
    if family not in cache:
        cache[family] = run(family, "vanilla")
    return cache[family]


@pytest.mark.serve
@pytest.mark.parametrize("family", FAMILIES)
def test_kvspec_allocates_the_engines_kv_cache(family: str, vanilla: dict) -> None:
    art = artifact(family)
    got = run(family, "allocate", artifact=str(art), poison=True)
    want = vanilla_of(vanilla, family)
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
    # zeroing: the artifact's rule is the engine's; the allocation is zeroed
    assert seen["needs_zeroing"] == seen["engine_needs_zeroing"]
    assert seen["zeroed"]
    # identical greedy tokens, with the pool poisoned before zeroing; prefix hits
    assert got["tokens"] == want["tokens"]
    assert got["again"] == want["again"] == want["tokens"]
    assert got["cached"] == want["cached"] and got["cached"][1] >= 256


@pytest.mark.serve
def test_the_artifacts_zeroing_rule_alone_is_not_enough(vanilla: dict) -> None:
    """Evidence for allocate.ZERO: with only the artifact's rule (a plain attention
    cache needs no zeroing) and the pool filled with 0xFF (NaN in bf16), vLLM's
    kernels read NaN from the unwritten slots of partial blocks."""
    art = artifact("llama")
    got = run("llama", "allocate", "-rule", artifact=str(art), poison=True, zero=None)
    assert got["seen"]["needs_zeroing"] is False and got["seen"]["zeroed"] is False
    assert got["tokens"] != vanilla_of(vanilla, "llama")["tokens"]


if __name__ == "__main__":
    child(json.loads(sys.argv[1]))
