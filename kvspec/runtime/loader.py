"""``load()``: map a verified artifact onto memory as pools and per-layer views.

The artifact was compiled once, with every block-dependent offset and stride
an affine form of the block count; loading settles the count for this
deployment's memory and evaluates them::

    artifact --verify--> num_blocks (count | bytes | fraction of free memory)
             --agree-->  the smallest rank's count (torch.distributed)
             --allocate-> one int8 tensor per pool     (zeroed if the layout needs it)
             --view-->   one as_strided per layer      (B, H, N, C) in its dtype

>>> cache = load("layouts/llama-3.1-8b.kvlayout.json", device="meta", num_blocks=20480)
>>> view = cache.views["model.layers.0.self_attn.attn"]
>>> tuple(view.shape), view.stride(), view.dtype     # (B, H, N, C), LBNHC
((20480, 8, 16, 256), (32768, 256, 2048, 1), torch.bfloat16)
>>> k, v = cache.kv["model.layers.0.self_attn.attn"]
>>> tuple(k.shape), k.stride()                       # (B, H, N, head_size)
((20480, 8, 16, 128), (32768, 256, 2048, 1))
>>> tuple(cache.layouts.nhd("model.layers.0.self_attn.attn").shape)   # (B, N, H, C)
(20480, 16, 8, 256)

Memory. Each allocation the artifact's stage declares is one int8 tensor in
``buffers`` (``device``; ``host`` in pinned host memory when CUDA is available),
and each pool a slice of its allocation: ``buffers["draft"]`` is a drafter's
own pool, beyond the main pool in the device allocation. Before anything is
allocated, the structure the views rest on is proved for the block count
chosen (:func:`kvspec.artifact.structure.memory_problems`): every view inside
its pool, no two block ids sharing a byte.
"""

# one idea: loading is one pass over an artifact (size, prove, allocate, view) and the
# cache it gives; split, the pieces would be read together anyway.

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from kvspec.artifact import Artifact
from kvspec.artifact.blocks import allocation_blocks, memory_problems
from kvspec.artifact.format import Pool, Stage, at
from kvspec.artifact.read import unsound
from kvspec.connectors.describe import describe_loaded
from kvspec.connectors.descriptor import Descriptor
from kvspec.errors import KvspecError
from kvspec.model.axes import AxisOrder
from kvspec.runtime import distributed
from kvspec.runtime.block_pool import BlockPool
from kvspec.runtime.budget import LoadError, free_memory, resolve_counts, resolve_num_blocks
from kvspec.runtime.views import (
    CellParts,
    KVViews,
    LayerMeta,
    LayoutViews,
    build_tensor_views,
    per_tensor_scales,
)

__all__ = ["LoadError", "LoadedCache", "free_memory", "load", "resolve_num_blocks"]

#: The most bytes one allocation may have (torch sizes are int64).
_MAX_BYTES = 2**63 - 1


@dataclass(eq=False)
class LoadedCache:
    """One rank's KV cache: pools, per-layer views and a block pool.

    ``views[layer]`` is ``(B, H, N, C)`` in the layer's dtype (B = blocks, or
    kernel blocks when split; H head slots; N states per block; C cell
    elements); ``kv[layer]`` is ``(K, V)`` where a cell holds both;
    ``layouts`` gives NHD / HND forms; ``metadata[layer]`` says which group,
    block size, window and pool the view belongs to.
    """

    artifact: Artifact
    stage: int
    device: torch.device
    num_blocks: int
    #: Blocks of each pool (the main pool's are ``num_blocks``).
    pool_blocks: dict[str, int]
    draft_num_blocks: int | None
    axis_order: AxisOrder
    buffers: dict[str, torch.Tensor]
    views: dict[str, torch.Tensor]
    metadata: dict[str, LayerMeta]
    zeroed: bool
    kv: KVViews = field(init=False)
    layouts: LayoutViews = field(init=False)
    #: ``parts[layer][name]``: K, V, in-cell scales, MLA NoPE/RoPE... of every cell.
    parts: CellParts = field(init=False)
    #: ``scales[layer]``: ``{"k_scale", "v_scale"}`` per-tensor constants (fp8 per-tensor
    #: modes), views of one float32 allocation ``buffers["scales"]``.
    scales: dict[str, dict[str, torch.Tensor]] = field(init=False)

    def __post_init__(self) -> None:
        self.kv = KVViews(self.views, self.metadata)
        self.layouts = LayoutViews(self.views, self.metadata, self.axis_order)
        body = self.artifact.body
        layers, cells = body.layers, body.cells
        self.parts = CellParts(self.views, {
            n: tuple(cells[layers[n].cells]) for n in self.views  # type: ignore[index]
            if n in layers and layers[n].cells is not None})
        scaled = [n for n in self.views if n in layers and layers[n].per_tensor_scales]
        buf, self.scales = per_tensor_scales(scaled, self.device)
        if buf is not None:
            self.buffers["scales"] = buf

    def __repr__(self) -> str:
        pools = ", ".join(f"{k}: {v.numel()} B" for k, v in self.buffers.items())
        return (f"LoadedCache({self.artifact.name!r}, stage={self.stage}, "
                f"device={str(self.device)!r}, num_blocks={self.num_blocks}, "
                f"layers={len(self.views)}, layout={self.axis_order.name}, pools={{{pools}}})")

    @cached_property
    def block_pool(self) -> BlockPool:
        """A :class:`~kvspec.runtime.block_pool.BlockPool` over ``num_blocks``
        (made on first use), shared by every group aliasing the device pool."""
        return self._make_pool(self.num_blocks, draft=False)

    @cached_property
    def draft_block_pool(self) -> BlockPool | None:
        """The drafter's own block pool (``draft_num_blocks``), or None."""
        if self.draft_num_blocks is None:
            return None
        return self._make_pool(self.draft_num_blocks, draft=True)

    def _make_pool(self, num_blocks: int, *, draft: bool) -> BlockPool:
        body = self.artifact.body
        draft_layers = set(body.stages[self.stage].draft_layers)
        groups = [g for g in body.groups if bool(set(g.layers) & draft_layers) == draft]
        caching = body.engine.enable_prefix_caching and any(g.prefix_cacheable for g in groups)
        return BlockPool(num_blocks, enable_caching=caching,
                         hash_block_size=body.hash_block_size,
                         num_groups=len(body.groups) or None)

    def block_view(self, name: str) -> torch.Tensor:
        """``views[name]`` with manager blocks as dim 0 (the reference's
        ``group_kernel_blocks``): ``(num_blocks, ratio, H, N, C)`` when split
        into ``ratio`` kernel blocks, else the view itself."""
        view, meta = self.views[name], self.metadata[name]
        if meta.kernel_blocks_per_block == 1:
            return view
        return view.unflatten(0, (meta.num_blocks, meta.kernel_blocks_per_block))

    def descriptor(self, rank: int | None = None) -> Descriptor:
        """This rank's connector descriptor (docs/connectors.md) with the real base
        addresses: ``rank`` is the deployment's rank (default: this stage's
        tensor-parallel rank from ``torch.distributed``, else its first)."""
        if rank is None:
            tp = self.artifact.body.engine.tensor_parallel_size
            rank = self.stage * tp + distributed.tensor_rank(self.artifact)
        return describe_loaded(self, rank)

    @property
    def nbytes(self) -> int:
        """Bytes allocated (0 on meta)."""
        if self.device.type == "meta":
            return 0
        allocations = {a.name for a in self.artifact.body.stages[self.stage].allocations}
        return sum(b.numel() * b.element_size() for k, b in self.buffers.items()
                   if k in allocations or k == "scales")


# ---------------------------------------------------------------------------
# load
# ---------------------------------------------------------------------------


def load(artifact: Artifact | Mapping[str, Any] | str | Path, *, device: Any = "cpu",
         num_blocks: int | None = None, memory: int | str | None = None,
         memory_fraction: float | None = None, stage: int | None = None,
         kernel_block_size: int | Mapping[int, int] | None = None,
         zero: bool | None = None, replan: bool = False) -> LoadedCache:
    """Verify ``artifact``, size its pool, allocate and view it on ``device``.

    - ``num_blocks``, ``memory`` (bytes, or ``"40GiB"``), ``memory_fraction``
      (of the device's free memory): give at most one; none means the
      artifact's own override or budget. A count that cannot serve one request
      at ``max_model_len`` is refused.
    - ``stage``: the pipeline stage to load (default: this rank's, from
      ``torch.distributed``, else 0).
    - ``kernel_block_size``: split blocks into kernel blocks, for every
      attention group (an int) or per group id (a mapping).
    - ``zero``: zero the pools (default: when the artifact needs it).
    - ``device="meta"`` builds every view with no memory behind it.
    - ``replan``: also prove the artifact is exactly what this kvspec's compiler
      plans from its inputs (imports the compiler; ``kvspec check`` does the same
      before deployment).

    A path or a dict is read and checked (:mod:`kvspec.artifact.read`); an
    :class:`~kvspec.artifact.Artifact` was checked when it was made and never
    changes. Either way, the structure is proved for the block count chosen
    before anything is allocated (docs/artifact.md, "The trust model").
    """
    if distributed.is_initialized():
        art, dev, st_index, count = _agreed(artifact, device, stage, num_blocks, memory,
                                            memory_fraction, replan)
    else:
        art = _verified(artifact, replan)
        dev, st_index = _target(art, device, stage)
    if distributed.is_initialized():  # the count every rank agreed on
        count, counts = resolve_counts(art, st_index, dev, num_blocks=count)
    else:
        count, counts = resolve_counts(art, st_index, dev, num_blocks=num_blocks,
                                       memory=memory, memory_fraction=memory_fraction)
    st = art.body.stages[st_index]
    order = AxisOrder.parse(art.body.engine.axis_order)
    problems = memory_problems(art.body, st_index, counts)
    if problems:
        raise unsound(problems, _origin(artifact), art.source)
    zeroed = art.body.needs_zeroing if zero is None else bool(zero)
    buffers = _allocate(st, counts, dev, zero=zeroed)
    kernel = _kernel_block_sizes(art, st, kernel_block_size)
    views, metadata = _build_views(st, order, buffers, counts, kernel)
    # model order (the stage's layer list), not placement order
    views = {n: views[n] for n in st.layers if n in views}
    metadata = {n: metadata[n] for n in st.layers if n in metadata}
    return LoadedCache(artifact=art, stage=st_index, device=dev, num_blocks=count,
                       pool_blocks=counts, draft_num_blocks=st.draft_num_blocks,
                       axis_order=order,
                       buffers=buffers, views=views, metadata=metadata,
                       zeroed=zeroed and dev.type != "meta")


def _origin(artifact: Any) -> str:
    return str(artifact) if isinstance(artifact, (str, Path)) else "<artifact>"


def _agreed(artifact: Any, device: Any, stage: int | None, num_blocks: int | None,
            memory: int | str | None, memory_fraction: float | None, replan: bool
            ) -> tuple[Artifact, torch.device, int, int]:
    """Every rank reaches the agreement, even one that failed to read or size
    its cache: its problem is reported by all, so none waits."""
    art: Artifact | None = None
    dev, st_index, mine, problem = None, 0, None, None
    try:
        art = _verified(artifact, replan)
        if art.pooled:
            raise LoadError("a plan of several pools (policy separate) does not agree block "
                            "counts across ranks yet", hint="give every rank the same memory= "
                            "and load without torch.distributed, or compile policy: unified")
        dev, st_index = _target(art, device, stage)
        mine = resolve_num_blocks(art, dev, num_blocks=num_blocks, memory=memory,
                                  memory_fraction=memory_fraction)
    except KvspecError as err:
        problem = err
    count = distributed.agree(art, mine, problem=problem)
    assert art is not None and dev is not None
    return art, dev, st_index, art.num_blocks_for(num_blocks=count)


def _target(art: Artifact, device: Any, stage: int | None) -> tuple[torch.device, int]:
    """The device, and the stage: given, else this rank's pipeline stage."""
    dev = _device(device)
    index = stage if stage is not None else distributed.pipeline_rank(art)
    stages = art.body.stages
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(stages):
        raise LoadError(f"the artifact has {len(stages)} pipeline stage(s), not stage {index!r}",
                        expected=f"a stage in 0..{len(stages) - 1}", found=repr(index),
                        hint="give stage=... of this rank, or leave it out to take "
                        "torch.distributed's pipeline rank (else 0)")
    return dev, index


def _verified(artifact: Artifact | Mapping[str, Any] | str | Path, replan: bool = False
              ) -> Artifact:
    """The artifact, checked: an Artifact as it is (it was checked when it was
    made), a path or dict read and checked; ``replan``: proved by re-planning."""
    if isinstance(artifact, Artifact):
        art = artifact
    elif isinstance(artifact, (str, Path)):
        art = Artifact.read(artifact)
    elif isinstance(artifact, Mapping):
        art = Artifact.from_dict(dict(artifact))
    else:
        raise LoadError(f"cannot load a {type(artifact).__name__}",
                        expected="an Artifact, its dict, or the path of a .kvlayout.json",
                        hint="e.g. kvspec.load('layouts/llama-3.1-8b.kvlayout.json', "
                             "device='cuda')")
    if replan:
        # deferred: the compiler (pydantic, PyYAML), imported only for replan=True
        from kvspec.compiled import replan as replanned
        art = replanned(art, _origin(artifact))
    return art


def _device(device: Any) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise LoadError(f"not a torch device: {device!r}", found=repr(device),
                        expected="a torch.device or its name: 'cuda', 'cuda:1', 'cpu', 'meta'",
                        hint="meta builds every view with no memory behind it") from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise LoadError("device 'cuda' asked for, but this torch sees no CUDA device",
                            hint="load on 'cpu' or 'meta' to inspect the views")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
    return dev


# ---------------------------------------------------------------------------
# pools
# ---------------------------------------------------------------------------


def _allocate(stage: Stage, counts: dict[str, int], device: torch.device, *,
              zero: bool) -> dict[str, torch.Tensor]:
    """One int8 tensor per allocation of the stage (``device``, ``host``, or one per
    pool under the ``separate`` policy), and a slice of it for each pool that does
    not start at its allocation's start (a drafter's own pool: ``buffers["draft"]``)."""
    buffers: dict[str, torch.Tensor] = {}
    n = allocation_blocks(stage, counts)
    for a in stage.allocations:
        buf = _empty(at(a.size, n[a.name]), device, host=a.memory == "host",
                     num_blocks=counts.get(a.scales_with or "", 0))
        if zero and device.type != "meta":
            buf.zero_()
        buffers[a.name] = buf  # (size,) int8: the allocation's bytes
    for p in stage.pools:
        start = at(p.offset, n.get(p.allocation, 0))
        if start and p.allocation in buffers and p.name not in buffers:
            buffers[p.name] = buffers[p.allocation][start:]  # the pool's region, no copy
    return buffers


def _empty(size: int, device: torch.device, *, host: bool, num_blocks: int) -> torch.Tensor:
    """``size`` bytes on ``device`` (pinned host memory for a host pool), or a
    :class:`LoadError` saying why not (out of memory, a backend this torch lacks)."""
    where = "pinned host memory" if host and device.type != "meta" else str(device)
    if size > _MAX_BYTES:
        raise LoadError(f"a pool of {num_blocks:,} blocks would be {size:,} bytes, more than "
                        "any device holds", found=f"{num_blocks:,} blocks",
                        hint="give fewer blocks (num_blocks=...), or a memory budget")
    try:
        if host and device.type != "meta":
            return torch.empty(size, dtype=torch.int8, device="cpu",
                               pin_memory=torch.cuda.is_available())
        return torch.empty(size, dtype=torch.int8, device=device)
    except (RuntimeError, NotImplementedError) as exc:   # torch.OutOfMemoryError included
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise LoadError(f"cannot allocate {size:,} bytes on {where}: {reason[:200]}",
                        found=f"{num_blocks:,} blocks",
                        hint="give fewer blocks or less memory, or another device") from None


# ---------------------------------------------------------------------------
# views
# ---------------------------------------------------------------------------


def _positive_kernel(kernel: Any) -> None:
    if isinstance(kernel, bool) or not isinstance(kernel, int) or kernel < 1:
        raise LoadError("kernel_block_size must be a positive integer", found=repr(kernel),
                        expected="a divisor of the group's block size, e.g. 16",
                        hint="an int for every attention group, or {group id: size}")


def _kernel_block_sizes(artifact: Artifact, stage: Stage,
                        kernel: int | Mapping[int, int] | None) -> dict[int, int]:
    """Group id -> kernel block size, for the groups that split."""
    if kernel is None:
        return {}
    if isinstance(kernel, Mapping):
        known = set(range(len(artifact.body.groups)))
        unknown = sorted(set(kernel) - known)
        if unknown:
            raise LoadError(f"kernel_block_size names unknown group(s) {unknown}",
                            expected=f"group ids {sorted(known)}",
                            hint="artifact.body.groups lists the groups, by id")
        for k in kernel.values():
            _positive_kernel(k)
        return {int(g): k for g, k in kernel.items()}
    _positive_kernel(kernel)
    # State layers (one state per request, no tokens) take no part in kernel blocks.
    return {t.group: kernel for t in stage.tensors
            if t.view.tokens_per_state is not None and t.block_size != kernel}


def _build_views(stage: Stage, order: AxisOrder, buffers: dict[str, torch.Tensor],
                 counts: dict[str, int], kernel: dict[int, int],
                 ) -> tuple[dict[str, torch.Tensor], dict[str, LayerMeta]]:
    views: dict[str, torch.Tensor] = {}
    metadata: dict[str, LayerMeta] = {}
    pools: dict[str, Pool] = {p.name: p for p in stage.pools}
    n = allocation_blocks(stage, counts)
    for index, t in enumerate(stage.tensors):
        pool = pools[t.pool]
        made = build_tensor_views(buffers[pool.allocation], t, index, order,
                                  n[pool.allocation], counts[pool.name], kernel.get(t.group),
                                  t.pool)
        for view, meta in made:
            views[meta.name] = view  # (B, H, N, C) in meta.dtype
            metadata[meta.name] = meta
    return views, metadata
