"""Load time of 100- and 1,000-layer artifacts, against a bare loop of ``as_strided``.

    python benchmarks/bench_load.py [--layers 100 1000] [--repeat R] [--num-blocks N]

For each size, two sources are built in memory (``repeat: N``) and compiled:
``uniform`` (one full-attention group) and ``hybrid`` (3 sliding-window : 1
full-attention layers, so several groups and tensors alias slot by slot).
Reported, best of ``--repeat`` runs, in milliseconds:

- read: ``Artifact.read`` of the artifact's file (decode and validate it against
  the format, check the sha256 over the envelope, prove the structure: placement,
  strides, and the block-id property at the fewest blocks and the budget's count),
  which ``load()`` does first when it is given a path; no re-planning;
- load meta / load cpu: ``kvspec.load`` of a verified ``Artifact`` (size, allocate
  one int8 pool, zero it when the artifact asks, one ``as_strided`` +
  ``.view(dtype)`` per layer, metadata);
- load file: ``kvspec.load`` of the artifact's path on the CPU: verify + load cpu,
  what a serving process pays at start-up;
- bare loop: ``torch.as_strided(buf, shape, stride, offset).view(dtype)`` over
  the same, precomputed geometry on an already allocated buffer: the floor;
  bare+alloc: the same with the allocation;
- parse: reading the artifact file and ``orjson.loads`` of its text (the parser
  reading uses; ``json.loads`` takes about three times as long), nothing else: the
  floor of any check of the file, before its first field is looked at;
- floor: parse + bare+alloc, the least any loader of the file does (issue 29's
  baseline); file/floor: load file / floor (goal <= 1.5), for ``cpu`` and for
  ``meta`` (whose floor's loop runs on a meta buffer);
- x bare: load cpu / bare+alloc, the figure to compare across machines;
- us/layer: (load cpu - bare+alloc) / layers, in microseconds: what kvspec adds
  per layer beyond the bare loop.
"""

from __future__ import annotations

import argparse
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import orjson
import torch

from kvspec.artifact import Artifact
from kvspec.compiler import compile_source
from kvspec.runtime.loader import load
from kvspec.runtime.views import torch_dtype

SOURCE = """\
kvspec: 1
name: bench-{kind}-{layers}
engine:
  block_size: 16
  max_model_len: 1024
  max_num_batched_tokens: 1024
  max_num_seqs: 4
  layout: LBNHC
defaults: {{num_kv_heads: 2, head_size: 64, dtype: bfloat16}}
layer_types:
  local: {{kind: sliding_window, sliding_window: 128}}
  attn: {{kind: full_attention}}
layers:
  - {{repeat: {repeat}, pattern: {pattern}}}
"""

PATTERNS = {"uniform": ["attn"], "hybrid": ["local", "local", "local", "attn"]}


def artifact(kind: str, layers: int) -> Artifact:
    pattern = PATTERNS[kind]
    text = SOURCE.format(kind=kind, layers=layers, repeat=layers // len(pattern),
                         pattern="[" + ", ".join(pattern) + "]")
    return compile_source(text, f"bench-{kind}-{layers}.yaml")


def best_ms(run: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def bare_loop(buf: torch.Tensor, geometry: list[tuple]) -> list[torch.Tensor]:
    out = []
    for shape, stride, offset, dtype in geometry:
        out.append(torch.as_strided(buf, shape, stride, offset).view(dtype))
    return out


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux), else what ``platform`` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--num-blocks", type=int, default=None,
                        help="blocks per pool (default: the fewest that serve a request)")
    args = parser.parse_args()

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{cpu_name()}; best of {args.repeat}, milliseconds")
    head = (f"{'model':<9}{'layers':>7}{'blocks':>7}{'pool MiB':>9}{'read':>7}"
            f"{'load meta':>11}{'load cpu':>10}{'load file':>11}{'bare loop':>11}"
            f"{'bare+alloc':>12}{'x bare':>8}{'us/layer':>10}{'parse':>8}{'floor':>8}"
            f"{'file/floor':>12}{'meta file/floor':>17}")
    print(head)
    print("-" * len(head))
    tmp = tempfile.mkdtemp(prefix="kvspec-bench-load-")
    for layers in args.layers:
        for kind in PATTERNS:
            art = artifact(kind, layers)
            n = args.num_blocks or art.min_num_blocks()
            cache = load(art, device="cpu", num_blocks=n)
            assert len(cache.views) == layers
            geometry = []
            for meta in cache.metadata.values():
                item = torch.empty((), dtype=torch_dtype(meta.dtype)).element_size()
                geometry.append(((*meta.shape[:3], meta.shape[3] * item), meta.byte_stride,
                                 meta.byte_offset, torch_dtype(meta.dtype)))
            size = cache.buffers["device"].numel()
            buf = torch.empty(size, dtype=torch.int8)

            path = Path(tmp) / f"{kind}-{layers}.kvlayout.json"
            art.write(path)
            verify = best_ms(lambda: Artifact.read(path), args.repeat)
            meta_ms = best_ms(lambda: load(art, device="meta", num_blocks=n), args.repeat)
            cpu_ms = best_ms(lambda: load(art, device="cpu", num_blocks=n), args.repeat)
            file_ms = best_ms(lambda: load(path, device="cpu", num_blocks=n), args.repeat)
            bare = best_ms(lambda: bare_loop(buf, geometry), args.repeat)
            bare_alloc = best_ms(lambda: bare_loop(torch.empty(size, dtype=torch.int8),
                                                   geometry), args.repeat)
            parse = best_ms(lambda: orjson.loads(path.read_text(encoding="utf-8")),
                            args.repeat)
            meta_file = best_ms(lambda: load(path, device="meta", num_blocks=n), args.repeat)
            meta_bare = best_ms(lambda: bare_loop(torch.empty(size, dtype=torch.int8,
                                                              device="meta"), geometry),
                                args.repeat)
            per_layer = (cpu_ms - bare_alloc) / layers * 1e3
            floor = parse + bare_alloc
            print(f"{kind:<9}{layers:>7}{n:>7}{size / 2**20:>9.1f}{verify:>7.2f}"
                  f"{meta_ms:>11.2f}{cpu_ms:>10.2f}{file_ms:>11.2f}{bare:>11.2f}"
                  f"{bare_alloc:>12.2f}{cpu_ms / bare_alloc:>8.1f}{per_layer:>10.1f}"
                  f"{parse:>8.2f}{floor:>8.2f}{file_ms / floor:>12.2f}"
                  f"{meta_file / (parse + meta_bare):>17.2f}")
    shutil.rmtree(tmp)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
