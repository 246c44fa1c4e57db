"""``kvspec engine-args ARTIFACT --engine sglang``: SGLang 0.5.23 flags for a plan's pools.

SGLang 0.5.23 sizes its KV-cache pools in ``KVCacheConfigurator`` and the pool
configurators of ``model_executor/pool_configurator.py`` (file and function
names below are SGLang's, under ``python/sglang/srt/``). What each flag means
there, and so how a kvspec pool maps onto it:

* a token pool of ``size`` tokens holds ``size + page_size`` token rows, the
  first page a padding page (``mem_cache/memory_pool.py``,
  ``MHATokenToKVPool``); kvspec's pools keep block 0 as the null block, so a
  kvspec pool of ``N`` blocks of ``B`` tokens is SGLang's ``(N - 1) * B`` tokens
  at ``--page-size B``: the same bytes;
* ``--max-total-tokens T`` caps the token capacity it profiled
  (``KVCacheConfigurator._apply_token_constraints``); for a model with full and
  sliding-window layers ``T`` is the **full** pool's tokens and the
  sliding-window pool gets ``page_align(int(T * r))`` tokens, ``r`` being
  ``--swa-full-tokens-ratio``: a ratio of **tokens** (sliding over full), not of
  bytes (``HybridSWAPoolConfigurator._solve_pool_sizes``);
* a Mamba state pool of ``--max-mamba-cache-size K`` holds ``K + 1`` slots (a
  padding slot: ``MambaPool``, and ``KVCacheConfigurator._handle_max_mamba_cache``),
  so kvspec's state pool of ``N`` slots (slot 0 null) is ``K = N - 1``. Without
  it, ``--mamba-full-memory-ratio m`` is a ratio of **bytes**: the state pool
  gets ``m / (1 + m)`` of the memory left after weights, the full-attention
  pool the rest (same function);
* at most ``min(--max-running-requests, tokens // 2, K // ratio)`` requests
  run, ``ratio`` being 1 without the radix cache and 3 or more with it
  (``KVCacheConfigurator.resolve_max_num_reqs``, ``_calculate_mamba_ratio``).
  With the radix cache off and ``--max-running-requests`` given, SGLang sizes
  the sliding-window pool from the request cap and ignores the ratio
  (``SWARequestCapPoolConfigurator.is_applicable``), so that flag is left out
  of such plans.

Pinned sizes (``--max-total-tokens``, ``--max-mamba-cache-size``) do not depend
on ``--mem-fraction-static``; SGLang only needs at least the budget free for
its KV cache after the weights (else it warns and keeps the smaller profiled
size, with the same split). A plan SGLang cannot hold (a unified hybrid plan,
several windows, layer kinds SGLang pools otherwise) is a :class:`KvspecError`
naming what serves it. Needs no SGLang.

>>> from kvspec.artifact import Artifact
>>> args = server_args(Artifact.read("layouts/pooling-separate.kvlayout.json"), "a.json")
>>> [(f.flag, f.value) for f in args.flags if f.flag in ("--page-size", "--max-total-tokens")]
[('--page-size', '16'), ('--max-total-tokens', '608688')]
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from kvspec.artifact import Artifact
from kvspec.artifact import format as fmt
from kvspec.errors import KvspecError
from kvspec.integrations.sglang import TARGET

__all__ = ["Flag", "PoolSize", "ServerArgs", "render_shell", "server_args", "swa_tokens"]

#: kvspec KV-cache dtypes and SGLang's ``--kv-cache-dtype`` names for them.
_KV_DTYPES = {"auto": "auto", "bfloat16": "bfloat16", "fp8": "fp8_e4m3",
              "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}
#: SSM state dtypes ``--mamba-ssm-dtype`` takes.
_SSM_DTYPES = ("float32", "bfloat16", "float16")
#: The radix cache keeps this many state slots per running request at least
#: (``MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO``).
RADIX_STATE_SLOTS = 3
#: What serves a plan SGLang cannot hold.
_HINT = ("compile it with pooling.policy: separate (or auto with serve_with: kvspec), whose "
         "pools SGLang can reproduce, or serve this plan with vLLM (--engine vllm) or "
         "kvspec's runtime")


@dataclass(frozen=True)
class Flag:
    """One ``sglang serve`` flag: the flag, its value (None: a switch), what it sets."""

    flag: str
    value: str | None
    why: str

    def words(self) -> list[str]:
        return [self.flag] if self.value is None else [self.flag, self.value]


@dataclass(frozen=True)
class PoolSize:
    """One pool: kvspec's blocks and SGLang's size for it (tokens, or state slots)."""

    name: str
    #: ``full``, ``swa`` or ``state``.
    role: str
    num_blocks: int | None
    block_size: int
    bytes_per_block: int
    #: SGLang's size: tokens of a token pool, ``max_mamba_cache_size`` of a state pool.
    sglang: int | None


@dataclass(frozen=True)
class ServerArgs:
    """Everything ``sglang serve`` needs to give an artifact's pools."""

    model: str
    artifact: str
    fingerprint: str
    flags: tuple[Flag, ...]
    pools: tuple[PoolSize, ...]
    notes: tuple[str, ...] = field(default=())


def _refuse(path: str, what: str, *, where: str = "body", found: str | None = None,
            hint: str = _HINT) -> KvspecError:
    return KvspecError(f"SGLang {TARGET} cannot hold this plan's pools: {what}", file=path,
                       path=where, found=found, hint=hint)


def _role(kinds: set[str], path: str) -> str:
    """A pool's role in SGLang from the kvspec kinds of its tensors."""
    if kinds <= {"full_attention", "mla"} and len(kinds) == 1:
        return "full"
    if kinds <= {"sliding_window", "sliding_window_mla"} and len(kinds) == 1:
        return "swa"
    if kinds == {"mamba"}:
        return "state"
    raise _refuse(path, f"a pool of {' and '.join(sorted(kinds))} layers, which SGLang "
                  "pools otherwise (it has full-attention, sliding-window and Mamba-state "
                  "pools)", where="body.stages[0].pools", found=", ".join(sorted(kinds)))


def _pool_sizes(artifact: Artifact, path: str) -> list[PoolSize]:
    """The stage's pools, each with its role and block count."""
    body = artifact.body
    stage = body.stages[0]
    budgets: dict[str, fmt.Budget | None] = {"device": body.budget}
    if body.pooling is not None and body.pooling.policy == "separate":
        budgets = {p.name: p.budget for p in body.pooling.pools}
    out = []
    for pool in stage.pools:
        kinds = {t.kind for t in stage.tensors if t.pool == pool.name}
        if not kinds:
            continue
        if len(kinds) > 1 or pool.name in ("draft", "host"):
            raise _refuse(path, f"pool {pool.name} shares one page size between "
                          f"{' and '.join(sorted(kinds))} layers (a unified hybrid "
                          "plan); SGLang keeps each kind in a pool of its own",
                          where="body.pooling.policy", found="unified")
        role = _role(kinds, path)
        block = max(t.block_size for t in stage.tensors if t.pool == pool.name)
        budget = budgets.get(pool.name)
        n = pool.num_blocks or (budget.num_blocks if budget is not None else None)
        size = None if n is None else (n - 1 if role == "state" else (n - 1) * block)
        out.append(PoolSize(pool.name, role, n, block, pool.bytes_per_block, size))
    return out


def _check_shape(pools: list[PoolSize], artifact: Artifact, path: str) -> None:
    roles = sorted(p.role for p in pools)
    if roles not in (["full"], ["full", "swa"], ["full", "state"]):
        raise _refuse(path, "pools " + ", ".join(f"{p.name} ({p.role})" for p in pools)
                      + "; SGLang holds one full-attention pool, with at most one "
                      "sliding-window pool or one Mamba-state pool beside it",
                      where="body.stages[0].pools")
    engine = artifact.body.engine
    page = {p.block_size for p in pools if p.role != "state"}
    if len(page) > 1:
        raise _refuse(path, f"token pools at block sizes {sorted(page)}; SGLang has one "
                      "--page-size", where="body.pooling.block_size")
    for what, bad in (("pipeline stages", engine.pipeline_parallel_size > 1),
                      ("decode-context parallelism", engine.decode_context_parallel_size > 1),
                      ("a drafter", engine.speculative_method is not None)):
        if bad:
            raise _refuse(path, f"{what}: kvspec does not map that onto SGLang's pools",
                          where="body.engine", hint="serve it with vLLM (--engine vllm) "
                          "or kvspec's runtime")


def swa_tokens(full_tokens: int, ratio: float, page_size: int) -> int:
    """The sliding-window pool SGLang makes beside ``full_tokens`` full tokens:
    ``HybridSWAPoolConfigurator._solve_pool_sizes``.

    >>> swa_tokens(608688, 0.138931, 16)
    84560
    """
    return int(full_tokens * ratio) // page_size * page_size


def swa_ratio(full_tokens: int, swa: int, page_size: int) -> str:
    """The shortest ``--swa-full-tokens-ratio`` (as printed) with which SGLang makes
    exactly ``swa`` sliding-window tokens beside ``full_tokens``.

    >>> swa_ratio(608688, 84560, 16)
    '0.13893'
    """
    for digits in range(2, 12):
        text = f"{(swa + page_size / 2) / full_tokens:.{digits}g}"
        if swa_tokens(full_tokens, float(text), page_size) == swa:
            return text
    raise AssertionError("no ratio reproduces the pool")  # pragma: no cover


def _dtype_flags(artifact: Artifact, path: str) -> list[Flag]:
    body = artifact.body
    modes = {e.kv_cache_dtype for e in body.layers.values() if e.kv_cache_dtype is not None}
    if len(modes) > 1:
        raise _refuse(path, f"layers in several quantization modes ({', '.join(sorted(modes))})"
                      "; SGLang has one --kv-cache-dtype", where="body.layers")
    mode = next(iter(modes), "auto")
    if mode not in _KV_DTYPES:
        raise _refuse(path, f"KV-cache dtype {mode}, which SGLang {TARGET} does not store",
                      where="body.engine.kv_cache_dtype", found=mode,
                      hint=f"SGLang takes {', '.join(sorted(set(_KV_DTYPES)))}")
    out = [Flag("--kv-cache-dtype", _KV_DTYPES[mode], "quantization of the KV cache")]
    states: list[Any] = [s for s in body.specs if getattr(s, "dtypes", None)]
    if states:
        ssm = states[0].dtypes[-1]
        if ssm in _SSM_DTYPES:
            out.append(Flag("--mamba-ssm-dtype", ssm, "the SSM state's dtype (the state slot's "
                            "bytes)"))
    return out


def _pool_flags(pools: list[PoolSize], path: str) -> tuple[list[Flag], list[str]]:
    """The flags that size the pools, and notes on what SGLang does with them."""
    full = next(p for p in pools if p.role == "full")
    flags, notes = [], []
    if full.sglang is not None:
        flags.append(Flag("--max-total-tokens", str(full.sglang),
                          f"full-attention pool: {full.num_blocks} blocks of "
                          f"{full.block_size} tokens, less the null block"))
    for p in pools:
        if p.role == "swa" and full.sglang is not None and p.sglang is not None:
            if p.sglang > full.sglang:
                raise _refuse(path, f"the sliding-window pool ({p.sglang} tokens) is larger "
                              f"than the full-attention pool ({full.sglang}); SGLang's "
                              "--swa-full-tokens-ratio must be in (0, 1] "
                              "(arg_groups/kv_cache_hook.py)", where="body.pooling.pools",
                              hint="give the full-attention pool a larger share "
                              "(pooling.split)")
            flags.append(Flag("--swa-full-tokens-ratio",
                              swa_ratio(full.sglang, p.sglang, full.block_size),
                              f"sliding-window tokens over full tokens: {p.sglang} / "
                              f"{full.sglang}"))
        if p.role == "state" and p.sglang is not None:
            flags.append(Flag("--max-mamba-cache-size", str(p.sglang),
                              f"state slots: {p.num_blocks}, less the null slot"))
            if full.num_blocks is not None and p.num_blocks is not None:
                ratio = p.num_blocks * p.bytes_per_block / (full.num_blocks *
                                                            full.bytes_per_block)
                notes.append(f"to size by SGLang's own memory instead of fixed sizes, "
                             f"replace --max-mamba-cache-size and --max-total-tokens with "
                             f"--mamba-full-memory-ratio {ratio:.4g} (state bytes over "
                             f"full-attention bytes)")
    return flags, notes


def running(pools: list[PoolSize], max_num_seqs: int, caching: bool) -> int:
    """The most requests SGLang runs at once with these pools:
    ``KVCacheConfigurator.resolve_max_num_reqs`` (at least ``RADIX_STATE_SLOTS``
    state slots per request with the radix cache, one without)."""
    out = max_num_seqs
    for p in pools:
        if p.sglang is None:
            continue
        if p.role == "full":
            out = min(out, p.sglang // 2)
        elif p.role == "state":
            out = min(out, p.sglang // (RADIX_STATE_SLOTS if caching else 1))
    return out


def server_args(artifact: Artifact, path: str, *, model: str | None = None
                ) -> ServerArgs:
    """The ``sglang serve`` flags that give ``artifact``'s pools (see the module
    docstring), or a :class:`KvspecError` when SGLang cannot hold them."""
    body = artifact.body
    pools = _pool_sizes(artifact, path)
    _check_shape(pools, artifact, path)
    engine = body.engine
    page = next(p.block_size for p in pools if p.role == "full")
    caching = engine.enable_prefix_caching
    flags = [Flag("--tp-size", str(engine.tensor_parallel_size), "KV heads per rank"),
             *_dtype_flags(artifact, path),
             Flag("--page-size", str(page), "tokens per block of the token pools"),
             Flag("--context-length", str(engine.max_model_len), "the longest request")]
    sized, notes = _pool_flags(pools, path)
    flags += sized
    swa_without_radix = not caching and any(p.role == "swa" for p in pools)
    if swa_without_radix:
        notes.append("--max-running-requests left out: without the radix cache SGLang "
                     "would size the sliding-window pool from it and ignore the ratio")
    else:
        flags.append(Flag("--max-running-requests", str(engine.max_num_seqs),
                          "requests per step"))
        most = running(pools, engine.max_num_seqs, caching)
        if most < engine.max_num_seqs:
            notes.append(f"SGLang runs at most {most} requests at once with these pools "
                         + ("(state slots per running request: 3 or more with the radix "
                            "cache)" if caching else "(one state slot per request)")
                         if any(p.role == "state" for p in pools)
                         else f"SGLang runs at most {most} requests at once (half its tokens)")
    flags.append(Flag("--chunked-prefill-size", str(engine.max_num_batched_tokens),
                      "tokens per prefill chunk"))
    if not caching:
        flags.append(Flag("--disable-radix-cache", None, "no prefix caching"))
    if any(p.sglang is None for p in pools):
        notes.append("the artifact has no memory budget: pool sizes are left to SGLang")
    elif body.budget is not None:
        notes.append(f"SGLang needs {body.budget.memory:,} bytes per rank free for the KV "
                     "cache after the weights (raise --mem-fraction-static if it logs "
                     "'larger than the profiled value')")
    return ServerArgs(model or body.model or "MODEL", path, artifact.fingerprint,
                      tuple(flags), tuple(pools), tuple(notes))


def render_shell(args: ServerArgs) -> str:
    """A shell command (one flag a line), the pools and notes as comments."""
    lines = [(f"# sglang serve flags giving the pools of {args.artifact} ({args.fingerprint}), "
             f"SGLang {TARGET}")]
    for p in args.pools:
        unit = "state slots" if p.role == "state" else "tokens"
        size = "-" if p.sglang is None else f"{p.sglang:,} {unit}"
        lines.append(f"# pool {p.name} ({p.role}): {p.num_blocks or '-'} blocks x "
                     f"{p.bytes_per_block:,} B -> SGLang {size}")
    words = [f"sglang serve --model-path {shlex.quote(args.model)}"]
    words += ["  " + " ".join(shlex.quote(w) for w in f.words()) for f in args.flags]
    lines.append(" \\\n".join(words))
    lines += [f"# note: {n}" for n in args.notes]
    return "\n".join(lines) + "\n"


def as_json(args: ServerArgs) -> dict[str, Any]:
    return {"engine": "sglang", "sglang": TARGET, "model": args.model,
            "artifact": args.artifact, "fingerprint": args.fingerprint,
            "flags": [{"flag": f.flag, "value": f.value, "sets": f.why} for f in args.flags],
            "argv": ["sglang", "serve", "--model-path", args.model]
            + [w for f in args.flags for w in f.words()],
            "pools": [{"name": p.name, "role": p.role, "num_blocks": p.num_blocks,
                       "block_size": p.block_size, "bytes_per_block": p.bytes_per_block,
                       "sglang": p.sglang} for p in args.pools],
            "notes": list(args.notes)}
