"""Tiny real checkpoints for the serving suite, made by the tests, never downloaded.

Each family is a small HF config: ``make(family, root)`` instantiates the model from it
with seeded random weights (``torch.manual_seed``), casts to bf16, and saves it with
``save_pretrained`` (safetensors) under ``root/<family>-<hash>``. The hash covers the
family's config, the seed and the transformers version, so a changed config makes a new
directory and an unchanged one is reused (idempotent). No tokenizer is written: the
engine runs with ``skip_tokenizer_init=True`` and token-id prompts.

This module imports torch/transformers lazily, inside ``make``: it runs in the engine
venv (build/serve/venv), never in the compiler's.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

SEED = 38
VOCAB = 512
#: Weights are N(0, INIT_STD), drawn in parameter-name order: large enough that the
#: greedy tokens depend on the whole context (the KV cache), not one token repeated.
INIT_STD = 0.1

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
    # untied: with tied random embeddings, Gemma's scaled embedding dominates and the
    # model copies its input token (it never needs the KV cache)
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
    },
}


def config_dict(family: str) -> dict[str, Any]:
    """The family's HF config as a plain dict (a copy)."""
    if family not in FAMILIES:
        raise KeyError(f"unknown family {family!r}; known: {', '.join(sorted(FAMILIES))}")
    return json.loads(json.dumps(FAMILIES[family]))


def _digest(family: str) -> str:
    import transformers

    payload = json.dumps(
        {"config": FAMILIES[family], "seed": SEED, "std": INIT_STD,
         "transformers": transformers.__version__},
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def make(family: str, root: Path) -> Path:
    """The checkpoint directory of ``family`` under ``root``, made once (cached by hash)."""
    conf = config_dict(family)
    root = Path(root)
    target = root / f"{family}-{_digest(family)}"
    if (target / "config.json").is_file() and (target / ".complete").is_file():
        return target
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    root.mkdir(parents=True, exist_ok=True)
    model_type = conf.pop("model_type")
    config = AutoConfig.for_model(model_type, **conf)
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # transformers' own init is N(0, 0.02) and family-specific; draw every matrix
    # again from one seeded generator (norms and biases keep their init)
    gen = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for _, param in sorted(model.named_parameters()):
            if param.dim() >= 2:
                param.copy_(torch.randn(param.shape, generator=gen) * INIT_STD)
    model = model.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    tmp = Path(tempfile.mkdtemp(prefix=f".{family}-", dir=root))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        (tmp / ".complete").write_text(_digest(family) + "\n")
        if target.exists():  # a half-written directory from an interrupted run
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


if __name__ == "__main__":
    import sys

    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("build/serve/checkpoints")
    for name in sys.argv[2:] or sorted(FAMILIES):
        print(name, make(name, out))
