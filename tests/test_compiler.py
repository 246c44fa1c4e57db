"""The compiler as a library: the pass pipeline, artifacts, and torch staying out."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import kvspec
from kvspec.artifact import Artifact
from kvspec.compiled import CompiledArtifact
from kvspec.compiler import (
    PASSES,
    Composed,
    Expanded,
    Parsed,
    Planned,
    Pooled,
    Sized,
    SourceText,
    Validated,
    compile_source,
    pass_named,
    run,
)
from kvspec.errors import ArtifactError, KvspecError, PlanError
from kvspec.model.engine import BudgetRef, SettingRef
from tests.conftest import ROOT

LLAMA = Path("layouts/llama-3.1-8b.yaml")


def test_every_prefix_of_the_pipeline_runs_and_ends_in_its_stage_type() -> None:
    start = SourceText(text=LLAMA.read_text(), file=str(LLAMA))
    stages = (Composed, Parsed, Expanded, Validated, Planned, Sized, Pooled, CompiledArtifact)
    assert [p.gives for p in PASSES] == list(stages)
    for i, stage in enumerate(stages, 1):
        out = run(start, PASSES[:i])
        assert type(out) is stage, (i, type(out))
    # what each stage adds, on the last prefix's output and on the way
    expanded = run(start, PASSES[:3])
    assert expanded.doc.data["name"] == "llama-3.1-8b"
    assert len(expanded.expansion.stage_specs[0]) == 32
    assert expanded.expansion.quantization["model.layers.0.self_attn.attn"].kv_cache_dtype \
        == "auto"
    assert out.layout.stage(0).bytes_per_block == 2097152
    assert out.text() == (ROOT / "layouts/llama-3.1-8b.kvlayout.json").read_text()


def test_a_sequence_of_passes_that_does_not_chain_is_refused() -> None:
    start = SourceText(text=LLAMA.read_text(), file=str(LLAMA))
    with pytest.raises(TypeError, match="pass plan takes Validated, not Expanded"):
        run(start, (*PASSES[:3], pass_named("plan")))
    with pytest.raises(TypeError, match="pass parse takes Composed, not SourceText"):
        run(start, PASSES[1:])


def test_a_pass_error_is_located_once_from_its_reference() -> None:
    """The planner says what an error is about (an engine setting, the budget); the
    fold locates it at that setting's key in the source."""
    planned = run(SourceText(text=LLAMA.read_text(), file="l.yaml"), PASSES[:5])
    err = planned.where.locate(PlanError("x", ref=SettingRef("axis_order"), hint="h"))
    assert (err.file, err.line, err.column, err.path) == ("l.yaml", 13, 11, "engine.layout")
    text = LLAMA.read_text().replace("memory: 40GiB", "memory: 1MiB")
    with pytest.raises(KvspecError) as info:
        compile_source(text, "l.yaml")
    assert (info.value.file, info.value.path) == ("l.yaml", "engine.memory")
    assert isinstance(info.value.ref, BudgetRef)
    with pytest.raises(KvspecError) as info:  # the caller's budget: located at memory=
        compile_source(LLAMA.read_text(), "l.yaml", memory="1MiB")
    assert (info.value.line, info.value.path, info.value.found) == (
        None, "memory", "1,048,576 bytes")


def test_compile_does_not_import_torch() -> None:
    code = ("import sys, kvspec; kvspec.compile('layouts/llama-3.1-8b.yaml'); "
            "import kvspec.cli, kvspec.runtime.block_pool; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_artifact_tamper_is_refused(tmp_path: Path) -> None:
    art = kvspec.compile(LLAMA)
    data = json.loads(art.text())
    data["body"]["stages"][0]["bytes_per_block"] += 1
    path = tmp_path / "t.kvlayout.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match="does not match its sha256"):
        Artifact.read(path)


def test_artifact_format_mismatch_is_refused() -> None:
    data = json.loads(kvspec.compile(LLAMA).text())
    data["format"] = "kvspec.layout/99"
    with pytest.raises(ArtifactError, match=re.escape("this artifact is format kvspec.layout/99; "
                                                      "this kvspec reads kvspec.layout/3 only")):
        Artifact.from_dict(data)


def test_artifact_resizes_for_any_budget() -> None:
    art = kvspec.compile(LLAMA)
    assert art.num_blocks_for(memory=80 << 30) == 40960
    assert art.num_blocks_for(num_blocks=9000) == 9000
    with pytest.raises(KvspecError, match="cannot serve one request"):
        art.num_blocks_for(num_blocks=100)


#: Two pipeline stages whose blocks cost differently (stage 1 holds twice the layers).
UNEVEN_STAGES = """kvspec: 1
name: uneven
engine: {block_size: 16, max_model_len: 4096, num_blocks: 400}
parallel: {pipeline: 2, pipeline_partition: [1, 2]}
defaults: {num_kv_heads: 8, head_size: 128, dtype: bfloat16}
layer_types:
  full: {kind: full_attention}
layers:
  - {type: full, repeat: 3}
"""


def test_a_fixed_block_count_costs_what_the_costliest_rank_spends() -> None:
    """With ``num_blocks`` fixed, the budget is what those blocks cost the rank that
    spends the most (here stage 1), as re-sizing the artifact says too."""
    layout = compile_source(UNEVEN_STAGES, "uneven.yaml").layout
    costs = [400 * st.bytes_per_block for st in layout.stages]
    assert costs[1] == 2 * costs[0]
    assert layout.budget.memory == costs[1]
    from kvspec.planner import resize  # the figure re-sizing gives
    assert resize(layout, num_blocks=400).memory == layout.budget.memory


def test_source_hash_and_determinism() -> None:
    text = LLAMA.read_text()
    a = compile_source(text, "a.yaml")
    b = compile_source(text, "elsewhere/b.yaml")
    assert a.text() == b.text(), "the artifact must not depend on where the source lives"
    import hashlib
    assert a.source_sha256 == hashlib.sha256(text.encode()).hexdigest()


def test_memory_override_changes_only_the_budget() -> None:
    a = kvspec.compile(LLAMA)
    b = kvspec.compile(LLAMA, memory=20 << 30)
    assert a.data["body"]["stages"] == b.data["body"]["stages"]
    assert b.data["body"]["budget"]["num_blocks"] == 10240


def test_max_model_len_auto_fits_memory() -> None:
    text = LLAMA.read_text().replace("max_model_len: 131072",
                                     "max_model_len: auto\n  model_max_len: 131072").replace(
        "memory: 40GiB", "memory: 10GiB")
    art = compile_source(text, "auto.yaml")
    budget = art.data["body"]["budget"]
    assert budget["max_model_len"] < 131072
    # one request at the fitted length fits the budget less the null block
    assert (budget["max_model_len"] + 15) // 16 * 2 * 2**20 <= (10 << 30) - 2**20


def test_tensor_parallel_splits_and_replicates_heads() -> None:
    base = LLAMA.read_text()
    tp2 = compile_source(base.replace("tensor: 1", "tensor: 2"), "tp2.yaml")
    assert tp2.data["body"]["groups"][0]["page_size_bytes"] == 65536 // 2
    tp16 = compile_source(base.replace("tensor: 1", "tensor: 16"), "tp16.yaml")
    body = tp16.data["body"]
    spec = body["specs"][body["groups"][0]["spec"]]
    assert spec["num_kv_heads"] == 1   # 8 heads over 16 ranks: replicated, one per rank


def test_flat_layer_list_is_accepted() -> None:
    layers = "\n".join(
        f"  - {{name: blk.{i}.attn, kind: full_attention, num_kv_heads: 8, head_size: 64, "
        f"dtype: float16}}" for i in range(3))
    text = ("kvspec: 1\nname: flat\nengine: {block_size: 16, max_model_len: 2048, "
            f"memory: 1GiB}}\nlayers:\n{layers}\n")
    art = compile_source(text, "flat.yaml")
    assert art.data["body"]["groups"][0]["layers"] == ["blk.0.attn", "blk.1.attn", "blk.2.attn"]
