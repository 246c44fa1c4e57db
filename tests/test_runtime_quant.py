"""Quantized caches at runtime: cell parts (K, V, in-cell scales) and per-tensor scales."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the runtime tests need torch "
                            "(pip install -e '.[runtime]')")

from kvspec.compiler import compile_source  # noqa: E402
from kvspec.runtime.loader import load  # noqa: E402

SRC = """kvspec: 1
name: q
engine: {{block_size: 16, max_model_len: 256}}
defaults: {{num_kv_heads: 2, head_size: 64, dtype: bfloat16}}
quantization: {{kv_cache_dtype: {mode}}}
layer_types:
  attn: {{kind: full_attention}}
layers:
  - {{repeat: 2, pattern: [attn]}}
"""


def test_int8_per_token_head_parts_are_views_of_the_cell() -> None:
    cache = load(compile_source(SRC.format(mode="int8_per_token_head"), "q.yaml"),
                 num_blocks=20)
    name = "model.layers.1.self_attn.attn"
    parts = cache.parts[name]
    assert list(parts) == ["k", "k_scale", "v", "v_scale"]
    view = cache.views[name]                                 # (B, H, N, 2 * (64 + 4)) int8
    assert view.shape == (20, 2, 16, 136) and view.dtype == torch.int8
    assert parts["k"].shape == (20, 2, 16, 64) and parts["k_scale"].dtype == torch.float32
    assert parts["k_scale"].shape == (20, 2, 16, 1)
    parts["k_scale"][3, 1, 5, 0] = 0.5
    parts["v"][3, 1, 5, :] = 7
    raw = view[3, 1, 5]                                     # one cell's 136 bytes
    assert torch.equal(raw[64:68].view(torch.float32), torch.tensor([0.5]))
    assert torch.all(raw[68:132] == 7)
    assert (
        parts["k"].untyped_storage().data_ptr()
        == cache.buffers["device"].untyped_storage().data_ptr()
    )
    assert cache.scales == {}


def test_fp8_per_tensor_scales_live_beside_the_cache() -> None:
    cache = load(compile_source(SRC.format(mode="fp8"), "q.yaml"), num_blocks=20)
    assert set(cache.scales) == set(cache.views)
    s = cache.scales["model.layers.0.self_attn.attn"]
    assert float(s["k_scale"]) == 1.0 and s["v_scale"].dtype == torch.float32
    assert cache.buffers["scales"].shape == (2, 2)
    k = cache.parts["model.layers.0.self_attn.attn"]["k"]
    assert k.dtype == torch.float8_e4m3fn and k.shape == (20, 2, 16, 64)


def test_opaque_formats_have_no_parts_and_meta_works() -> None:
    cache = load(compile_source(SRC.format(mode="nvfp4"), "q.yaml"), num_blocks=20,
                 device="meta")
    assert len(cache.parts) == 0
    with pytest.raises(KeyError, match="no addressable cell parts"):
        cache.parts["model.layers.0.self_attn.attn"]
