"""Early checks: what would go wrong (or waste memory) in the engine, said up front.

Each check returns warnings with the numbers behind them; the engine would
only find these out after a model load, or never say them at all.

* a model with state layers whose ``max_num_seqs`` exceeds the pool's blocks
  (vLLM 0.33.0 then fails at start-up, "max_num_seqs exceeds available Mamba
  cache blocks", after a ten-minute load; vLLM issue 49064), or whose states
  fit fewer requests than ``max_num_seqs`` at once;
* page unification that inflates an attention group's block size, so prompts
  shorter than one block never hit the prefix cache (vLLM issue 40696);
* a scheduler block (LCM over groups) far above the configured block size
  (vLLM issue 52804);
* padding that wastes more than :data:`PADDING_WARN` of each block.

The checks read a plan through :class:`Checked` (its groups and stages), which the
planner's plan and an artifact's frozen body (read back as groups of specs) both
are: one set of rules, whichever side of ``freeze`` asks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from kvspec.errors import KvspecError
from kvspec.model.blocks import block_sizes
from kvspec.model.engine import Engine
from kvspec.model.specs import Attention, LayerSpec, MambaState, layer_specs

#: Share of a request's KV memory spent on one group's padding that is flagged.
PADDING_WARN = 0.10
#: Scheduler block (LCM over groups) over the configured block size to flag.
LCM_WARN = 8
#: The start of the state-slot warnings (they depend on the budget).
STATE_SLOTS = "state layers hold"
STATE_BLOCKS = "max_num_seqs"


class CheckedGroup(Protocol):
    """A group as the checks read it (on a stage: the layers the stage holds)."""

    @property
    def layer_names(self) -> tuple[str, ...]: ...
    @property
    def spec(self) -> LayerSpec: ...
    @property
    def own_pool(self) -> bool: ...
    @property
    def padding_slots(self) -> int: ...
    def layer_spec(self, name: str) -> LayerSpec: ...
    def blocks_per_request(self, engine: Engine) -> int: ...


class CheckedStage(Protocol):
    """A pipeline stage as the checks read it: its groups and one block's bytes."""

    @property
    def groups(self) -> Sequence[CheckedGroup]: ...
    @property
    def bytes_per_block(self) -> int: ...


class Checked(Protocol):
    """A plan as the checks read it: its groups and its stages."""

    @property
    def groups(self) -> Sequence[CheckedGroup]: ...
    @property
    def stages(self) -> Sequence[CheckedStage]: ...


def state_slot_warnings(engine: Engine, stage: CheckedStage, num_blocks: int) -> list[str]:
    """What the pool's block count means for a model with state layers:

    * vLLM 0.33.0 refuses to start when ``max_num_seqs`` exceeds the pool's
      blocks and CUDA graphs capture full decodes (its default): each decoding
      sequence needs a state block (``CompilationConfig``, vllm/config/compilation.py);
    * fewer requests' states than ``max_num_seqs`` fit at once: the rest wait
      for blocks (not an error, but ``max_num_seqs`` promises more).
    """
    groups = [g for g in stage.groups if g.layer_names
              and all(isinstance(s, MambaState) for s in layer_specs(g.spec))]
    if not groups:
        return []
    seqs = engine.max_num_seqs
    if seqs > num_blocks:
        return [(f"{STATE_BLOCKS} {seqs} is more than the pool's {num_blocks} blocks: vLLM "
                 f"0.33.0 refuses to start with full CUDA graphs (its default: 'max_num_seqs "
                 f"({seqs}) exceeds available Mamba cache blocks ({num_blocks})'); lower "
                 f"max_num_seqs to {num_blocks} or less, or give the KV cache more memory")]
    per_request = sum(g.blocks_per_request(engine) for g in groups)
    slots = (num_blocks - 1) // per_request if per_request else 0
    if slots >= seqs:
        return []
    return [(f"{STATE_SLOTS} {slots} requests' states at once in {num_blocks} blocks "
             f"({per_request} state blocks per request), below max_num_seqs {seqs}: more "
             f"running requests wait for blocks; lower max_num_seqs to {max(slots, 1)} to "
             "match, or give the KV cache more memory")]


def _inflated_blocks(engine: Engine, plan: Checked) -> list[str]:
    out = []
    for i, g in enumerate(plan.groups):
        specs = layer_specs(g.spec)
        if specs and all(isinstance(s, Attention) for s in specs) and \
                g.spec.prefix_cacheable and g.spec.block_size > engine.block_size:
            out.append(
                f"group {i} ({len(g.layer_names)} layers): page unification raised its block "
                f"size from {engine.block_size} to {g.spec.block_size} tokens; prompts "
                f"shorter than {g.spec.block_size} tokens never hit the prefix cache")
    return out


def _scheduler_block(engine: Engine, stage: CheckedStage) -> list[str]:
    # With mamba_cache_mode "none" a state group's block is the whole request
    # (max_model_len): no prefill aligns to it, so leave it out of this check.
    considered = [g for g in stage.groups if not (
        engine.mamba_cache_mode == "none"
        and all(isinstance(s, MambaState) for s in layer_specs(g.spec)))]
    try:
        sched, _ = block_sizes(engine, considered) if considered else (engine.block_size, 0)
    except KvspecError:  # a rejected prefix_match_unit is reported by the plan itself
        sched = engine.block_size
    if sched < LCM_WARN * engine.block_size * engine.decode_context_parallel_size:
        return []
    return [(f"the scheduler block (LCM of the groups' block sizes) is {sched} tokens, "
             f"{sched // engine.block_size}x the configured block_size {engine.block_size}: "
             "chunked prefill and prefix-cache hits align to it")]


def _padding(engine: Engine, stage: CheckedStage) -> list[str]:
    """A group's unused bytes in every block it holds, weighed by how many
    blocks a request holds in that group."""
    per_block = stage.bytes_per_block
    held = {i: g.blocks_per_request(engine) for i, g in enumerate(stage.groups)
            if g.layer_names and not g.own_pool}
    total = per_block * sum(held.values())
    if not (per_block and total):
        return []
    out = []
    for i, blocks in held.items():
        g = stage.groups[i]
        useful = sum(g.layer_spec(n).unpadded_page_size_bytes for n in g.layer_names)
        waste = (per_block - useful) * blocks
        if waste / total > PADDING_WARN:
            out.append(
                f"group {i} ({g.spec.ref_class}, {len(g.layer_names)} layers) leaves "
                f"{(per_block - useful) / per_block:.0%} of each block it holds unused "
                f"({useful} of {per_block} bytes; {g.padding_slots} padding slots): "
                f"{waste / total:.0%} of a request's KV memory is padding")
    return out


def early_checks(plan: Checked, engine: Engine, num_blocks: int | None = None) -> list[str]:
    """Every early-check warning for ``plan`` (sized for ``engine``; the state-slot
    check needs the budget's ``num_blocks``)."""
    if not plan.groups:
        return []
    st0 = plan.stages[0]
    warnings = []
    if num_blocks is not None:
        warnings += state_slot_warnings(engine, st0, num_blocks)
    return warnings + _inflated_blocks(engine, plan) + _scheduler_block(engine, st0) \
        + _padding(engine, st0)
