"""Workload vocabularies: the trace formats kvspec reads and the workload presets,
each preset with the numbers it reproduces, their source and how it was fitted
(docs/traces.md, docs/pooling.md#workload-presets). Data only: the readers are
:mod:`kvspec.sim.formats`, the sampling :mod:`kvspec.sim.presets`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["DEFAULT_STEP_MS", "FORMATS", "MOONCAKE_BLOCK_TOKENS", "PRESETS", "Preset",
           "TraceFormat"]

#: Milliseconds one engine step stands for, unless declared: a decode step of an
#: 8B model at a few dozen running requests on one H100-class GPU (a convention
#: for turning arrival times into steps, not a measurement; declare your own).
DEFAULT_STEP_MS = 20.0
#: Tokens per ``hash_ids`` block in Mooncake's traces (its FAST'25 README).
MOONCAKE_BLOCK_TOKENS = 512
#: The trace formats kvspec reads, in documentation order.
TraceFormat = Literal["kvspec", "azure-2023", "azure-2024", "mooncake", "burstgpt", "lengths"]
#: Each format (in :data:`TraceFormat`'s order) and what it reads
#: (``kvspec trace import --help``, docs/traces.md).
FORMATS: dict[TraceFormat, str] = {
    "kvspec": "kvspec's JSONL trace (arrival, prompt_tokens, output_tokens)",
    "azure-2023": "Azure LLM inference trace 2023: CSV TIMESTAMP, ContextTokens, "
                  "GeneratedTokens",
    "azure-2024": "Azure LLM inference trace 2024: the same columns",
    "mooncake": "Mooncake FAST'25 trace: JSONL timestamp (ms), input_length, "
                "output_length, hash_ids (512-token blocks)",
    "burstgpt": "BurstGPT: CSV Timestamp (s), Model, Request tokens, Response tokens, "
                "Total tokens, Log Type",
    "lengths": "any CSV or JSONL of lengths, with --columns prompt=...,output=...[,time=...]",
}


@dataclass(frozen=True, slots=True)
class Preset:
    """One workload preset (drawn by :func:`kvspec.sim.presets.preset_trace`)."""

    name: str
    title: str
    #: Where the numbers come from.
    source: str
    #: The table the lengths are drawn from, and the factor they are scaled by.
    table: str
    #: Mean arrivals per second, and the inter-arrival times' coefficient of variation.
    rate: float
    arrival_cv: float
    #: The published (or measured) statistics the preset reproduces: name -> value.
    stated: tuple[tuple[str, float], ...]
    #: How it was fitted, and what could not be checked.
    fit: str
    prompt_scale: float = 1.0
    output_scale: float = 1.0
    #: Content blocks (Mooncake's ``hash_ids``), when drawn: every prompt opens with one
    #: shared block (a system prompt); ``continuation`` of the requests continue one of
    #: the ``lookback`` before them (a conversation's next turn), the one of
    #: ``candidates`` drawn among them whose full blocks it holds most of, opening with
    #: those blocks; 0: no blocks drawn.
    continuation: float = 0.0
    lookback: int = 0
    candidates: int = 1
    block_tokens: int = 512


_AZURE = ("Azure LLM inference trace 2023 (Splitwise, ISCA 2024): "
          "github.com/Azure/AzurePublicDataset, data/AzureLLMInferenceTrace_{}.csv")
_MOONCAKE = ("Mooncake FAST'25 traces: github.com/kvcache-ai/Mooncake, "
             "FAST25-release/traces/{}_trace.jsonl")
_FITTED = ("lengths: the trace's own, 200 equal-probability bins; arrivals: its mean rate, "
           "Gamma inter-arrival times of its coefficient of variation")

#: The presets, by name.
PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("azure-conversation-2023", "Azure 2023, conversation (1 h, 19,366 requests)",
           _AZURE.format("conv"), "azure-conversation-2023", rate=5.5301, arrival_cv=1.094,
           stated=(("prompt_mean", 1154.7), ("prompt_p50", 1020), ("output_mean", 211.1),
                   ("output_p50", 129), ("rate", 5.5301), ("arrival_cv", 1.094)),
           fit=_FITTED + "; every figure measured on the file"),
    Preset("azure-code-2023", "Azure 2023, code (1 h, 8,819 requests)",
           _AZURE.format("code"), "azure-code-2023", rate=2.5664, arrival_cv=13.151,
           stated=(("prompt_mean", 2047.8), ("prompt_p50", 1469), ("output_mean", 27.88),
                   ("output_p50", 13), ("rate", 2.5664), ("arrival_cv", 13.151)),
           fit=_FITTED + "; every figure measured on the file"),
    Preset("mooncake-conversation", "Mooncake, conversation (1 h, 12,031 requests)",
           _MOONCAKE.format("conversation"), "mooncake-conversation", rate=3.4012,
           arrival_cv=3.034,
           stated=(("prompt_mean", 12035.1), ("prompt_p50", 6909), ("output_mean", 342.6),
                   ("output_p50", 350), ("rate", 3.4012), ("arrival_cv", 3.034),
                   ("block_reuse", 0.366)),
           continuation=0.387, lookback=1472, candidates=22,
           fit=_FITTED + "; every figure measured on the file (its timestamps are "
               "grouped: 90% of the gaps are 0 ms); prefix blocks: block 0 shared by all "
               "(as in the file), 38.7% of the requests continue an earlier one (as in "
               "the file, at a mean lag of 736 requests: a window of 1,472), the earlier "
               "one the best of 22 candidates, a number fitted so that 36.6% of the "
               "blocks are seen before (the file's reuse with an unlimited cache)"),
    Preset("mooncake-toolagent", "Mooncake, tool and agent (1 h, 23,608 requests)",
           _MOONCAKE.format("toolagent"), "mooncake-conversation", rate=23_608 / 3600,
           arrival_cv=3.034, prompt_scale=8596 / 12035.1, output_scale=182 / 342.6,
           stated=(("prompt_mean", 8596), ("output_mean", 182), ("rate", 23_608 / 3600)),
           fit="only the published means (the FAST'25 README: 23,608 requests in one hour, "
               "mean input 8,596, mean output 182) could be checked, not the file: the "
               "lengths borrow the conversation trace's shape, scaled to those means, and "
               "the arrivals its variation"),
)}
