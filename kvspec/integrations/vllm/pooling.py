"""What vLLM 0.33 can serve of a pooling decision, and what the decision changed.

vLLM 0.33 holds every KV-cache group in one shared pool with one page size.
An artifact whose plan pools memory separately (``body.pooling.policy:
separate``: several block pools, each with a share of the budget) cannot be
held by it, with or without kvspec's plugin; :func:`refusal` says why and what
serves it instead. A unified plan ``auto`` chose is served like any other,
with the flags of the chosen candidate's engine settings, which the artifact's
engine already records; :func:`decision_notes` says what the choice changed
from the source's own settings. Needs no vLLM.

>>> from kvspec.artifact import Artifact
>>> refusal(Artifact.read("layouts/llama-3.1-8b.kvlayout.json")) is None
True
>>> why, where = refusal(Artifact.read("layouts/pooling-separate.kvlayout.json"))
>>> where
'body.pooling.policy'
>>> why.split(" (")[0], why.split("; ")[1][:36]
('the plan holds 2 separate pools', 'vLLM 0.33 keeps every group in one s')
"""

from __future__ import annotations

from kvspec.artifact import Artifact
from kvspec.artifact import format as fmt
from kvspec.model.pooling import ONE_SHARED_POOL, SERVE_SEPARATE

__all__ = ["SERVE_SEPARATE", "decision_notes", "refusal"]



def _share(p: fmt.PoolShare) -> str:
    return f"{p.name} {p.share[0] / p.share[1]:.1%}"


def refusal(artifact: Artifact) -> tuple[str, str] | None:
    """``(why, where)`` vLLM 0.33 cannot hold ``artifact``'s pools, or None when it can
    (``where``: the artifact field that says so)."""
    record = artifact.body.pooling
    if record is None or record.policy != "separate":
        return None
    pools = ", ".join(map(_share, record.pools))
    why = (f"the plan holds {len(record.pools)} separate pools ({pools} of the budget); "
           f"{ONE_SHARED_POOL}")
    return why, "body.pooling.policy"


def _figure(c: fmt.Candidate) -> str:
    """What a candidate buys at the workload: simulated mean running, else static."""
    if c.simulated is not None:
        return f"{c.simulated.mean_running:.1f} requests running on average (simulated)"
    if c.workload_requests is not None:
        return f"{c.workload_requests:.1f} requests at the workload (static)"
    return "no figure"


def decision_notes(artifact: Artifact) -> list[str]:
    """Comment lines on the pooling decision: the candidate chosen, what it buys, and
    how its engine settings differ from the source's (candidate 0, vLLM's own plan)."""
    record = artifact.body.pooling
    if record is None or record.chosen is None or not record.candidates:
        return []
    chosen = record.candidates[record.chosen]
    source = record.candidates[0]
    out = [(f"pooling: {record.asked} (serve_with {record.serve_with}) chose "
           f"'{chosen.name}': {_figure(chosen)}")]
    if record.chosen != 0:
        out.append(f"pooling: the source's own engine settings ('{source.name}'): "
                   f"{_figure(source)}; the flags below are the chosen plan's")
        if chosen.block_size != source.block_size:
            out.append(f"pooling: block size {source.block_size} -> {chosen.block_size}")
        if "no prefix caching" in chosen.name and "no prefix caching" not in source.name:
            out.append("pooling: prefix caching off (state layers keep one state per "
                       "request: mamba_cache_mode none)")
    return out
