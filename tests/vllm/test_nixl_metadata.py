"""``kvspec descriptor --as vllm-nixl`` against vLLM 0.33.0's own NIXL connector classes:
the export builds the real ``NixlAgentMetadata`` and survives vLLM's msgpack round
trip; its regions are in vLLM's region order; each attention region's block length is
the page size vLLM's own spec computes; and the descriptors per block kvspec reports
for vLLM are what vLLM's ``_compute_desc_ids`` computes from those regions."""

from __future__ import annotations

import dataclasses

import msgspec
import numpy as np
import pytest

from kvspec.artifact import Artifact
from kvspec.connectors.describe import describe
from kvspec.connectors.exporters import vllm_nixl
from kvspec.model import kinds
from tests.connectors.caches import compiled

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

LAYOUTS = ["llama-3.1-8b", "gpt-oss-120b", "gemma-3-27b-it", "jamba-v0.1", "deepseek-v3",
           "example-packed-blhnc", "nemotron-h-56b-base-8k",
           "qwen3-next-80b-a3b-thinking"]


def _nixl():
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_worker, metadata

    return base_worker, metadata


def _descriptors():
    for name in LAYOUTS:
        yield name, describe(Artifact.read(f"layouts/{name}.kvlayout.json"))
    for layout in ("LBHNC", "BLHNC", "LHBNC"):
        yield f"dense-{layout}", describe(compiled("dense", layout=layout), num_blocks=8)


@pytest.mark.parametrize("name, desc", list(_descriptors()), ids=lambda v: v
                         if isinstance(v, str) else "")
def test_the_export_is_vllms_metadata(name: str, desc) -> None:
    base_worker, metadata = _nixl()
    cls = metadata.NixlAgentMetadata
    assert tuple(f.name for f in dataclasses.fields(cls)) == vllm_nixl.FIELDS
    meta = cls(**vllm_nixl.agent_metadata(desc, engine_id="e", agent=b"agent",
                                          attn_backend_name="FLASH_ATTN"))
    raw = msgspec.msgpack.Encoder().encode(meta)  # what vLLM sends its peers
    back = msgspec.msgpack.Decoder(cls).decode(raw)
    assert dataclasses.asdict(back) == {**dataclasses.asdict(meta), "ssm_sizes": meta.ssm_sizes}
    names = meta.region_names
    assert names == sorted(names, key=base_worker._region_sort_key)
    assert len(meta.kv_caches_base_addr) == len(meta.block_lens) == len(meta.block_strides) \
        == len(meta.region_group_ids) == len(meta.region_num_blocks)
    assert meta.kv_cache_layout == desc.axis_order


def _page_of(art: Artifact, layer: str) -> int:
    """vLLM's ``page_size_bytes`` of ``layer``'s spec, from vLLM's own class."""
    from kvspec.integrations.vllm.specs import to_vllm
    from kvspec.integrations.vllm.v0_33.specs import materialize

    record = art.body.specs[art.body.layers[layer].spec]
    spec = kinds.spec_from_dict(msgspec.to_builtins(record))
    return materialize(to_vllm(spec)).page_size_bytes


@pytest.mark.parametrize("name", ["llama-3.1-8b", "gpt-oss-120b", "deepseek-v3",
                                  "example-packed-blhnc"])
def test_block_lens_are_vllms_page_sizes(name: str) -> None:
    art = Artifact.read(f"layouts/{name}.kvlayout.json")
    meta = vllm_nixl.agent_metadata(describe(art))
    for layer, block_len in zip(meta["region_names"], meta["block_lens"], strict=True):
        assert block_len == _page_of(art, layer), layer


def test_padded_pages_in_one_allocation_are_refused() -> None:
    """fp8 sliding-window pages padded to the bf16 page: vLLM's registration splits a
    view that is not block-major into segments of ``num_blocks * block_stride`` bytes,
    which a padded page's view (its unpadded bytes) does not fill (its assertion, l. 1655)."""
    desc = describe(Artifact.read("layouts/example-mixed-precision.kvlayout.json"))
    with pytest.raises(ValueError, match="cannot partition this cache"):
        vllm_nixl.agent_metadata(desc)


def _worker(meta: dict, desc):
    """A bare vLLM NIXL worker holding just what ``_compute_desc_ids`` reads."""
    from vllm.distributed.kv_transfer.kv_connector.v1.ssm_conv_transfer_utils import (
        MambaConvSplitInfo,
    )
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    base_worker, _ = _nixl()
    w = object.__new__(base_worker.NixlBaseConnectorWorker)
    states = [x for x in desc.layers if kinds.by_name(x.kind).state]
    w._has_mamba = bool(states)
    w._transfer_layer_group_ids = ()
    w.num_regions = len(meta["block_lens"])
    w.block_len_per_layer = meta["block_lens"]
    w.region_group_ids = meta["region_group_ids"]
    w._uses_region_group_mapping = len(set(meta["region_group_ids"])) > 1
    w._scratch_region_indices = []
    w._ple_group_index = None
    w._group_spec_types = [MambaSpec if g.kind == "mamba" else FullAttentionSpec
                           for g in desc.groups]
    if states:
        mine = {x.name for x in states}
        w._ssm_region_indices = [i for i, members in enumerate(_members(meta, desc))
                                 if members & mine]
        projections = 1 if states[0].state_type == "MAMBA1" else 3
        w._conv_decomp = MambaConvSplitInfo(conv_rows=3, local_proj_dims=(1,) * projections,
                                            conv_dtype_size=2, ssm_sizes=(0, 0))
    return w


def _members(meta: dict, desc) -> list[set[str]]:
    found, _ = vllm_nixl.regions(desc)
    return [set(r.members) for r in found]


@pytest.mark.parametrize("name", ["llama-3.1-8b", "gpt-oss-120b", "gemma-3-27b-it",
                                  "jamba-v0.1", "nemotron-h-56b-base-8k",
                                  "qwen3-next-80b-a3b-thinking", "example-packed-blhnc"])
def test_descriptor_counts_are_vllms(name: str) -> None:
    desc = describe(Artifact.read(f"layouts/{name}.kvlayout.json"))
    meta = vllm_nixl.agent_metadata(desc)
    w = _worker(meta, desc)
    for g in desc.groups:
        block_ids = [[] for _ in desc.groups]
        block_ids[g.id] = [1]
        ids = w._compute_desc_ids(block_ids, meta["num_blocks"], None, 1,
                                  meta["region_num_blocks"], meta["region_group_ids"],
                                  w._uses_region_group_mapping)
        assert len(np.asarray(ids)) == vllm_nixl.descriptors_per_block(desc, g.id), g.id
