"""``kvspec init`` of an MLA model (DeepSeek-V3/R1, Kimi-K2) writes the block size vLLM
0.33.0's MLA backend takes on the ``--target`` GPU class, and says in the header which
backend it assumes (kvspec/integrations/mla_backend.py; checked against vLLM's own
classes in tests/vllm/test_mla_backend.py)."""

from __future__ import annotations

import json
import re

import pytest

from kvspec.integrations.mla_backend import mla_backend
from kvspec.integrations.rules import GPU_TARGETS, target
from tests.conftest import ROOT, invoke

DEEPSEEK = "tests/data/hf/deepseek-v3.json"


def _init(*args: str) -> tuple[int, str]:
    code, out, err = invoke(["init", "--from-hf", DEEPSEEK, "--max-model-len", "32768", *args])
    assert code == 0, err
    block = re.search(r"^  block_size: (\d+)$", out, re.MULTILINE)
    assert block is not None
    header = " ".join(line[2:] for line in out.splitlines() if line.startswith("# "))
    return int(block.group(1)), header


@pytest.mark.parametrize("gpu,dtype,backend,block", [
    ("hopper", "auto", "FLASH_ATTN_MLA", 16),
    ("hopper", "fp8", "FLASHMLA", 64),
    ("blackwell", "auto", "FLASHINFER_MLA", 32),
    ("blackwell", "fp8", "FLASHINFER_MLA", 32),
    ("ampere", "auto", "TRITON_MLA", 16),
    ("ada", "fp8", "TRITON_MLA", 16),
])
def test_a_cuda_target_gets_its_mla_backends_block(gpu: str, dtype: str, backend: str,
                                                   block: int) -> None:
    got, header = _init("--target", gpu, "--kv-cache-dtype", dtype)
    assert got == block
    assert f"on {gpu} vLLM 0.33.0 serves MLA with its {backend} backend" in header


def test_without_a_target_the_note_says_where_16_holds_and_where_not() -> None:
    block, header = _init()
    assert block == 16
    assert ("block_size 16 is what vLLM 0.33.0 sets for MLA on volta, turing, ampere, ada "
            "(TRITON_MLA) and hopper (FLASH_ATTN_MLA); on blackwell it is 32 "
            "(FLASHINFER_MLA): say where it runs with --target.") in header


def test_a_block_size_given_wins_and_the_header_keeps_the_command_line() -> None:
    block, header = _init("--target", "blackwell", "--block-size", "64")
    assert block == 64 and "MLA" not in header
    assert ("kvspec init --from-hf tests/data/hf/deepseek-v3.json --target blackwell "
            "--max-model-len 32768 --block-size 64") in header
    block, header = _init("--target", "blackwell")
    assert block == 32 and "--block-size" not in header.split("Review")[0]


def test_flashinfer_mla_needs_a_qk_nope_head_dim_it_has_kernels_for() -> None:
    assert mla_backend(target("blackwell"), "auto", 96) == ("CUTLASS_MLA", 128)
    assert mla_backend(target("blackwell"), "fp8_e5m2", 128) is None
    assert mla_backend(target(None), "auto", 128) is None


def test_models_without_mla_keep_16_and_no_note() -> None:
    for gpu in GPU_TARGETS:
        code, out, _ = invoke(["init", "--from-hf", "tests/data/hf/qwen3-8b.json",
                               "--target", gpu])
        assert code == 0 and "  block_size: 16\n" in out and "MLA" not in out


def test_kimi_k2_is_a_deepseek_v3_to_the_rule(tmp_path) -> None:
    config = json.loads((ROOT / DEEPSEEK).read_text())
    config.update(num_attention_heads=64, n_routed_experts=384, _name_or_path="moonshotai/Kimi-K2")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    code, out, err = invoke(["init", "--from-hf", str(path), "--target", "blackwell"])
    assert code == 0, err
    assert "  block_size: 32\n" in out and "FLASHINFER_MLA" in out
