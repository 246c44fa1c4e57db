"""The runtime loader: artifacts -> pools + per-layer views (CPU and meta).

Every conformance case is imported (``kvspec import``'s ``dump_to_yaml``),
compiled, and loaded:

* on ``meta`` at the reference's block count, each view's shape, stride,
  storage offset and dtype equal the reference's ``create_kv_cache_views``
  (``expected/NAME.json`` ``views``; one list per worker for pipeline cases);
* on CPU, with the case shrunk to a short ``max_model_len`` so a few blocks
  serve a request, a distinct byte pattern written through every view lands
  at exactly the bytes the artifact's tensors declare (offset + slot * layer
  stride + block * block stride + the page's own strides), and nowhere else;
  no two layers of one group (and no drafter region) share a byte.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import re
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the runtime tests need torch "
                            "(pip install -e '.[runtime]')")

from kvspec.artifact import Artifact  # noqa: E402
from kvspec.compiler import compile, compile_source  # noqa: E402
from kvspec.errors import ArtifactError, KvspecError, PlanError  # noqa: E402
from kvspec.integrations.dump.importer import dump_to_yaml  # noqa: E402
from kvspec.model.affine import Affine  # noqa: E402
from kvspec.model.kinds import spec_from_dict  # noqa: E402
from kvspec.passes.freeze import frozen as freeze  # noqa: E402
from kvspec.runtime import budget as budget_module  # noqa: E402
from kvspec.runtime.loader import LoadError, load  # noqa: E402
from kvspec.runtime.views import LayoutMismatch  # noqa: E402
from tests.conformance.harness import case_names  # noqa: E402
from tests.conformance.harness import load as load_case  # noqa: E402
from tests.conftest import signature_of  # noqa: E402

DATA = Path(__file__).parent / "data" / "runtime"
CASES = case_names()
OK_CASES = [n for n in CASES if load_case(n)[1]["ok"]]
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


# ---------------------------------------------------------------------------
# artifacts of the conformance cases
# ---------------------------------------------------------------------------


def shrink(case: dict[str, Any]) -> dict[str, Any]:
    """The case at a max_model_len of four blocks, so a handful of blocks
    serves one request and the pools fit in a test's memory."""
    small = copy.deepcopy(case)
    cfg = small["config"]
    cfg["max_model_len"] = 4 * cfg["block_size"]
    cfg.pop("original_max_model_len", None)
    cfg["max_num_batched_tokens"] = 4 * cfg["block_size"]
    cfg["max_num_seqs"] = 2
    cfg["num_gpu_blocks_override"] = None
    return small


@functools.cache
def case_artifact(name: str, small: bool = False) -> Artifact:
    """A conformance case imported as a source and compiled."""
    case, _ = load_case(name)
    if small:
        case = shrink(case)
    return compile_source(dump_to_yaml(case), f"{name}.yaml")


@functools.cache
def data_artifact(name: str) -> Artifact:
    return compile(DATA / f"{name}.yaml")


def with_layout(name: str, layout: str) -> Artifact:
    text = (DATA / f"{name}.yaml").read_text().replace("layout: LBNHC", f"layout: {layout}")
    return compile_source(text, f"{name}-{layout}.yaml")


# ---------------------------------------------------------------------------
# an independent oracle: the bytes a tensor declares for one layer
# ---------------------------------------------------------------------------


def declared_addresses(art: Artifact, stage: int, tensor_index: int, slot: int,
                       num_blocks: int, kernel_block_size: int | None = None) -> torch.Tensor:
    """``(B, H, N, C_bytes)`` byte addresses of one layer, from the tensor's
    fields alone: L and B strides as declared, every other axis spanning
    everything physically inside it (the layout names axes outermost first)."""
    body = art.data["body"]
    st = body["stages"][stage]
    t = st["tensors"][tensor_index]
    group = body["specs"][body["groups"][t["group"]]["spec"]]  # the spec the group plans with
    spec = spec_from_dict(group["kv_cache_specs"][t["layers"][0]]
                          if group["kind"] == "uniform_type" else group)
    at = lambda key: Affine.from_json(t[key]).at(num_blocks)  # noqa: E731
    blocks = st["draft_num_blocks"] if t["pool"] == "draft" else num_blocks
    kernel = kernel_block_size or spec.block_size
    ratio = spec.block_size // kernel
    size = {"L": len(t["layers"]), "B": blocks * ratio, "H": spec.num_heads,
            "N": spec.kernel_states(kernel), "C": spec.state_content_size_bytes}
    stride = {"L": at("layer_stride"), "B": at("block_stride") // ratio}
    span = 1
    for axis in reversed(body["engine"]["axis_order"]):
        if axis not in stride:
            stride[axis] = span
        span = stride[axis] * size[axis]
    idx = {a: torch.arange(size[a], dtype=torch.int64) * stride[a] for a in "BHNC"}
    return (at("offset") + slot * stride["L"] + idx["B"][:, None, None, None]
            + idx["H"][None, :, None, None] + idx["N"][None, None, :, None]
            + idx["C"][None, None, None, :])


def allocation(cache, name: str) -> torch.Tensor:
    pool = cache.metadata[name].pool
    return cache.buffers["host" if pool == "host" else "device"]


def byte_pattern(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Odd (so nonzero) bytes that differ along every axis and with ``seed``."""
    out = torch.full(shape, seed, dtype=torch.uint8)
    for axis, (n, k) in enumerate(zip(shape, (7, 13, 29, 3))):
        step = (torch.arange(n, dtype=torch.int64) * k % 256).to(torch.uint8)
        out += step.reshape([n if a == axis else 1 for a in range(len(shape))])
    return out | 1


def write_and_find(cache, name: str, addresses: torch.Tensor, seed: int) -> None:
    """Write a pattern through ``name``'s view; find it at ``addresses`` only."""
    buf = allocation(cache, name).view(torch.uint8)
    buf.zero_()
    view_bytes = cache.views[name].view(torch.uint8)  # (B, H, N, C bytes)
    assert tuple(view_bytes.shape) == tuple(addresses.shape), name
    pattern = byte_pattern(tuple(view_bytes.shape), seed)
    view_bytes.copy_(pattern)
    assert int(addresses.max()) < buf.numel() and int(addresses.min()) >= 0
    assert torch.equal(buf[addresses.reshape(-1)], pattern.reshape(-1)), name
    assert int(torch.count_nonzero(buf)) == pattern.numel(), f"{name} wrote outside its bytes"


def cell_intervals(addresses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[start, end) of every (b, h, n) cell: C is one contiguous run of bytes."""
    starts = addresses[..., 0].reshape(-1)
    return starts, starts + addresses.shape[-1]


def assert_disjoint(label: str, parts: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    if len(parts) < 2:
        return
    starts = torch.cat([s for s, _ in parts])
    ends = torch.cat([e for _, e in parts])
    order = torch.argsort(starts)
    starts, ends = starts[order], ends[order]
    assert bool((ends[:-1] <= starts[1:]).all()), f"{label}: two layers share bytes"


# ---------------------------------------------------------------------------
# conformance: views equal the reference's
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", OK_CASES)
def test_views_match_reference_on_meta(name: str) -> None:
    _, expected = load_case(name)
    art = case_artifact(name)
    views = expected["views"]
    per_worker = views if views and isinstance(views[0], list) else [views]
    assert len(per_worker) == len(art.data["body"]["stages"])
    for stage, worker_views in enumerate(per_worker):
        cache = load(art, device="meta", num_blocks=expected["num_blocks"], stage=stage)
        assert cache.device.type == "meta" and cache.nbytes == 0
        want_layers = set()
        for tv in worker_views:
            for lv in tv["layers"]:
                want_layers.add(lv["layer"])
                v = cache.views[lv["layer"]]
                got = (list(v.shape), list(v.stride()), v.storage_offset(),
                       str(v.dtype).removeprefix("torch."))
                want = (lv["shape"], lv["stride"], lv["storage_offset"], lv["dtype"])
                assert got == want, lv["layer"]
                meta = cache.metadata[lv["layer"]]
                assert (list(meta.shape), list(meta.stride), meta.storage_offset) == \
                    (lv["shape"], lv["stride"], lv["storage_offset"])
                assert v.untyped_storage().nbytes() == \
                    allocation(cache, lv["layer"]).untyped_storage().nbytes()
        assert set(cache.views) == want_layers == set(art.data["body"]["stages"][stage]["layers"])


@pytest.mark.parametrize("name", OK_CASES)
def test_every_case_loads_on_cpu_with_its_declared_bytes(name: str) -> None:
    art = case_artifact(name, small=True)
    group_of = {n: g["id"] for g in art.data["body"]["groups"] for n in g["layers"]}
    for stage in range(len(art.data["body"]["stages"])):
        num_blocks = art.data["body"]["stages"][stage]["min_num_blocks"] + 1
        cache = load(art, device="cpu", num_blocks=num_blocks, stage=stage, zero=True)
        assert cache.num_blocks == num_blocks and cache.zeroed
        assert sum(1 for k in cache.buffers if k not in ("draft", "scales")) == \
            len(art.data["body"]["stages"][stage]["allocations"])
        by_group: dict[int, list] = {}
        draft, main = [], []
        for ti, t in enumerate(art.data["body"]["stages"][stage]["tensors"]):
            for slot, layer in enumerate(t["layers"]):
                addresses = declared_addresses(art, stage, ti, slot, num_blocks)
                write_and_find(cache, layer, addresses, seed=len(by_group) * 7 + slot)
                part = cell_intervals(addresses)
                by_group.setdefault(group_of[layer], []).append(part)
                (draft if t["pool"] == "draft" else main).append(part)
        for gid, parts in by_group.items():
            assert_disjoint(f"{name} stage {stage} group {gid}", parts)
        if draft:
            d_start = min(int(s.min()) for s, _ in draft)
            assert all(int(e.max()) <= d_start for _, e in main), "main pool in draft region"
            assert cache.buffers["draft"].data_ptr() == \
                cache.buffers["device"].data_ptr() + d_start
            assert_disjoint(f"{name} draft region", draft)


@pytest.mark.parametrize("name", OK_CASES)
def test_each_view_is_the_int8_view_reinterpreted(name: str) -> None:
    """A view made in elements of the pool seen in its dtype (one as_strided) is
    the one as_strided over the int8 pool and ``.view(dtype)`` make: dtype, shape,
    strides, offset and first byte, in every case (fp8 and int8 views take the
    latter path)."""
    art = case_artifact(name, small=True)
    cache = load(art, device="cpu", num_blocks=art.min_num_blocks() + 1)
    for layer, view in cache.views.items():
        meta = cache.metadata[layer]
        item = view.element_size()
        pool = allocation(cache, layer)  # a drafter's views too: offsets in the device pool
        ref = torch.as_strided(pool, (*meta.shape[:3], meta.shape[3] * item),
                               meta.byte_stride, pool.storage_offset() + meta.byte_offset
                               ).view(view.dtype)
        assert (view.dtype, view.shape, view.stride(), view.storage_offset(),
                view.data_ptr()) == (ref.dtype, ref.shape, ref.stride(),
                                     ref.storage_offset(), ref.data_ptr()), layer
        assert pool.untyped_storage().data_ptr() == view.untyped_storage().data_ptr()


def test_aliasing_is_across_groups_only() -> None:
    """Slot i of every group shares bytes (gemma-2: sliding + full groups)."""
    art = case_artifact("gemma-2-9b-tp1", small=True)
    cache = load(art, device="cpu", num_blocks=art.min_num_blocks(), zero=True)
    t0, t1 = art.data["body"]["stages"][0]["tensors"][:2]
    a, b = t0["layers"][0], t1["layers"][0]
    assert cache.metadata[a].group != cache.metadata[b].group
    cache.views[a].fill_(1.5)
    assert bool((cache.views[b] == 1.5).all())


# ---------------------------------------------------------------------------
# sizing and refusal
# ---------------------------------------------------------------------------


def test_too_few_blocks_is_refused_with_the_numbers() -> None:
    art = data_artifact("tiny")
    need = art.min_num_blocks()
    with pytest.raises(PlanError) as info:
        load(art, device="meta", num_blocks=need - 1)
    err = info.value
    assert "cannot serve one request at max_model_len 256" in err.message
    assert err.expected == f"num_blocks >= {need}" and err.found == str(need - 1)
    assert load(art, device="meta", num_blocks=need).num_blocks == need


def test_too_little_memory_is_refused() -> None:
    art = data_artifact("tiny")
    per_block = art.data["body"]["stages"][0]["bytes_per_block"]
    with pytest.raises(PlanError, match="cannot serve one request"):
        load(art, device="meta", memory=per_block * 3)
    cache = load(art, device="meta", memory=per_block * 40 + 5)
    assert cache.num_blocks == 40
    assert load(art, device="meta", memory=f"{per_block * 40 // 1024}KiB").num_blocks == 40


def test_memory_fraction(monkeypatch: pytest.MonkeyPatch) -> None:
    art = data_artifact("tiny")
    per_block = art.data["body"]["stages"][0]["bytes_per_block"]
    monkeypatch.setattr(budget_module, "free_memory", lambda device: per_block * 100)
    assert load(art, device="cpu", memory_fraction=0.5).num_blocks == 50
    monkeypatch.undo()
    with pytest.raises(LoadError, match="memory_fraction needs a device with memory"):
        load(art, device="meta", memory_fraction=0.5)
    with pytest.raises(LoadError, match=r"must be in \(0, 1\]"):
        load(art, device="meta", memory_fraction=1.5)


def test_sizing_arguments_conflict_or_are_missing() -> None:
    art = data_artifact("tiny")
    with pytest.raises(LoadError, match="give one of num_blocks, memory and memory_fraction"):
        load(art, device="meta", num_blocks=20, memory=10**9)
    with pytest.raises(LoadError, match="no memory budget of its own"):
        load(art, device="meta")
    with pytest.raises(LoadError, match="positive integer"):
        load(art, device="meta", num_blocks=0)


_BAD_ARGS = [
    ({"num_blocks": 20, "memory": 10**9}, "give one of num_blocks, memory and memory_fraction"),
    ({"num_blocks": 0}, "num_blocks must be a positive integer"),
    ({"num_blocks": 2.5}, "num_blocks must be a positive integer"),
    ({"memory_fraction": float("nan")}, "memory_fraction must be in (0, 1]"),
    ({"device": None, "num_blocks": 40}, "not a torch device: None"),
    ({"device": "tpu", "num_blocks": 40}, "not a torch device: 'tpu'"),
    ({"stage": 1, "num_blocks": 40}, "the artifact has 1 pipeline stage(s), not stage 1"),
    ({"stage": True, "num_blocks": 40}, "the artifact has 1 pipeline stage(s), not stage True"),
    ({"kernel_block_size": "16", "num_blocks": 40}, ("kernel_block_size must be a positive "
      "integer")),
    ({"kernel_block_size": {0: 1.5}, "num_blocks": 40}, ("kernel_block_size must be a positive "
      "integer")),
    ({"kernel_block_size": {0: "x"}, "num_blocks": 40}, ("kernel_block_size must be a positive "
      "integer")),
    ({"kernel_block_size": {7: 16}, "num_blocks": 40}, ("kernel_block_size names unknown "
      "group(s) [7]")),
    ({"kernel_block_size": 3, "num_blocks": 40}, ("kernel block size 3 must divide the KV cache "
      "block size 16")),
    ({"num_blocks": 10**30}, ("a pool of 1,000,000,000,000,000,000,000,000,000,000 blocks would "
      "be")),
]


@pytest.mark.parametrize("kwargs,message", _BAD_ARGS, ids=[m[:40] for _, m in _BAD_ARGS])
def test_every_bad_argument_is_a_clear_error_with_a_hint(kwargs: dict, message: str) -> None:
    kwargs = {"device": "meta", **kwargs}
    with pytest.raises(KvspecError) as info:
        load(data_artifact("tiny"), **kwargs)
    assert message in info.value.message and info.value.hint, info.value.render()


def test_a_device_this_torch_cannot_allocate_on_is_a_load_error() -> None:
    # torch knows the device type, but this build has no backend for it
    with pytest.raises(LoadError) as info:
        load(data_artifact("tiny"), device="xla", num_blocks=40)
    assert info.value.message.startswith("cannot allocate ") and " bytes on xla" in \
        info.value.message
    assert info.value.found == "40 blocks" and info.value.hint


def test_the_artifacts_own_budget_is_the_default() -> None:
    art = compile("layouts/llama-3.1-8b.yaml")
    assert load(art, device="meta").num_blocks == art.data["body"]["budget"]["num_blocks"] == 20480
    override = case_artifact("syn-override")
    assert load(override, device="meta").num_blocks == 4096
    # the source's num_blocks override wins over a budget, as in the reference
    assert load(override, device="meta", memory=10**12).num_blocks == 4096


# ---------------------------------------------------------------------------
# verification
# ---------------------------------------------------------------------------


def test_tampered_artifacts_are_refused(tmp_path: Path) -> None:
    art = data_artifact("tiny")
    data = json.loads(art.text())
    data["body"]["stages"][0]["tensors"][0]["offset"] = 64
    with pytest.raises(ArtifactError, match="does not match its sha256"):
        load(data, device="meta", num_blocks=32)
    path = tmp_path / "tiny.kvlayout.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ArtifactError) as info:
        load(path, device="meta", num_blocks=32)
    assert info.value.file == str(path)
    # an edit with the hash recomputed is refused too: its views overlap
    data["sha256"] = signature_of(data)
    with pytest.raises(ArtifactError, match="structure is unsound") as info:
        load(data, device="meta", num_blocks=32)
    assert info.value.path.startswith("body.stages[0].tensors[")
    # ... and, re-planned, it is not what kvspec plans
    with pytest.raises(ArtifactError, match=r"structure is unsound|not what kvspec plans"):
        load(data, device="meta", num_blocks=32, replan=True)
    # the data of a checked Artifact is not what the loader reads: editing it changes nothing
    edited = Artifact.from_text(art.text())
    edited.data["body"]["engine"]["max_model_len"] = 16
    cache = load(edited, device="meta", num_blocks=32)
    assert cache.artifact.body.engine.max_model_len == art.body.engine.max_model_len
    data["format"] = "kvspec.layout/99"
    with pytest.raises(ArtifactError, match=re.escape("this artifact is format kvspec.layout/99")):
        load(data, device="meta", num_blocks=32)


def test_replan_proves_an_artifact_at_load() -> None:
    """``replan=True``: the artifact proved exactly what this compiler plans (a
    checked edit of an input the structure cannot judge, caught)."""
    art = data_artifact("tiny")
    assert load(json.loads(art.text()), device="meta", num_blocks=32,
                replan=True).artifact.sha256 == art.sha256
    data = json.loads(art.text())
    data["body"]["engine"]["block_size"] *= 2  # sound, but not what the plan says
    data["sha256"] = signature_of(data)
    assert load(data, device="meta", num_blocks=32).num_blocks == 32
    with pytest.raises(ArtifactError, match="not what kvspec plans"):
        load(data, device="meta", num_blocks=32, replan=True)


def test_loads_from_a_path_and_a_dict(tmp_path: Path) -> None:
    art = data_artifact("tiny")
    path = tmp_path / "tiny.kvlayout.json"
    art.write(path)
    a = load(path, device="meta", num_blocks=20)
    b = load(json.loads(art.text()), device="meta", num_blocks=20)
    assert a.artifact.sha256 == b.artifact.sha256 == art.sha256
    with pytest.raises(LoadError, match="cannot load a int"):
        load(3, device="meta", num_blocks=20)  # type: ignore[arg-type]
    source = DATA / "tiny.yaml"
    with pytest.raises(ArtifactError, match="this is a layout source, not an artifact"):
        load(source, device="meta", num_blocks=20)


def _edited(art: Artifact, stage: int, tensor: int, **changes: Any) -> Artifact:
    """``art`` with one tensor of its IR changed (what no compiler writes): for
    testing the loader's own checks and paths the compiler never takes."""
    layout = art.layout
    st = layout.stage(stage)
    tensors = list(st.tensors)
    tensors[tensor] = dataclasses.replace(tensors[tensor], **changes)
    stages = list(layout.stages)
    stages[stage] = dataclasses.replace(st, tensors=tuple(tensors))
    edited = dataclasses.replace(layout, plan=dataclasses.replace(layout.plan,
                                                                  stages=tuple(stages)))
    return freeze(edited, "edited")


def test_inconsistent_geometry_is_refused() -> None:
    """A view that leaves its pool is refused by the loader itself."""
    art = data_artifact("tiny")
    bad = _edited(art, 0, 0, offset=Affine(1, 0))
    with pytest.raises(ArtifactError, match="outside pool"):
        load(bad, device="meta", num_blocks=20)


def test_unknown_devices_and_stages() -> None:
    art = data_artifact("tiny")
    with pytest.raises(LoadError, match="not a torch device"):
        load(art, device="potato", num_blocks=20)
    with pytest.raises(LoadError, match="1 pipeline stage"):
        load(art, device="meta", num_blocks=20, stage=1)
    if not torch.cuda.is_available():
        with pytest.raises(LoadError, match="sees no CUDA device"):
            load(art, device="cuda", num_blocks=20)


# ---------------------------------------------------------------------------
# views: metadata, K/V, NHD/HND, kernel blocks
# ---------------------------------------------------------------------------


def test_metadata_and_kv_split() -> None:
    art = data_artifact("kernel32")
    cache = load(art, device="cpu", num_blocks=10)
    name = "model.layers.1.self_attn.attn"
    meta = cache.metadata[name]
    assert (meta.group, meta.kind, meta.block_size, meta.kernel_block_size, meta.pool) == \
        (0, "full_attention", 32, 32, "device")
    assert (meta.head_size, meta.head_size_v, meta.dtype, meta.slot) == (96, 64, "float16", 1)
    view = cache.views[name]
    assert tuple(view.shape) == (10, 2, 32, 160)  # (B, H, N, K||V)
    k, v = cache.kv[name]
    assert tuple(k.shape) == (10, 2, 32, 96) and tuple(v.shape) == (10, 2, 32, 64)
    assert k.stride() == v.stride() == view.stride()
    assert v.storage_offset() == view.storage_offset() + 96
    assert k.data_ptr() == view.data_ptr()  # no copy
    k.fill_(1.0)
    v.fill_(2.0)
    assert bool((view[..., :96] == 1).all()) and bool((view[..., 96:] == 2).all())
    assert set(cache.kv) == set(cache.views) and len(cache.kv) == 3
    assert cache.kv[name] is cache.kv[name]


def test_kv_split_is_absent_where_cells_are_not_kv() -> None:
    cache = load(case_artifact("synthetic-mla"), device="meta", num_blocks=2049)
    name = next(iter(cache.views))
    assert name not in cache.kv and len(cache.kv) == 0
    with pytest.raises(KeyError, match="does not store K and V side by side"):
        cache.kv[name]
    jamba = load(case_artifact("jamba-v0.1-tp1", small=True), device="meta", num_blocks=20)
    kinds = {m.kind for m in jamba.metadata.values()}
    assert kinds == {"mamba", "full_attention"}
    assert set(jamba.kv) == {n for n, m in jamba.metadata.items()
                                     if m.kind == "full_attention"}
    state = next(n for n, m in jamba.metadata.items() if m.kind == "mamba")
    assert jamba.views[state].dtype == torch.int8  # state pages are raw bytes
    assert jamba.metadata[state].sliding_window is None


def test_metadata_of_windows_and_groups() -> None:
    cache = load(case_artifact("gemma-2-9b-tp1"), device="meta", num_blocks=15603)
    windows = {m.kind: m.sliding_window for m in cache.metadata.values()}
    assert windows == {"sliding_window": 4096, "full_attention": None}
    assert {m.group for m in cache.metadata.values()} == {0, 1}


@pytest.mark.parametrize("layout, yields", [
    ("LBNHC", ("NHD",)), ("BLNHC", ("NHD",)), ("LBHNC", ("HND",)), ("BLHNC", ("HND",)),
    ("LHBNC", ("HND",)), ("BHLNC", ("HND",))])
def test_kernel_conventions_per_layout(layout: str, yields: tuple[str, ...]) -> None:
    art = with_layout("tiny", layout)
    cache = load(art, device="cpu", num_blocks=18)
    name = "model.layers.2.self_attn.attn"
    assert cache.layouts.supports(name) == yields
    view = cache.views[name]  # (B, H, N, C)
    if "NHD" in yields:
        nhd = cache.layouts.nhd(name)
        assert tuple(nhd.shape) == (18, 16, 2, 128)  # (B, N, H, C)
        assert nhd.stride()[1:] == (256, 128, 1)
        k, v = cache.layouts.kv_nhd(name)
        assert tuple(k.shape) == (18, 16, 2, 64) and v.storage_offset() == k.storage_offset() + 64
        with pytest.raises(LayoutMismatch, match=f"layout {layout} does not store"):
            cache.layouts.hnd(name)
    else:
        hnd = cache.layouts.hnd(name)
        assert hnd.data_ptr() == view.data_ptr() and tuple(hnd.shape) == (18, 2, 16, 128)
        assert hnd.stride()[2:] == (128, 1)
        k, v = cache.layouts.kv_hnd(name)
        assert tuple(v.shape) == (18, 2, 16, 64)
        with pytest.raises(LayoutMismatch):
            cache.layouts.nhd(name)
    # every layout's views still write exactly the declared bytes
    cache.buffers["device"].zero_()
    for ti, t in enumerate(art.data["body"]["stages"][0]["tensors"]):
        for slot, layer in enumerate(t["layers"]):
            write_and_find(cache, layer, declared_addresses(art, 0, ti, slot, 18), seed=slot)


def test_a_single_head_page_yields_both_conventions() -> None:
    cache = load(case_artifact("synthetic-mla"), device="meta", num_blocks=2049)
    name = next(iter(cache.views))
    assert cache.layouts.supports(name) == ("NHD", "HND")


def test_kernel_block_splitting() -> None:
    art = data_artifact("kernel32")
    cache = load(art, device="cpu", num_blocks=10, kernel_block_size=16)
    name = "model.layers.2.self_attn.attn"
    view, meta = cache.views[name], cache.metadata[name]
    whole = load(art, device="meta", num_blocks=10).views[name]
    assert tuple(view.shape) == (20, 2, 16, 160)  # (B * 2, H, N / 2, C)
    assert view.stride() == (whole.stride(0) // 2, *whole.stride()[1:])
    assert view.storage_offset() == whole.storage_offset()
    assert (meta.kernel_block_size, meta.kernel_blocks_per_block, meta.block_size) == (16, 2, 32)
    blocks = cache.block_view(name)  # the reference's group_kernel_blocks
    assert tuple(blocks.shape) == (10, 2, 2, 16, 160)
    for slot, layer in enumerate(art.data["body"]["stages"][0]["tensors"][0]["layers"]):
        write_and_find(cache, layer, declared_addresses(art, 0, 0, slot, 10, 16), seed=slot)
    full = load(art, device="cpu", num_blocks=10, kernel_block_size={0: 32})
    assert full.metadata[name].kernel_block_size == 32


def test_kernel_block_splitting_shares_bytes_with_the_whole_view() -> None:
    art = data_artifact("kernel32")
    split = load(art, device="cpu", num_blocks=10, kernel_block_size=16, zero=True)
    name = "model.layers.0.self_attn.attn"
    whole = torch.as_strided(split.buffers["device"], (10, 2, 32, 320),
                             (2 * 32 * 320, 320, 640, 1)).view(torch.float16)
    # the same bytes, seen as whole blocks (B, H, N, C) in LBNHC
    split.views[name][3].fill_(7.0)  # kernel block 3 = block 1, tokens 16..31
    assert bool((whole[1, :, 16:] == 7).all()) and int((whole != 0).sum()) == 2 * 16 * 160


def test_kernel_block_splitting_refusals() -> None:
    art = data_artifact("kernel32")
    with pytest.raises(LoadError, match="must divide the KV cache block size 32"):
        load(art, device="meta", num_blocks=10, kernel_block_size=24)
    with pytest.raises(LoadError, match="unknown group"):
        load(art, device="meta", num_blocks=10, kernel_block_size={5: 16})
    packed = case_artifact("syn-packed-blhnc", small=True)
    with pytest.raises(LoadError, match="does not store blocks as dense, unpadded pages"):
        load(packed, device="meta", num_blocks=30, kernel_block_size=8)


def test_state_layers_are_not_split_into_kernel_blocks() -> None:
    art = case_artifact("jamba-v0.1-tp1", small=True)
    cache = load(art, device="meta", num_blocks=20, kernel_block_size=16)
    assert {m.block_size for m in cache.metadata.values() if m.kind == "mamba"} == {64}
    for meta in cache.metadata.values():
        want = meta.block_size if meta.kind == "mamba" else 16
        assert meta.kernel_block_size == want


# ---------------------------------------------------------------------------
# pools: zeroing, drafter region, host pools, block pool
# ---------------------------------------------------------------------------


def test_zeroing_follows_the_artifact() -> None:
    needs = case_artifact("synthetic-mamba-hybrid", small=True)
    assert needs.data["body"]["needs_zeroing"]
    cache = load(needs, device="cpu", num_blocks=10)
    assert cache.zeroed and int(torch.count_nonzero(cache.buffers["device"])) == 0
    assert not load(needs, device="cpu", num_blocks=10, zero=False).zeroed
    plain = data_artifact("tiny")
    assert not plain.data["body"]["needs_zeroing"]
    assert not load(plain, device="cpu", num_blocks=20).zeroed
    forced = load(plain, device="cpu", num_blocks=20, zero=True)
    assert forced.zeroed and int(torch.count_nonzero(forced.buffers["device"])) == 0
    assert not load(needs, device="meta", num_blocks=10).zeroed


def test_one_allocation_per_pool() -> None:
    art = case_artifact("syn-glm5-next", small=True)
    st = art.data["body"]["stages"][0]
    n = st["min_num_blocks"]
    cache = load(art, device="cpu", num_blocks=n)
    size = Affine.from_json(st["allocations"][0]["size"]).at(n)
    assert set(cache.buffers) == {"device", "draft"}
    assert cache.buffers["device"].numel() == size == cache.nbytes
    assert cache.buffers["device"].dtype == torch.int8
    ptrs = {v.untyped_storage().data_ptr() for v in cache.views.values()}
    assert ptrs == {cache.buffers["device"].untyped_storage().data_ptr()}
    drafts = [m for m in cache.metadata.values() if m.pool == "draft"]
    assert drafts and all(m.num_blocks == st["draft_num_blocks"] for m in drafts)
    assert cache.draft_num_blocks == st["draft_num_blocks"]
    assert cache.draft_block_pool.num_blocks == st["draft_num_blocks"]


def _with_host_tensor(art: Artifact) -> Artifact:
    return _edited(art, 0, 1, host_resident=True)


def test_host_resident_tensors_get_a_host_pool() -> None:
    art = _with_host_tensor(case_artifact("gemma-2-9b-tp1", small=True))
    cache = load(art, device="cpu", num_blocks=12, zero=True)
    assert set(cache.buffers) == {"device", "host"}
    host_layers = art.data["body"]["stages"][0]["tensors"][1]["layers"]
    for slot, layer in enumerate(host_layers):
        assert cache.metadata[layer].pool == "host"
        assert cache.views[layer].untyped_storage().data_ptr() == \
            cache.buffers["host"].untyped_storage().data_ptr()
        write_and_find(cache, layer, declared_addresses(art, 0, 1, slot, 12), seed=slot)
    assert cache.buffers["host"].is_pinned() == torch.cuda.is_available()
    # host and device pools no longer alias
    dev_layer = art.data["body"]["stages"][0]["tensors"][0]["layers"][0]
    cache.buffers["device"].zero_()
    cache.views[host_layers[0]].fill_(3.0)
    assert int(torch.count_nonzero(cache.views[dev_layer])) == 0


def test_block_pool_over_num_blocks() -> None:
    art = data_artifact("tiny")
    cache = load(art, device="meta", num_blocks=20)
    pool = cache.block_pool
    assert pool is cache.block_pool  # made once
    assert pool.num_blocks == 20 and pool.num_free_blocks == 19  # block 0: null block
    assert pool.hash_block_size == art.data["body"]["hash_block_size"]
    assert cache.draft_block_pool is None
    assert repr(cache) == ("LoadedCache('tiny', stage=0, device='meta', num_blocks=20, "
                           "layers=4, layout=LBNHC, pools={device: 655360 B})")


def test_pipeline_stages_load_their_own_layers() -> None:
    art = data_artifact("tiny-pp3")
    for stage in range(3):
        cache = load(art, device="meta", num_blocks=20, stage=stage)
        assert cache.stage == stage
        assert list(cache.views) == art.data["body"]["stages"][stage]["layers"]
        # bf16 pages of 8 KiB: the second layer starts 20 pages in
        assert [v.storage_offset() for v in cache.views.values()] == [0, 20 * 8192 // 2]


# ---------------------------------------------------------------------------
# CUDA (skipped without a device)
# ---------------------------------------------------------------------------


@CUDA
@pytest.mark.parametrize("name", ["synthetic-swa-hybrid", "syn-glm5-next", "jamba-v0.1-tp1"])
def test_cuda_views_write_their_declared_bytes(name: str) -> None:
    art = case_artifact(name, small=True)
    n = art.min_num_blocks() + 1
    gpu = load(art, device="cuda", num_blocks=n, zero=True)
    cpu = load(art, device="cpu", num_blocks=n, zero=True)
    assert gpu.device.type == "cuda" and gpu.zeroed
    for layer, view in gpu.views.items():
        c = cpu.views[layer]
        assert (view.shape, view.stride(), view.storage_offset(), view.dtype) == \
            (c.shape, c.stride(), c.storage_offset(), c.dtype)
    for seed, layer in enumerate(gpu.views):
        gpu.buffers["device"].zero_()
        cpu.buffers["device"].zero_()
        gpu.views[layer].view(torch.uint8).fill_(seed % 255 + 1)
        cpu.views[layer].view(torch.uint8).fill_(seed % 255 + 1)
        assert torch.equal(gpu.buffers["device"].cpu(), cpu.buffers["device"])


@CUDA
def test_cuda_memory_fraction_and_pinned_host_pool() -> None:
    art = _with_host_tensor(case_artifact("gemma-2-9b-tp1", small=True))
    free, _ = torch.cuda.mem_get_info()
    per_block = art.data["body"]["stages"][0]["bytes_per_block"]
    fraction = min(1.0, 64 * per_block / free)
    cache = load(art, device="cuda", memory_fraction=fraction)
    assert cache.num_blocks >= art.min_num_blocks()
    assert cache.buffers["host"].is_pinned() and cache.buffers["host"].device.type == "cpu"
    assert cache.buffers["device"].device.type == "cuda"


def test_error_is_a_kvspec_error() -> None:
    assert issubclass(LoadError, KvspecError) and issubclass(LayoutMismatch, KvspecError)


LAYOUTS = Path(__file__).resolve().parents[1] / "layouts"


@pytest.mark.parametrize("path", sorted(LAYOUTS.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_layout_loads_on_meta(path: Path) -> None:
    art = compile(path)
    own = (art.data["body"].get("budget") or {}).get("num_blocks")
    for stage in range(len(art.data["body"]["stages"])):
        if art.pooled:  # several pools: each sized from its share of the budget
            cache = load(art, device="meta", stage=stage)
        else:
            cache = load(art, device="meta", num_blocks=own or art.min_num_blocks(),
                         stage=stage)
        assert list(cache.views) == art.data["body"]["stages"][stage]["layers"]


# ---------------------------------------------------------------------------
# any arguments: a cache, or a clear error
# ---------------------------------------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_LAYOUTS = sorted((Path(__file__).parents[1] / "layouts").glob("*.kvlayout.json"))
_ANY = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 70_000), st.sampled_from([10**30, 2**63]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(
        ["x", "", "40GiB", "1KiB", "0", "auto", "-1"]),
    st.dictionaries(st.integers(-1, 9), st.one_of(st.integers(-1, 300), st.text(max_size=2)),
                    max_size=3), st.lists(st.integers(0, 3), max_size=2))


@functools.cache
def _shipped(i: int) -> Artifact:
    return Artifact.read(_LAYOUTS[i])


@settings(max_examples=400, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(layout=st.integers(0, len(_LAYOUTS) - 1),
       kwargs=st.dictionaries(st.sampled_from(["num_blocks", "memory", "memory_fraction",
                                               "stage", "kernel_block_size", "zero"]),
                              _ANY, max_size=3),
       device=st.sampled_from(["meta", "meta", "meta", None, 5, "tpu", "xla", "cuda:7"]))
def test_any_arguments_load_or_are_a_clear_error(layout: int, kwargs: dict,
                                                 device: Any) -> None:
    """On ``meta`` (no memory behind it) and on devices this torch cannot use:
    a cache, or a KvspecError with a hint -- never a torch or Python exception."""
    try:
        cache = load(_shipped(layout), device=device, **kwargs)
    except KvspecError as err:  # a cache or a clear error: each outcome is checked
        assert err.hint, err.render()  # noqa: PT017
        return
    assert cache.device.type == "meta" and cache.num_blocks >= 1
