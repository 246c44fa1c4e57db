"""The engine settings ``kvspec init`` writes, after vLLM's config-stage rules.

A source for a deployment carries what the engine will run with, not the
engine's defaults: for a hybrid (a model with Mamba-style state layers) with
prefix caching, vLLM 0.33.0 sets ``mamba_cache_mode: align``, raises the
attention block size until one attention page holds one state, makes
``mamba_block_size`` that block, and gives Mamba-2 mixers (and Gated-DeltaNet
layers on FlashInfer) a prefill-checkpoint block. The rules themselves, with
the vLLM code each follows, are :mod:`kvspec.integrations.rules`.

>>> h = Hybrid(block_size=1040, attention_page=4259840, state_page=4255744,
...            mode="align", mamba_types=("mamba2",))
>>> h.state_fields("mamba2")
{'num_prefill_checkpoint_blocks': 1, 'prefill_checkpoint_alignment': 1}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvspec.errors import KvspecError, UsageError
from kvspec.integrations import rules
from kvspec.integrations.hf.families import ModelFacts
from kvspec.integrations.hf.families.facts import LATENT, STATE
from kvspec.integrations.options import InitOptions
from kvspec.source.writer import exact_size

GDN = "gdn_attention"


@dataclass(frozen=True)
class Hybrid:
    """What the engine sets for a hybrid: the raised block and the state mode."""

    #: The attention block size (and, in align mode, ``mamba_block_size``).
    block_size: int
    #: Bytes per rank of one attention page at ``block_size``, and of one state.
    attention_page: int
    state_page: int
    #: ``mamba_cache_mode`` (align with prefix caching, else none).
    mode: str
    mamba_types: tuple[str, ...] = ()
    #: The GDN prefill backend (models with GDN layers only).
    gdn_backend: str | None = None
    #: The model's prefill-checkpoint alignment (:func:`rules.prefill_checkpoint_alignment`).
    checkpoint_alignment: int | None = None
    #: The block on the other GDN prefill backend, when no target was named.
    other_block: int | None = None

    def state_fields(self, mamba_type: str) -> dict[str, int]:
        """The prefill-checkpoint fields of a state layer of ``mamba_type``."""
        return rules.checkpoint_fields(mamba_type, self.checkpoint_alignment, self.block_size)


def hybrid(facts: ModelFacts, pages: tuple[int, int] | None, options: InitOptions,
           target: rules.Target, head_k_dim: int | None) -> Hybrid | None:
    """The engine's hybrid settings, from ``pages`` = (attention bytes per token,
    state bytes) per rank; None for a model without state layers."""
    types = tuple(sorted({lay.mamba_type or "" for lay in facts.layers if lay.kind == STATE}))
    if not types:
        return None
    block_size = options.block_size
    assert block_size is not None, "source_text settles the block size first"
    mode = rules.mamba_cache_mode(options.prefix_caching)
    backend = rules.gdn_prefill_backend(target, head_k_dim) if GDN in types else None
    alignment = rules.prefill_checkpoint_alignment(types, mode, backend or "")
    if pages is None:  # no attention layer: nothing to align to
        return Hybrid(block_size, 0, 0, mode, types, backend, alignment)
    per_token, state = pages
    mla = any(lay.kind == LATENT for lay in facts.layers)

    def block(align_to: int | None) -> int:
        return rules.hybrid_block_size(block_size, per_token, state, mla=mla,
                                       checkpoint_alignment=align_to, align=mode == "align")

    size = block(alignment)
    other = None
    if backend is not None and target.name is None and mode == "align":
        flash = rules.prefill_checkpoint_alignment(types, mode, "flashinfer")
        other = block(flash) if block(flash) != size else None
    return Hybrid(size, size * per_token, state, mode, types, backend, alignment, other)


def engine_section(facts: ModelFacts, options: InitOptions, hyb: Hybrid | None,
                   notes: list[str]) -> dict[str, Any]:
    """The source's ``engine:`` mapping, and the notes that explain it."""
    engine: dict[str, Any] = {"block_size": hyb.block_size if hyb else options.block_size}
    engine.update(_max_model_len(facts, options, notes))
    engine.update({"max_num_batched_tokens": 8192, "max_num_seqs": 256, "layout": "LBNHC",
                   "prefix_caching": options.prefix_caching})
    if hyb is not None and hyb.mode == "align":
        engine["mamba_cache_mode"] = hyb.mode
        engine["mamba_block_size"] = hyb.block_size
    if options.memory is not None:
        engine["memory"] = exact_size(options.memory)
    if hyb is not None:
        notes += hybrid_notes(hyb, options)
    return engine


def _max_model_len(facts: ModelFacts, options: InitOptions, notes: list[str]) -> dict[str, Any]:
    if options.max_model_len == "auto":
        if facts.max_position_embeddings is None:
            raise KvspecError("max_model_len auto needs the model's max_position_embeddings, "
                              "which config.json does not give", file=options.config_name,
                              hint="pass --max-model-len N")
        if options.memory is None:
            raise UsageError("--max-model-len auto needs --memory to fit it to",
                             hint="pass --memory 40GiB, or a fixed --max-model-len")
        return {"max_model_len": "auto", "model_max_len": facts.max_position_embeddings}
    max_len = options.max_model_len or facts.max_position_embeddings
    if not max_len:
        raise KvspecError("config.json gives no max_position_embeddings",
                          file=options.config_name, hint="pass --max-model-len N")
    if options.max_model_len is None:
        notes.append(f"max_model_len is the model's max_position_embeddings "
                     f"({max_len}); serving shorter requests needs less memory.")
    return {"max_model_len": max_len}


def hybrid_notes(hyb: Hybrid, options: InitOptions) -> list[str]:
    """Why the engine section of a hybrid reads as it does (docs/engine-rules.md)."""
    notes = []
    if hyb.mode == "align":
        notes.append("mamba_cache_mode is align and mamba_block_size is block_size, as vLLM "
                     "0.33 sets them for a hybrid with prefix caching: state layers keep a "
                     "state per block, and a request holds 2 state blocks per layer, 3 where "
                     "the layer keeps a prefill checkpoint (num_prefill_checkpoint_blocks).")
    if hyb.block_size != options.block_size:
        notes.append(f"engine.block_size is {hyb.block_size}, as vLLM sets it: one attention "
                     f"page ({hyb.attention_page} B per rank) must hold one state "
                     f"({hyb.state_page} B per rank); the planner pads state pages to it.")
    if hyb.gdn_backend is not None and hyb.mode == "align":
        if hyb.other_block is not None:
            notes.append(f"block_size {hyb.block_size} assumes a Gated-DeltaNet prefill other "
                         "than FlashInfer (Ampere, Ada): on Hopper, and Blackwell, vLLM "
                         "prefills with FlashInfer, whose checkpoints align to "
                         f"{rules.FLASHINFER_GDN_CHECKPOINT_ALIGNMENT} tokens, and the block "
                         f"is {hyb.other_block}; say where it runs with --target.")
        elif options.target is not None:
            align = hyb.checkpoint_alignment or 1
            notes.append(f"on {options.target} vLLM prefills Gated-DeltaNet layers with "
                         f"{hyb.gdn_backend} (checkpoint alignment {align} tokens).")
    return notes
