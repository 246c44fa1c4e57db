"""vLLM 0.33.0's own ``Scheduler`` and ``KVCacheManager``, built on CPU for a plan.

:func:`build` makes the scheduler the engine core would make for a plan's
per-stage specs: vLLM's planning calls (as :mod:`.planning` runs them for
``verify``) give the scheduler's ``KVCacheConfig``, block sizes and config;
the block count is then set to ``num_blocks`` (the plan is made at the
layout's budget, which must fit ``max_model_len``). The class is the one
``SchedulerConfig.get_scheduler_cls()`` picks (``AsyncScheduler`` with async
scheduling), as vLLM's scheduler tests build one on CPU.

:class:`VllmEngine` drives it step by step for :func:`kvspec.sim.engine.drive`:
requests with the trace's synthetic token ids, and a stub model output of one
sampled token per request whose scheduled tokens end its known tokens.
"""

from __future__ import annotations

from typing import Any

from kvspec.integrations.vllm.v0_33.config import planning_config
from kvspec.integrations.vllm.v0_33.planning import worker_specs
from kvspec.model.steptime import shape_of
from kvspec.sim.chains import Chains, chain_token_id
from kvspec.sim.metrics import LiveBytes, StepRecord
from kvspec.sim.trace import TraceRequest, prefix_codes, token_id

__all__ = ["VllmEngine", "build"]


def kv_cache_configs(vc: Any, workers: list[Any], memory: int) -> list[Any]:
    """The engine core's per-worker KV-cache configs at ``memory`` each (vLLM 0.33 plans
    the global groups first)."""
    # deferred: vllm, imported only in its own environment
    from vllm.v1.engine import core

    groups = core.get_global_kv_cache_groups(vc, workers)
    return core.get_kv_cache_configs(vc, workers, [memory] * len(workers), groups)


def build(settings: dict[str, Any], stages: list[dict[str, dict[str, Any]]], memory: int,
          num_blocks: int, *, hash_fn: str = "sha256",
          configs_of: Any = kv_cache_configs) -> tuple[Any, Any]:
    """(scheduler, block hasher or None) for the plan of ``stages`` at ``memory``;
    ``configs_of``: the version's :func:`kv_cache_configs`."""
    # deferred: vllm, imported only in its own environment
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils as U
    from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
    from vllm.v1.engine import core
    from vllm.v1.structured_output import StructuredOutputManager

    vc, _ = planning_config(settings)
    register_all_kvcache_specs(vc)
    workers = worker_specs(stages)
    config = core.generate_scheduler_kv_cache_config(configs_of(vc, workers, memory))
    config.num_blocks = num_blocks
    vc.cache_config.num_gpu_blocks = num_blocks
    cacheable = [g.kv_cache_spec.block_size for g in config.kv_cache_groups
                 if g.kv_cache_spec.prefix_cacheable]
    vc.cache_config.block_size = min(cacheable or [g.kv_cache_spec.block_size
                                                   for g in config.kv_cache_groups])
    if settings.get("mamba_cache_mode", "none") in ("none", None) and config.has_mamba_layers:
        vc.cache_config.enable_prefix_caching = False  # vLLM caches states only in "align"
    core.update_kv_cache_capacity(vc, config)
    scheduler_block_size, hash_block_size = core.resolve_kv_cache_block_sizes(config, vc)
    cls = vc.scheduler_config.get_scheduler_cls()
    scheduler = cls(vllm_config=vc, kv_cache_config=config,
                    structured_output_manager=StructuredOutputManager(vc),
                    block_size=scheduler_block_size, hash_block_size=hash_block_size,
                    log_stats=False)
    hasher = None
    if vc.cache_config.enable_prefix_caching:
        fn = get_hash_fn_by_name(hash_fn)
        U.init_none_hash(fn)
        hasher = U.get_request_block_hasher(hash_block_size, fn)
    return scheduler, hasher


class VllmEngine:
    """vLLM's scheduler as a :class:`kvspec.sim.engine.StepEngine`."""

    def __init__(self, scheduler: Any, hasher: Any, live: LiveBytes,
                 trace: list[TraceRequest], *, log_blocks: bool = False) -> None:
        # deferred: vllm, imported only in its own environment
        from vllm.sampling_params import SamplingParams
        from vllm.v1.outputs import ModelRunnerOutput
        from vllm.v1.request import Request

        self.s = scheduler
        self.hasher = hasher
        self.live = live
        self.trace = trace
        self.codes = prefix_codes(trace)
        self.num_codes = max(self.codes, default=0)
        #: Content-block prompts' chain codes, past every prefix code and request's own id.
        self.chains = Chains(self.num_codes + 2 + len(trace))
        self._request, self._params, self._output = Request, SamplingParams, ModelRunnerOutput
        self.added = 0
        self.preemptions = 0
        self.hit_tokens = 0
        #: Per step, with ``log_blocks``: ({request index: block ids per group}, free queue).
        self.block_log: list[tuple[dict[int, tuple], list[int]]] | None = (
            [] if log_blocks else None)

    @property
    def finished(self) -> int:
        return self.added - len(self.s.requests)

    def _tokens(self, index: int, start: int, stop: int) -> list[int]:
        r = self.trace[index]
        if r.prefix_blocks:
            chain = self.chains.codes(r.prefix_blocks)
            limit = min(r.prompt_tokens, len(chain) * r.prefix_block_tokens)
            return [chain_token_id(index, p, chain, r.prefix_block_tokens, limit,
                                   self.num_codes + 1) for p in range(start, stop)]
        code = self.codes[index]
        return [token_id(index, p, code, r.prefix_tokens, self.num_codes)
                for p in range(start, stop)]

    def add(self, index: int, request: TraceRequest) -> None:
        params = self._params(max_tokens=request.output_tokens, ignore_eos=True)
        self.s.add_request(self._request(
            request_id=str(index), prompt_token_ids=self._tokens(index, 0, request.prompt_tokens),
            sampling_params=params, pooling_params=None, arrival_time=float(index),
            block_hasher=self.hasher))
        self.added += 1

    def has_requests(self) -> bool:
        return self.s.has_requests()

    def schedule(self) -> Any:
        out = self.s.schedule()
        requests = self.s.requests
        out.kvspec_sampled = [rid for rid in out.num_scheduled_tokens
                              if not requests[rid].is_prefill_chunk]
        out.total = out.total_num_scheduled_tokens
        cached = out.scheduled_cached_reqs
        self.hit_tokens += sum(n.num_computed_tokens for n in out.scheduled_new_reqs) + sum(
            c for rid, c in zip(cached.req_ids, cached.num_computed_tokens)
            if rid in cached.resumed_req_ids)
        self.preemptions += len(out.preempted_req_ids)
        return out

    def update(self, out: Any) -> None:
        ids = list(out.num_scheduled_tokens)
        sampled = set(out.kvspec_sampled)
        tokens = []
        for rid in ids:
            request = self.s.requests.get(rid)
            if rid in sampled and request is not None:
                index = int(rid)
                tokens.append(self._tokens(index, request.num_tokens, request.num_tokens + 1))
            else:
                tokens.append([0] if rid in sampled else [])
        self.s.update_from_output(out, self._output(
            req_ids=ids, req_id_to_index={rid: i for i, rid in enumerate(ids)},
            sampled_token_ids=tokens))

    def shape(self, out: Any) -> tuple[int, int, int, int]:
        """The step-time terms of a step just scheduled (as kvspec's engine sums them,
        :data:`kvspec.model.steptime.TERMS`): vLLM's scheduler has advanced each
        scheduled request's computed tokens by its tokens."""
        requests = self.s.requests
        return shape_of([(n, requests[rid].num_computed_tokens - n)
                         for rid, n in out.num_scheduled_tokens.items()])

    def stuck(self) -> str | None:
        """Why nothing can run (None when nothing waits)."""
        s = self.s
        if s.running:
            return f"running request #{int(s.running[0].request_id) + 1} gets no tokens"
        for queue in (s.kv_holding_waiting, s.waiting):
            if queue:
                r = queue.peek_request()
                return (f"request #{int(r.request_id) + 1} ({r.num_tokens} tokens) does not "
                        f"fit the free blocks "
                        f"({s.kv_cache_manager.block_pool.get_num_free_blocks()}) of an idle "
                        "engine")
        return None

    def record(self, step: int, out: Any) -> StepRecord:
        s = self.s
        of = self.live.of
        live = sum(of(r.num_computed_tokens, r.num_prompt_tokens) for r in s.running)
        pool = s.kv_cache_manager.block_pool
        if self.block_log is not None:
            tables = {int(r.request_id): s.kv_cache_manager.get_block_ids(r.request_id)
                      for r in s.running}
            free = [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]
            self.block_log.append(({k: tuple(map(tuple, v)) for k, v in tables.items()},
                                   free))
        return StepRecord(step, len(s.running), len(s.waiting) + len(s.kv_holding_waiting),
                          (pool.get_num_free_blocks(),), out.total_num_scheduled_tokens,
                          len(out.preempted_req_ids), self.live.utilization(live))
