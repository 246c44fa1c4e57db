"""The pooling policy (docs/pooling.md): unified is today's plan, separate pools
compile, load and keep their block ids apart, auto keeps the best candidate its
runtime can serve, and every decision is recorded, re-planned and reported."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from kvspec.artifact import Artifact
from kvspec.compiled import read, verified
from kvspec.compiler import compile as compile_file
from kvspec.compiler import compile_source
from kvspec.errors import KvspecError
from kvspec.pooling.choose import TIE
from kvspec.pooling.figures import Figures, capacity_curve
from tests.conftest import ROOT, invoke
from tests.invariants import block_overlaps, check_artifact

torch = pytest.importorskip("torch")

#: A small hybrid: Mamba-2 state layers, full attention and a sliding window, sized
#: so CPU tests allocate megabytes.
HYBRID = """\
kvspec: 1
name: small-hybrid
engine: {{block_size: 16, max_model_len: 2048, max_num_seqs: 32, prefix_caching: {caching},
         memory: {memory}}}
defaults: {{num_kv_heads: 2, head_size: 64, dtype: bfloat16}}
layer_types:
  mamba: {{kind: mamba, mamba_type: mamba2, shapes: [[3, 256], [4, 16, 32]],
          dtypes: [bfloat16, float32]}}
  full: {{kind: full_attention}}
  window: {{kind: sliding_window, sliding_window: 256}}
layers:
  - {{repeat: 2, pattern: [mamba, mamba, full, window]}}
"""

POOLING = """\
pooling:
  policy: {policy}
  serve_with: {serve_with}
  workload: {{context_tokens: {{mean: 600, spread: 0.4}}, output_tokens: 64, requests: 60}}
"""


def source(policy: str = "separate", serve_with: str = "kvspec", *, memory: str = "96MiB",
           caching: str = "false", pooling: bool = True) -> str:
    text = HYBRID.format(memory=memory, caching=caching)
    if pooling:
        text += POOLING.format(policy=policy, serve_with=serve_with)
    return text


def write(tmp_path: Path, text: str, name: str = "src.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# -- unified is today's plan ------------------------------------------------------------

def test_unified_is_the_plan_without_a_pooling_section() -> None:
    plain = compile_source(source(pooling=False))
    text = source(pooling=False) + "pooling: {policy: unified}\n"
    unified = compile_source(text)
    assert plain.body == unified.body
    assert unified.body.pooling is None


def test_unified_with_a_workload_records_it_and_changes_nothing_else() -> None:
    plain = compile_source(source(pooling=False))
    art = compile_source(source("unified", "vllm"))
    record = art.body.pooling
    assert record is not None and record.policy == record.asked == "unified"
    assert [c.name for c in record.candidates] == ["unified"]
    assert msgspec.structs.replace(art.body, pooling=None) == plain.body


# -- separate ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def separate() -> object:
    return compile_source(source("separate"))


def test_separate_has_a_pool_per_layer_class_and_splits_the_budget(separate) -> None:
    body = separate.body
    pools = body.pooling.pools
    assert [p.name for p in pools] == ["mamba", "full_attention", "sliding_window_256"]
    shares = [p.share[0] / p.share[1] for p in pools]
    assert abs(sum(shares) - 1) < 1e-9 and all(s > 0 for s in shares)
    # each pool is sized for its share: its blocks' bytes within it
    budget = body.budget.memory
    for p, share in zip(pools, shares):
        assert p.budget.memory <= round(budget * share) + 1
    # attention at 16 tokens a block, whatever the state page
    kinds = {g.kind: g.block_size for g in body.groups}
    assert kinds["full_attention"] == kinds["sliding_window"] == 16


def test_separate_pools_carry_no_padding_slots(separate) -> None:
    assert all(g.padding_slots == 0 for g in separate.layout.groups)
    for p in separate.pools:
        assert all(g.padding_slots == 0 for g in p.layout.groups)


def test_separate_artifact_reads_back_and_replans(separate, tmp_path: Path) -> None:
    path = tmp_path / "a.kvlayout.json"
    separate.write(path)
    again = read(path)
    assert again.sha256 == separate.sha256
    assert [p.name for p in again.pools] == [p.name for p in separate.pools]


def test_a_separate_artifacts_edited_share_is_refused(separate) -> None:
    data = json.loads(separate.text())
    share = data["body"]["pooling"]["pools"][0]["share"]
    data["body"]["pooling"]["pools"][0]["share"] = [share[0] + 1, share[1]]
    with pytest.raises(KvspecError, match="sha256"):
        verified(json.dumps(data))


def test_each_pool_keeps_its_block_ids_apart(separate) -> None:
    for p in separate.pools:
        for st in p.layout.stages:
            for blocks in (2, 3, 5):
                assert block_overlaps(p.layout, st, blocks) == []
    assert check_artifact(separate) == []


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_separate_loads_one_buffer_per_pool(separate, device: str) -> None:
    from kvspec.runtime.loader import load

    cache = load(separate, device=device)
    names = [p.name for p in separate.body.pooling.pools]
    assert [n for n in cache.buffers if n != "scales"] == names
    assert cache.pool_blocks == {p.name: p.budget.num_blocks
                                 for p in separate.body.pooling.pools}
    assert set(cache.views) == set(separate.body.layers)


def test_no_two_block_ids_share_a_byte_in_any_pool(separate) -> None:
    """Write a marker into every block of every layer, then read every one back: a
    block id sharing bytes with another (in any layer of its pool) shows as a lost
    marker."""
    from kvspec.runtime.loader import load

    cache = load(separate, memory="24MiB", device="cpu")
    # markers fit every view's dtype (raw int8 state bytes too); two numberings, so
    # two overlapping blocks cannot hide behind one marker in both
    for step in (1, 7):
        marks = {}
        count = 0
        for name, view in cache.views.items():
            for b in range(1, view.shape[0]):
                value = (count * step) % 97 + 1
                view[b].fill_(value)
                marks[name, b] = value
                count += 1
        lost = [(n, b) for (n, b), v in marks.items()
                if not bool((cache.views[n][b] == v).all())]
        assert lost == []
    assert count > 100


def test_separate_under_vllm_is_refused_with_why(tmp_path: Path) -> None:
    path = write(tmp_path, source("separate", "vllm"))
    code, _out, err = invoke(["compile", str(path)])
    assert code == 1
    assert "the separate policy cannot be served by vLLM" in err
    assert "one shared pool" in err and "serve_with: kvspec" in err


# -- auto -------------------------------------------------------------------------------

@pytest.mark.parametrize("serve_with", ["kvspec", "vllm"])
def test_auto_keeps_the_best_candidate_its_runtime_serves(serve_with: str) -> None:
    art = compile_source(source("auto", serve_with, caching="true"))
    record = art.body.pooling
    chosen = record.candidates[record.chosen]
    assert chosen.note is None and chosen.simulated is not None
    servable = [c for c in record.candidates if c.note is None and c.simulated]
    best = max(c.simulated.mean_running for c in servable)
    assert chosen.simulated.mean_running >= best * (1 - TIE)
    if serve_with == "vllm":
        assert chosen.policy == "unified"
        assert all(c.note for c in record.candidates if c.policy == "separate")
    else:
        assert any(c.policy == "separate" and c.simulated for c in record.candidates)
    # the unified candidate is vLLM's plan: auto never does worse than it
    unified = record.candidates[0]
    assert unified.name == "unified"
    assert chosen.simulated.mean_running >= unified.simulated.mean_running * (1 - TIE)


def test_every_candidates_waste_adds_up_to_its_pools() -> None:
    art = compile_source(source("auto", "kvspec", caching="true"))
    for c in art.body.pooling.candidates:
        if c.waste is None:
            continue
        w = c.waste
        wasted = w.padding_slots + w.padded_pages + w.block_inflation + w.per_request + w.idle
        used = c.simulated.utilization_while_memory_bound
        # live + waste = the pools' bytes while memory binds (the live share is the
        # utilisation then; the waste is sampled, the utilisation read at every step)
        assert abs((w.pool_bytes - wasted) / w.pool_bytes - used) < 0.02, c.name


def test_auto_is_deterministic() -> None:
    a = compile_source(source("auto", "kvspec"))
    b = compile_source(source("auto", "kvspec"))
    assert a.sha256 == b.sha256


def test_a_workload_no_plan_serves_is_a_clear_error(tmp_path: Path) -> None:
    text = source("auto", "kvspec", memory="2MiB")
    path = write(tmp_path, text)
    code, _out, err = invoke(["compile", str(path)])
    assert code == 1 and "Traceback" not in err
    assert "hint:" in err


# -- the commands -----------------------------------------------------------------------

def test_trace_is_seeded_and_simulate_reads_it(tmp_path: Path) -> None:
    args = ["trace", "-n", "50", "--prompt-mean", "500", "--output-mean", "40", "--seed", "7"]
    code, first, _ = invoke(args)
    assert code == 0
    assert invoke(args)[1] == first
    rows = [json.loads(line) for line in first.splitlines()]
    assert len(rows) == 50 and all(r["prompt_tokens"] > 0 for r in rows)
    trace = tmp_path / "t.jsonl"
    trace.write_text(first)
    code, out, err = invoke(["simulate", "layouts/llama-3.1-8b.kvlayout.json", "--workload",
                             str(trace), "--num-blocks", "300", "--format", "json"])
    assert code == 0, err
    data = json.loads(out)
    assert set(data["kvspec"]) == {"steps", "mean_running", "peak_running", "preemptions",
                                   "hit_tokens", "mean_utilization", "peak_utilization",
                                   "utilization_while_waiting", "waiting_steps_by_reason",
                                   "utilization_while_memory_bound", "layout_waste"}
    assert data["requests"] == 50 and data["pools"] == [{"name": "device", "blocks": 300}]
    # fewer blocks: fewer requests run at once
    code, out, _ = invoke(["simulate", "layouts/llama-3.1-8b.kvlayout.json", "--workload",
                           str(trace), "--num-blocks", "150", "--format", "json"])
    assert json.loads(out)["kvspec"]["mean_running"] < data["kvspec"]["mean_running"]


def test_simulate_a_separate_source_uses_its_own_workload(tmp_path: Path) -> None:
    path = write(tmp_path, source("separate"))
    code, out, err = invoke(["simulate", str(path), "--format", "json"])
    assert code == 0, err
    data = json.loads(out)
    assert data["requests"] == 60
    assert [p["name"] for p in data["pools"]] == ["mamba", "full_attention",
                                                  "sliding_window_256"]


def test_simulate_against_vllm_refuses_separate_pools(tmp_path: Path, separate) -> None:
    path = tmp_path / "s.kvlayout.json"
    separate.write(path)
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"arrival": 0, "prompt_tokens": 10, "output_tokens": 2}\n')
    code, _out, err = invoke(["simulate", str(path), "--workload", str(trace),
                             "--against", "vllm"])
    assert code == 2
    assert "vLLM 0.33 holds one shared pool" in err


def test_simulate_points_at_a_bad_trace_line(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"arrival": 0, "prompt_tokens": 10, "output_tokens": 2}\n{oops\n')
    code, _out, err = invoke(["simulate", "layouts/llama-3.1-8b.kvlayout.json",
                             "--workload", str(trace)])
    assert code == 1
    assert err.startswith(f"{trace}:2:")


def test_simulate_without_a_trace_says_how_to_make_one() -> None:
    code, _out, err = invoke(["simulate", "layouts/llama-3.1-8b.kvlayout.json"])
    assert code == 2 and "kvspec trace" in err


def test_plan_of_a_separate_layout_prints_each_pool_and_the_decision() -> None:
    code, out, err = invoke(["plan", "layouts/pooling-auto.kvlayout.json"])
    assert code == 0, err
    assert "pool mamba (" in out and "pool full_attention (" in out
    assert "pooling: separate (asked auto, served by kvspec)" in out
    assert "kept: separate, no prefix caching" in out


def test_explain_shows_candidates_capacity_against_context_and_waste() -> None:
    code, out, err = invoke(["explain", "layouts/pooling-vllm.kvlayout.json"])
    assert code == 0, err
    section = out[out.index("POOLING"):out.index("WARNINGS")]
    assert "capacity against context" in section
    for kind in ("padding slots", "padded pages", "block inflation",
                 "per-request constants", "idle"):
        assert kind in section
    assert max(len(line) for line in section.splitlines()) <= 80
    code, out, err = invoke(["explain", "layouts/pooling-vllm.kvlayout.json", "--format",
                             "json"])
    assert code == 0
    assert json.loads(out)["pooling"]["kept"] == "unified"


def test_the_pooling_examples_choose_what_their_docs_say() -> None:
    """docs/pooling.md's claims about the three examples, checked on the artifacts."""
    auto = read(ROOT / "layouts/pooling-auto.kvlayout.json").body.pooling
    assert auto.candidates[auto.chosen].name == "separate, no prefix caching"
    vllm = read(ROOT / "layouts/pooling-vllm.kvlayout.json").body.pooling
    assert vllm.candidates[vllm.chosen].name == "unified"
    sep = read(ROOT / "layouts/pooling-separate.kvlayout.json").body.pooling
    assert sep.policy == "separate" and len(sep.pools) == 2
    doc = yaml.safe_load((ROOT / "layouts/pooling-auto.yaml").read_text())
    assert doc["pooling"]["serve_with"] == "kvspec"


#: The static figures read from committed artifacts: (artifact, each main pool's
#: blocks, requests of 2048 tokens each pool holds, live bytes of one such request,
#: the bytes the pools are sized for). A drafter's own pool is no main pool; a
#: separate plan's pools each get their share, rounded down.
FIGURES = [
    ("llama-3.1-8b", {"device": 20480}, [(20479 / 128, "device")], 128 * 2048 * 1024,
     40 << 30),
    ("pooling-separate", {"sliding_window_1024": 5286, "full_attention": 38044},
     [(5285 / 129, "sliding_window_1024"), (38043 / 128, "full_attention")], 301989888,
     (40 << 30) - 1),
    ("example-glm5-next-drafter", {"device": 2773}, [(252.0, "device")], 19707392, 8 << 30),
]


@pytest.mark.parametrize("name,blocks,at_2048,live,memory", FIGURES)
def test_figures_read_the_frozen_artifact(name: str, blocks: dict[str, int],
                                          at_2048: list[tuple[float, str]], live: int,
                                          memory: int) -> None:
    body = Artifact.read(ROOT / "layouts" / f"{name}.kvlayout.json").body
    figures = Figures(body)
    assert {p.name: p.num_blocks for p in figures.pools} == blocks
    got = figures.workload_requests(2048)
    assert [n for _, n in got] == [n for _, n in at_2048]
    assert [v for v, _ in got] == pytest.approx([v for v, _ in at_2048])
    assert figures.live_bytes(2048) == live
    assert figures.memory() == memory
    assert figures.physical_limit(2048) == body.budget.memory / live
    assert figures.static_requests() == body.budget.max_concurrency
    curve = capacity_curve(figures, 2048)
    assert curve[2] == (2048, round(min(v for v, _ in at_2048), 2))


# -- auto in time (docs/pooling.md#auto-in-time) ------------------------------------------

PROFILE = """\
kvspec_profile: 1
describes: {engine: vllm, engine_version: 0.33.0, device: test, model: m,
  tensor_parallel_size: 1, pipeline_parallel_size: 1, dtype: bfloat16, kv_cache_dtype: auto,
  kvspec_version: 0.3.0}
step_time: {form: linear, fixed: 5ms, prefill_tokens: 100us, decode_requests: 50us,
  context_tokens: 0ns, prefill_pairs: 0ps}
provenance: {method: declared, date: 2025-06-01, command: written by hand}
"""

SHARED = """\
kvspec: 1
name: shared-prefix
model: m
engine: {{block_size: 16, max_model_len: 4096, max_num_seqs: 64, max_num_batched_tokens: 512,
         prefix_caching: true, memory: 1GiB}}
defaults: {{num_kv_heads: 2, head_size: 64, dtype: bfloat16}}
layers:
  - {{repeat: 4, kind: full_attention}}
pooling:
  policy: auto
  serve_with: vllm
  block_sizes: [16]
  workload: {{trace: shared.jsonl}}
{judge}"""


def shared_prefix(tmp_path: Path, judge: str) -> Any:
    """The issue's example: prompts of 2,000 tokens sharing a 1,800-token system
    prompt, one every 8 steps, chunked 512 tokens a step. On the step clock a chunk
    costs what a decode costs, so the plan without prefix caching keeps each request
    three steps longer and runs more of them on average; on a linear profile its
    prefills take 10x longer and it misses a 100 ms TTFT."""
    lines = [json.dumps({"arrival": 8 * i, "prompt_tokens": 2000, "output_tokens": 32,
                         "prefix_id": "sys", "prefix_tokens": 1800}) for i in range(120)]
    write(tmp_path, "\n".join(lines) + "\n", "shared.jsonl")
    write(tmp_path, PROFILE, "p.profile.yaml")
    path = write(tmp_path, SHARED.format(judge=judge))
    return compile_file(path).body.pooling


def test_auto_with_an_slo_keeps_the_goodput_winner_where_mean_running_disagrees(
        tmp_path: Path) -> None:
    by_running = shared_prefix(tmp_path, "")
    names = [c.name for c in by_running.candidates]
    cached, uncached = names.index("unified"), names.index("unified, no prefix caching")
    running = [c.simulated.mean_running for c in by_running.candidates[:2]]
    # today's rule (no profile, no SLO): more than 1% more running: prefix caching off
    assert running[uncached] > running[cached] * (1 + TIE)
    assert by_running.chosen == uncached and by_running.judged_by is None
    with_slo = shared_prefix(tmp_path, "  slo: {ttft_p99: 100ms}\n"
                                       "  step_time: {profile: p.profile.yaml}\n")
    c = with_slo.candidates
    assert with_slo.chosen == cached
    assert c[cached].simulated.goodput_requests_per_s > \
        c[uncached].simulated.goodput_requests_per_s * (1 + TIE)
    # mean running stays in the record, and the record names the profile it used
    assert c[uncached].simulated.mean_running > c[cached].simulated.mean_running
    judged = with_slo.judged_by
    profile = tmp_path / "p.profile.yaml"
    assert judged.metric == "goodput" and judged.slo == ["ttft_p99=100ms"]
    assert judged.profile == str(profile)
    assert judged.profile_sha256 == hashlib.sha256(profile.read_bytes()).hexdigest()
    # a profile alone: the throughput winner
    by_throughput = shared_prefix(tmp_path, "  step_time: {profile: p.profile.yaml}\n")
    assert by_throughput.chosen == cached and by_throughput.judged_by.metric == "throughput"
    # an SLO alone: the constant model at the workload's step_ms
    constant = shared_prefix(tmp_path, "  slo: {ttft_p99: 100ms}\n")
    assert constant.judged_by.profile is None and constant.judged_by.step_ms == 20
    assert constant.candidates[0].simulated.requests_per_s is not None


def test_auto_in_time_is_deterministic(tmp_path: Path) -> None:
    judge = "  slo: {ttft_p99: 100ms}\n  step_time: {profile: p.profile.yaml}\n"
    assert shared_prefix(tmp_path, judge) == shared_prefix(tmp_path, judge)
