"""Where the reference planner and upstream vLLM 0.33.0 differ on purpose.

kvspec plans what the reference planner (a vLLM fork) plans. Upstream vLLM
0.33.0 differs from that fork in a few deliberate places; ``kvspec verify
--against vllm`` marks a difference they explain "differs by design" and names
the rule, and the plugin names the rule when it refuses a layout upstream
cannot serve. This table is the one list of them (docs/vllm.md shows it, and a
test keeps the two in step).

Each rule says when it applies to a plan and which compared fields it
explains (patterns of :mod:`.compare`'s field names: ``[*]`` any index, ``*``
anything).

>>> [r.id for r in RULES][:3]
['state-slot-layout', 'kpool-tail', 'drafter-pool']
>>> by_id("mamba-cache-all").explains("group[1].max_memory_usage_bytes")
True
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

from kvspec.model import kinds
from kvspec.model.plan import Plan
from kvspec.model.specs import Attention, MambaState, layer_specs

#: Fields that follow from the block count and the bytes per block.
_CAPACITY = ("num_blocks", "stage[*].num_blocks", "pool_bytes_per_block",
             "stage[*].pool_bytes_per_block", "stage[*].tensor*", "max_concurrency",
             "kv_cache_size_tokens", "estimated_max_model_len", "max_model_len")


@dataclass(frozen=True)
class Rule:
    """One deliberate difference between the reference fork and upstream vLLM."""

    id: str
    title: str
    #: What the reference planner (and so kvspec) does.
    reference: str
    #: What upstream vLLM 0.33.0 does instead.
    upstream: str
    #: Compared fields it explains (patterns); empty: none are compared.
    fields: tuple[str, ...]
    applies: Callable[[Plan], bool]

    def explains(self, field: str) -> bool:
        return any(_pattern(p).fullmatch(field) for p in self.fields)


@cache
def _pattern(text: str) -> re.Pattern[str]:
    """``group[*].x``: any group's ``x``; ``*`` elsewhere: anything."""
    parts = [re.escape(p).replace(r"\*", ".*") for p in text.split("[*]")]
    return re.compile(r"\[\d+\]".join(parts))


def _strategy(name: str) -> Callable[[Plan], bool]:
    return lambda plan: any(g.strategy == name for g in plan.groups)


def _any_spec(test: Callable[[object], bool]) -> Callable[[Plan], bool]:
    return lambda plan: any(test(s) for s in plan.specs.values())


def _draft_pool(plan: Plan) -> bool:
    return any(g.own_pool for g in plan.groups) or any(
        st.draft_num_blocks is not None for st in plan.stages)


def _stride_alignment(plan: Plan) -> bool:
    return plan.engine.axis_order.is_layer_compact and _any_spec(
        lambda s: getattr(s, "block_stride_alignment", None) is not None)(plan)


def _mamba_all(plan: Plan) -> bool:
    return plan.engine.mamba_cache_mode == "all" and _any_spec(
        lambda s: isinstance(s, MambaState))(plan)


def _dcp_unsharded(plan: Plan) -> bool:
    return plan.engine.decode_context_parallel_size > 1 and any(
        isinstance(s, Attention) and not s.dcp_sharded
        for g in plan.groups for s in layer_specs(g.spec))


def _prefix_match_unit(plan: Plan) -> bool:
    unit = plan.engine.prefix_match_unit
    return unit is not None and unit != plan.engine.block_size


def _eagle(plan: Plan) -> bool:
    return plan.engine.speculative_method is not None


RULES: tuple[Rule, ...] = (
    Rule("state-slot-layout", "GLM-5-Next state/attention aliasing layout",
         "groups MLA, indexer, Mamba and drafter layers into state slots whose pages "
         "alias one another (_get_kv_cache_groups_glm5_next, _glm5_next_tensor_layout)",
         "has no such layout: unify_kv_cache_spec_page_size refuses the page sizes "
         "(NotImplementedError), or BLHNC packs them instead", ("*",),
         _strategy("state_slots")),
    Rule("kpool-tail", "kpool indexer tail ring (KpoolTailSpec)",
         "keeps a one-block ring of a kpool indexer's raw tail, aliasing its indexer's page",
         "has no KpoolTailSpec (its nearest relative, CircularBufferSpec, is not aliased)",
         ("*",), _any_spec(lambda s: kinds.of(s).name == "kpool_tail")),
    Rule("drafter-pool", "a drafter's own pool (DraftSlidingWindowSpec)",
         "gives GLM-5-Next drafter layers a fixed pool of their own "
         "(VLLM_GLM5NEXT_DRAFT_POOL*, KVCacheConfig.draft_num_blocks)",
         "has neither the spec, the pool nor draft_num_blocks", ("*",), _draft_pool),
    Rule("block-stride-alignment", "block-stride alignment in layer-outer layouts",
         "keeps block_stride = page in layer-outer layouts and only rounds the block "
         "total up to the alignments' lcm",
         "pads every layer's block stride to its block_stride_alignment "
         "(_get_layer_block_stride), so blocks and tensors are larger",
         _CAPACITY, _stride_alignment),
    Rule("mamba-cache-all", "Mamba cache mode 'all'",
         "charges a state layer cdiv(max_model_len, block_size) + speculative pages per "
         "request in mode 'all'",
         "charges 1 + speculative pages, as in mode 'none' (MambaSpec.max_memory_usage_bytes)",
         ("group[*].max_memory_usage_bytes", "group[*].max_num_blocks_per_req",
          "max_concurrency", "kv_cache_size_tokens", "estimated_max_model_len",
          "max_model_len"), _mamba_all),
    Rule("dcp-block-size", "decode-context parallelism of unsharded caches",
         "scales every attention group's block by the DCP size (resolve_dcp_kv_block_size)",
         "scales only dcp_sharded specs", ("scheduler_block_size", "hash_block_size",
                                           "group[*].max_num_blocks_per_req"),
         _dcp_unsharded),
    Rule("prefix-match-unit", "prefix_match_unit other than the block size",
         "ignores prefix_match_unit when planning",
         "refuses a prefix_match_unit other than the block size for one group with "
         "prefix caching (ValueError)", ("*",), _prefix_match_unit),
    Rule("eagle-groups", "which group is the drafter's",
         "flags groups with non_causal_multi_token_decode layers, or the last layer's "
         "group for MTP (_annotate_eagle_groups)",
         "flags groups holding layers whose spec has is_draft", ("group[*].is_eagle_group",),
         _eagle),
    Rule("tp-replicas", "tensor-parallel replicas of MLA caches",
         "does not record replicas", "sets KVCacheConfig.kv_tp_replicas from "
         "max_tp_shards (MLA layers publish 1); planning is unchanged", (),
         lambda plan: False),
)

_BY_ID = {r.id: r for r in RULES}


def by_id(rule_id: str) -> Rule:
    return _BY_ID[rule_id]


def applicable(plan: Plan) -> tuple[Rule, ...]:
    """The rules that apply to ``plan``."""
    return tuple(r for r in RULES if r.applies(plan))


def explaining(field: str, rules: tuple[Rule, ...]) -> Rule | None:
    """The first of ``rules`` that explains a difference in ``field``."""
    return next((r for r in rules if r.explains(field)), None)


def markdown_table() -> str:
    """The table docs/vllm.md shows (a test checks the page holds it)."""
    lines = ["| rule | what | the reference (and kvspec) | upstream vLLM 0.33.0 |",
             "| --- | --- | --- | --- |"]
    lines += [f"| `{r.id}` | {r.title} | {r.reference} | {r.upstream} |" for r in RULES]
    return "\n".join(lines)
