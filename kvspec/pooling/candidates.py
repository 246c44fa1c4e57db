"""The plans a policy weighs, each compiled through the pipeline and frozen.

A candidate is the source compiled again with other settings -- the parsed source's
engine ``block_size``, ``prefix_caching``, ``mamba_cache_mode``; the pooling policy
and its split -- through :mod:`kvspec.passes.pipeline` (expand .. freeze), so its
errors are located as any compile's. A variant the model does not plan (a block size
its layers refuse) is no candidate; a separate plan ``auto`` cannot make is listed
with why (reported, never chosen).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kvspec.errors import KvspecError
from kvspec.model.plan import Layout
from kvspec.model.pooling import Pooling
from kvspec.model.specs import MambaState
from kvspec.passes.freeze import CompiledArtifact, freeze
from kvspec.passes.parse import Parsed
from kvspec.passes.pipeline import Pass, run, run_until
from kvspec.passes.pool import Pooled, PoolLayout, pooled, separate_layouts
from kvspec.passes.size import Sized
from kvspec.pooling.figures import Figures

__all__ = ["Candidate", "candidates", "compiled", "resized", "separated"]


@dataclass(frozen=True, slots=True)
class Candidate:
    """One plan: a unified layout, or the pools of a separate plan, compiled up to
    the pool pass and frozen (without a decision)."""

    name: str
    policy: str
    block_size: int
    pooled: Pooled
    artifact: CompiledArtifact
    #: Its static figures, read from its artifact.
    figures: Figures
    #: Why the runtime asked for cannot serve it (then it is reported, not chosen).
    note: str | None = None

    @property
    def layout(self) -> Layout:
        return self.pooled.layout

    @property
    def pools(self) -> tuple[PoolLayout, ...]:
        return self.pooled.pools

    @property
    def layouts(self) -> tuple[Layout, ...]:
        return tuple(p.layout for p in self.pools) or (self.layout,)

    @property
    def groups(self) -> int:
        return sum(len(x.groups) for x in self.layouts)

    @property
    def hash_block_size(self) -> int:
        return min(x.hash_block_size for x in self.layouts)


def _frozen(name: str, policy: str, block_size: int, kept: Pooled) -> Candidate:
    artifact = freeze(kept)
    return Candidate(name, policy, block_size, kept, artifact, Figures(artifact.body))


def compiled(name: str, sized: Sized, block_size: int | None = None) -> Candidate:
    """``sized`` kept as a unified plan, frozen."""
    size = block_size if block_size is not None else sized.layout.engine.block_size
    return _frozen(name, "unified", size, pooled(sized))


def separated(name: str, sized: Sized, pooling: Pooling, tokens: int) -> Candidate:
    """The separate plan of ``sized`` for requests holding ``tokens`` tokens (the
    pool pass with ``pooling``, through the fold: its errors located), frozen."""
    step = Pass("pool", lambda s: pooled(s, separate_layouts(s, pooling, tokens)),
                Sized, Pooled)
    return _frozen(name, "separate", pooling.block_size, run(sized, (step,)))


def resized(sized: Sized, **engine: object) -> Sized | None:
    """The source compiled again up to its sized plan with other engine settings
    (the source's ``engine`` keys: ``block_size``, ``prefix_caching``, ...); None
    when it does not plan, or plans as the source does."""
    source = sized.source
    changed = source.model_copy(update={"engine": source.engine.model_copy(update=engine)})
    parsed = Parsed(text=sized.text, file=sized.file, memory=sized.memory, doc=sized.doc,
                    source=changed)
    try:
        out = run_until(parsed, Sized)
    except KvspecError:  # a variant the model does not plan is no candidate
        return None
    if out.layout.groups == sized.layout.groups and out.layout.engine == sized.layout.engine:
        return None
    return out


def _has_state(sized: Sized) -> bool:
    """Whether the model has state layers: vLLM then sizes attention blocks to the
    state page (hybrid page unification), so no other attention block size is one
    it would run."""
    return any(isinstance(s, MambaState) for st in sized.expansion.stage_specs
               for s in st.values())


def _no_prefix_caching(sized: Sized) -> Sized | None:
    """The plan without prefix caching (state layers then keep one state per
    request: vLLM's mamba_cache_mode none), or None when it has none to turn off."""
    if not sized.layout.engine.enable_prefix_caching:
        return None
    if _has_state(sized):
        return resized(sized, prefix_caching=False, mamba_cache_mode="none")
    return resized(sized, prefix_caching=False)


def _separate(name: str, sized: Sized, pooling: Pooling, tokens: int) -> Candidate:
    """The separate plan; for ``auto``, one it cannot make is listed with why."""
    try:
        c = separated(name, sized, pooling, tokens)
    except KvspecError as err:
        if pooling.policy == "separate":
            raise
        base = compiled(name, sized)
        return dataclasses.replace(base, policy="separate", block_size=pooling.block_size,
                                   note=f"cannot plan: {err.message}")
    note = "vLLM 0.33 holds one shared pool" if pooling.serve_with == "vllm" else None
    return dataclasses.replace(c, note=note)


def _unified(sized: Sized, pooling: Pooling, uncached: Sized | None) -> list[Candidate]:
    """``auto``'s unified plans beside the source's: at other attention block sizes
    (models without state layers, whose block size vLLM derives from the state
    page), and without prefix caching (which frees the state blocks a request keeps
    for hits)."""
    out = []
    for b in () if _has_state(sized) else pooling.block_sizes:
        other = resized(sized, block_size=b)
        if other is not None and (pooling.max_groups is None
                                  or len(other.layout.groups) <= pooling.max_groups):
            out.append(compiled(f"unified, block {b}", other, b))
    if uncached is not None:
        out.append(compiled("unified, no prefix caching", uncached))
    return out


def candidates(sized: Sized, pooling: Pooling, tokens: int) -> list[Candidate]:
    """vLLM's plan first (the unified plan, the baseline), then what the policy
    weighs: ``separate``, its separate plan; ``auto``, the other unified plans and
    the separate plan of the source's and of the one without prefix caching."""
    out = [compiled("unified", sized)]
    if pooling.policy == "separate":
        out.append(_separate("separate", sized, pooling, tokens))
    elif pooling.policy == "auto":
        uncached = _no_prefix_caching(sized)
        out += _unified(sized, pooling, uncached)
        out.append(_separate("separate", sized, pooling, tokens))
        if uncached is not None:
            out.append(_separate("separate, no prefix caching", uncached, pooling, tokens))
    return out
