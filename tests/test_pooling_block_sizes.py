"""``pooling.block_sizes``: the attention block sizes ``auto`` tries for a model
without state layers, so it chooses only among blocks the serving engine's
attention kernels take (vLLM 0.32's CPU backend refuses a 16-token block: its
kernel blocks are multiples of 32; tests/serve/test_capacity.py serves the choice)."""

from __future__ import annotations

import pytest

from kvspec.compiler import compile_source
from kvspec.errors import KvspecError

SOURCE = """\
kvspec: 1
name: blocks
engine: {{block_size: 128, max_model_len: 512, max_num_seqs: 32, memory: 4MiB}}
defaults: {{num_kv_heads: 2, head_size: 64, dtype: bfloat16}}
layer_types:
  full: {{kind: full_attention}}
layers:
- {{repeat: 4, pattern: [full]}}
pooling:
  policy: auto
  serve_with: vllm
{extra}  workload: {{context_tokens: 100, output_tokens: 40, requests: 60}}
"""


def _unified_blocks(extra: str) -> list[int]:
    record = compile_source(SOURCE.format(extra=extra), "b.yaml").body.pooling
    assert record is not None
    return sorted(c.block_size for c in record.candidates if c.policy == "unified"
                  and "no prefix caching" not in c.name)


def test_auto_tries_the_default_block_sizes() -> None:
    assert _unified_blocks("") == [16, 32, 64, 128]


def test_auto_tries_only_the_block_sizes_the_source_names() -> None:
    assert _unified_blocks("  block_sizes: [64, 32, 32]\n") == [32, 64, 128]


def test_an_empty_list_of_block_sizes_is_refused_at_its_position() -> None:
    with pytest.raises(KvspecError) as err:
        compile_source(SOURCE.format(extra="  block_sizes: []\n"), "b.yaml")
    assert "b.yaml:12:16: " in str(err.value) and "block_sizes" in str(err.value)
