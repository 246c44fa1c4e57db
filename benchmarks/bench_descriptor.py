"""Descriptors per transferred block, and ``kvspec transfer`` on 10,000-layer artifacts
(issue 31's goals), in one run.

    python benchmarks/bench_descriptor.py [--layers 10000] [--repeat 3]

Descriptors: for each pair, the descriptors one destination rank posts per destination
block with kvspec's merged plan, against a per-layer, per-K/V connector (``layers x 2``
per source rank read) and vLLM 0.33.0's NIXL connector for the same cache where it can
move it (its own ``_compute_desc_ids`` rules, ``kvspec.connectors.exporters.vllm_nixl``).
The goal: no more than the contiguous byte runs, i.e. kvspec's count is the number of
runs the bytes form (checked: a run never continues into the next on both sides).

Planning time: two artifacts of ``--layers`` full-attention layers are compiled (not
timed), then ``plan_transfer`` is timed, same layout and TP 2 -> 1 ``LBHNC``, best of
``--repeat``, as a ratio to the 2 s goal and to reading the two artifacts
(``Artifact.read``) in the same run.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kvspec.artifact import Artifact
from kvspec.compiler import compile_source
from kvspec.connectors.transfer import plan_transfer

ROOT = Path(__file__).resolve().parents[1]


def _edit(name: str, **changes: str) -> Artifact:
    """A committed layout's source with text replaced, compiled."""
    text = (ROOT / "layouts" / f"{name}.yaml").read_text()
    for old, new in changes.items():
        assert old in text, (name, old)
        text = text.replace(old, new)
    return compile_source(text, f"{name}.yaml")


def _pairs() -> list[tuple[str, Artifact, Artifact]]:
    llama = Artifact.read(ROOT / "layouts" / "llama-3.1-8b.kvlayout.json")
    hnd = _edit("llama-3.1-8b", **{"layout: LBNHC": "layout: LBHNC"})
    outer = _edit("llama-3.1-8b", **{"layout: LBNHC": "layout: BLHNC"})
    gpt = Artifact.read(ROOT / "layouts" / "gpt-oss-120b.kvlayout.json")
    gpt_hnd2 = _edit("gpt-oss-120b", **{"layout: LBNHC": "layout: LBHNC"})
    gpt_hnd1 = _edit("gpt-oss-120b", **{"layout: LBNHC": "layout: LBHNC",
                                        "tensor: 2": "tensor: 1"})
    gemma = Artifact.read(ROOT / "layouts" / "gemma-3-27b-it.kvlayout.json")
    return [("llama-3.1-8b LBNHC", llama, llama), ("llama-3.1-8b LBHNC (HND)", hnd, hnd),
            ("llama-3.1-8b BLHNC", outer, outer), ("llama-3.1-8b LBNHC -> LBHNC", llama, hnd),
            ("gpt-oss-120b TP2 (hybrid)", gpt, gpt),
            ("gpt-oss-120b TP2 -> TP1 LBHNC", gpt_hnd2, gpt_hnd1),
            ("gemma-3-27b-it TP2 (hybrid)", gemma, gemma)]


def _counts() -> None:
    print(f"{'pair':<32} {'group':>5} {'layers':>6} {'kvspec':>7} {'layers x 2':>10} "
          f"{'vLLM':>5} {'vs layers x 2':>13} {'vs vLLM':>7}")
    for name, src, dst in _pairs():
        t = plan_transfer(src, dst)
        for r in t.plan.routes:  # every run is maximal: none continues into another
            starts = {(x.src_region, x.src_offset, x.src_stride, x.dst_region, x.dst_offset,
                       x.dst_stride) for x in r.runs}
            assert not any((x.src_region, x.src_offset + x.length, x.src_stride, x.dst_region,
                            x.dst_offset + x.length, x.dst_stride) in starts for x in r.runs)
        seen = set()
        for c in t.counts:
            key = (c.kind, c.layers, c.descriptors, c.vllm)
            if key in seen:  # gemma's six sliding-window groups alike: one row each kind
                continue
            seen.add(key)
            vllm = "-" if c.vllm is None else str(c.vllm)
            vs = "-" if c.vllm is None else f"{c.descriptors / c.vllm:.2f}x"
            print(f"{name:<32} {c.key:>5} {c.layers:>6} {c.descriptors:>7} "
                  f"{c.per_layer_kv:>10} {vllm:>5} {c.descriptors / c.per_layer_kv:>12.2f}x "
                  f"{vs:>7}")


def _source(layers: int, tp: int, layout: str) -> str:
    return (f"kvspec: 1\nname: big\nmodel: synthetic/big\n"
            f"layer_name: model.layers.{{index}}.self_attn.attn\n"
            f"engine: {{block_size: 16, max_model_len: 4096, max_num_seqs: 4, "
            f"max_num_batched_tokens: 4096, layout: {layout}}}\n"
            f"parallel: {{tensor: {tp}}}\n"
            f"defaults: {{num_kv_heads: 8, head_size: 128, dtype: bfloat16}}\n"
            f"layer_types:\n  full: {{kind: full_attention}}\n"
            f"layers:\n  - {{repeat: {layers}, pattern: [full]}}\n")


def _planning(layers: int, repeat: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for tp, layout in ((1, "LBNHC"), (2, "LBHNC"), (1, "LBHNC")):
            path = Path(tmp) / f"big-tp{tp}-{layout}.kvlayout.json"
            compile_source(_source(layers, tp, layout), "big.yaml").write(path)
            paths[tp, layout] = path
        print(f"\n# kvspec transfer on two {layers:,}-layer artifacts (best of {repeat}; "
              "goal < 2 s)")
        print(f"{'pair':<24} {'read both s':>11} {'plan s':>7} {'runs':>8} "
              f"{'vs goal':>8} {'vs read':>8}")
        for name, a, b in (("same, LBNHC", (1, "LBNHC"), (1, "LBNHC")),
                           ("TP2 -> TP1, LBHNC", (2, "LBHNC"), (1, "LBHNC"))):
            reads, plans = [], []
            for _ in range(repeat):
                start = time.perf_counter()
                src, dst = Artifact.read(paths[a]), Artifact.read(paths[b])
                reads.append(time.perf_counter() - start)
                start = time.perf_counter()
                t = plan_transfer(src, dst)
                plans.append(time.perf_counter() - start)
            runs = sum(len(r.runs) for r in t.plan.routes)
            print(f"{name:<24} {min(reads):>11.3f} {min(plans):>7.3f} {runs:>8,} "
                  f"{min(plans) / 2.0:>7.2f}x {min(plans) / min(reads):>7.2f}x")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    print("# descriptors one destination rank posts per destination block")
    _counts()
    _planning(args.layers, args.repeat)


if __name__ == "__main__":
    main()
