"""Every quantization mode compiles through a source, with the documented page sizes:
a Llama-3.1-8B source (8 KV heads x 128) and, where the mode applies to MLA, a
DeepSeek-V3 source (one 576-dim latent)."""

from __future__ import annotations

import pytest

from kvspec.compiler import compile_source
from kvspec.errors import KvspecError
from kvspec.model import quant as q
from kvspec.model.specs import MLA, FullAttention
from tests.invariants import check_artifact

LLAMA = """kvspec: 1
name: llama-quant
engine: {{block_size: 16, max_model_len: 8192, memory: 16GiB}}
defaults: {{num_kv_heads: 8, head_size: 128, dtype: bfloat16}}
quantization: {{kv_cache_dtype: {mode}}}
layer_types:
  attn: {{kind: full_attention}}
layers:
  - {{repeat: 32, pattern: [attn]}}
"""

DEEPSEEK = """kvspec: 1
name: deepseek-quant
engine: {{block_size: 64, max_model_len: 8192, memory: 16GiB}}
parallel: {{tensor: 8}}
quantization: {{kv_cache_dtype: {mode}}}
layer_types:
  mla: {{kind: mla, num_kv_heads: 1, head_size: 576, dtype: bfloat16}}
layers:
  - {{repeat: 61, pattern: [mla]}}
"""

MODES = sorted({s for f in q.FORMATS for s in f.kv_cache_dtypes})


def _expected_page(mode: str, *, mla: bool) -> int:
    heads, head, head_v, block = (1, 576, 0, 64) if mla else (8, 128, 128, 16)
    lq = q.layer_quant(mode, model_dtype="bfloat16", kind="mla" if mla else "attention",
                               head_size=head, head_size_v=head_v, num_kv_heads=heads,
                               block_size=block)
    cls = MLA if mla else FullAttention
    return cls(block_size=block, num_kv_heads=heads, head_size=head, head_size_v=head_v,
               dtype=lq.dtype, state_content_bytes=lq.state_content_bytes,
               num_head_slots=lq.num_head_slots).page_size_bytes


def _applies(mode: str, *, mla: bool) -> bool:
    try:
        _expected_page(mode, mla=mla)
    except KvspecError:
        return False
    return True


@pytest.mark.parametrize("mode", MODES)
def test_mode_on_llama(mode: str) -> None:
    text = LLAMA.format(mode=mode)
    if not _applies(mode, mla=False):
        with pytest.raises(KvspecError, match="kv_cache_dtype"):
            compile_source(text, "llama.yaml")
        return
    art = compile_source(text, "llama.yaml")
    body = art.data["body"]
    group = body["groups"][0]
    assert group["page_size_bytes"] == _expected_page(mode, mla=False)
    assert body["specs"][group["spec"]]["kv_quant_mode"] == int(q.quant_mode(mode))
    assert check_artifact(art) == []


@pytest.mark.parametrize("mode", MODES)
def test_mode_on_deepseek(mode: str) -> None:
    text = DEEPSEEK.format(mode=mode)
    if not _applies(mode, mla=True):
        with pytest.raises(KvspecError, match="kv_cache_dtype"):
            compile_source(text, "deepseek.yaml")
        return
    art = compile_source(text, "deepseek.yaml")
    assert art.data["body"]["groups"][0]["page_size_bytes"] == _expected_page(mode, mla=True)
    assert check_artifact(art) == []


def test_fp8_halves_llama_pages_and_doubles_capacity() -> None:
    bf16 = compile_source(LLAMA.format(mode="auto"), "a.yaml").data["body"]
    fp8 = compile_source(LLAMA.format(mode="fp8"), "b.yaml").data["body"]
    assert bf16["groups"][0]["page_size_bytes"] == 2 * fp8["groups"][0]["page_size_bytes"]
    assert fp8["budget"]["num_blocks"] == 2 * bf16["budget"]["num_blocks"]
    assert fp8["specs"][fp8["groups"][0]["spec"]]["dtype"] == "float8_e4m3fn"


def test_skipped_layers_make_a_mixed_precision_cache_that_needs_zeroing() -> None:
    text = LLAMA.format(mode="fp8").replace("{kv_cache_dtype: fp8}",
                                            "{kv_cache_dtype: fp8, skip_layers: [0, 31]}")
    art = compile_source(text, "mixed.yaml")
    body = art.data["body"]
    assert body["needs_zeroing"] is True
    dtypes = {body["specs"][body["layers"][f"model.layers.{i}.self_attn.attn"]["spec"]]["dtype"]
              for i in (0, 1, 31)}
    assert dtypes == {"bfloat16", "float8_e4m3fn"}
    assert check_artifact(art) == []
    uniform = compile_source(LLAMA.format(mode="fp8"), "u.yaml").data["body"]
    assert uniform["needs_zeroing"] is False


def test_per_type_override() -> None:
    text = LLAMA.format(mode="auto").replace(
        "attn: {kind: full_attention}", "attn: {kind: full_attention, kv_cache_dtype: fp8_e5m2}"
    )
    art = compile_source(text, "o.yaml")
    body = art.data["body"]
    assert body["specs"][body["groups"][0]["spec"]]["dtype"] == "float8_e5m2"
