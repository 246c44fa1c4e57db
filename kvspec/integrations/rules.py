"""vLLM 0.33.0's config-stage rules: what the engine changes before it plans.

vLLM adjusts a deployment's configuration at start-up, after reading the
model's ``config.json`` and before it builds the KV-cache specs: it picks the
serving dtype, switches hybrids to prefix-cacheable state blocks, raises the
attention block size so one attention page holds one state, and refuses some
configs outright. A source that describes a deployment has to carry the
adjusted values, so ``kvspec init`` applies these rules (docs/engine-rules.md
explains each with an example). Every rule names the vLLM 0.33.0 code it
follows; paths are under ``vllm/`` of the installed 0.33.0 wheel.

The module is pure and torch-free: it takes plain values (dtype names, byte
counts, config dicts) so that both ``init --from-hf`` (no vLLM) and
``init --from-vllm`` (vLLM's own model code on a CPU build, which cannot see
the GPU the deployment runs on) can apply the same rules.

>>> served_dtype("float32", "llama", target("hopper"))
'bfloat16'
>>> mamba_cache_mode(prefix_caching=True)
'align'
>>> hybrid_block_size(16, 2048, 1097728)       # Qwen3-Next TP 1, alignment 1
544
>>> hybrid_block_size(16, 2048, 1097728, checkpoint_alignment=64)   # on Hopper
576
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from math import lcm
from typing import Any

__all__ = [
    "CPU_TARGET",
    "FLASHINFER_GDN_CHECKPOINT_ALIGNMENT",
    "GDN_PREFILL_BACKENDS",
    "GPU_TARGETS",
    "KERNEL_BLOCK",
    "EngineRefusal",
    "Target",
    "check_dtype",
    "checkpoint_fields",
    "gdn_prefill_backend",
    "hybrid_block_size",
    "mamba_block_size",
    "mamba_cache_mode",
    "prefill_checkpoint_alignment",
    "qwen2_sliding_window",
    "served_dtype",
    "ssm_cache_dtype",
    "target",
]


class EngineRefusal(ValueError):
    """vLLM 0.33.0 would refuse this config at start-up; ``str()`` is its reason."""

    def __init__(self, reason: str, hint: str | None = None) -> None:
        super().__init__(reason)
        self.hint = hint


# --------------------------------------------------------------------------
# the deployment target: a GPU class, or a GDN prefill backend
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class Target:
    """Where the deployment runs, as far as a config-stage rule depends on it.

    ``capability`` is the CUDA compute capability (None: unknown, taken as
    Ampere or newer); ``gdn_backend`` a Gated-DeltaNet prefill backend the
    user chose (vLLM's ``--gdn-prefill-backend``), None: vLLM's ``auto``.
    """

    name: str | None = None
    capability: tuple[int, int] | None = None
    gdn_backend: str | None = None


#: The common rule: no target named (Ampere or newer, no FlashInfer GDN prefill).
COMMON = Target()

#: GPU classes ``--target`` takes, by CUDA compute capability.
GPU_TARGETS: dict[str, tuple[int, int]] = {
    "volta": (7, 0), "turing": (7, 5), "ampere": (8, 0), "ada": (8, 9),
    "hopper": (9, 0), "blackwell": (10, 0),
}
#: vLLM 0.33.0's CUDA Gated-DeltaNet prefill backends (``--gdn-prefill-backend``).
GDN_PREFILL_BACKENDS: tuple[str, ...] = ("flashinfer", "triton", "cutedsl")
#: vLLM's CPU engine as a target: its settings are its platform's on the host it runs
#: on (AMX, AVX512-BF16), which only ``init --from-vllm`` under vLLM reads.
CPU_TARGET = "cpu"
#: The CUDA runtime the vLLM 0.33.0 wheel is built with (torch 2.14.0+cu130).
CUDA_RUNTIME_MAJOR = 13


def target(name: str | None) -> Target:
    """The :class:`Target` named ``name`` (a GPU class or a GDN prefill backend).

    None is the common rule: a GPU of Ampere or newer whose GDN prefill is
    not FlashInfer. ``ValueError`` names the choices for anything else.

    >>> target("hopper").capability, target("FlashInfer").gdn_backend
    ((9, 0), 'flashinfer')
    """
    if name is None:
        return COMMON
    key = name.strip().lower()
    if key in GPU_TARGETS:
        return Target(key, GPU_TARGETS[key])
    if key in GDN_PREFILL_BACKENDS:
        return Target(key, None, key)
    raise ValueError(f"unknown target {name!r}: expected a GPU class "
                     f"({', '.join(GPU_TARGETS)}) or a GDN prefill backend "
                     f"({', '.join(GDN_PREFILL_BACKENDS)})")


# --------------------------------------------------------------------------
# the serving dtype
# --------------------------------------------------------------------------

#: ``config/model.py`` ``_FLOAT16_NOT_SUPPORTED_MODELS``: model types vLLM never runs in fp16.
FLOAT16_UNSUPPORTED: tuple[str, ...] = ("gemma2", "gemma3", "gemma3_text", "glm4")


def _supported_dtypes(t: Target, model_type: str) -> list[str]:
    """``platforms/cuda.py`` ``CudaPlatform.supported_dtypes``, less ``_is_valid_dtype``'s."""
    cap = t.capability or (8, 0)
    dtypes = ["bfloat16", "float16", "float32"] if cap >= (8, 0) else ["float16", "float32"]
    return [d for d in dtypes if not (d == "float16" and model_type in FLOAT16_UNSUPPORTED)]


def served_dtype(config_dtype: str | None, model_type: str, t: Target = COMMON) -> str:
    """The dtype vLLM serves a checkpoint in under ``--dtype auto``.

    ``config/model.py`` ``_get_and_verify_dtype`` / ``_resolve_auto_dtype``: a
    float32 checkpoint (and one that names no dtype: vLLM would read the
    weights' safetensors dtype, which a config alone does not give, and falls
    back to float32) is served in the platform's first supported dtype --
    bf16 on Ampere and newer, fp16 before (fp32 for the model types that
    refuse fp16); a dtype the platform cannot run falls back to it as well.

    >>> served_dtype("bfloat16", "llama", target("turing"))
    'float16'
    >>> served_dtype(None, "gemma2", target("turing"))
    'float32'
    """
    supported = _supported_dtypes(t, model_type)
    dtype = config_dtype or "float32"
    if dtype == "float32":
        dtype = supported[0]
    return dtype if dtype in supported else supported[0]


def check_dtype(dtype: str, model_type: str) -> None:
    """``config/model.py`` ``_check_valid_dtype``: some model types refuse fp16.

    >>> try:
    ...     check_dtype("float16", "gemma2")
    ... except EngineRefusal as refusal:
    ...     print(refusal)
    The model type 'gemma2' does not support float16. Reason: Numerical instability. \
Please use bfloat16 or float32 instead.
    """
    if dtype in ("float16", "half", "fp16") and model_type in FLOAT16_UNSUPPORTED:
        raise EngineRefusal(f"The model type {model_type!r} does not support float16. "
                            "Reason: Numerical instability. Please use bfloat16 or float32 "
                            "instead.", hint="pass --dtype bfloat16")


# --------------------------------------------------------------------------
# hybrids: cache mode, state dtype, the attention block that holds a state
# --------------------------------------------------------------------------

def mamba_cache_mode(prefix_caching: bool) -> str:
    """``models/config.py`` ``MambaModelConfig.verify_and_update_config`` (every
    hybrid, through ``HybridAttentionMambaModelConfig``): prefix caching turns
    ``mamba_cache_mode`` "none" into "align"; without it the mode is "none".
    (``--mamba-cache-mode`` is deprecated in 0.33.0 and has no effect:
    ``engine/arg_utils.py`` ``_MAMBA_CACHE_MODE_DEPRECATION_MESSAGE``.)"""
    return "align" if prefix_caching else "none"


def mamba_block_size(prefix_caching: bool, block_size: int, max_model_len: int) -> int:
    """The same hook: ``mamba_block_size`` is the block size with prefix caching
    (``Platform._align_hybrid_block_size`` then sets it to the raised attention
    block), ``max_model_len`` without (one state block per request).

    >>> mamba_block_size(True, 576, 262144), mamba_block_size(False, 576, 262144)
    (576, 262144)
    """
    return block_size if prefix_caching else max_model_len


#: SSM-state dtype hooks, by architecture (``models/config.py`` ``MODELS_CONFIG_MAP``):
#: the config key they read and their default when it is missing (None: keep "auto").
_SSM_DTYPE_HOOKS: dict[str, tuple[str, str | None]] = {
    # NemotronHForCausalLMConfig.update_mamba_ssm_cache_dtype
    "NemotronHForCausalLM": ("mamba_ssm_cache_dtype", "float32"),
    "NemotronHPuzzleForCausalLM": ("mamba_ssm_cache_dtype", "float32"),
    # Qwen3_5ForConditionalGenerationConfig / Qwen3_5ForCausalLMConfig
    "Qwen3_5ForCausalLM": ("mamba_ssm_dtype", None),
    "Qwen3_5ForConditionalGeneration": ("mamba_ssm_dtype", None),
    "Qwen3_5MoeForCausalLM": ("mamba_ssm_dtype", None),
    "Qwen3_5MoeForConditionalGeneration": ("mamba_ssm_dtype", None),
}


def ssm_cache_dtype(architecture: str | None, text_config: Mapping[str, Any],
                    requested: str = "auto") -> str:
    """``--mamba-ssm-cache-dtype`` after the model's own hook: an explicit value
    stays; "auto" becomes Nemotron-H's ``mamba_ssm_cache_dtype`` (default
    float32) or Qwen3.5's ``mamba_ssm_dtype``, and stays "auto" elsewhere.

    >>> ssm_cache_dtype("Qwen3_5ForConditionalGeneration", {"mamba_ssm_dtype": "float32"})
    'float32'
    >>> ssm_cache_dtype("NemotronHForCausalLM", {}), ssm_cache_dtype("JambaForCausalLM", {})
    ('float32', 'auto')
    """
    hook = _SSM_DTYPE_HOOKS.get(architecture or "")
    if requested != "auto" or hook is None:
        return requested
    key, default = hook
    value = text_config.get(key)
    return str(value) if value is not None else (default or "auto")


#: ``v1/attention/backends/gdn_attn.py``: FlashInfer's GDN prefill emits states every 64 tokens.
FLASHINFER_GDN_CHECKPOINT_ALIGNMENT = 64
#: The smallest kernel block of vLLM's CUDA attention backends for these models
#: (FlashAttention ``MultipleOf(16)``, FlashInfer ``[16, 32, 64, ...]``, Triton ``MultipleOf(16)``).
KERNEL_BLOCK = 16
#: Hybrid MLA models: TRTLLM/FlashInfer MLA decode needs 128-token manager blocks.
MLA_HYBRID_BLOCK = 128


def gdn_prefill_backend(t: Target, head_k_dim: int | None) -> str:
    """``model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py``
    ``_resolve_gdn_prefill_backend`` on CUDA: FlashInfer on Hopper (SM90), and
    on Blackwell (SM10.x, SM12.x) when ``linear_key_head_dim`` is 128 and the
    CUDA runtime is 13 or newer; Triton/FLA otherwise. A backend given as the
    target is taken as chosen.

    >>> gdn_prefill_backend(target("hopper"), 128), gdn_prefill_backend(target("ampere"), 128)
    ('flashinfer', 'triton')
    """
    if t.gdn_backend is not None:
        return t.gdn_backend
    cap = t.capability
    if cap == (9, 0):
        return "flashinfer"
    if cap is not None and cap[0] in (10, 12) and head_k_dim == 128 \
            and CUDA_RUNTIME_MAJOR >= 13:
        return "flashinfer"
    return "triton"


def _layer_alignment(mamba_type: str, mode: str, gdn_backend: str) -> int | None:
    """``MambaBase.get_prefill_checkpoint_alignment``: None but for a GDN layer
    on FlashInfer in align mode (``QwenGatedDeltaNetAttention.__init__``)."""
    if mamba_type == "gdn_attention" and mode == "align" and gdn_backend == "flashinfer":
        return FLASHINFER_GDN_CHECKPOINT_ALIGNMENT
    return None


def prefill_checkpoint_alignment(mamba_types: Iterable[str], mode: str,
                                 gdn_backend: str) -> int | None:
    """``model_executor/layers/mamba/abstract.py``
    ``get_mamba_prefill_checkpoint_alignment``: the LCM of the state layers'
    alignments, None unless every state layer declares one.

    >>> prefill_checkpoint_alignment(["gdn_attention"] * 3, "align", "flashinfer")
    64
    >>> prefill_checkpoint_alignment(["mamba2"], "align", "flashinfer") is None
    True
    """
    out = 1
    for mamba_type in mamba_types:
        layer = _layer_alignment(mamba_type, mode, gdn_backend)
        if layer is None:
            return None
        out = lcm(out, layer)
    return out


def checkpoint_fields(mamba_type: str, model_alignment: int | None,
                      grid: int) -> dict[str, int]:
    """The prefill-checkpoint fields a state layer's spec carries.

    ``MambaMixer2.get_kv_cache_spec`` (``mamba_mixer2.py``): every Mamba-2
    mixer, ``num_prefill_checkpoint_blocks`` 1 and alignment 1.
    ``QwenGatedDeltaNetAttention.get_kv_cache_spec``: a GDN layer that exports
    checkpoints (``model_alignment`` is not None) carries 1 and the prefix
    grid (``get_mamba_prefill_checkpoint_grid``: ``mamba_block_size``, as
    kvspec sets no ``prefix_match_unit``). Other layers carry none. Only align
    mode reads them: there a request holds ``2 + spec + checkpoint`` state blocks.

    >>> checkpoint_fields("mamba2", None, 1040)
    {'num_prefill_checkpoint_blocks': 1, 'prefill_checkpoint_alignment': 1}
    >>> checkpoint_fields("gdn_attention", 64, 576)
    {'num_prefill_checkpoint_blocks': 1, 'prefill_checkpoint_alignment': 576}
    """
    if mamba_type == "mamba2":
        return {"num_prefill_checkpoint_blocks": 1, "prefill_checkpoint_alignment": 1}
    if mamba_type == "gdn_attention" and model_alignment is not None:
        return {"num_prefill_checkpoint_blocks": 1, "prefill_checkpoint_alignment": grid}
    return {}


def hybrid_block_size(block_size: int, attention_bytes_per_token: int, state_bytes: int,
                      *, checkpoint_alignment: int | None = None, align: bool = True,
                      mla: bool = False, kernel_block: int = KERNEL_BLOCK) -> int:
    """``platforms/interface.py`` ``Platform._align_hybrid_block_size``: the
    attention block size of a hybrid, so one attention page holds one state::

        k = max(kernel_block, block_size)            (128 at least for MLA)
        k = lcm(k, checkpoint_alignment or 1)        (align mode only)
        block = k * ceil(state / (k * attention_bytes_per_token)),
                rounded up to a multiple of kernel_block

    and never below ``block_size``. The state page is then padded to the
    attention page, and in align mode ``mamba_block_size`` is this block.

    >>> hybrid_block_size(16, 4096, 4255744)     # Nemotron-H 8B TP 1
    1040
    """
    k = max(kernel_block, block_size)
    if mla:
        k = max(k, MLA_HYBRID_BLOCK)
    if align:
        k = lcm(k, checkpoint_alignment or 1)
    block = k * -(-state_bytes // (k * attention_bytes_per_token))
    block = kernel_block * -(-block // kernel_block)
    return max(block_size, block)


# --------------------------------------------------------------------------
# configs vLLM refuses
# --------------------------------------------------------------------------

def tensor_parallel(num_attention_heads: int, tp: int) -> None:
    """``config/model.py`` ``ModelConfig.verify_with_parallel_config``: the
    attention (query) heads must split evenly over the tensor-parallel ranks,
    whatever the KV heads do (Qwen2.5-7B's 4 KV heads replicate over 8 ranks,
    but its 28 query heads do not split).

    >>> try:
    ...     tensor_parallel(28, 8)
    ... except EngineRefusal as refusal:
    ...     print(refusal)
    Total number of attention heads (28) must be divisible by tensor parallel size (8).
    """
    if num_attention_heads % tp:
        raise EngineRefusal(f"Total number of attention heads ({num_attention_heads}) must be "
                            f"divisible by tensor parallel size ({tp}).",
                            hint="choose a --tp that divides the attention heads")


def qwen2_sliding_window(layer_types: list[str], max_window_layers: int,
                         num_layers: int) -> None:
    """``model_executor/models/qwen2.py`` ``Qwen2Model.__init__`` (Qwen2 and
    Qwen3): a sliding window on some layers but not all is refused, with this
    assertion's message (its wording, "some but all", is vLLM's).

    >>> try:
    ...     qwen2_sliding_window(["full_attention"] * 2 + ["sliding_attention"] * 2, 2, 4)
    ... except EngineRefusal as refusal:
    ...     print(refusal)
    Sliding window for some but all layers is not \
supported. This model uses sliding window but `max_window_layers` = 2 is less than \
`num_hidden_layers` = 4. Please open an issue to discuss this feature.
    """
    if len(set(layer_types)) > 1 and max_window_layers != num_layers:
        raise EngineRefusal(
            "Sliding window for some but all layers is not supported. This model uses "
            f"sliding window but `max_window_layers` = {max_window_layers} is less than "
            f"`num_hidden_layers` = {num_layers}. Please open an issue to discuss this "
            "feature.",
            hint="vLLM serves Qwen2/Qwen3 with the window on every layer (max_window_layers "
                 "0) or on none (use_sliding_window false)")
