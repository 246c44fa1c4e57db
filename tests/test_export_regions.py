"""What ``descriptor --as vllm-nixl`` exports, as a property (issue 36, item 3): for
every rank of every committed and generated plan vLLM can hold, no two of vLLM's
regions share a byte (where the plan aliases no two layers' bytes; where it does,
only layers of different groups share bytes, as vLLM's own packed and hybrid
registrations do), every byte of every layer's page lies in a region that lists the
layer, every layer is in a region and ``region_names`` names one of each region's
layers, and a region holds one pool's layers. A plan of several
pools (the ``separate`` policy) is refused, naming why, by every exporter of a cache
vLLM holds, as ``kvspec engine-args`` refuses it.

The descriptors get a distinct base per allocation, as a loaded cache's have (from
the artifact alone every region's base is 0)."""

from __future__ import annotations

import bisect
import itertools
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from kvspec.artifact import Artifact
from kvspec.compiler import compile_source
from kvspec.connectors.describe import Base, describe
from kvspec.connectors.descriptor import Descriptor, ExportError, Layer
from kvspec.connectors.exporters import export, vllm_nixl
from kvspec.errors import KvspecError
from kvspec.model import kinds
from tests.conftest import ROOT, invoke
from tests.fuzz.generators import valid_sources

ARTIFACTS = sorted([*(ROOT / "layouts").glob("*.kvlayout.json"),
                    *(ROOT / "tests" / "golden").glob("*.kvlayout.json")])
#: Blocks per pool the property is checked at (every block of each, brute force).
BLOCKS = 40
#: Bytes between two allocations' bases: past any allocation of BLOCKS blocks here.
SPACING = 1 << 44


def _descriptors(art: Artifact) -> list[Descriptor]:
    """Every rank's descriptor at a few blocks past the fewest one request needs, each
    allocation at a base of its own."""
    e = art.body.engine
    out = []
    for rank in range(e.tensor_parallel_size * len(art.body.stages)):
        st = art.body.stages[rank // e.tensor_parallel_size]
        bases = {a.name: Base((i + 1) * SPACING, "cuda:0", 0)
                 for i, a in enumerate(st.allocations)}
        counts = art.counts_for(rank // e.tensor_parallel_size, fewest=True)
        least = {k: min(v, BLOCKS) if v > BLOCKS else v for k, v in counts.items()}
        try:
            out.append(describe(art, rank=rank, bases=bases, num_blocks=least))
        except KvspecError:  # too few blocks for a pool of this plan: its fewest, then
            out.append(describe(art, rank=rank, bases=bases, num_blocks=counts))
    return out


def _several_pools(desc: Descriptor) -> bool:
    return len({g.pool for g in desc.groups if not g.own_pool}) > 1


def check_regions(desc: Descriptor) -> None:
    """The property (see the module's docstring) of ``desc``'s vLLM regions."""
    meta = export(desc, "vllm-nixl")
    found = vllm_nixl.regions(desc)
    assert found is not None
    regs, _ = found
    n = len(regs)
    assert len(meta["region_names"]) == len(meta["kv_caches_base_addr"]) == n
    bases = {r.id: r.base for r in desc.regions}
    # layers' bytes over every block: only layers of different groups share any
    pages = sorted((bases[x.region] + o + b * x.block_stride,
                    bases[x.region] + o + b * x.block_stride + n, x.name, x.group)
                   for x in desc.layers for o, n in _runs(x)
                   for b in range(_blocks(desc, x)))
    aliased, open_ = False, []
    for start, end, name, group in pages:
        open_ = [o for o in open_ if o[1] > start]
        for o in open_:
            assert o[3] != group, f"layers {o[2]} and {name} of group {group} share bytes"
            aliased = True
        open_.append((start, end, name, group))
    # no two regions share a byte, over every block, where no two layers do
    spans = sorted((r.base + b * r.block_stride, r.base + b * r.block_stride + r.block_len, i)
                   for i, r in enumerate(regs) for b in range(r.num_blocks))
    for (_, e0, i0), (s1, _, i1) in itertools.pairwise(spans):
        assert aliased or e0 <= s1, \
            f"regions {regs[i0].name} and {regs[i1].name} share bytes at {s1}"
    pools = {x.name: x.pool for x in desc.layers}
    member = {name: i for i, r in enumerate(regs) for name in r.members}
    for i, r in enumerate(regs):
        assert meta["region_names"][i] == r.name and r.name in r.members
        assert len({pools[m] for m in r.members}) == 1, (r.name, r.members)
    counted: dict[str, int] = {}
    for r in regs:
        for m in r.members:
            counted[m] = counted.get(m, 0) + 1
    # every byte of a layer's page in a region that lists it
    mine: dict[str, list[tuple[int, int]]] = {}
    for s0, e0, i in spans:
        for m in regs[i].members:
            mine.setdefault(m, []).append((s0, e0))
    for x in desc.layers:
        assert x.name in member, f"layer {x.name} is in no region"
        own = sorted(mine[x.name])
        starts = [s0 for s0, _ in own]
        for b in range(_blocks(desc, x)):
            for offset, length in _runs(x):
                start = bases[x.region] + offset + b * x.block_stride
                k = bisect.bisect_right(starts, start) - 1
                assert k >= 0 and own[k][1] >= start + length, \
                    f"layer {x.name} block {b}: bytes outside the regions that list it"


def _blocks(desc: Descriptor, x: Layer) -> int:
    return next(p.num_blocks for p in desc.pools if p.name == x.pool)


def _runs(x: Layer) -> list[tuple[int, int]]:
    """``(offset, length)`` of layer ``x``'s page in block 0: its runs, or a state's
    whole (padded) page, which vLLM registers as one."""
    if kinds.by_name(x.kind).state:
        return [(x.offset, x.page_bytes_padded or x.page_bytes)]
    return [(run.offset, run.length) for run in x.runs]


@pytest.mark.parametrize("path", ARTIFACTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_committed_plans_export_disjoint_regions_or_are_refused(path: Path) -> None:
    art = Artifact.read(path)
    for desc in _descriptors(art):
        if _several_pools(desc):
            with pytest.raises(ExportError, match="separate pools"):
                export(desc, "vllm-nixl")
            continue
        try:
            vllm_nixl.agent_metadata(desc)
        except ValueError:  # vLLM cannot partition this axis order: refused as such
            with pytest.raises(ExportError, match="cannot partition"):
                export(desc, "vllm-nixl")
            continue
        check_regions(desc)


PROPERTY = settings(deadline=None, derandomize=True, database=None, print_blob=False,
                    max_examples=40, suppress_health_check=list(HealthCheck))
#: A separate policy for a generated source (its pools served by kvspec's runtime).
SEPARATE = """
pooling:
  policy: separate
  serve_with: kvspec
  workload: {context_tokens: 100, output_tokens: 20, requests: 8}
"""


@PROPERTY
@given(valid_sources())
def test_generated_plans_export_disjoint_regions_or_are_refused(case: tuple) -> None:
    text, _ = case
    for variant in (text, text.rstrip("\n") + "\n" + SEPARATE):
        try:
            art = compile_source(variant, "gen.yaml")
        except KvspecError:
            continue
        for desc in _descriptors(art):
            if _several_pools(desc):
                for target in ("vllm-nixl", "lmcache"):
                    with pytest.raises(ExportError, match=r"vLLM 0\.33 keeps every group in "
                                                           r"one shared pool"):
                        export(desc, target)
                continue
            if vllm_nixl.regions(desc) is None:
                continue
            check_regions(desc)


@pytest.mark.parametrize("name", ["pooling-separate", "pooling-auto"])
@pytest.mark.parametrize("target", ["vllm-nixl", "lmcache"])
def test_the_cli_refuses_a_separate_plan_naming_why(name: str, target: str) -> None:
    """The issue's corrupt export: exit 0 with overlapping regions and an attention
    layer merged into a Mamba layer's region. Refused now, as engine-args refuses it."""
    path = ROOT / "layouts" / f"{name}.kvlayout.json"
    code, out, err = invoke(["descriptor", str(path), "--as", target])
    assert (code, out) == (1, ""), out
    assert f"{target}: the cache holds 2 separate pools" in err
    assert "vLLM 0.33 keeps every group in one shared pool with one page size" in err
    assert "  hint: serve it with SGLang" in err
    code, _, err_args = invoke(["engine-args", str(path)])
    assert code == 1 and "vLLM 0.33 keeps every group in one shared pool" in err_args
