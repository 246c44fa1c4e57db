"""kvspec.integrations.rules: vLLM 0.33.0's config-stage rules, one test per rule.

Expected numbers come from the rule's vLLM source (cited in the module) and
were checked against vLLM 0.33.0 itself: its model code built on the meta
device, with the GDN prefill backend as vLLM picks it on each GPU class
(tests/data/hf/README.md).
"""

from __future__ import annotations

import pytest

from kvspec.integrations import rules
from kvspec.integrations.rules import EngineRefusal, target

# --------------------------------------------------------------------------
# targets
# --------------------------------------------------------------------------


def test_targets_name_gpu_classes_and_gdn_backends() -> None:
    assert target(None) == rules.COMMON
    assert target("Hopper") == rules.Target("hopper", (9, 0))
    assert target("blackwell").capability == (10, 0)
    assert target("triton") == rules.Target("triton", None, "triton")
    with pytest.raises(ValueError, match=r"unknown target 'h100'.*hopper.*flashinfer"):
        target("h100")


# --------------------------------------------------------------------------
# dtype
# --------------------------------------------------------------------------


@pytest.mark.parametrize("checkpoint,gpu,model_type,served", [
    ("float32", "hopper", "llama", "bfloat16"),    # float32 is downcast to bf16
    ("float32", "ampere", "llama", "bfloat16"),
    ("float32", "turing", "llama", "float16"),     # no bf16 before Ampere
    ("bfloat16", "turing", "llama", "float16"),    # an unsupported dtype falls back
    ("float16", "hopper", "llama", "float16"),     # a half type stays
    ("bfloat16", "hopper", "llama", "bfloat16"),
    (None, "hopper", "gpt_oss", "bfloat16"),       # no dtype named: as float32
    ("float32", "turing", "gemma2", "float32"),    # gemma2 never runs in fp16
    ("bfloat16", "volta", "gemma3", "float32"),
])
def test_served_dtype(checkpoint, gpu, model_type, served) -> None:
    assert rules.served_dtype(checkpoint, model_type, target(gpu)) == served


def test_served_dtype_without_a_target_is_ampere_or_newer() -> None:
    assert rules.served_dtype("float32", "llama") == "bfloat16"


def test_fp16_refused_for_gemma() -> None:
    rules.check_dtype("float16", "llama")
    rules.check_dtype("bfloat16", "gemma2")
    with pytest.raises(EngineRefusal, match="'gemma3' does not support float16") as info:
        rules.check_dtype("float16", "gemma3")
    assert info.value.hint == "pass --dtype bfloat16"


# --------------------------------------------------------------------------
# hybrids
# --------------------------------------------------------------------------


def test_mamba_cache_mode_follows_prefix_caching() -> None:
    assert rules.mamba_cache_mode(True) == "align"
    assert rules.mamba_cache_mode(False) == "none"
    assert rules.mamba_block_size(True, 1040, 8192) == 1040
    assert rules.mamba_block_size(False, 1040, 8192) == 8192


@pytest.mark.parametrize("arch,config,requested,dtype", [
    ("NemotronHForCausalLM", {}, "auto", "float32"),
    ("NemotronHForCausalLM", {"mamba_ssm_cache_dtype": "bfloat16"}, "auto", "bfloat16"),
    ("NemotronHForCausalLM", {}, "float16", "float16"),
    ("Qwen3_5MoeForConditionalGeneration", {"mamba_ssm_dtype": "float32"}, "auto", "float32"),
    ("Qwen3_5ForCausalLM", {}, "auto", "auto"),
    ("Qwen3NextForCausalLM", {"mamba_ssm_dtype": "float32"}, "auto", "auto"),
    (None, {}, "auto", "auto"),
])
def test_ssm_cache_dtype_hooks(arch, config, requested, dtype) -> None:
    assert rules.ssm_cache_dtype(arch, config, requested) == dtype


@pytest.mark.parametrize("gpu,head_k_dim,backend", [
    ("hopper", 128, "flashinfer"),
    ("hopper", 64, "flashinfer"),       # SM90: no further constraints
    ("blackwell", 128, "flashinfer"),   # SM10.x, head_k_dim 128, CUDA 13
    ("blackwell", 64, "triton"),
    ("ampere", 128, "triton"),
    ("ada", 128, "triton"),
    ("flashinfer", None, "flashinfer"),  # a backend named as the target
    ("cutedsl", 128, "cutedsl"),
    (None, 128, "triton"),
])
def test_gdn_prefill_backend(gpu, head_k_dim, backend) -> None:
    assert rules.gdn_prefill_backend(target(gpu), head_k_dim) == backend


def test_prefill_checkpoint_alignment() -> None:
    gdn = ["gdn_attention"] * 36
    assert rules.prefill_checkpoint_alignment(gdn, "align", "flashinfer") == 64
    assert rules.prefill_checkpoint_alignment(gdn, "align", "triton") is None
    assert rules.prefill_checkpoint_alignment(gdn, "none", "flashinfer") is None
    # Mamba-2 mixers declare none (their spec's alignment 1 is another field)
    assert rules.prefill_checkpoint_alignment(["mamba2"], "align", "flashinfer") is None
    assert rules.prefill_checkpoint_alignment([], "align", "triton") == 1


def test_checkpoint_fields() -> None:
    both = {"num_prefill_checkpoint_blocks": 1}
    assert rules.checkpoint_fields("mamba2", None, 1040) == {**both,
                                                             "prefill_checkpoint_alignment": 1}
    assert rules.checkpoint_fields("gdn_attention", 64, 576) == {
        **both, "prefill_checkpoint_alignment": 576}
    assert rules.checkpoint_fields("gdn_attention", None, 544) == {}
    assert rules.checkpoint_fields("mamba1", None, 80) == {}


@pytest.mark.parametrize("model,block,per_token,state,alignment,expected", [
    # Jamba (transformers defaults), TP 1: 311296 B state, 4096 B/token -> 80
    ("jamba", 16, 4096, 311296, None, 80),
    # Nemotron-H 8B TP 1: (3 x 10240 x 2) + (128 x 64 x 128 x 4) = 4255744 B state,
    # 4096 B/token -> 1040 (the figure); TP 2 halves both -> 1040 again
    ("nemotron-h-8b", 16, 4096, 4255744, None, 1040),
    ("nemotron-h-8b tp2", 16, 2048, 2127872, None, 1040),
    # Nemotron-H 56B TP 1: 16900096 B / 4096 B per token -> 4128
    ("nemotron-h-56b", 16, 4096, 16900096, None, 4128),
    # Qwen3-Next TP 1: 1097728 B, 2048 B/token: 544; FlashInfer GDN (64) -> 576
    ("qwen3-next", 16, 2048, 1097728, None, 544),
    ("qwen3-next hopper", 16, 2048, 1097728, 64, 576),
    # Qwen3.5-122B TP 1: 3 x 12288 x 2 + 64 x 128 x 128 x 4 (f32 SSM) = 4268032 B,
    # 2048 B/token: 2096; FlashInfer GDN -> 2112
    ("qwen3.5-122b", 16, 2048, 4268032, None, 2096),
    ("qwen3.5-122b hopper", 16, 2048, 4268032, 64, 2112),
    # a user's block size above the kernel block is the alignment unit
    ("block 48", 48, 4096, 311296, None, 96),
])
def test_hybrid_block_size(model, block, per_token, state, alignment, expected) -> None:
    assert rules.hybrid_block_size(block, per_token, state,
                                   checkpoint_alignment=alignment) == expected


def test_hybrid_block_size_details() -> None:
    # the checkpoint alignment counts in align mode only
    assert rules.hybrid_block_size(16, 2048, 1097728, checkpoint_alignment=64,
                                   align=False) == 544
    # never below the configured block; MLA hybrids align to 128 tokens
    assert rules.hybrid_block_size(1024, 2048, 1097728) == 1024
    assert rules.hybrid_block_size(16, 1152, 300000, mla=True) == 384


# --------------------------------------------------------------------------
# refusals
# --------------------------------------------------------------------------


def test_qwen2_partial_sliding_window() -> None:
    full, sliding = "full_attention", "sliding_attention"
    rules.qwen2_sliding_window([full] * 28, 28, 28)
    rules.qwen2_sliding_window([sliding] * 28, 0, 28)
    rules.qwen2_sliding_window([full] * 20 + [sliding] * 8, 28, 28)  # vLLM's check passes
    with pytest.raises(EngineRefusal) as info:
        rules.qwen2_sliding_window([full] * 20 + [sliding] * 8, 20, 28)
    assert str(info.value).startswith("Sliding window for some but all layers is not "
                                      "supported. This model uses sliding window but "
                                      "`max_window_layers` = 20 is less than "
                                      "`num_hidden_layers` = 28.")
    assert "max_window_layers 0" in info.value.hint


def test_tensor_parallel_needs_the_attention_heads_to_split() -> None:
    rules.tensor_parallel(28, 4)
    with pytest.raises(EngineRefusal, match=r"attention heads \(28\) must be divisible by "
                                            r"tensor parallel size \(8\)"):
        rules.tensor_parallel(28, 8)
