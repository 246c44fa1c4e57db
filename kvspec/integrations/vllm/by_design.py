"""Where the reference planner and upstream vLLM 0.33.0 differ on purpose.

kvspec plans what the reference planner (a vLLM fork) plans. Upstream vLLM
0.33.0 differs from that fork in a few deliberate places; ``kvspec verify
--against vllm`` marks a difference they explain "differs by design" and names
the rule, and the plugin names the rule when it refuses a layout upstream
cannot serve. This table is the one list of them (docs/vllm.md shows it, and a
test keeps the two in step).

Each rule says when it applies to a plan and which compared fields it
explains (patterns of :mod:`.compare`'s field names: ``[*]`` any index, ``*``
anything). A rule whose upstream behaviour is a refusal explains the
``outcome`` only, and only the refusal it names (the exception's type and the
start of its message): a plan upstream does plan, or refuses for another
reason, is not its to explain.

>>> [r.id for r in RULES][:3]
['state-slot-layout', 'kpool-tail', 'drafter-pool']
>>> by_id("mamba-cache-all").explains("group[1].max_memory_usage_bytes")
True
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Protocol

from kvspec.model import kinds
from kvspec.model.engine import Engine
from kvspec.model.specs import (
    Attention,
    FullAttention,
    LayerSpec,
    MambaState,
    SlidingWindow,
    SlidingWindowMLA,
    UniformType,
    layer_specs,
)


class _GroupLike(Protocol):
    """What the rules read of a group: a :class:`kvspec.model.plan.Group`, or the
    plugin's (:class:`.frozen.GroupFacts`)."""

    @property
    def layer_names(self) -> tuple[str, ...]: ...

    @property
    def spec(self) -> LayerSpec: ...

    @property
    def strategy(self) -> str: ...

    @property
    def own_pool(self) -> bool: ...


class _StageLike(Protocol):
    @property
    def draft_num_blocks(self) -> int | None: ...
    @property
    def groups(self) -> Sequence[_GroupLike]: ...


class Plan(Protocol):
    """What the rules read of a plan: a :class:`kvspec.model.plan.Plan`, or the
    plugin's view of a frozen artifact (:meth:`..guard.Expectation.facts`)."""

    @property
    def engine(self) -> Engine: ...
    @property
    def specs(self) -> Mapping[str, LayerSpec]: ...
    @property
    def groups(self) -> Sequence[_GroupLike]: ...
    @property
    def stages(self) -> Sequence[_StageLike]: ...


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
    #: Upstream's refusals it explains (the ``outcome`` field), each as
    #: ``"Type: the start of the message"`` (``*``: anything); empty: any refusal,
    #: where its fields cover ``outcome``.
    refusals: tuple[str, ...] = ()

    @property
    def everything(self) -> bool:
        """It explains every field (its upstream plans differently throughout)."""
        return self.fields == ("*",)

    def explains(self, field: str, refusal: str | None = None) -> bool:
        """Whether it explains a difference in ``field``; ``refusal``: upstream's
        refusal (``"Type: message"``), for the ``outcome`` field."""
        if field == "outcome" and self.refusals and not any(
                _pattern(p).match(refusal or "") for p in self.refusals):
            return False
        return any(_pattern(p).fullmatch(field) for p in self.fields)


@cache
def _pattern(text: str) -> re.Pattern[str]:
    """``group[*].x``: any group's ``x``; ``*`` elsewhere: anything (a refusal's
    ``ValueError: Invalid *`` is matched at the start of upstream's)."""
    parts = [re.escape(p).replace(r"\*", ".*") for p in text.split("[*]")]
    return re.compile(r"\[\d+\]".join(parts))


def _strategy(name: str) -> Callable[[Plan], bool]:
    return lambda plan: any(g.strategy == name for g in plan.groups)


def _any_spec(test: Callable[[LayerSpec], bool]) -> Callable[[Plan], bool]:
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
    """A unit other than the block size: the engine's, or (one group) upstream's,
    the group's own times DCP where it is sharded (see ``engine-block-size``)."""
    unit, engine = plan.engine.prefix_match_unit, plan.engine
    if unit is None:
        return False
    if len(plan.groups) != 1:
        return unit != engine.block_size
    spec = plan.groups[0].spec
    dcp = engine.decode_context_parallel_size if getattr(spec, "dcp_sharded", False) else 1
    return unit != engine.block_size or unit != spec.block_size * dcp


def _eagle(plan: Plan) -> bool:
    return plan.engine.speculative_method is not None


def _sink_states(plan: Plan) -> bool:
    return _any_spec(lambda s: kinds.of(s).name == "sink_full_attention"
                     and getattr(s, "tokens_per_state", 1) != 1)(plan)


def _lookahead(plan: Plan) -> bool:
    return plan.engine.num_prefill_lookahead_tokens > 1 and _any_spec(
        lambda s: isinstance(s, SlidingWindow))(plan)


def _swa_mla_promoted(plan: Plan) -> bool:
    return not plan.engine.hybrid and _any_spec(
        lambda s: isinstance(s, SlidingWindowMLA))(plan) and _any_spec(
        lambda s: isinstance(s, FullAttention))(plan)


def _async_pipeline(plan: Plan) -> bool:
    return plan.engine.pipeline_parallel_size > 1 and plan.engine.async_scheduling_resolved


def _engine_block_size(plan: Plan) -> bool:
    return len(plan.groups) == 1 and plan.groups[0].spec.block_size != plan.engine.block_size


def _stage_without_uniform_group(plan: Plan) -> bool:
    """A pipeline stage holds none of the layers of a group that packs specs of
    several shapes (the reference's UniformTypeKVCacheSpecs)."""
    packed = {i for i, g in enumerate(plan.groups) if isinstance(g.spec, UniformType)}
    return len(plan.stages) > 1 and any(
        not st.groups[i].layer_names for st in plan.stages for i in packed)


RULES: tuple[Rule, ...] = (
    Rule("state-slot-layout", "GLM-5-Next state/attention aliasing layout",
         "groups MLA, indexer, Mamba and drafter layers into state slots whose pages "
         "alias one another (_get_kv_cache_groups_glm5_next, _glm5_next_tensor_layout)",
         "has no such layout: unify_kv_cache_spec_page_size refuses the page sizes "
         "(NotImplementedError; in BHLNC, ValueError: the layout cannot express them), "
         "or BLHNC packs them instead", ("*",),
         _strategy("state_slots")),
    Rule("kpool-tail", "kpool indexer tail ring (KpoolTailSpec)",
         "keeps a one-block ring of a kpool indexer's raw tail, aliasing its indexer's page",
         "has no KpoolTailSpec (its nearest relative, CircularBufferSpec, is not aliased)",
         ("outcome",), _any_spec(lambda s: kinds.of(s).name == "kpool_tail"),
         refusals=("NotUpstream: vLLM * has no KpoolTailSpec",)),
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
         "prefix caching (ValueError)", ("outcome",), _prefix_match_unit,
         refusals=("ValueError: Invalid prefix_match_unit",)),
    Rule("eagle-groups", "which group is the drafter's",
         "flags groups with non_causal_multi_token_decode layers, or the last layer's "
         "group for MTP (_annotate_eagle_groups)",
         "flags groups holding layers whose spec has is_draft", ("group[*].is_eagle_group",),
         _eagle),
    Rule("engine-block-size", "one group whose block size is not engine.block_size",
         "takes the configured engine block_size x DCP as the scheduler and hash block "
         "size of a single group (resolve_kv_cache_block_sizes reads "
         "cache_config.block_size)",
         "first sets cache_config.block_size to the smallest prefix-cacheable group's "
         "block size (EngineCore._initialize_kv_caches), so a single group's own block "
         "size x DCP", ("scheduler_block_size", "hash_block_size"), _engine_block_size),
    Rule("pp-packed-group", "a pipeline stage without any layer of a packed group",
         "projects the group to no layers and places tensors for the stage's own layers "
         "only",
         "keeps the group's UniformTypeKVCacheSpecs whole when the stage has none of its "
         "layers (_project_kv_cache_groups_to_worker), and get_kv_cache_config_from_groups "
         "places tensors for those other stages' layers", ("stage[*].tensor*",),
         _stage_without_uniform_group),
    Rule("async-pipeline", "async scheduling with more than one pipeline stage",
         "counts pipeline stages + 1 batches in flight, as vLLM's Model Runner V2 (its "
         "default on GPUs) does, so sliding-window and chunked-local groups keep blocks "
         "for one more batch",
         "with the V1 model runner (the CPU platform, or a model V2 does not support "
         "yet) counts pipeline stages: V1 does not overlap steps under PP "
         "(VllmConfig.max_concurrent_batches)", ("group[*].max_memory_usage_bytes",
                                     "group[*].max_num_blocks_per_req", "max_concurrency",
                                     "kv_cache_size_tokens", "estimated_max_model_len",
                                     "max_model_len"), _async_pipeline),
    Rule("encoder-only-layers", "encoder-only attention layers",
         "plans encoder-only layers (EncoderOnlyAttentionSpec) into a group of their own, "
         "with pages in every block", "leaves them out of planning (their "
         "get_kv_cache_spec is None) and adds their group afterwards, without memory "
         "(may_add_encoder_only_layers_to_kv_cache_config)", ("*",),
         _any_spec(lambda s: kinds.of(s).name == "encoder_only")),
    Rule("sink-tokens-per-state", "sink layers that store other than one state per token",
         "kvspec plans them as it plans any full-attention layers (docs/deviations.md, 3: "
         "the reference's SinkFullAttentionSpec.merge drops tokens_per_state, as "
         "upstream's does)", "cannot merge even identical such layers: the merged spec "
         "loses tokens_per_state, so its same-spec check fails (AssertionError) or the "
         "layers are packed as UniformTypeKVCacheSpecs", ("*",), _sink_states),
    Rule("prefill-lookahead", "prefill_lookahead_tokens above 1",
         "keeps prefill_lookahead_tokens - 1 more tokens in each sliding window "
         "(the reference's num_prefill_lookahead_tokens, as the source gives it)",
         "derives the lookahead from --speculative-config (a multi-module MTP drafter: its "
         "speculative tokens; another EAGLE-family drafter: 1; none: 0), so verify plans "
         "with what its stand-in config derives", (
             "group[*].max_memory_usage_bytes", "group[*].max_num_blocks_per_req",
             "max_concurrency", "kv_cache_size_tokens", "estimated_max_model_len",
             "max_model_len"), _lookahead),
    Rule("swa-mla-hybrid-off", "sliding-window MLA layers with the hybrid manager off",
         "kvspec allocates them as MLA layers (docs/deviations.md, 6: the reference's "
         "promotion fails the same way)", "fails to promote them: replace_as copies "
         "SlidingWindowMLASpec.bounded_replay, which MLAAttentionSpec does not have "
         "(TypeError in _promote_local_kv_cache_specs)", ("outcome",), _swa_mla_promoted,
         refusals=("TypeError: *unexpected keyword argument 'bounded_replay'",)),
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


def explaining(field: str, rules: tuple[Rule, ...], refusal: str | None = None
               ) -> Rule | None:
    """The rule of ``rules`` that explains a difference in ``field`` (``refusal``:
    upstream's refusal as ``"Type: message"``, for ``outcome``): the first that
    names the field, else the first that explains every field (``*``), so a
    difference is credited to the rule whose mechanism it is.

    >>> rules = (by_id("encoder-only-layers"), by_id("pp-packed-group"),
    ...          by_id("prefix-match-unit"))
    >>> explaining("stage[1].tensor[0].layers", rules).id
    'pp-packed-group'
    >>> explaining("outcome", rules, "ValueError: Invalid prefix_match_unit=8; ...").id
    'prefix-match-unit'
    >>> explaining("outcome", rules, "ValueError: KV cache layout BHLNC cannot ...").id
    'encoder-only-layers'
    >>> explaining("num_blocks", rules[1:]) is None
    True
    """
    named = next((r for r in rules if not r.everything and r.explains(field, refusal)), None)
    return named or next((r for r in rules if r.everything), None)


def _scope(rule: Rule) -> str:
    """What a rule explains, for the table."""
    if rule.everything:
        return "every field no rule naming it explains"
    if rule.refusals:
        return "vLLM's refusal " + ", ".join(f"`{r}`" for r in rule.refusals)
    return ", ".join(f"`{f}`" for f in rule.fields) or "nothing compared"


def markdown_table() -> str:
    """The table docs/vllm.md shows (a test checks the page holds it)."""
    lines = ["| rule | what | the reference (and kvspec) | upstream vLLM 0.33.0 | explains |",
             "| --- | --- | --- | --- | --- |"]
    lines += [f"| `{r.id}` | {r.title} | {r.reference} | {r.upstream} | {_scope(r)} |"
              for r in RULES]
    return "\n".join(lines)
