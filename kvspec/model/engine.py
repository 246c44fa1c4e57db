"""Engine settings that shape a plan: the pooling policy of one deployment.

These are the few serving-engine settings the planner reads. Everything the
reference planner reads from the environment is an explicit field here
(``draft_pool``, ``draft_block_size``, ``draft_pool_blocks``); compiling never
reads the environment.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvspec.model.axes import DEFAULT_AXIS_ORDER, AxisOrder


@dataclass(frozen=True, slots=True, kw_only=True)
class Engine:
    """Pooling policy and parallelism of one deployment.

    >>> e = Engine(block_size=16, max_model_len=8192)
    >>> e.max_in_flight_tokens   # 8192 batched tokens x 2 batches (async scheduling)
    16384
    """

    block_size: int = 16
    max_model_len: int = 8192
    #: -1 when the user asked for ``max_model_len: auto`` (fit it to memory).
    original_max_model_len: int | None = None
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    #: Encoder tokens a cross-attention layer caches per request.
    max_num_encoder_input_tokens: int | None = None
    #: None: on for a single pipeline stage, off otherwise (vLLM's GPU default).
    async_scheduling: bool | None = None
    enable_prefix_caching: bool = True
    #: ``disable_hybrid_kv_cache_manager``: local attention allocated as full.
    hybrid: bool = True
    #: Physical order of the axes ``[L, B, H, N, C]`` (the source's ``engine.layout``).
    axis_order: AxisOrder = DEFAULT_AXIS_ORDER
    kv_cache_dtype: str = "auto"
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    decode_context_parallel_size: int = 1
    num_gpu_blocks_override: int | None = None
    mamba_cache_mode: str = "none"
    mamba_block_size: int | None = None
    prefix_match_unit: int | None = None
    #: Tokens a multi-module speculative step may re-prefill.
    num_prefill_lookahead_tokens: int = 0
    #: Speculative decoding method (``eagle``, ``eagle3``, ``mtp``...), or None.
    speculative_method: str | None = None
    #: GLM-5-Next drafter: its own pool (VLLM_GLM5NEXT_DRAFT_POOL, default on).
    draft_pool: bool = True
    #: GLM-5-Next drafter block size (VLLM_GLM5NEXT_DRAFT_BLOCK_SIZE), None: derived.
    draft_block_size: int | None = None
    #: GLM-5-Next drafter pool blocks (VLLM_GLM5NEXT_DRAFT_POOL_BLOCKS), None: derived.
    draft_pool_blocks: int | None = None
    #: Layers of the whole model (for pipeline stage boundaries).
    total_num_hidden_layers: int | None = None
    #: Explicit pipeline partition (VLLM_PP_LAYER_PARTITION), layers per stage.
    pp_layer_partition: tuple[int, ...] | None = None

    @property
    def async_scheduling_resolved(self) -> bool:
        if self.async_scheduling is None:
            return self.pipeline_parallel_size == 1
        return self.async_scheduling

    @property
    def concurrent_batches(self) -> int:
        """Batches scheduled but not yet settled: one per pipeline stage, and
        async scheduling keeps one more step in flight."""
        return self.pipeline_parallel_size * (2 if self.async_scheduling_resolved else 1)

    @property
    def max_in_flight_tokens(self) -> int:
        return self.max_num_batched_tokens * self.concurrent_batches

    @property
    def encoder_tokens(self) -> int:
        if self.max_num_encoder_input_tokens is not None:
            return self.max_num_encoder_input_tokens
        return self.max_num_batched_tokens

    @property
    def auto_max_model_len(self) -> bool:
        return self.original_max_model_len == -1
