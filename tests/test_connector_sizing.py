"""One sizing for every reader (issue 36, items 2, 5 and 12): ``kvspec descriptor``,
``kvspec transfer``, ``LoadedCache.descriptor()`` and ``kvspec plan`` give every pool
of every committed artifact the same block count, whatever its pooling policy; every
pipeline stage of a separate plan loads the plan's count; the source's ``num_blocks``
wins for separate pools as for unified ones; a block count past an address space is
refused naming the option."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvspec.artifact import Artifact
from kvspec.compiler import compile_source
from kvspec.connectors.descriptor import Descriptor
from tests.conftest import ROOT, invoke

torch = pytest.importorskip("torch")

ARTIFACTS = sorted([*(ROOT / "layouts").glob("*.kvlayout.json"),
                    *(ROOT / "tests" / "golden").glob("*.kvlayout.json")])


def _plan_counts(path: Path) -> dict[str, int]:
    """What ``kvspec plan --format json`` gives each pool: a separate plan's pools by
    name, else the main pool (``device``) and a drafter's own (``draft``)."""
    code, out, err = invoke(["plan", str(path), "--format", "json"])
    assert code == 0, err
    data = json.loads(out)
    if "pools" in data and data["pools"][0]["name"] is not None:
        return {p["name"]: p["num_blocks"] for p in data["pools"]}
    view = data["pools"][0] if "pools" in data else data
    out_ = {"device": view["num_blocks"]}
    if view.get("draft_num_blocks"):
        out_["draft"] = view["draft_num_blocks"]
    return out_


@pytest.mark.parametrize("path", ARTIFACTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_descriptor_transfer_load_and_plan_agree(path: Path) -> None:
    import kvspec

    art = Artifact.read(path)
    planned = _plan_counts(path)
    tp = art.body.engine.tensor_parallel_size
    code, out, err = invoke(["transfer", str(path), str(path), "--format", "json"])
    assert code == 0, err
    transferred = json.loads(out)["source"]["num_blocks"]
    for stage in range(len(art.body.stages)):
        code, out, err = invoke(["descriptor", str(path), "--rank", str(stage * tp),
                                 "--format", "json"])
        assert code == 0, err
        cli = {p.name: p.num_blocks for p in Descriptor.from_json(out).pools}
        loaded = kvspec.load(art, device="meta", stage=stage).descriptor(stage * tp)
        runtime = {p.name: p.num_blocks for p in loaded.pools}
        assert cli == runtime, (stage, cli, runtime)
        for name, n in cli.items():
            assert planned.get(name, n) == n, (stage, name, planned, cli)
        if stage == 0:
            assert transferred == cli
    if art.body.pooling is not None and art.body.pooling.pools:
        record = {p.name: p.budget.num_blocks for p in art.body.pooling.pools if p.budget}
        assert record == planned == {k: v for k, v in transferred.items() if k in record}


def test_the_separate_examples_full_attention_pool() -> None:
    """The issue's numbers: 38,044 blocks, not the first pool's 5,286."""
    path = ROOT / "layouts" / "pooling-separate.kvlayout.json"
    code, out, _ = invoke(["descriptor", str(path), "--format", "json"])
    pools = {p.name: p.num_blocks for p in Descriptor.from_json(out).pools}
    assert pools == {"sliding_window_1024": 5286, "full_attention": 38044}
    code, out, _ = invoke(["transfer", str(path), str(path)])
    assert code == 0 and "full_attention 38,044" in out


# -- separate pools over pipeline stages of unequal size --------------------------------

PIPELINE = """\
kvspec: 1
name: pp-separate
model: test/pp-separate
engine:
  block_size: 16
  max_model_len: 4096
  max_num_seqs: 16
{sizing}
parallel: {{tensor: 1, pipeline: 2, pipeline_partition: [2, 6]}}
defaults: {{num_kv_heads: 4, head_size: 64, dtype: bfloat16}}
layer_types:
  sliding: {{kind: sliding_window, sliding_window: 256}}
  full: {{kind: full_attention}}
layers:
- {{repeat: 1, pattern: [sliding, full, sliding, sliding, sliding, sliding, full, sliding]}}
pooling:
  policy: separate
  serve_with: kvspec
  workload: {{context_tokens: 1000, output_tokens: 100, requests: 20}}
"""


def _pipeline(sizing: str) -> Artifact:
    return compile_source(PIPELINE.format(sizing=sizing))


def test_every_stage_of_a_separate_plan_loads_the_plans_count() -> None:
    """Stage 0 holds one sliding-window layer, stage 1 five: sized alone, stage 0 would
    afford five times the blocks, and its block ids would be out of range on stage 1."""
    import kvspec

    art = _pipeline("  memory: 1GiB")
    stages = art.body.stages
    assert stages[0].pools[0].bytes_per_block != stages[1].pools[0].bytes_per_block
    record = {p.name: p.budget.num_blocks for p in art.body.pooling.pools if p.budget}
    loaded = [kvspec.load(art, device="meta", stage=s).pool_blocks for s in (0, 1)]
    assert loaded[0] == loaded[1] == record
    for rank in (0, 1):
        d = kvspec.load(art, device="meta", stage=rank).descriptor(rank)
        assert {p.name: p.num_blocks for p in d.pools} == record


@pytest.mark.parametrize("sizing", ["  memory: 1GiB\n  num_blocks: 2000", "  num_blocks: 2000"])
def test_the_sources_num_blocks_wins_for_separate_pools(sizing: str) -> None:
    import kvspec

    art = _pipeline(sizing)
    for stage in (0, 1):
        cache = kvspec.load(art, device="meta", stage=stage)
        assert set(cache.pool_blocks.values()) == {2000}
        assert {p.num_blocks for p in cache.descriptor(stage).pools} == {2000}
    if art.body.budget is not None:
        assert {p.budget.num_blocks for p in art.body.pooling.pools} == {2000}


def test_a_block_count_too_small_for_a_separate_pool_is_refused() -> None:
    art = _pipeline("  memory: 1GiB")
    least = max(p.min_num_blocks for st in art.body.stages for p in st.pools)
    with pytest.raises(Exception, match="cannot serve one request") as info:
        art.counts_for(0, num_blocks=least - 1)
    assert info.value.expected == f"num_blocks >= {least}"


# -- bounds -----------------------------------------------------------------------------

@pytest.mark.parametrize("args,option", [
    (["descriptor", "{a}", "--num-blocks", str(10**23)], "--num-blocks"),
    (["descriptor", "{a}", "--num-blocks", str(10**23), "--as", "vllm-nixl"], "--num-blocks"),
    (["transfer", "{a}", "{a}", "--src-num-blocks", str(10**21)], "--src-num-blocks"),
    (["transfer", "{a}", "{a}", "--dst-num-blocks", str(2**62)], "--dst-num-blocks"),
])
def test_a_block_count_past_an_address_space_is_refused(args: list[str], option: str) -> None:
    a = str(ROOT / "layouts" / "llama-3.1-8b.kvlayout.json")
    code, out, err = invoke([x.format(a=a) for x in args])
    assert (code, out) == (1, "")
    assert err.startswith(f"kvspec: error: {option}: a pool of ") and \
        "more than a 64-bit address space holds" in err


def test_the_largest_addressable_count_is_described_within_64_bits() -> None:
    art = Artifact.read(ROOT / "layouts" / "llama-3.1-8b.kvlayout.json")
    per_block = art.body.stages[0].bytes_per_block
    n = (2**63 - 1) // per_block
    code, out, err = invoke(["descriptor", str(ROOT / "layouts" / "llama-3.1-8b.kvlayout.json"),
                             "--num-blocks", str(n), "--format", "json"])
    assert code == 0, err
    d = Descriptor.from_json(out)
    assert all(r.base + r.length < 2**64 for r in d.regions)
    assert all(run.offset + n * run.stride < 2**64 for g in d.groups for run in g.runs)
