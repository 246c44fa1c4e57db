"""kvspec's simulator against vLLM 0.33.0's own ``Scheduler`` and ``KVCacheManager``.

For every conformance case vLLM plans and every hybrid layout in ``layouts/``, three
traces (tens of requests, a block count small enough that requests wait and, in one
of them at least, are preempted) run through kvspec's scheduler model and manager
and through vLLM's scheduler (:mod:`kvspec.integrations.vllm.replay`), with the same
block count. Every step must be the same on both sides: running and waiting
requests, free blocks, tokens scheduled, preemptions, utilisation; and every
running request's block ids in every group, and the whole free queue, in order.

The layouts vLLM 0.33 cannot run as kvspec plans them are listed in
:data:`NOT_IN_VLLM` with the reason, and a test checks that vLLM refuses them.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from kvspec.compiled import CompiledArtifact as Artifact
from kvspec.compiled import read as read_artifact
from kvspec.runtime.manager import from_artifact
from kvspec.sim import generate_trace, run_artifact
from tests.vllm.cases import CASES, TOO_SMALL, artifact

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

LAYOUTS = Path(__file__).resolve().parents[2] / "layouts"

#: Plans kvspec simulates that vLLM 0.33 cannot run (by-design differences), and what
#: vLLM says: the state-slot layout's tail has no vLLM spec (by-design rules
#: state-slot-layout, kpool-tail, drafter-pool); vLLM's Mamba cache modes are "align"
#: and "none" (rule mamba-cache-all), and its MambaManager refuses any other with
#: prefix caching on.
_TAIL = "vLLM 0.33.0 has no KpoolTailSpec"
_ALL = "Mamba prefix caching requires mamba_cache_mode='align'"
NOT_IN_VLLM = {"syn-glm5-next": _TAIL, "example-glm5-next-drafter": _TAIL,
               "syn-mamba-all": _ALL, "example-mamba-cache-all": _ALL}


def _hybrid_layouts() -> list[str]:
    names = []
    for path in sorted(LAYOUTS.glob("*.kvlayout.json")):
        art = read_artifact(path)
        if art.pools:  # separate pools: vLLM 0.33 holds one shared pool, and the plugin
            continue   # refuses them (tests/vllm/test_engine_args_pooling.py)
        lay = from_artifact(art, 10)
        if any(g.kind != "full" for g in lay.groups):
            names.append(path.name.removesuffix(".kvlayout.json"))
    return names


SUBJECTS = [(n, "case") for n in CASES if n not in TOO_SMALL] + \
    [(n, "layout") for n in _hybrid_layouts()]


@cache
def _artifact(name: str, kind: str, tmp: str) -> Artifact:
    if kind == "layout":
        return read_artifact(LAYOUTS / f"{name}.kvlayout.json")
    return artifact(name, Path(tmp))[1]


def traces(art: Artifact) -> list[tuple[int, list]]:
    """Three (block count, trace) pairs: short prompts with long outputs and just the
    blocks the longest request needs (cheap admissions, then decoding requests run
    out of blocks); then prompts past the layout's windows, chunks and blocks, with
    shared prefixes, and more blocks."""
    lay = from_artifact(art, 10)
    sizes = [g.block_size for g in lay.groups if g.block_size < lay.max_model_len] or [16]
    reach = max([g.sliding_window or g.attention_chunk_size or 0 for g in lay.groups] + [0])
    prompt = max(300, int(reach * 1.3), int(max(sizes) * 1.3))
    if prompt > lay.max_model_len // 2:
        prompt = int(lay.max_model_len * 0.6)
    short = min(max(200, int(max(sizes) * 1.3)), lay.max_model_len // 4)
    longest = min(lay.max_model_len - 300, prompt * 2)
    shapes = [  # prompt mean, output mean, arrival rate, prefix share, blocks x need
        (short, min(max(600, reach), 1200, lay.max_model_len - 2 * short - 300), 1.0, 0.0, 1.05),
        (prompt, max(150, min(max(sizes) // 4, 300)), 0.5, 0.7, 1.8),
        (prompt, max(150, min(max(sizes) // 4, 300)), 0.3, 0.7, 3.0)]
    out = []
    for k, (mean, output, rate, share, more) in enumerate(shapes):
        trace = generate_trace(30, seed=k + 1, prompt_mean=mean, prompt_spread=0.35,
                               output_mean=output, output_spread=0.3, rate=rate,
                               max_prompt_tokens=min(longest, mean * 2),
                               prefix_groups=2 if share else 0, prefix_share=share,
                               prefix_tokens=int(mean * (0.5 + 0.3 * k)))
        tokens = min(max(r.prompt_tokens + r.output_tokens for r in trace), lay.max_model_len)
        need = sum(min(-(-tokens // g.block_size), _cap(g, lay)) + 1 for g in lay.groups)
        out.append((int(need * more) + 2, trace))
    return out


def _cap(group, lay) -> int:
    """Blocks an admission reserves at most in a group (vLLM's admission cap)."""
    if group.kind == "sliding":
        return -(-min(group.sliding_window - 1 + lay.max_in_flight_tokens,
                      lay.max_model_len) // group.block_size) + 1
    if group.kind == "local":
        return -(-min(group.attention_chunk_size + lay.max_in_flight_tokens,
                      lay.max_model_len) // group.block_size)
    if group.kind == "state":
        return 2
    return 1 << 30


def _compare(art: Artifact, num_blocks: int, trace: list, **settings) -> tuple[int, str | None]:
    from kvspec.integrations.vllm.replay import replay

    ours, engine = run_artifact(art, trace, num_blocks, log_blocks=True, **settings)
    theirs, vllm = replay(art, trace, num_blocks, hash_fn="sha256", log_blocks=True,
                          **settings)
    for i, (a, b) in enumerate(zip(ours.steps, theirs.steps)):
        if a != b:
            return ours.preemptions, f"step {i}: kvspec {a} != vLLM {b}"
        if engine.block_log[i] != vllm.block_log[i]:
            return ours.preemptions, f"step {i}: block tables or free queue differ"
    if len(ours.steps) != len(theirs.steps) or ours.as_dict() != theirs.as_dict():
        return ours.preemptions, f"kvspec {ours.as_dict()} != vLLM {theirs.as_dict()}"
    return ours.preemptions, None


@pytest.mark.parametrize("name,kind", [s for s in SUBJECTS if s[0] not in NOT_IN_VLLM],
                         ids=lambda v: v if isinstance(v, str) and v not in ("case", "layout")
                         else "")
def test_every_step_and_block_is_vllms(name: str, kind: str, tmp_path_factory) -> None:
    art = _artifact(name, kind, str(tmp_path_factory.mktemp(name)))
    preempted = 0
    for num_blocks, trace in traces(art):
        n, problem = _compare(art, num_blocks, trace)
        assert problem is None, f"{name}, {num_blocks} blocks: {problem}"
        preempted += n
    assert preempted > 0, "one of the traces preempts"


@pytest.mark.parametrize("name", ["llama-3.1-8b", "gemma-3-27b-it", "gpt-oss-20b",
                                  "jamba-v0.1", "qwen3-next-80b-a3b-thinking",
                                  "llama-4-scout-17b-16e-instruct", "nemotron-h-56b-base-8k"])
def test_synchronous_scheduling_too(name: str) -> None:
    """Without async scheduling (each step's tokens known before the next step)."""
    art = _artifact(name, "layout", "")
    for num_blocks, trace in traces(art):
        _, problem = _compare(art, num_blocks, trace, async_scheduling=False)
        assert problem is None, f"{name}, {num_blocks} blocks: {problem}"


@pytest.mark.parametrize("name,kind", [s for s in SUBJECTS if s[0] in NOT_IN_VLLM],
                         ids=lambda v: v if isinstance(v, str) and v not in ("case", "layout")
                         else "")
def test_plans_vllm_cannot_run_are_refused_by_vllm(name: str, kind: str,
                                                    tmp_path_factory) -> None:
    """Each entry of NOT_IN_VLLM is a plan vLLM 0.33 refuses (so the list stays honest),
    and kvspec simulates it."""
    from kvspec.integrations.vllm.replay import replay

    art = _artifact(name, kind, str(tmp_path_factory.mktemp(name)))
    num_blocks, trace = traces(art)[2]
    assert run_artifact(art, trace, num_blocks)[0].num_steps > 0
    # vLLM's own refusal, whatever its type: its message is checked below
    with pytest.raises(Exception) as caught:  # noqa: PT011
        replay(art, trace, num_blocks)
    assert NOT_IN_VLLM[name] in str(caught.value)


def block_trace(art: Artifact) -> tuple[int, list]:
    """Mooncake-style prompts (kvspec.sim.chains): content blocks of 64 tokens, most
    requests opening with blocks of an earlier one and branching off it, so hits come
    from chains that share some blocks and not others; and a block count that makes
    requests wait."""
    import random

    from kvspec.sim.trace import TraceRequest

    lay = from_artifact(art, 10)
    rng = random.Random(7)
    size, fresh, chains, trace = 64, 1, [(0,)], []
    for i in range(30):
        n = rng.randrange(2, 9)
        base = rng.choice(chains)
        k = min(rng.randrange(1, len(base) + 1), n)
        blocks = base[:k] + tuple(range(fresh, fresh + n - k))
        fresh += n - k
        chains.append(blocks)
        prompt = min(n * size - rng.randrange(0, size), lay.max_model_len // 2)
        trace.append(TraceRequest(i // 2, prompt, rng.randrange(20, 120), None, 0, blocks,
                                  size))
    tokens = min(max(r.prompt_tokens + r.output_tokens for r in trace), lay.max_model_len)
    need = sum(min(-(-tokens // g.block_size), _cap(g, lay)) + 1 for g in lay.groups)
    return need * 3 + 2, trace


@pytest.mark.parametrize("name", ["llama-3.1-8b", "gemma-3-27b-it", "jamba-v0.1",
                                  "nemotron-h-56b-base-8k"])
def test_prefix_blocks_hit_as_vllms(name: str) -> None:
    """Content blocks (Mooncake's hash_ids) give vLLM's hashes the same hits, step for
    step and block for block."""
    art = _artifact(name, "layout", "")
    num_blocks, trace = block_trace(art)
    _, problem = _compare(art, num_blocks, trace)
    assert problem is None, f"{name}, {num_blocks} blocks: {problem}"
