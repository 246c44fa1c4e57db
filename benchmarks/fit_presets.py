"""Fit the workload presets' tables (kvspec/model/preset_tables.py) from the
published traces, and print each file's statistics (docs/pooling.md#workload-presets).

    python benchmarks/fit_presets.py AzureLLMInferenceTrace_conv.csv \\
        AzureLLMInferenceTrace_code.csv conversation_trace.jsonl > kvspec/model/preset_tables.py

The files: github.com/Azure/AzurePublicDataset ``data/AzureLLMInferenceTrace_{conv,code}.csv``
and github.com/kvcache-ai/Mooncake ``FAST25-release/traces/conversation_trace.jsonl``.
Each length distribution becomes 200 bins of equal probability: the sorted lengths cut
into 200 runs of equal count, each bin the range centred on its run's mean and as wide
as the run allows (so a draw uniform in a uniformly chosen bin has the run's mean).
The statistics go to stderr.
"""

from __future__ import annotations

import csv
import itertools
import json
import statistics
import sys
from datetime import UTC, datetime

BINS = 200
HEADER = '''"""The presets' length tables (:mod:`kvspec.model.workloads`), fitted from the published
traces by ``benchmarks/fit_presets.py``: per distribution, 200 bins of equal
probability (the sorted lengths cut in 200 runs of equal count), each bin a range
``(low, high)`` centred on the mean of its run and as wide as the run allows, so a
draw uniform in a uniformly chosen bin has the trace's mean, and the bins' edges
its quantiles. Generated: do not edit by hand.
"""

from __future__ import annotations

#: (preset, "prompt" or "output") -> 200 bins (low, high) of tokens.
TABLES: dict[tuple[str, str], tuple[tuple[float, float], ...]] = {
'''


def azure(path: str) -> tuple[list[float], list[int], list[int]]:
    with open(path, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    times = [datetime.fromisoformat(r["TIMESTAMP"]).replace(tzinfo=UTC).timestamp()
             for r in rows]
    return (times, [int(r["ContextTokens"]) for r in rows],
            [int(r["GeneratedTokens"]) for r in rows])


def mooncake(path: str) -> tuple[list[float], list[int], list[int]]:
    with open(path, encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return ([r["timestamp"] / 1000 for r in rows], [r["input_length"] for r in rows],
            [r["output_length"] for r in rows])


def bins(lengths: list[int]) -> list[tuple[float, float]]:
    s = sorted(lengths)
    n = len(s)
    out = []
    for k in range(BINS):
        run = s[k * n // BINS:(k + 1) * n // BINS]
        low, high, mean = run[0], run[-1], sum(run) / len(run)
        half = min(mean - low, high - mean)
        out.append((round(mean - half, 1), round(mean + half, 1)))
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    sources = {"azure-conversation-2023": azure(argv[0]), "azure-code-2023": azure(argv[1]),
               "mooncake-conversation": mooncake(argv[2])}
    out = [HEADER]
    for name, (times, prompts, outputs) in sources.items():
        gaps = [b - a for a, b in itertools.pairwise(times)]
        print(f"{name}: {len(times):,} requests over {times[-1] - times[0]:.0f} s, "
              f"rate {(len(times) - 1) / (times[-1] - times[0]):.4f}/s, inter-arrival CV "
              f"{statistics.pstdev(gaps) / statistics.fmean(gaps):.3f}; prompt mean "
              f"{statistics.fmean(prompts):.1f} p50 {statistics.median(prompts)}; output "
              f"mean {statistics.fmean(outputs):.2f} p50 {statistics.median(outputs)}",
              file=sys.stderr)
        for label, lengths in (("prompt", prompts), ("output", outputs)):
            table = bins(lengths)
            rows = "".join("        " + ", ".join(f"({a:g}, {b:g})" for a, b in
                                                  table[r:r + 5]) + ",\n"
                           for r in range(0, BINS, 5))
            out.append(f"    ({name!r}, {label!r}): (\n{rows}    ),\n")
    out.append("}\n")
    sys.stdout.write("".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
