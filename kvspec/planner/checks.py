"""Early checks: what would go wrong (or waste memory) in the engine, said up front.

Each check returns warnings with the numbers behind them; the engine would
only find these out after a model load, or never say them at all.

* state slots below ``max_num_seqs`` (vLLM issue 49064: "max_num_seqs exceeds
  available Mamba cache blocks" after a ten-minute load);
* page unification that inflates an attention group's block size, so prompts
  shorter than one block never hit the prefix cache (vLLM issue 40696);
* a scheduler block (LCM over groups) far above the configured block size
  (vLLM issue 52804);
* padding that wastes more than :data:`PADDING_WARN` of each block.
"""

from __future__ import annotations

from kvspec.planner.plan import Plan, Resolved
from kvspec.planner.size import block_sizes, group_blocks_per_request
from kvspec.spec import Attention, MambaState, layer_specs

#: Share of a request's KV memory spent on one group's padding that is flagged.
PADDING_WARN = 0.10
#: Scheduler block (LCM over groups) over the configured block size to flag.
LCM_WARN = 8


def early_checks(plan: Plan, resolved: Resolved | None = None) -> list[str]:
    engine = resolved.engine if resolved is not None else plan.engine
    warnings: list[str] = []
    if not plan.groups:
        return warnings
    st0 = plan.stages[0]

    state_groups = [g for g in st0.groups
                    if g.layer_names and all(isinstance(s, MambaState) for s in layer_specs(g.spec))]
    if resolved is not None and state_groups:
        per_request = sum(group_blocks_per_request(engine, g) for g in state_groups)
        slots = (resolved.num_blocks - 1) // per_request if per_request else 0
        if slots < engine.max_num_seqs:
            warnings.append(
                f"state layers hold {slots} requests' states in {resolved.num_blocks} blocks "
                f"({per_request} state blocks per request), below max_num_seqs "
                f"{engine.max_num_seqs}: lower max_num_seqs to {max(slots, 1)} or give the KV "
                "cache more memory (vLLM fails at start-up with 'max_num_seqs exceeds "
                "available Mamba cache blocks')")

    for i, g in enumerate(plan.groups):
        specs = layer_specs(g.spec)
        if specs and all(isinstance(s, Attention) for s in specs) and \
                g.spec.prefix_cacheable and g.spec.block_size > engine.block_size:
            warnings.append(
                f"group {i} ({len(g.layer_names)} layers): page unification raised its block "
                f"size from {engine.block_size} to {g.spec.block_size} tokens; prompts "
                f"shorter than {g.spec.block_size} tokens never hit the prefix cache")

    # With mamba_cache_mode "none" a state group's block is the whole request
    # (max_model_len): no prefill aligns to it, so leave it out of this check.
    considered = [g for g in st0.groups if not (
        engine.mamba_cache_mode == "none"
        and all(isinstance(s, MambaState) for s in layer_specs(g.spec)))]
    try:
        sched, _ = block_sizes(engine, considered) if considered else (engine.block_size, 0)
    except Exception:  # a rejected prefix_match_unit is reported by the plan itself
        sched = engine.block_size
    if sched >= LCM_WARN * engine.block_size * engine.decode_context_parallel_size:
        warnings.append(
            f"the scheduler block (LCM of the groups' block sizes) is {sched} tokens, "
            f"{sched // engine.block_size}x the configured block_size {engine.block_size}: "
            "chunked prefill and prefix-cache hits align to it")

    # Padding that costs capacity: a group's unused bytes in every block it
    # holds, weighed by how many blocks a request holds in that group.
    per_block = st0.bytes_per_block
    groups = [g for g in st0.groups if g.layer_names and not g.own_pool]
    held = {id(g): group_blocks_per_request(engine, g) for g in groups}
    total = per_block * sum(held.values())
    if per_block and total:
        for i, g in enumerate(st0.groups):
            if id(g) not in held:
                continue
            useful = sum(g.layer_spec(n).unpadded_page_size_bytes for n in g.layer_names)
            waste = (per_block - useful) * held[id(g)]
            if waste / total > PADDING_WARN:
                warnings.append(
                    f"group {i} ({g.spec.ref_class}, {len(g.layer_names)} layers) leaves "
                    f"{(per_block - useful) / per_block:.0%} of each block it holds unused "
                    f"({useful} of {per_block} bytes; {g.padding_slots} padding slots): "
                    f"{waste / total:.0%} of a request's KV memory is padding")
    return warnings
