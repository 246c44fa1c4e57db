"""Run by LMCache 0.5.6's Python (not kvspec's): read a ``--as lmcache`` export on stdin,
build the per-layer tensors it describes (views of one buffer per region, with the
export's shapes, element strides and offsets), let LMCache detect their formats and
group them into kernel groups with the export's ``EngineGroupInfo`` list (LMCache
refuses infos that do not match its own grouping), and print what LMCache derived as
JSON. Imports nothing of kvspec."""

from __future__ import annotations

import json
import sys
from typing import Any


def _tensors(export: dict, sizes: list[int]) -> list[Any]:
    import torch  # in LMCache's environment only (pytest collects this module for doctests)

    bufs = [torch.empty(size, dtype=torch.uint8) for size in sizes]  # one per region
    return [torch.as_strided(bufs[layer["region"]].view(getattr(torch, layer["dtype"])),
                             layer["shape"], layer["stride"], layer["offset"])
            for layer in export["layers"]]


def probe(request: dict) -> dict:
    """What LMCache derives from one export's tensors."""
    # in LMCache's environment only (pytest collects this module for its doctests)
    from lmcache.utils import EngineType
    from lmcache.v1.distributed.api import AttnWindowDesc
    from lmcache.v1.gpu_connector.utils import normalize_and_discover_per_layer_formats
    from lmcache.v1.kv_layer_groups import KVLayerGroupsManager
    from lmcache.v1.multiprocess.group_view import EngineGroupInfo

    export = request["export"]
    kv = _tensors(export, request["region_bytes"])  # (NB, ...) views, as vLLM hands them
    groups: dict[int, list[int]] = {}
    for layer in export["layers"]:
        groups.setdefault(layer["group"], []).append(layer["index"])
    normalized, formats = normalize_and_discover_per_layer_formats(
        kv, list(groups.values()), EngineType.VLLM, export["layout_hints"])
    infos = [EngineGroupInfo(engine_group_id=g["engine_group_id"],
                             layer_indices=tuple(g["layer_indices"]),
                             tokens_per_block=g["tokens_per_block"],
                             sw_size_tokens=g["sw_size_tokens"],
                             extra_object_group_tag=g["extra_object_group_tag"],
                             recurrent_state=g["recurrent_state"])
             for g in export["engine_group_infos"]]
    manager = KVLayerGroupsManager(normalized, formats, engine_group_infos=infos,
                                   lmcache_tokens_per_chunk=export["chunk_size"],
                                   separate_object_groups=True)
    window = manager.get_attn_desc()
    ours = AttnWindowDesc(num_chunks_in_sw=export["attn_window"]["num_chunks_in_sw"],
                          world_size=export["attn_window"]["world_size"],
                          group_kinds=tuple(export["attn_window"]["group_kinds"]))
    return {
        "formats": [f.name for f in formats],
        "kernel_groups": [{
            "layer_indices": list(g.layer_indices), "engine_kv_format": g.engine_kv_format.name,
            "dtype": str(g.dtype).removeprefix("torch."), "engine_group_id": g.engine_group_idx,
            "tokens_per_block": g.tokens_per_block, "sw_size_tokens": g.sw_size_tokens,
            "shape_desc": {k: getattr(g.shape_desc, k) for k in (
                "kv_size", "nl", "nb", "bs", "nh", "hs", "element_size",
                "block_stride_elems")}} for g in manager.kernel_groups],
        "attn_window": {"num_chunks_in_sw": window.num_chunks_in_sw,
                        "group_kinds": list(window.group_kinds)},
        "ours_valid": ours.num_object_groups,
    }


def main() -> None:
    """stdin: ``{name: request}``; stdout, last line: ``{name: result or error}``."""
    out = {}
    for name, request in json.load(sys.stdin).items():
        try:
            out[name] = probe(request)
        except Exception as exc:  # noqa: BLE001 - reported to the test, which shows it
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
