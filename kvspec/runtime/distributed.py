"""Many ranks, one cache plan: agree on the block count and on the artifact.

Every rank of a deployment sizes its pool from its own free memory, so the
counts differ; the engine must use one count everywhere (the reference's
``get_kv_cache_configs``: the smallest rank's count wins). And a rank that
loaded an artifact compiled from another source would lay its cache out
differently from its peers, silently. :func:`agree` settles both with two
collectives, on any ``torch.distributed`` backend:

1. an all-gather of each rank's (source_sha256, sha256, count or the
   problem that kept it from one), as JSON bytes in tensors (nothing is
   unpickled); a rank that could not read its artifact or size its pool, or
   ranks with different artifacts, raise the same :class:`RankMismatchError`
   on every rank, so none is left waiting in a collective;
2. ``all_reduce(MIN)`` of the count.

``load()`` calls it whenever ``torch.distributed`` is initialised.
"""

from __future__ import annotations

import json
from typing import Any

import torch

from kvspec.artifact import Artifact
from kvspec.errors import KvspecError

__all__ = ["RankMismatchError", "agree", "is_initialized", "pipeline_rank", "tensor_rank"]


class RankMismatchError(KvspecError):
    """Ranks of one deployment disagree on the artifact or cannot size their pools."""


def is_initialized() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def pipeline_rank(artifact: Artifact, group: Any = None) -> int:
    """This rank's pipeline stage: ranks are laid out tensor-parallel innermost
    (vLLM's order), so ``stage = (rank // tensor_parallel_size) % pipeline_size``.
    0 when ``torch.distributed`` is not initialised."""
    if not is_initialized():
        return 0
    engine = artifact.body.engine
    tp, pp = engine.tensor_parallel_size, engine.pipeline_parallel_size
    return (torch.distributed.get_rank(group) // tp) % pp


def tensor_rank(artifact: Artifact, group: Any = None) -> int:
    """This rank's tensor-parallel rank (``rank % tensor_parallel_size``); 0 when
    ``torch.distributed`` is not initialised."""
    if not is_initialized():
        return 0
    return torch.distributed.get_rank(group) % artifact.body.engine.tensor_parallel_size


def _short(sha: str) -> str:
    return sha[:12]


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _reduce_device(group: Any) -> torch.device:
    backend = torch.distributed.get_backend(group)
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _all_gather_bytes(payload: bytes, world: int, device: torch.device,
                      group: Any) -> list[bytes]:
    """Every rank's ``payload``, as tensors (no pickling, no numpy): the
    lengths first, then the bytes padded to the longest."""
    dist = torch.distributed
    length = torch.tensor([len(payload)], dtype=torch.int64, device=device)
    lengths = [torch.empty_like(length) for _ in range(world)]
    dist.all_gather(lengths, length, group=group)
    longest = max(int(n.item()) for n in lengths)
    mine = torch.zeros(longest, dtype=torch.uint8)
    mine[:len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    mine = mine.to(device)
    parts = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(parts, mine, group=group)
    return [bytes(p[:int(n.item())].cpu().tolist()) for p, n in zip(parts, lengths)]


def agree(artifact: Artifact | None, num_blocks: int | None, *, group: Any = None,
          problem: KvspecError | None = None) -> int:
    """The block count every rank of ``group`` uses: the smallest rank's.

    ``num_blocks`` is this rank's own count, or None with ``problem`` when it
    could not read its artifact or size its pool (``artifact`` may then be
    None); every rank then raises :class:`RankMismatchError` naming the ranks
    and their problems. It is raised too, on every rank, when ranks loaded
    artifacts of different sources (or the same source compiled differently:
    the bodies differ), naming the ranks on each side.
    """
    dist = torch.distributed
    world = dist.get_world_size(group)
    mine = {"source": artifact.source_sha256 if artifact is not None else None,
            "body": artifact.sha256 if artifact is not None else None,
            "name": artifact.name if artifact is not None else None,
            "num_blocks": num_blocks,
            "problem": problem.message if problem is not None else None}
    device = _reduce_device(group)
    gathered = [json.loads(raw) for raw in
                _all_gather_bytes(json.dumps(mine).encode(), world, device, group)]

    failed = [(r, info["problem"]) for r, info in enumerate(gathered)
              if info["num_blocks"] is None]
    if failed:
        raise RankMismatchError(
            "not every rank can load its KV cache: " + "; ".join(
                f"rank {r}: {msg}" for r, msg in failed),
            hint="give every rank a valid artifact and enough memory (or a num_blocks "
                 "all of them can serve)")

    by_artifact: dict[tuple[str, str], list[int]] = {}
    for rank, info in enumerate(gathered):
        by_artifact.setdefault((info["source"], info["body"]), []).append(rank)
    if len(by_artifact) > 1:
        sides = []
        for (source, body), ranks in by_artifact.items():
            name = gathered[ranks[0]]["name"]
            sides.append(f"{_ranks(ranks)}: {name!r} source {_short(source)} "
                         f"body {_short(body)}")
        sources = {s for s, _ in by_artifact}
        what = ("sources" if len(sources) > 1 else
                "bodies from one source (another compiler or other compile options)")
        raise RankMismatchError(
            f"the ranks loaded artifacts of different {what}: " + "; ".join(sides),
            expected="one artifact on every rank", found=f"{len(by_artifact)} artifacts",
            hint="deploy the same .kvlayout.json to every rank")

    count = torch.tensor([int(num_blocks)], dtype=torch.int64,  # type: ignore[arg-type]
                         device=device)
    dist.all_reduce(count, op=dist.ReduceOp.MIN, group=group)
    return int(count.item())
