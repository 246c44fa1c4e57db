"""The connector descriptor (kvspec.connectors.descriptor, .describe), its exporters'
refusals, and the ``kvspec descriptor`` / ``kvspec transfer`` commands.

A group's runs are checked against a brute force: every byte each of its layers' pages
holds in block ``b`` (heads x states x cell, from the artifact's tensors), for a few
blocks; the runs at ``b`` cover exactly those bytes, without overlap, merged."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import msgspec
import pytest

import kvspec
from kvspec.artifact import Artifact
from kvspec.artifact import format as fmt
from kvspec.artifact.blocks import allocation_blocks
from kvspec.artifact.text import file_text, sign
from kvspec.connectors.describe import Base, describe
from kvspec.connectors.descriptor import Descriptor, DescriptorError, ExportError
from kvspec.connectors.exporters import dynamo, export, vllm_nixl
from tests.conftest import ROOT, invoke
from tests.connectors.caches import compiled

LAYOUTS = sorted(p.name.removesuffix(".kvlayout.json")
                 for p in (ROOT / "layouts").glob("*.kvlayout.json"))
SCHEMA = json.loads((ROOT / "schemas" / "descriptor.schema.json").read_text())


def _art(name: str) -> Artifact:
    return Artifact.read(ROOT / "layouts" / f"{name}.kvlayout.json")


def _cells(t: fmt.Tensor, slot: int, b: int, n: int) -> list[tuple[int, int]]:
    """``(start, length)`` of every cell layer ``slot`` of tensor ``t`` holds in block ``b``
    (the allocation's block count ``n``)."""
    v = t.view
    start = fmt.at(t.offset, n) + slot * fmt.at(t.layer_stride, n) + b * fmt.at(t.block_stride, n)
    sh, sn = fmt.at(v.head_stride, n), fmt.at(v.state_stride, n)
    return [(start + h * sh + s * sn, v.cell_bytes) for h in range(v.heads)
            for s in range(v.states)]


def _union(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for start, length in sorted(spans):
        if out and start <= out[-1][0] + out[-1][1]:
            out[-1][1] = max(out[-1][1], start + length - out[-1][0])
        else:
            out.append([start, length])
    return [tuple(x) for x in out]  # type: ignore[misc]


@pytest.mark.parametrize("name", LAYOUTS)
def test_every_layout_is_described_and_its_runs_are_exact(name: str) -> None:
    art = _art(name)
    world = art.body.engine.tensor_parallel_size * len(art.body.stages)
    descs = [describe(art, rank=r) for r in range(world)]
    assert len({d.identity for d in descs}) == 1  # one digest per deployment
    for d in descs:
        jsonschema.validate(json.loads(d.to_json()), SCHEMA)
        assert Descriptor.from_json(d.to_json()) == d
    d = descs[-1]
    st = art.body.stages[d.parallel.pipeline_stage]
    n = allocation_blocks(st, {p.name: p.num_blocks for p in d.pools})
    for g in d.groups:
        total = sum(r.length for r in g.runs)
        assert total == g.bytes_per_block and total > 0
        for b in (0, 1, g.num_blocks - 1):
            want: list[tuple[int, int]] = []
            for t in st.tensors:
                if t.group == g.id:
                    alloc = next(p.allocation for p in st.pools if p.name == t.pool)
                    for slot in range(len(t.layers)):
                        want += _cells(t, slot, b, n[alloc])
            got = [(r.offset + b * r.stride, r.length) for r in g.runs]
            assert sum(length for _, length in want) == total  # no two cells overlap
            assert _union(got) == _union(want)                # the same bytes
        ends = {(r.region, r.stride, r.offset + r.length) for r in g.runs}
        assert not any((r.region, r.stride, r.offset) in ends for r in g.runs)  # merged


def test_the_identity_names_the_geometry_not_the_deployment_size() -> None:
    base = compiled("dense")
    assert describe(base, num_blocks=8).identity == describe(base, num_blocks=64).identity
    again = compiled("dense")
    assert describe(again, num_blocks=8).identity == describe(base, num_blocks=8).identity
    for other in (dict(quantization="fp8"), dict(layout="LBHNC"), dict(tensor=2),
                  dict(block=32), dict(model="other")):
        assert describe(compiled("dense", **other), num_blocks=8).identity != \
            describe(base, num_blocks=8).identity, other


def test_parallel_geometry_and_heads_of_each_rank() -> None:
    art = _art("example-pipeline-parallel")
    d = describe(art, rank=1)
    assert (d.parallel.pipeline_stage, d.parallel.world_size) == (1, 2)
    assert d.parallel.layers == art.body.stages[1].layers
    assert {x.name for x in d.layers} == set(art.body.stages[1].layers)
    gpt = [describe(_art("gpt-oss-120b"), rank=r).layers[0] for r in (0, 1)]
    assert [(x.head_start, x.heads, x.heads_total) for x in gpt] == [(0, 4, 8), (4, 4, 8)]
    mla = describe(_art("deepseek-v3"), rank=5).layers[0]
    assert (mla.head_start, mla.heads_total, mla.replicated) == (0, 1, True)
    state = describe(_art("jamba-v0.1")).layers[0]
    assert (state.kind, state.replicated, [p.shape for p in state.parts]) == (
        "mamba", False, [[3, 4096], [4096, 16]])


def test_a_drafters_own_pool_and_state_slots() -> None:
    d = describe(_art("example-glm5-next-drafter"))
    draft = next(g for g in d.groups if g.own_pool)
    pool = next(p for p in d.pools if p.name == draft.pool)
    assert (draft.pool, draft.num_blocks) == ("draft", pool.num_blocks)
    assert pool.offset == d.pools[0].num_blocks * d.pools[0].bytes_per_block
    assert all(r.offset >= pool.offset for r in draft.runs)
    assert {g.retention for g in d.groups} == {"grows_with_tokens", "bounded_window",
                                                "constant_per_request"}


def _hosted(art: Artifact) -> Artifact:
    """``art`` with its allocation in pinned host memory (kvspec plans none today)."""
    env = art.envelope
    st = env.body.stages[0]
    allocs = [msgspec.structs.replace(a, memory="host") for a in st.allocations]
    body = msgspec.structs.replace(env.body, stages=[msgspec.structs.replace(
        st, allocations=allocs)])
    unsigned = fmt.Unsigned(body=body, compiler=env.compiler, format=env.format,
                            source_sha256=env.source_sha256)
    return Artifact.from_text(file_text(sign(unsigned)))


def test_host_memory_reaches_the_exports() -> None:
    d = describe(_hosted(_art("llama-3.1-8b")))
    assert d.regions[0].memory == "host"
    assert set(vllm_nixl.agent_metadata(d)["region_mem_types"]) == {"DRAM"}
    assert dynamo.export(d)["location"] == "Pinned"


def test_a_loaded_cache_gives_real_addresses() -> None:
    art = compiled("dense", tensor=2, layout="LBHNC")
    cache = kvspec.load(art, device="cpu", num_blocks=8)
    d = cache.descriptor(rank=1)
    assert d.regions[0].base == cache.buffers["device"].data_ptr()
    assert d == describe(art, rank=1, num_blocks=8, bases={"device": Base(
        cache.buffers["device"].data_ptr(), "cpu", 0)})
    for x in d.layers:
        view = cache.views[x.name]
        assert view.data_ptr() == d.regions[0].base + x.offset
        item = view.element_size()
        assert tuple(s * item for s in view.stride()[:3]) == (
            x.block_stride, x.head_stride, x.state_stride)
    assert cache.descriptor().parallel.rank == 0
    with pytest.raises(DescriptorError, match="rank 2 is on pipeline stage 1"):
        kvspec.load(compiled("dense", tensor=2, pipeline=2), device="cpu",
                    num_blocks=8).descriptor(rank=2)


@pytest.mark.parametrize("kw, message", [
    (dict(rank=2), "the deployment has 2 rank.s. .tensor 2 x pipeline 1., not rank 2"),
    (dict(num_blocks=3), "3 blocks cannot serve one request"),
])
def test_bad_ranks_and_block_counts_are_refused(kw: dict, message: str) -> None:
    with pytest.raises(DescriptorError, match=message) as err:
        describe(compiled("dense", tensor=2), **kw)
    assert err.value.hint


@pytest.mark.parametrize("name, message", [
    ("gpt-oss-120b", "it has 2 groups"),
    ("jamba-v0.1", "it has 8 groups"),
    ("example-mixed-precision", "it has 4 groups"),
    ("qwen3-next-80b-a3b-thinking", "it has 4 groups"),
])
def test_dynamo_refuses_what_kvbm_cannot_express(name: str, message: str) -> None:
    with pytest.raises(ExportError, match=message) as err:
        export(describe(_art(name)), "dynamo")
    assert err.value.path and err.value.hint


@pytest.mark.parametrize("kw, field", [
    (dict(block=48), "groups[0].block_size"), (dict(layout="LHBNC"), "axis_order"),
])
def test_dynamo_names_the_field(kw: dict, field: str) -> None:
    with pytest.raises(ExportError) as err:
        export(describe(compiled("dense", **kw), num_blocks=8), "dynamo")
    assert err.value.path == field


@pytest.mark.parametrize("layout, kind, blocks", [("LBNHC", "LayerSeparate", 4),
                                                  ("BLHNC", "FullyContiguous", 1)])
def test_dynamo_layouts(layout: str, kind: str, blocks: int) -> None:
    d = describe(compiled("dense", layout=layout), num_blocks=8)
    out = export(d, "dynamo")
    assert list(out["layout_type_details"]) == [kind]
    assert len(out["memory_descriptors"]) == blocks
    cfg = out["layout_config"]
    per_block = cfg["num_layers"] * cfg["outer_dim"] * cfg["page_size"] * cfg["inner_dim"] * \
        cfg["dtype_width_bytes"]
    assert per_block == d.groups[0].bytes_per_block  # KVBM's bytes_per_block()


# -- the commands ------------------------------------------------------------------------

def test_descriptor_command(tmp_path: Path) -> None:
    art = ROOT / "layouts" / "gpt-oss-120b.kvlayout.json"
    code, out, err = invoke(["descriptor", str(art), "--rank", "1"])
    assert (code, err) == (0, "")
    assert out.splitlines()[0] == ("gpt-oss-120b: rank 1 of 2 (tensor 1 of 2, stage 0 of 1), "
                                   "LBNHC, kv_cache_dtype auto")
    code, out, _ = invoke(["descriptor", str(art), "--format", "json", "--num-blocks", "9300"])
    assert code == 0 and Descriptor.from_json(out).pools[0].num_blocks == 9300
    code, out, _ = invoke(["descriptor", str(art), "--as", "vllm-nixl"])
    assert code == 0 and json.loads(out)["kv_cache_layout"] == "LBNHC"
    code, out, err = invoke(["descriptor", str(art), "--as", "dynamo"])
    assert (code, out) == (1, "") and "it has 2 groups" in err
    code, _, err = invoke(["descriptor", str(art), "--rank", "2"])
    assert code == 1 and "--rank 2: the deployment has 2 ranks" in err
    code, out, err = invoke(["descriptor", str(art), "--as", "dynamo", "--format", "json"])
    assert (code, err) == (1, "") and json.loads(out)["errors"][0]["path"] == "groups"
    code, out, err = invoke(["descriptor", str(art), "-o", str(tmp_path / "d.json")])
    assert (code, out, err) == (0, "", f"wrote {tmp_path / 'd.json'}\n")


def test_transfer_command(tmp_path: Path) -> None:
    src, dst = tmp_path / "p.kvlayout.json", tmp_path / "d.kvlayout.json"
    compiled("dense", tensor=2).write(src)
    compiled("dense", layout="LBHNC").write(dst)
    plan = tmp_path / "plan.json"
    code, out, err = invoke(["transfer", str(src), str(dst), "-o", str(plan)])
    assert code == 0 and err == f"wrote {plan}\n"
    assert out.splitlines()[2] == ("re-mappable: tensor_parallel_size 2 -> 1, axis_order "
                                   "LBNHC -> LBHNC")
    code, out, _ = invoke(["transfer", str(src), str(dst), "--format", "json"])
    data = json.loads(out)
    assert code == 0 and data["verdict"] == "re-mappable"
    assert json.loads(plan.read_text()) == data["plan"]
    llama = ROOT / "layouts" / "llama-3.1-8b.kvlayout.json"
    code, out, err = invoke(["transfer", str(src), str(llama), "--format", "json"])
    assert (code, err) == (1, "")
    assert json.loads(out)["ok"] is False
    code, out, err = invoke(["transfer", str(src), str(llama)])
    assert (code, out) == (1, "")
    assert err.startswith(f"{llama}:") and "is missing from" in err
