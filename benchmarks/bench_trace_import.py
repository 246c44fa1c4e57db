"""Trace import in bounded memory: peak RSS of ``kvspec trace import`` per format.

    python benchmarks/bench_trace_import.py [--rows N] [--baseline N] [--json]
                                            [--out benchmarks/results/trace_import.md]

For each format (azure-2023, azure-2024, mooncake, burstgpt, lengths) it writes a
generated file of ``--rows`` rows (1,000,000 by default) in the format's published
column layout, and one of ``--baseline`` rows (1,000), then converts each with
``python -m kvspec trace import FORMAT FILE -o OUT`` in a process of its own and
reads that process's peak resident set size (``/usr/bin/time -f %M``). Bounded
memory means the big file's peak is the small one's: the ratio stays near 1 (goal:
<= 1.25, whatever the row count), where reading the file whole would grow with it.
The wall time is printed beside it, for scale only.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FORMATS = ("azure-2023", "azure-2024", "mooncake", "burstgpt", "lengths")
#: The goal: the big file's peak RSS over the small one's.
GOAL = 1.25
#: GNU time, which reports a command's peak resident set size (``%M``, KiB).
TIME = "/usr/bin/time"


def _azure(zone: bool) -> Callable[[int, random.Random], Iterator[str]]:
    def rows(n: int, rng: random.Random) -> Iterator[str]:
        yield "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        t = datetime(2023, 11, 16, 18, 15, 46, tzinfo=UTC)
        for _ in range(n):
            t += timedelta(microseconds=rng.randrange(0, 400_000))
            stamp = (t.isoformat(sep=" ", timespec="microseconds") if zone
                     else t.strftime("%Y-%m-%d %H:%M:%S.%f") + "0")
            yield f"{stamp},{rng.randrange(1, 8000)},{rng.randrange(1, 600)}\n"
    return rows


def _mooncake(n: int, rng: random.Random) -> Iterator[str]:
    t, next_id = 0, 0
    for _ in range(n):
        t += rng.randrange(0, 600)
        prompt = rng.randrange(1, 24_000)
        blocks = -(-prompt // 512)
        shared = rng.randrange(0, blocks + 1) if next_id else 0
        ids = list(range(min(shared, next_id))) + list(range(next_id, next_id + blocks - shared))
        next_id += blocks - shared
        yield json.dumps({"timestamp": t, "input_length": prompt,
                          "output_length": rng.randrange(1, 800), "hash_ids": ids}) + "\n"


def _burstgpt(n: int, rng: random.Random) -> Iterator[str]:
    yield "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
    t = 0
    for _ in range(n):
        t += rng.randrange(0, 3)
        prompt, output = rng.randrange(0, 3000), rng.randrange(0, 600)
        model = "ChatGPT" if rng.random() < 0.8 else "GPT-4"
        yield f"{t},{model},{prompt},{output},{prompt + output},Conversation log\n"


def _lengths(n: int, rng: random.Random) -> Iterator[str]:
    yield "conversation,input_len,output_len\n"
    for i in range(n):
        yield f"c{i},{rng.randrange(1, 4000)},{rng.randrange(1, 1000)}\n"


GENERATORS: dict[str, tuple[str, Callable[[int, random.Random], Iterator[str]], list[str]]] = {
    "azure-2023": (".csv", _azure(False), []),
    "azure-2024": (".csv", _azure(True), []),
    "mooncake": (".jsonl", _mooncake, []),
    "burstgpt": (".csv", _burstgpt, []),
    "lengths": (".csv", _lengths, ["--columns", "prompt=input_len,output=output_len"]),
}


def write(path: Path, lines: Iterator[str]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        batch: list[str] = []
        for line in lines:
            batch.append(line)
            if len(batch) >= 10_000:
                fh.writelines(batch)
                batch.clear()
        fh.writelines(batch)


def run(fmt: str, path: Path, out: Path, extra: list[str]) -> tuple[float, int, str]:
    """(seconds, peak RSS in KiB, stderr) of one conversion in a process of its own,
    under ``/usr/bin/time`` (a small process that forks and execs it: Linux carries
    the peak RSS across an exec, so a child forked from this Python process would
    report this process's peak when it was the higher)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    proc = subprocess.run([TIME, "-f", "peak-rss-kib %M", sys.executable, "-m", "kvspec",
                           "trace", "import", fmt, str(path), "-o", str(out), *extra],
                          env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, check=False)
    seconds = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"{fmt}: kvspec trace import failed:\n{proc.stderr}")
    lines = proc.stderr.strip().splitlines()
    rss = int(lines[-1].split()[-1])
    return seconds, rss, "\n".join(lines[:-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--baseline", type=int, default=1_000)
    ap.add_argument("--formats", nargs="*", default=list(FORMATS))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", type=Path, help="Also write the Markdown table here.")
    args = ap.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="kvspec-bench-import-") as tmp:
        for fmt in args.formats:
            suffix, gen, extra = GENERATORS[fmt]
            row: dict[str, object] = {"format": fmt, "rows": args.rows}
            for label, n in (("baseline", args.baseline), ("big", args.rows)):
                path = Path(tmp) / f"{fmt}-{n}{suffix}"
                write(path, gen(n, random.Random(0)))
                out = Path(tmp) / f"{fmt}-{n}.out.jsonl"
                seconds, rss, note = run(fmt, path, out, extra)
                out.unlink()
                row[f"{label}_rss_kib"] = rss
                row[f"{label}_seconds"] = round(seconds, 2)
                row[f"{label}_file_mib"] = round(path.stat().st_size / 2**20, 1)
                row[f"{label}_note"] = note
                path.unlink()
            row["rss_ratio"] = round(row["big_rss_kib"] / row["baseline_rss_kib"], 3)  # type: ignore[operator]
            results.append(row)
            print(f"{fmt}: {row['big_file_mib']} MiB, peak RSS {row['big_rss_kib']:,} KiB "
                  f"({row['rss_ratio']}x the {args.baseline:,}-row file's), "
                  f"{row['big_seconds']} s", file=sys.stderr)
    table = _markdown(results, args)
    if args.out:
        args.out.write_text(table, encoding="utf-8")
    print(json.dumps(results, indent=1) if args.json else table)
    return 0 if all(r["rss_ratio"] <= GOAL for r in results) else 1  # type: ignore[operator]


def _markdown(results: list[dict[str, object]], args: argparse.Namespace) -> str:
    lines = [
        "# Trace import: peak memory",
        "",
        (f"`python benchmarks/bench_trace_import.py` ({datetime.now(UTC):%Y-%m-%d}): "
        f"`kvspec trace import` of a generated {args.rows:,}-row file per format, each in a "
        f"process of its own, against a {args.baseline:,}-row file of the same generator "
        f"(the baseline, measured in the same run). Goal: the ratio <= {GOAL} (bounded "
        "memory); the times are for scale only (a shared 2-core machine)."),
        "",
        ("| format | rows | file (MiB) | peak RSS (MiB) | baseline peak RSS (MiB) | ratio | "
        "seconds |"),
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        lines.append(f"| {r['format']} | {r['rows']:,} | {r['big_file_mib']} | "
                     f"{r['big_rss_kib'] / 1024:.1f} | {r['baseline_rss_kib'] / 1024:.1f} | "  # type: ignore[operator]
                     f"{r['rss_ratio']} | {r['big_seconds']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
