"""kvspec.integrations.hf: per-family layer facts from real config.json files, and the
torch-free re-derivation of vLLM's Mamba state-shape/dtype calculators.

The configs under tests/data/hf/ are copies of public models' config.json;
tests/data/hf/README.md says where each one came from.  Expected numbers are
derived by hand from the config and the vLLM rules cited in
kvspec/integrations/hf/families/ and kvspec/integrations/hf/state_shapes.py, and
were cross-checked against vLLM 0.33.0's own model code built on the meta device
(tests/data/hf/README.md records the result per config and TP size).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from kvspec.integrations import rules
from kvspec.integrations.hf import state_shapes as ss
from kvspec.integrations.hf.families import (
    SUPPORTED_FAMILIES,
    LayerFacts,
    ModelFacts,
    UnsupportedModelError,
    describe,
    family_of,
)
from kvspec.integrations.hf.families.facts import ConfigError

DATA = Path(__file__).parent / "data" / "hf"


def load(name: str) -> dict:
    with open(DATA / name) as f:
        return json.load(f)


def kind_at(facts: ModelFacts, index: int) -> str | None:
    for layer in facts.layers:
        if layer.index == index:
            return layer.kind
    return None


# --------------------------------------------------------------------------
# every committed config: family, layer counts by kind, heads
# --------------------------------------------------------------------------

# file, family, num_layers, counts by kind, {kind: (num_kv_heads, head_size)}, dtype, max_pos
CASES = [
    # Llama 3.1 8B: 32 full layers, head 4096/32 = 128, 8 KV heads.
    (
        "llama-3.1-8b.json", "llama", 32, {"full_attention": 32},
        {"full_attention": (8, 128)}, "bfloat16", 131072,
    ),
    # Qwen2.5 7B: sliding_window 131072 is ignored (use_sliding_window false);
    # head 3584/28 = 128, 4 KV heads.
    (
        "qwen2.5-7b.json", "qwen2", 28, {"full_attention": 28},
        {"full_attention": (4, 128)}, "bfloat16", 131072,
    ),
    # Qwen3 8B: explicit head_dim 128, 8 KV heads.
    (
        "qwen3-8b.json", "qwen3", 36, {"full_attention": 36},
        {"full_attention": (8, 128)}, "bfloat16", 40960,
    ),
    # Mistral NeMo: explicit head_dim 128 (5120/32 = 160 would be wrong), no window.
    (
        "mistral-nemo-base-2407.json", "mistral", 40, {"full_attention": 40},
        {"full_attention": (8, 128)}, "bfloat16", 128000,
    ),
    # Gemma 2 9B: even layers slide (4096): 21 sliding + 21 full, head 256.
    (
        "gemma-2-9b-it.json", "gemma2", 42, {"sliding_window": 21, "full_attention": 21},
        {"sliding_window": (8, 256), "full_attention": (8, 256)}, "bfloat16", 8192,
    ),
    # Gemma 3 27B: pattern 6 (default) -> global at 5, 11, ..., 59: 10 full, 52 sliding.
    # max_position_embeddings is absent from text_config -> Gemma3TextConfig default.
    (
        "gemma-3-27b-it.json", "gemma3", 62, {"sliding_window": 52, "full_attention": 10},
        {"sliding_window": (16, 128), "full_attention": (16, 128)}, "bfloat16", 131072,
    ),
    # gpt-oss 120B: layer_types alternate: 18 sliding (128) + 18 full, head 64.
    # Its config.json names no torch_dtype.
    (
        "gpt-oss-120b.json", "gpt_oss", 36, {"sliding_window": 18, "full_attention": 18},
        {"sliding_window": (8, 64), "full_attention": (8, 64)}, None, 131072,
    ),
    # Llama 4 Scout: no_rope_layers [] -> every 4th layer NoPE/global: 12 full,
    # 36 chunked local (8192).
    (
        "llama-4-scout-17b-16e-instruct.json", "llama4", 48,
        {"chunked_local": 36, "full_attention": 12},
        {"chunked_local": (8, 128), "full_attention": (8, 128)}, "bfloat16", 10485760,
    ),
    # DeepSeek V3: 61 MLA layers, one latent head of 512 + 64 = 576.
    (
        "deepseek-v3.json", "deepseek_v3", 61, {"mla": 61},
        {"mla": (1, 576)}, "bfloat16", 163840,
    ),
    # Qwen3-Next 80B-A3B: every 4th layer full: 12 full (2 KV heads x 256), 36 GDN.
    (
        "qwen3-next-80b-a3b-thinking.json", "qwen3_next", 48,
        {"full_attention": 12, "mamba": 36},
        {"full_attention": (2, 256), "mamba": (None, None)}, "bfloat16", 262144,
    ),
    # Nemotron-H 56B: pattern has 54 'M', 10 '*', 54 '-' (MLP, no cache).
    (
        "nemotron-h-56b-base-8k.json", "nemotron_h", 118,
        {"mamba": 54, "full_attention": 10},
        {"full_attention": (8, 128), "mamba": (None, None)}, "bfloat16", 8192,
    ),
    # Qwen3-30B-A3B (Qwen3-MoE): use_sliding_window false -> 48 full, 4 KV heads x 128.
    (
        "qwen3-30b-a3b.json", "qwen3_moe", 48, {"full_attention": 48},
        {"full_attention": (4, 128)}, "bfloat16", 40960,
    ),
    # Mixtral 8x7B: no sliding_window key (MixtralConfig default None): 32 full,
    # head 4096 / 32 = 128, 8 KV heads.
    (
        "mixtral-8x7b-v0.1.json", "mixtral", 32, {"full_attention": 32},
        {"full_attention": (8, 128)}, "bfloat16", 32768,
    ),
    # Mixtral 8x22B: sliding_window null: 56 full, head 6144 / 48 = 128.
    (
        "mixtral-8x22b-v0.1.json", "mixtral", 56, {"full_attention": 56},
        {"full_attention": (8, 128)}, "bfloat16", 65536,
    ),
    # Phi-3-mini: sliding_window 2047 on every layer; MHA, 32 KV heads x 3072 / 32 = 96.
    (
        "phi-3-mini-4k-instruct.json", "phi3", 32, {"sliding_window": 32},
        {"sliding_window": (32, 96)}, "bfloat16", 4096,
    ),
    # Phi-3-medium: sliding_window 2047 on every layer; 10 KV heads x 5120 / 40 = 128.
    (
        "phi-3-medium-4k-instruct.json", "phi3", 40, {"sliding_window": 40},
        {"sliding_window": (10, 128)}, "bfloat16", 4096,
    ),
    # Phi-4: sliding_window null: 40 full, 10 KV heads x 5120 / 40 = 128.
    (
        "phi-4.json", "phi3", 40, {"full_attention": 40},
        {"full_attention": (10, 128)}, "bfloat16", 16384,
    ),
    # Qwen3.5-9B: text_config layer_types, 3 GDN + 1 full: 24 GDN, 8 full (4 x 256).
    (
        "qwen3.5-9b.json", "qwen3_5", 32, {"mamba": 24, "full_attention": 8},
        {"full_attention": (4, 256), "mamba": (None, None)}, "bfloat16", 262144,
    ),
    # Qwen3.5-122B-A10B: 36 GDN, 12 full (2 x 256).
    (
        "qwen3.5-122b-a10b.json", "qwen3_5_moe", 48, {"mamba": 36, "full_attention": 12},
        {"full_attention": (2, 256), "mamba": (None, None)}, "bfloat16", 262144,
    ),
    # GLM-4.5-Air: explicit head_dim 128 (4096 / 96 is not whole), 8 KV heads; the
    # MTP layer (num_nextn_predict_layers 1) is not one of the 46.
    (
        "glm-4.5-air.json", "glm4_moe", 46, {"full_attention": 46},
        {"full_attention": (8, 128)}, "bfloat16", 131072,
    ),
    # MiniMax-M2: attn_type_list all 1, sliding_window null: 62 full, 8 KV heads x 128.
    # Its config.json names no dtype (an FP8 checkpoint).
    (
        "minimax-m2.json", "minimax_m2", 62, {"full_attention": 62},
        {"full_attention": (8, 128)}, None, 196608,
    ),
]


def test_every_committed_config_is_covered():
    files = sorted(p.name for p in DATA.glob("*.json"))
    assert files == sorted(case[0] for case in CASES)


@pytest.mark.parametrize(
    "name,family,num_layers,counts,heads,dtype,max_pos", CASES, ids=[c[0] for c in CASES]
)
def test_describe_committed_config(name, family, num_layers, counts, heads, dtype, max_pos):
    facts = describe(load(name))
    assert facts.family == family
    assert family in SUPPORTED_FAMILIES
    assert facts.num_layers == num_layers
    assert facts.count_by_kind() == counts
    assert facts.dtype == dtype
    assert facts.max_position_embeddings == max_pos
    for layer in facts.layers:
        assert (layer.num_kv_heads, layer.head_size) == heads[layer.kind]
        assert layer.head_size_v is None
    # indices are increasing, in range, and unique
    indices = [layer.index for layer in facts.layers]
    assert indices == sorted(set(indices))
    assert all(0 <= i < num_layers for i in indices)


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_describe_is_pure(name):
    config = load(name)
    before = copy.deepcopy(config)
    assert describe(config) == describe(config)
    assert config == before


# --------------------------------------------------------------------------
# spot checks of each family's documented layer pattern
# --------------------------------------------------------------------------


def test_gemma2_even_layers_slide():
    facts = describe(load("gemma-2-9b-it.json"))
    assert kind_at(facts, 0) == "sliding_window"
    assert kind_at(facts, 1) == "full_attention"
    assert kind_at(facts, 40) == "sliding_window"
    assert kind_at(facts, 41) == "full_attention"
    assert {lay.sliding_window for lay in facts.layers_of_kind("sliding_window")} == {4096}


def test_gemma3_every_sixth_layer_is_global():
    facts = describe(load("gemma-3-27b-it.json"))
    full = [lay.index for lay in facts.layers_of_kind("full_attention")]
    assert full == [5, 11, 17, 23, 29, 35, 41, 47, 53, 59]
    assert [kind_at(facts, i) for i in range(6)] == ["sliding_window"] * 5 + ["full_attention"]
    assert kind_at(facts, 60) == kind_at(facts, 61) == "sliding_window"
    assert {lay.sliding_window for lay in facts.layers_of_kind("sliding_window")} == {1024}


def test_gemma3_honours_layer_types_when_present():
    config = load("gemma-3-27b-it.json")
    n = config["text_config"]["num_hidden_layers"]
    # synthetic variant: newer transformers write layer_types out explicitly
    config["text_config"]["layer_types"] = ["full_attention"] + ["sliding_attention"] * (n - 1)
    facts = describe(config)
    assert facts.count_by_kind() == {"full_attention": 1, "sliding_window": 61}
    assert kind_at(facts, 0) == "full_attention"


def test_gpt_oss_alternates_from_layer_types():
    facts = describe(load("gpt-oss-120b.json"))
    assert kind_at(facts, 0) == "sliding_window"
    assert kind_at(facts, 1) == "full_attention"
    assert kind_at(facts, 35) == "full_attention"
    assert {lay.sliding_window for lay in facts.layers_of_kind("sliding_window")} == {128}


def test_llama4_every_fourth_layer_is_global():
    facts = describe(load("llama-4-scout-17b-16e-instruct.json"))
    assert [kind_at(facts, i) for i in range(4)] == ["chunked_local"] * 3 + ["full_attention"]
    assert [lay.index for lay in facts.layers_of_kind("full_attention")] == list(range(3, 48, 4))
    chunked = facts.layers_of_kind("chunked_local")
    assert {lay.attention_chunk_size for lay in chunked} == {8192}
    assert all(lay.sliding_window is None for lay in facts.layers)


def test_llama4_explicit_no_rope_layers():
    config = load("llama-4-scout-17b-16e-instruct.json")
    # synthetic variant: only layer 0 is NoPE
    config["text_config"]["no_rope_layers"] = [0] + [1] * 47
    facts = describe(config)
    assert facts.count_by_kind() == {"full_attention": 1, "chunked_local": 47}


def test_deepseek_v3_mla_head():
    facts = describe(load("deepseek-v3.json"), tp=8)
    layer = facts.layers[0]
    assert layer == LayerFacts(
        index=0, kind="mla", num_kv_heads=1, head_size=576,
        mla_kv_lora_rank=512, mla_rope_dim=64,
    )
    assert facts.layers[60].index == 60  # the MTP layer (index 61) is not listed


def test_deepseek_v2_uses_the_same_mla_rule():
    # No verbatim DeepSeek-V2(-Lite) config.json was found (see README), so this
    # is the V3 file relabelled as V2: the MLA rule is the same for both.
    config = load("deepseek-v3.json")
    config["model_type"] = "deepseek_v2"
    config["architectures"] = ["DeepseekV2ForCausalLM"]
    facts = describe(config)
    assert facts.family == "deepseek_v2"
    assert facts.count_by_kind() == {"mla": 61}
    assert facts.layers[0].head_size == 512 + 64


def test_qwen2_sliding_window_only_when_enabled():
    config = load("qwen2.5-7b.json")
    assert config["sliding_window"] == 131072  # present but switched off
    assert describe(config).count_by_kind() == {"full_attention": 28}
    # synthetic variants: switched on for every layer (max_window_layers 0) ...
    config["use_sliding_window"] = True
    config["sliding_window"] = 4096
    config["max_window_layers"] = 0
    facts = describe(config)
    assert facts.count_by_kind() == {"sliding_window": 28}
    assert {lay.sliding_window for lay in facts.layers} == {4096}
    # ... and for none (max_window_layers = num_hidden_layers)
    config["max_window_layers"] = 28
    assert describe(config).count_by_kind() == {"full_attention": 28}


def test_qwen2_sliding_on_some_layers_only_is_refused_as_vllm_does():
    # synthetic variant: the top 8 layers would slide. vLLM 0.33.0's Qwen2Model
    # (also Qwen3's) asserts max_window_layers == num_hidden_layers then.
    config = load("qwen2.5-7b.json")
    config.update(use_sliding_window=True, sliding_window=4096, max_window_layers=20)
    with pytest.raises(rules.EngineRefusal) as excinfo:
        describe(config)
    assert str(excinfo.value) == (
        "Sliding window for some but all layers is not supported. This model uses sliding "
        "window but `max_window_layers` = 20 is less than `num_hidden_layers` = 28. Please "
        "open an issue to discuss this feature.")
    qwen3 = load("qwen3-8b.json")
    qwen3.update(use_sliding_window=True, sliding_window=4096, max_window_layers=30)
    with pytest.raises(rules.EngineRefusal):
        describe(qwen3)
    # explicit mixed layer_types pass vLLM's check only when max_window_layers equals
    # the layer count; the layers then take no window (it is set for all-sliding only)
    config["max_window_layers"] = 28
    config["layer_types"] = ["full_attention"] * 20 + ["sliding_attention"] * 8
    assert describe(config).count_by_kind() == {"full_attention": 28}


def test_qwen3_moe_window_needs_use_sliding_window_and_covers_every_layer():
    config = load("qwen3-30b-a3b.json")
    assert config["max_window_layers"] == 48 and config["use_sliding_window"] is False
    # synthetic variant: Qwen3MoeModel has no max_window_layers rule; the window is
    # the model-level one, on every layer
    config.update(use_sliding_window=True, sliding_window=4096, max_window_layers=10)
    facts = describe(config)
    assert facts.count_by_kind() == {"sliding_window": 48}
    assert {lay.sliding_window for lay in facts.layers} == {4096}


def test_phi3_mini_slides_everywhere_and_phi4_nowhere():
    mini = describe(load("phi-3-mini-4k-instruct.json"), tp=2)
    assert {(lay.kind, lay.sliding_window, lay.num_kv_heads, lay.head_size)
            for lay in mini.layers} == {("sliding_window", 2047, 32, 96)}
    medium = describe(load("phi-3-medium-4k-instruct.json"))
    assert {lay.sliding_window for lay in medium.layers} == {2047}
    phi4 = describe(load("phi-4.json"))
    assert {(lay.kind, lay.sliding_window) for lay in phi4.layers} == {("full_attention", None)}


def test_mixtral_window_absent_or_null_means_full_attention():
    eight = load("mixtral-8x7b-v0.1.json")
    assert "sliding_window" not in eight  # this Hub revision has no key (README)
    assert describe(eight).count_by_kind() == {"full_attention": 32}
    assert load("mixtral-8x22b-v0.1.json")["sliding_window"] is None
    # synthetic variant: a model-level window slides on every layer
    eight["sliding_window"] = 4096
    assert describe(eight).count_by_kind() == {"sliding_window": 32}


def test_glm4_moe_and_minimax_m2_heads():
    glm = describe(load("glm-4.5-air.json"), tp=8)
    assert {(lay.num_kv_heads, lay.head_size) for lay in glm.layers} == {(8, 128)}
    assert [lay.index for lay in glm.layers] == list(range(46))
    minimax = describe(load("minimax-m2.json"))
    assert minimax.dtype is None and minimax.served_dtype == "bfloat16"
    assert {(lay.kind, lay.num_kv_heads, lay.head_size) for lay in minimax.layers} == {
        ("full_attention", 8, 128)}


def test_mistral_model_level_window_applies_to_every_layer():
    # synthetic variant: Mistral 7B v0.1 style sliding_window 4096 (no layer_types)
    config = load("mistral-nemo-base-2407.json")
    config["sliding_window"] = 4096
    facts = describe(config)
    assert facts.count_by_kind() == {"sliding_window": 40}
    assert {lay.sliding_window for lay in facts.layers} == {4096}


@pytest.mark.parametrize("name,family", [("qwen3.5-9b.json", "qwen3_5"),
                                         ("qwen3.5-122b-a10b.json", "qwen3_5_moe")])
def test_qwen3_5_layer_types_from_text_config(name, family):
    config = load(name)
    assert "layer_types" not in config and "layer_types" in config["text_config"]
    facts = describe(config)
    assert facts.family == family and facts.architecture.endswith("ForConditionalGeneration")
    n = facts.num_layers
    assert [kind_at(facts, i) for i in range(4)] == ["mamba"] * 3 + ["full_attention"]
    assert [lay.index for lay in facts.layers_of_kind("full_attention")] == list(range(3, n, 4))
    assert {lay.mamba_type for lay in facts.layers_of_kind("mamba")} == {"gdn_attention"}


def test_qwen3_5_state_shapes_and_float32_ssm_state():
    # gated_delta_net_state_shape, 9B: 16 K heads, 32 V heads, 128 x 128, kernel 4:
    # conv_dim = 2 * 16 * 128 + 32 * 128 = 8192; 122B: 16 K, 64 V heads: 12288.
    nine = load("qwen3.5-9b.json")
    assert mamba_shapes(describe(nine)) == {((3, 8192), (32, 128, 128))}
    assert mamba_shapes(describe(nine, tp=4)) == {((3, 2048), (8, 128, 128))}
    big = load("qwen3.5-122b-a10b.json")
    assert mamba_shapes(describe(big, tp=8)) == {((3, 1536), (8, 128, 128))}
    # Qwen3_5ForConditionalGenerationConfig: mamba_ssm_cache_dtype auto -> the
    # text config's mamba_ssm_dtype (float32); an explicit value wins
    assert nine["text_config"]["mamba_ssm_dtype"] == "float32"
    assert {lay.state_dtypes for lay in describe(nine).layers_of_kind("mamba")} == {
        ("bfloat16", "float32")}
    facts = describe(nine, mamba_ssm_cache_dtype="bfloat16")
    assert {lay.state_dtypes for lay in facts.layers_of_kind("mamba")} == {
        ("bfloat16", "bfloat16")}


def test_qwen3_next_every_fourth_layer_is_full():
    facts = describe(load("qwen3-next-80b-a3b-thinking.json"))
    assert [kind_at(facts, i) for i in range(4)] == ["mamba"] * 3 + ["full_attention"]
    assert [lay.index for lay in facts.layers_of_kind("full_attention")] == list(range(3, 48, 4))
    assert {lay.mamba_type for lay in facts.layers_of_kind("mamba")} == {"gdn_attention"}


def test_nemotron_h_pattern_positions():
    facts = describe(load("nemotron-h-56b-base-8k.json"))
    # "M-M-M-M*-M-..." : 0 M, 1 -, 2 M, 3 -, 4 M, 5 -, 6 M, 7 *, 8 -, 9 M
    assert kind_at(facts, 0) == "mamba"
    assert kind_at(facts, 1) is None  # MLP layer: no cache state
    assert kind_at(facts, 6) == "mamba"
    assert kind_at(facts, 7) == "full_attention"
    assert kind_at(facts, 8) is None
    assert kind_at(facts, 116) == "mamba"
    assert kind_at(facts, 117) is None
    assert {lay.mamba_type for lay in facts.layers_of_kind("mamba")} == {"mamba2"}


def test_nemotron_h_as_transformers_5_saves_it():
    # transformers 5 writes the pattern as layers_block_type names (M: linear_attention,
    # *: full_attention, -: mlp, E: moe) and drops num_hidden_layers
    hub = load("nemotron-h-56b-base-8k.json")
    names = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
    saved = {k: v for k, v in hub.items()
             if k not in ("hybrid_override_pattern", "num_hidden_layers")}
    saved["layers_block_type"] = [names[c] for c in hub["hybrid_override_pattern"]]
    assert describe(saved) == describe(hub)
    bad = {**saved, "layers_block_type": [*saved["layers_block_type"][:-1], "conv"]}
    with pytest.raises(ConfigError, match="unknown layers_block_type entry 'conv'"):
        describe(bad)
    with pytest.raises(ConfigError, match="117 entries for 118 layers"):
        describe({**saved, "num_hidden_layers": 118,
                  "layers_block_type": saved["layers_block_type"][:-1]})


# --------------------------------------------------------------------------
# state shapes: hand-derived from vLLM's MambaStateShapeCalculator formulas
# --------------------------------------------------------------------------


def mamba_shapes(facts: ModelFacts) -> set:
    return {lay.state_shapes for lay in facts.layers_of_kind("mamba")}


def test_qwen3_next_state_shapes_tp1_tp2():
    config = load("qwen3-next-80b-a3b-thinking.json")
    # gated_delta_net_state_shape: num_k_heads 16, num_v_heads 32,
    # head_k_dim 128, head_v_dim 128, conv kernel 4.
    # conv_dim = 2 * 16 * 128 + 32 * 128 = 4096 + 4096 = 8192
    # tp=1: conv (4 - 1, 8192) = (3, 8192); recurrent (32, 128, 128)
    # tp=2: conv (3, 8192 / 2) = (3, 4096); recurrent (32 / 2, 128, 128) = (16, 128, 128)
    assert mamba_shapes(describe(config, tp=1)) == {((3, 8192), (32, 128, 128))}
    assert mamba_shapes(describe(config, tp=2)) == {((3, 4096), (16, 128, 128))}
    # KV heads stay global under TP
    full = describe(config, tp=2).layers_of_kind("full_attention")
    assert {lay.num_kv_heads for lay in full} == {2}


def test_qwen3_next_state_dtypes():
    config = load("qwen3-next-80b-a3b-thinking.json")
    assert {lay.state_dtypes for lay in describe(config).layers_of_kind("mamba")} == {
        ("bfloat16", "bfloat16")
    }
    facts = describe(config, mamba_ssm_cache_dtype="float32")
    assert {lay.state_dtypes for lay in facts.layers_of_kind("mamba")} == {
        ("bfloat16", "float32")
    }


def test_nemotron_h_state_shapes_tp1_tp2():
    config = load("nemotron-h-56b-base-8k.json")
    # mamba2_state_shape: intermediate = mamba_num_heads * mamba_head_dim
    # = 256 * 64 = 16384; n_groups 8; state 256; conv kernel 4.
    # tp=1: 8 % 1 == 0 -> no extra groups;
    #       conv_dim = 16384 + 2 * 8 * 256 = 16384 + 4096 = 20480 -> conv (3, 20480)
    #       ssm (256 / 1, 64, 256) = (256, 64, 256)
    # tp=2: 8 % 2 == 0 -> no extra groups; conv (3, 20480 / 2) = (3, 10240)
    #       ssm (256 / 2, 64, 256) = (128, 64, 256)
    assert mamba_shapes(describe(config, tp=1)) == {((3, 20480), (256, 64, 256))}
    assert mamba_shapes(describe(config, tp=2)) == {((3, 10240), (128, 64, 256))}


def test_nemotron_h_extra_groups_when_tp_exceeds_groups():
    config = load("nemotron-h-56b-base-8k.json")
    # tp=16: 8 % 16 != 0 -> extra = 16 - 8 = 8 groups -> 16 groups
    # conv_dim = 16384 + 2 * 16 * 256 = 24576 -> 24576 / 16 = 1536
    # ssm (256 / 16, 64, 256) = (16, 64, 256)
    assert mamba_shapes(describe(config, tp=16)) == {((3, 1536), (16, 64, 256))}
    with pytest.raises(ValueError, match="not divisible"):
        describe(config, tp=3)


def test_nemotron_h_ssm_state_defaults_to_float32():
    config = load("nemotron-h-56b-base-8k.json")
    facts = describe(config)
    assert {lay.state_dtypes for lay in facts.layers_of_kind("mamba")} == {
        ("bfloat16", "float32")
    }
    facts = describe(config, mamba_ssm_cache_dtype="bfloat16")
    assert {lay.state_dtypes for lay in facts.layers_of_kind("mamba")} == {
        ("bfloat16", "bfloat16")
    }


# No verbatim Jamba config.json was found (see tests/data/hf/README.md).  This
# inline config carries transformers' JambaConfig defaults, which describe
# ai21labs/Jamba-v0.1's architecture; it is a test fixture, not a real file.
JAMBA_DEFAULTS = {
    "architectures": ["JambaForCausalLM"],
    "model_type": "jamba",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "attn_layer_period": 8,
    "attn_layer_offset": 4,
    "mamba_d_state": 16,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "max_position_embeddings": 262144,
    "torch_dtype": "bfloat16",
}


def test_jamba_layers_and_state_shapes_tp1_tp2():
    facts = describe(JAMBA_DEFAULTS)
    # attention iff i % 8 == 4 -> layers 4, 12, 20, 28
    assert [lay.index for lay in facts.layers_of_kind("full_attention")] == [4, 12, 20, 28]
    assert facts.count_by_kind() == {"mamba": 28, "full_attention": 4}
    assert {(lay.num_kv_heads, lay.head_size) for lay in facts.layers_of_kind("full_attention")} \
        == {(8, 4096 // 32)}
    # mamba1_state_shape: intermediate = mamba_expand * hidden = 2 * 4096 = 8192
    # tp=1: conv (4 - 1, 8192) = (3, 8192); ssm (8192, 16)
    # tp=2: conv (3, 8192 / 2) = (3, 4096); ssm (4096, 16)
    assert mamba_shapes(facts) == {((3, 8192), (8192, 16))}
    assert mamba_shapes(describe(JAMBA_DEFAULTS, tp=2)) == {((3, 4096), (4096, 16))}
    assert {lay.state_dtypes for lay in facts.layers_of_kind("mamba")} == {
        ("bfloat16", "bfloat16")
    }
    assert {lay.mamba_type for lay in facts.layers_of_kind("mamba")} == {"mamba1"}


# --------------------------------------------------------------------------
# the calculators themselves
# --------------------------------------------------------------------------


def test_mamba1_state_shape():
    # (conv_kernel - 1, intermediate / tp), (intermediate / tp, state)
    assert ss.mamba1_state_shape(
        tp_world_size=4, intermediate_size=8192, state_size=16, conv_kernel=4
    ) == ((3, 2048), (2048, 16))


def test_mamba2_state_shape_single_group_replication():
    # n_groups 1, tp 4 -> extra 4 - 1 = 3 -> 4 groups
    # conv_dim = 4096 + 2 * 4 * 128 = 5120 -> 5120 / 4 = 1280; heads 64 / 4 = 16
    assert ss.extra_groups_for_head_shards(1, 4) == 3
    assert ss.mamba2_state_shape(
        tp_world_size=4, intermediate_size=4096, n_groups=1, num_heads=64,
        head_dim=64, state_size=128, conv_kernel=4,
    ) == ((3, 1280), (16, 64, 128))


def test_conv_layout_and_speculative_tokens():
    sd = ss.mamba2_state_shape(
        tp_world_size=1, intermediate_size=16, n_groups=1, num_heads=2,
        head_dim=8, state_size=4, conv_kernel=4, num_spec=2,
    )
    # conv_dim = 16 + 2 * 1 * 4 = 24; state_len = 4 - 1 + 2 = 5
    assert sd == ((5, 24), (2, 8, 4))
    ds = ss.mamba2_state_shape(
        tp_world_size=1, intermediate_size=16, n_groups=1, num_heads=2,
        head_dim=8, state_size=4, conv_kernel=4, num_spec=2, conv_layout="DS",
    )
    assert ds == ((24, 5), (2, 8, 4))


def test_gated_delta_net_recurrent_order_is_v_then_k():
    # num_k_heads 2, num_v_heads 4, head_k 8, head_v 16:
    # conv_dim = 2 * 2 * 8 + 4 * 16 = 96; recurrent (4, 16, 8)
    assert ss.gated_delta_net_state_shape(
        tp_world_size=1, num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=16,
        conv_kernel_size=4,
    ) == ((3, 96), (4, 16, 8))


def test_short_conv_and_linear_attention():
    assert ss.short_conv_state_shape(
        tp_world_size=2, intermediate_size=1024, conv_kernel=3
    ) == ((2, 512),)
    assert ss.linear_attention_state_shape(num_heads=8, tp_world_size=2, head_dim=64) == (
        (4, 64, 64),
    )


def test_state_dtypes_rules():
    assert ss.state_dtypes("mamba2", "bfloat16") == ("bfloat16", "bfloat16")
    assert ss.state_dtypes("mamba1", "bfloat16", "auto", "float32") == ("bfloat16", "float32")
    assert ss.state_dtypes("mamba2", "bfloat16", "float16", "auto") == ("float16", "float16")
    assert ss.state_dtypes("gdn_attention", "float16", "auto", "float32") == (
        "float16", "float32",
    )
    assert ss.state_dtypes("gated_delta_net", "bfloat16") == ("bfloat16", "bfloat16")
    assert ss.state_dtypes("short_conv", "bfloat16", "auto", "float32") == ("bfloat16",)
    assert ss.state_dtypes("linear_attention", "half") == ("float16",)
    with pytest.raises(ValueError, match="unknown mamba_type 'mamba3'"):
        ss.state_dtypes("mamba3", "bfloat16")
    with pytest.raises(ValueError, match="unsupported cache dtype 'int4'"):
        ss.state_dtypes("mamba2", "bfloat16", "int4")


# --------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------


def test_unknown_architecture_names_supported_families():
    config = {"architectures": ["BertForMaskedLM"], "model_type": "bert", "num_hidden_layers": 12}
    with pytest.raises(UnsupportedModelError) as excinfo:
        describe(config)
    assert isinstance(excinfo.value, ValueError)
    message = str(excinfo.value)
    assert "BertForMaskedLM" in message
    for name in ("Llama", "Qwen3-Next", "Nemotron-H", "Jamba", "DeepSeek V3", "gpt-oss"):
        assert name in message


def test_family_falls_back_to_architectures():
    config = load("llama-3.1-8b.json")
    del config["model_type"]
    assert family_of(config) == "llama"


def test_bad_tp_rejected():
    with pytest.raises(ValueError, match="tp must be a positive integer, got 0"):
        describe(load("llama-3.1-8b.json"), tp=0)


def test_float32_or_missing_dtype_is_served_in_bf16():
    # vLLM's dtype auto: a float32 checkpoint, or one naming no dtype, is served in
    # the GPU's first supported half type (bf16 from Ampere on); states follow it
    config = dict(JAMBA_DEFAULTS)
    del config["torch_dtype"]
    facts = describe(config)
    assert (facts.dtype, facts.served_dtype) == (None, "bfloat16")
    assert {lay.state_dtypes for lay in facts.layers_of_kind("mamba")} == {
        ("bfloat16", "bfloat16")}
    config["torch_dtype"] = "float32"
    facts = describe(config)
    assert (facts.dtype, facts.served_dtype) == ("float32", "bfloat16")
    assert describe(config, target=rules.target("turing")).served_dtype == "float16"
    facts = describe(config, dtype="float32")  # --dtype float32 serves it as it is
    assert {lay.state_dtypes for lay in facts.layers_of_kind("mamba")} == {
        ("float32", "float32")}
    facts = describe(config, mamba_cache_dtype="bfloat16", mamba_ssm_cache_dtype="float32")
    assert {lay.state_dtypes for lay in facts.layers_of_kind("mamba")} == {
        ("bfloat16", "float32")}


def test_dtype_is_read_where_vllm_reads_it():
    # the top level first, then text_config: Qwen3.5 names its dtype in text_config only
    assert describe(load("qwen3.5-9b.json")).dtype == "bfloat16"
    config = load("gemma-3-27b-it.json")
    config["text_config"]["torch_dtype"] = "float16"
    assert describe(config).dtype == "bfloat16"  # the top level's


def test_readme_cites_every_config():
    readme = (DATA / "README.md").read_text()
    for path in DATA.glob("*.json"):
        assert path.name in readme
