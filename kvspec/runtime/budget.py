"""How many blocks this rank loads: a count, a budget, or a fraction of free memory.

Precedence: the argument given (at most one of the three); else the
artifact's own ``num_blocks`` override; else the budget it was compiled for.
The source's ``num_blocks`` override wins over a memory budget, as in the
reference. A count that cannot serve one request at ``max_model_len`` is
refused.
"""

from __future__ import annotations

import os

import torch

from kvspec.artifact import Artifact
from kvspec.errors import KvspecError
from kvspec.files import parse_size

__all__ = ["LoadError", "free_memory", "resolve_num_blocks"]


class LoadError(KvspecError):
    """The cache cannot be loaded as asked (device, budget or stage)."""


def free_memory(device: torch.device) -> int:
    """Free bytes of ``device``: ``torch.cuda.mem_get_info`` on CUDA, the
    available physical pages on a CPU (Linux ``sysconf``)."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    if device.type == "cpu":
        try:
            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError) as exc:
            raise LoadError("cannot tell this machine's free memory",
                            hint="give memory=... or num_blocks=... instead") from exc
    raise LoadError(f"memory_fraction needs a device with memory, not {device.type!r}",
                    hint="give memory=... or num_blocks=... to size a meta load")


def _budget(device: torch.device, memory: int | str | None,
            memory_fraction: float | None) -> int | None:
    if memory_fraction is not None:
        if isinstance(memory_fraction, bool) or not isinstance(memory_fraction, (int, float)) \
                or not 0 < memory_fraction <= 1:
            raise LoadError("memory_fraction must be in (0, 1]", found=repr(memory_fraction),
                            expected="a fraction of the device's free memory, e.g. 0.9",
                            hint="or give memory='40GiB' or num_blocks=N")
        return int(free_memory(device) * memory_fraction)
    if memory is not None:
        return parse_size(memory, what="memory", error=LoadError)
    return None


def resolve_num_blocks(artifact: Artifact, device: torch.device, *,
                       num_blocks: int | None = None, memory: int | str | None = None,
                       memory_fraction: float | None = None) -> int:
    """This rank's block count of a unified plan, checked to serve one request."""
    budget, given = _given(artifact, device, num_blocks=num_blocks, memory=memory,
                           memory_fraction=memory_fraction)
    return artifact.num_blocks_for(memory=budget, num_blocks=given)


def _given(artifact: Artifact, device: torch.device, *, num_blocks: int | None,
           memory: int | str | None, memory_fraction: float | None
           ) -> tuple[int | None, int | None]:
    """``(budget in bytes, block count)`` the caller gave (at most one), checked."""
    given = [k for k, v in (("num_blocks", num_blocks), ("memory", memory),
                            ("memory_fraction", memory_fraction)) if v is not None]
    if len(given) > 1:
        raise LoadError("give one of num_blocks, memory and memory_fraction",
                        found=", ".join(given),
                        hint="each sizes the pool: keep the one you mean, drop the others")
    if num_blocks is not None and (isinstance(num_blocks, bool) or not isinstance(num_blocks, int)
                                   or num_blocks < 1):
        raise LoadError("num_blocks must be a positive integer", found=repr(num_blocks),
                        expected="blocks per pool, e.g. artifact.min_num_blocks() or more",
                        hint="or give memory='40GiB' to size the pool from a budget")
    budget = _budget(device, memory, memory_fraction)
    body = artifact.body
    if num_blocks is None and budget is None and body.engine.num_blocks is None:
        if body.budget is None:
            raise LoadError("the artifact has no memory budget of its own",
                            hint="give num_blocks=..., memory=... or memory_fraction=...")
        budget = body.budget.memory
    return budget, num_blocks


def resolve_counts(artifact: Artifact, stage: int, device: torch.device, *,
                   num_blocks: int | None = None, memory: int | str | None = None,
                   memory_fraction: float | None = None) -> tuple[int, dict[str, int]]:
    """This rank's main block count and every pool's count on ``stage``: the
    artifact's one sizing rule (:meth:`~kvspec.artifact.Artifact.counts_for`), which
    ``descriptor`` and ``transfer`` use too."""
    budget, given = _given(artifact, device, num_blocks=num_blocks, memory=memory,
                           memory_fraction=memory_fraction)
    counts = artifact.counts_for(stage, memory=budget, num_blocks=given)
    main = next((p.name for p in artifact.body.stages[stage].pools if p.num_blocks is None),
                None)
    return (counts[main] if main is not None else min(counts.values(), default=1)), counts
