"""What a plan buys, statically, read from its frozen artifact: requests at
``max_model_len``, requests at the workload's held length, the physical limit, and
the capacity curve.

All per rank of pipeline stage 0 (every tensor-parallel rank of it is alike), from
the artifact's records (:mod:`kvspec.artifact.format`): each main pool's groups and
block count (:func:`kvspec.artifact.sizing.counts_for`), each spec rebuilt from its
description for its arithmetic (:func:`kvspec.model.kinds.spec_from_dict`).

* **static requests** -- what the engine's own accounting promises: blocks over
  the blocks one request at ``max_model_len`` takes (vLLM's "maximum concurrency");
* **workload requests** -- the same at the tokens a running request holds on
  average (prompt, half its output, draft tokens), which is what traffic needs;
* **physical limit** -- the budget over the bytes those tokens and one running
  state per state layer take, nothing else: no block rounds up, no page is padded;
* the pool that runs out first.

>>> from kvspec.compiler import compile
>>> figures = Figures(compile("layouts/llama-3.1-8b.yaml").body)
>>> round(figures.workload_requests(2048)[0][0], 1), round(figures.physical_limit(2048), 1)
(160.0, 160.0)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import msgspec

from kvspec.artifact import format as fmt
from kvspec.artifact.sizing import counts_for, share_of
from kvspec.model.engine import Engine, engine_from_artifact
from kvspec.model.kinds import spec_from_dict
from kvspec.model.specs import LayerSpec, MambaState
from kvspec.model.specs.attention import EncoderOnly
from kvspec.model.specs.base import cdiv
from kvspec.model.specs.uniform import UniformType

__all__ = ["CURVE", "Figures", "MainPool", "capacity_curve"]

#: The context lengths of a capacity curve, as multiples of the workload's held tokens.
CURVE = (0.25, 0.5, 1.0, 1.5, 2.0, 4.0)


@dataclass(frozen=True, slots=True)
class MainPool:
    """One pool requests draw from on stage 0: its name, its blocks (None: no
    budget) and each of its groups' spec."""

    name: str
    num_blocks: int | None
    specs: tuple[LayerSpec, ...]

    def request_blocks(self, engine: Engine, tokens: int) -> int:
        """Blocks of this pool one request holding ``tokens`` tokens takes."""
        at = dataclasses.replace(engine, max_model_len=max(tokens, 1))
        return sum(s.request_blocks(at) for s in self.specs)

    def workload_requests(self, engine: Engine, tokens: int) -> float | None:
        """Requests holding ``tokens`` tokens each that its blocks hold (the null
        block aside), statically."""
        if self.num_blocks is None:
            return None
        per = self.request_blocks(engine, tokens)
        return (self.num_blocks - 1) / per if per else None


def _as_grouped(spec: LayerSpec, name: str) -> LayerSpec:
    """Layer ``name``'s spec as its group holds it (``spec``, the group's): a member's
    own in a group of several specs, else the group's (a sliding-window layer the
    hybrid manager's absence promotes is counted as its group counts it)."""
    return spec.specs[name] if isinstance(spec, UniformType) else spec


def _block_bytes(body: fmt.Layout, specs: list[LayerSpec]
                 ) -> tuple[tuple[int, int, int, bool], ...]:
    """Per group the request-level manager holds (not an encoder-only one), in its
    order: the bytes one block takes ``(useful, padded pages, padding slots,
    state)`` across the stages (a drafter's own pool aside, whose blocks are
    counted as padding-free useful bytes)."""
    per_pool: dict[str, int] = {}  # a pool's bytes per block, over the stages
    pool_of: dict[int, str] = {}
    for st in body.stages:
        for p in st.pools:
            per_pool[p.name] = per_pool.get(p.name, 0) + p.bytes_per_block
            pool_of.update((g, p.name) for g in p.groups)
    allocated = {g: per_pool[name] for g, name in pool_of.items()}
    out = []
    for g in body.groups:
        spec = specs[g.spec]
        first = spec.members[0][1] if isinstance(spec, UniformType) else spec
        if isinstance(first, EncoderOnly):
            continue
        layers = [_as_grouped(spec, n) for n in g.layers]
        useful = sum(s.unpadded_page_size_bytes for s in layers)
        padded = sum(s.page_size_bytes - s.unpadded_page_size_bytes for s in layers)
        slots = 0 if g.own_pool else max(allocated.get(g.id, 0) - useful - padded, 0)
        out.append((useful, padded, slots, bool(layers) and isinstance(layers[0], MambaState)))
    return tuple(out)


class Figures:
    """An artifact's static figures (its body read once)."""

    def __init__(self, body: fmt.Layout) -> None:
        specs = [spec_from_dict(msgspec.to_builtins(s)) for s in body.specs]
        self.engine = engine_from_artifact(msgspec.to_builtins(body.engine))
        self.budget = body.budget
        self.max_model_len = body.engine.max_model_len
        stage = body.stages[0]
        counts = counts_for(body, 0) if body.budget is not None else {}
        groups = body.groups
        self.pools = tuple(
            MainPool(p.name, counts.get(p.name), tuple(specs[groups[g].spec] for g in p.groups))
            for p in stage.pools if not any(groups[g].own_pool for g in p.groups))
        self._shares = [Fraction(*p.share) for p in stage.pools if p.share is not None]
        self.layers = tuple(_as_grouped(specs[groups[g].spec], n) for n in stage.layers
                            if (g := body.layers[n].group) is not None)
        self.block_bytes = _block_bytes(body, specs)

    def memory(self) -> int | None:
        """The bytes the main pools are sized for: the budget, or the sum of a
        separate plan's pools' shares of it (each rounded down, as sized)."""
        if self.budget is None:
            return None
        if not self._shares:
            return self.budget.memory
        return sum(share_of(self.budget.memory, s) for s in self._shares)

    def static_requests(self) -> float | None:
        """Requests at ``max_model_len`` the budget's blocks hold (None: no budget;
        a separate plan's: its pool that runs out first)."""
        return self.budget.max_concurrency if self.budget is not None else None

    def workload_requests(self, tokens: int) -> list[tuple[float | None, str]]:
        """Each main pool's requests holding ``tokens`` tokens, and its name."""
        return [(p.workload_requests(self.engine, tokens), p.name) for p in self.pools]

    def live_bytes(self, tokens: int) -> int:
        """Bytes a request holding ``tokens`` tokens needs at the least, on stage 0:
        each attention layer's live tokens (a window's at most) at its unpadded bytes
        per token, and one state per state layer."""
        total = 0
        for spec in self.layers:
            if isinstance(spec, MambaState):
                total += spec.unpadded_page_size_bytes
                continue
            window = getattr(spec, "sliding_window", None) or \
                getattr(spec, "attention_chunk_size", None)
            live = min(tokens, window) if window else tokens
            total += cdiv(spec.unpadded_page_size_bytes * live, spec.block_size)
        return total

    def physical_limit(self, tokens: int, budget: int | None = None) -> float | None:
        """Requests holding ``tokens`` tokens whose live bytes alone fill ``budget``
        (default: the artifact's)."""
        memory = budget if budget is not None else (
            self.budget.memory if self.budget is not None else None)
        per = self.live_bytes(tokens)
        if memory is None or not per:
            return None
        return memory / per


def capacity_curve(figures: Figures | Sequence[Figures], tokens: int
                   ) -> list[tuple[int, float]]:
    """Static requests (the pool that runs out first) against the tokens each holds:
    at each :data:`CURVE` multiple of ``tokens``, up to ``max_model_len``.

    >>> from kvspec.compiler import compile
    >>> figures = Figures(compile("layouts/llama-3.1-8b.yaml").body)
    >>> [(t, round(r)) for t, r in capacity_curve(figures, 4096)][:3]
    [(1024, 320), (2048, 160), (4096, 80)]
    """
    every = [figures] if isinstance(figures, Figures) else list(figures)
    limit = min(f.max_model_len for f in every)
    out: list[tuple[int, float]] = []
    for m in CURVE:
        t = min(max(round(tokens * m), 1), limit)
        if out and out[-1][0] == t:
            break
        values = [v for f in every for v, _ in f.workload_requests(t)]
        if any(v is None for v in values):
            return []
        out.append((t, round(min(v for v in values if v is not None), 2)))
    return out
