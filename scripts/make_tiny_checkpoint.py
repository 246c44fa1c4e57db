"""Tiny seeded checkpoints to serve through kvspec: made here, never downloaded.

    python scripts/make_tiny_checkpoint.py FAMILY DIR      (e.g. llama ./tiny-llama)
    python scripts/make_tiny_checkpoint.py --list

Runs where torch and transformers are (the CPU engine's environment,
scripts/install-cpu-engine.sh). Each family is a small HF config: the model is
instantiated from it with seeded random weights (``torch.manual_seed``), cast to bf16
and saved with ``save_pretrained`` (safetensors), with a byte-level tokenizer (the 256
byte tokens at ids 3-258, ``<pad>`` ``<s>`` ``</s>`` at 0-2), so that ``LLM(model=DIR)``
takes text prompts as well as token ids. The same seed gives the same weights: the
serving checks (tests/serve/) make theirs with :func:`make`, under
``build/serve/checkpoints/<family>-<hash>``; the hash covers the family's config, the
seed, the tokenizer and the transformers version, so a changed config makes a new
directory and an unchanged one is reused.

The weights are random: the text a model generates means nothing. The checkpoints
exist to start real engines on real layer geometries (docs/serving.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

SEED = 38
VOCAB = 512
#: Weights are N(0, INIT_STD), drawn in parameter-name order: large enough that the
#: greedy tokens depend on the whole context (the KV cache), not one token repeated.
INIT_STD = 0.1
#: Families whose embedding is drawn smaller: Gemma ties its output head to the
#: embedding (vLLM's Gemma-2 has no lm_head) and scales the embedding by
#: sqrt(hidden_size); at INIT_STD the input token's own row dominates every logit
#: and the model copies its input, never reading the KV cache.
EMBED_STD = {"gemma2": 0.01}

# Shared geometry: head_dim 64 (a head size the CPU attention backend supports),
# vocab 512, a few layers. A few MB of bf16 each.
_DENSE: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}

FAMILIES: dict[str, dict[str, Any]] = {
    # dense GQA: 4 query heads share 2 KV heads
    "llama": {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        **_DENSE,
        "num_hidden_layers": 4,
    },
    # sliding window (64 tokens) alternating with full attention
    "gemma2": {
        "model_type": "gemma2",
        "architectures": ["Gemma2ForCausalLM"],
        **_DENSE,
        "num_hidden_layers": 4,
        "sliding_window": 64,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
        "query_pre_attn_scalar": 64,
        "tie_word_embeddings": True,
    },
    # alternating 64-token sliding window and full attention, with attention sinks;
    # a mixture of 4 experts
    "gpt_oss": {
        "model_type": "gpt_oss",
        "architectures": ["GptOssForCausalLM"],
        **_DENSE,
        "intermediate_size": 256,
        "num_hidden_layers": 4,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "sliding_window": 64,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
    },
    # MLA with DeepSeek's own latent geometry (vLLM's MLA kernels take only
    # kv_lora_rank 512 + rope 64 = 576): one dense layer, then a mixture of experts
    "deepseek_v2": {
        "model_type": "deepseek_v2",
        "architectures": ["DeepseekV2ForCausalLM"],
        **_DENSE,
        "num_key_value_heads": 4,
        "head_dim": None,
        "num_hidden_layers": 3,
        "kv_lora_rank": 512,
        "q_lora_rank": None,
        "qk_nope_head_dim": 64,
        "qk_rope_head_dim": 64,
        "v_head_dim": 64,
        "first_k_dense_replace": 1,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 128,
        "topk_method": "greedy",
        "n_group": 1,
        "topk_group": 1,
    },
    # Mamba-1 layers with one attention layer in two, experts every other layer
    "jamba": {
        "model_type": "jamba",
        "architectures": ["JambaForCausalLM"],
        **_DENSE,
        "head_dim": None,
        "num_hidden_layers": 4,
        "attn_layer_period": 2,
        "attn_layer_offset": 1,
        "expert_layer_period": 2,
        "expert_layer_offset": 1,
        "num_experts": 2,
        "num_experts_per_tok": 1,
        "mamba_d_state": 16,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
    },
    # Granite-4 hybrid: Mamba-2 and attention layers, a dense shared MLP
    "granitemoehybrid": {
        "model_type": "granitemoehybrid",
        "architectures": ["GraniteMoeHybridForCausalLM"],
        **_DENSE,
        "head_dim": None,
        "num_hidden_layers": 4,
        "layer_types": ["mamba", "attention", "mamba", "attention"],
        "num_local_experts": 0,
        "shared_intermediate_size": 512,
        "position_embedding_type": "rope",
        "mamba_n_heads": 8,
        "mamba_d_head": 64,
        "mamba_n_groups": 1,
        "mamba_d_state": 64,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "mamba_chunk_size": 64,
    },
    # Nemotron-H: Mamba-2, attention and MLP layers
    "nemotron_h": {
        "model_type": "nemotron_h",
        "architectures": ["NemotronHForCausalLM"],
        **_DENSE,
        "num_hidden_layers": 4,
        "layers_block_type": ["mamba", "attention", "mlp", "mamba"],
        "mamba_num_heads": 8,
        "mamba_head_dim": 64,
        "ssm_state_size": 64,
        "n_groups": 1,
        "conv_kernel": 4,
        "expand": 2,
        "chunk_size": 64,
    },
    # Falcon-H1: attention and Mamba-2 side by side in every layer
    "falcon_h1": {
        "model_type": "falcon_h1",
        "architectures": ["FalconH1ForCausalLM"],
        **_DENSE,
        "num_hidden_layers": 4,
        "mamba_d_ssm": 512,
        "mamba_n_heads": 8,
        "mamba_d_head": 64,
        "mamba_n_groups": 1,
        "mamba_d_state": 64,
        "mamba_d_conv": 4,
        "mamba_chunk_size": 64,
    },
    # Qwen3-Next: gated DeltaNet (linear attention) layers, one full attention in four
    "qwen3_next": {
        "model_type": "qwen3_next",
        "architectures": ["Qwen3NextForCausalLM"],
        **_DENSE,
        "num_hidden_layers": 4,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"],
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 64,
        "linear_value_head_dim": 64,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 128,
        "shared_expert_intermediate_size": 128,
    },
}


def config_dict(family: str) -> dict[str, Any]:
    """The family's HF config as a plain dict (a copy); a key set to None is left
    out (the family's config class derives it, e.g. ``head_dim``)."""
    if family not in FAMILIES:
        raise KeyError(f"unknown family {family!r}; known: {', '.join(sorted(FAMILIES))}")
    return {k: v for k, v in json.loads(json.dumps(FAMILIES[family])).items()
            if v is not None}


#: The tokenizer written beside the weights (its version is part of the hash).
TOKENIZER = {"kind": "byte-level", "specials": ["<pad>", "<s>", "</s>"], "version": 1}


def _digest(family: str) -> str:
    import transformers

    payload = json.dumps(
        {"config": FAMILIES[family], "seed": SEED, "std": INIT_STD,
         "embed_std": EMBED_STD.get(family), "tokenizer": TOKENIZER,
         "transformers": transformers.__version__},
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def save_tokenizer(directory: Path) -> None:
    """A byte-level tokenizer in ``directory`` (``tokenizer.json`` and its config):
    ``<pad>`` ``<s>`` ``</s>`` at ids 0-2 (the configs' pad, bos and eos), the 256 byte
    tokens at 3-258, no merges: any text encodes, within every family's vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = TOKENIZER["specials"]
    vocab = {tok: i for i, tok in enumerate(specials)}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    assert len(vocab) <= VOCAB
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=specials[0],
                                   bos_token=specials[1], eos_token=specials[2])
    fast.save_pretrained(directory)


def _complete(target: Path, digest: str) -> bool:
    marker = target / ".complete"
    return (target / "config.json").is_file() and marker.is_file() \
        and marker.read_text().strip() == digest


def write(family: str, target: Path) -> Path:
    """The checkpoint of ``family`` in the directory ``target`` (made there, whole, or
    not at all: it is written beside it and renamed into place); a complete one of the
    same family, seed and tokenizer is kept."""
    conf = config_dict(family)
    target = Path(target)
    digest = _digest(family)
    if _complete(target, digest):
        return target
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    target.parent.mkdir(parents=True, exist_ok=True)
    model_type = conf.pop("model_type")
    config = AutoConfig.for_model(model_type, **conf)
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # transformers' own init is N(0, 0.02) and family-specific; draw every matrix
    # again from one seeded generator (norms and biases keep their init)
    gen = torch.Generator().manual_seed(SEED)
    embed_std = EMBED_STD.get(family, INIT_STD)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if param.dim() >= 2:
                std = embed_std if "embed_tokens" in name else INIT_STD
                param.copy_(torch.randn(param.shape, generator=gen) * std)
    model = model.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        save_tokenizer(tmp)
        (tmp / ".complete").write_text(digest + "\n")
        if target.exists():  # a half-written or older checkpoint of this family
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def make(family: str, root: Path) -> Path:
    """The checkpoint directory of ``family`` under ``root``, made once (cached by hash)."""
    config_dict(family)  # an unknown family: KeyError before transformers is imported
    return write(family, Path(root) / f"{family}-{_digest(family)}")


USAGE = """usage: python scripts/make_tiny_checkpoint.py FAMILY DIR
       python scripts/make_tiny_checkpoint.py --list

Writes a tiny checkpoint of FAMILY (seeded random weights, bf16, a byte-level
tokenizer) into the directory DIR. Families: {families}."""


def main(argv: list[str]) -> int:
    families = ", ".join(FAMILIES)
    if argv == ["--list"]:
        for name, conf in FAMILIES.items():
            print(f"{name:18} {conf['architectures'][0]}")
        return 0
    if len(argv) != 2 or argv[0].startswith("-"):
        print(USAGE.format(families=families), file=sys.stderr)
        return 2
    family, directory = argv[0], Path(argv[1])
    if family not in FAMILIES:
        print(f"make_tiny_checkpoint.py: unknown family {family!r}\n"
              f"  expected: one of {families}", file=sys.stderr)
        return 2
    if directory.exists() and not directory.is_dir():
        print(f"make_tiny_checkpoint.py: {directory} is a file; give a directory to "
              "write the checkpoint into", file=sys.stderr)
        return 2
    if directory.is_dir() and any(directory.iterdir()) \
            and not (directory / ".complete").is_file():
        print(f"make_tiny_checkpoint.py: {directory} holds files that are not a tiny "
              "checkpoint; nothing was written\n  hint: give a new or empty directory",
              file=sys.stderr)
        return 2
    out = write(family, directory)
    print(f"{family}: {FAMILIES[family]['architectures'][0]} checkpoint in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
