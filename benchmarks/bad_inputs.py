"""Bad inputs through the real command line, each classified (issues 36 and 48).

    python benchmarks/bad_inputs.py [--jobs N] [--timeout S] [--only SURFACE] [--every K]
                                    [--out benchmarks/results/bad_inputs.md] [--list]

Every case is an input kvspec must refuse, or one whose right answer the case
states: hand-made ones (the issues') and ones generated from tables of bad values
per option and field, across the surfaces ``trace`` (its options), ``workload``
(trace files and the source's ``pooling.workload``), ``pooling`` (the rest of the
``pooling`` section and the budget), ``simulate`` (its options and inputs),
``descriptor`` and ``transfer`` (their options and artifacts), ``sweep`` (grid
files: every field's bad values, constraints, bases, workloads, grids too large
to plan), ``rows`` (the sweep's ``-o`` results file, ``--report``, ``--csv``),
``ray`` (``--ray`` addresses, loopback only) and ``trace-import`` (``kvspec trace
import``: every format's fields, files and options). Each case runs as ``python
-m kvspec ...`` in a directory of its own (its own process group, killed whole
afterwards), with ``--timeout`` seconds (10), and is classified:

* **clear** -- exit 1 or 2, no traceback, and the message places the problem:
  ``file:line:col``, an ``at:`` path, the option's name, or the file it names; a
  case may ask for more (``at``: a pattern the message must match, such as the
  grid's line; ``says``/``not_says``), and pydantic's internal names
  (``constrained-float``, ``Input should be``) never make a clear message;
* **right** -- exit 0 where the case's ``ok`` predicate accepts the answer (a
  duplicate axis value run once, rows on stdout for ``-o -``, a trace imported
  whole and readable by ``simulate``);
* **unclear** -- exit 1 or 2, no traceback, but nothing places the problem;
* **refused** -- exit 1 or 2 where the case's answer is success (``must_run``);
* **traceback** -- a Python traceback, or an exit code that is neither 0, 1 nor 2;
* **runaway** -- still running at the timeout with no progress line on stderr;
* **slow** -- still running at the timeout, but saying how far it is on stderr
  (a ``label: N of M`` line);
* **silent wrong** -- exit 0, where an error is due (no ``ok``), or an answer the
  case's ``ok`` rejects;
* **lost file** -- a file the case declares changed afterwards: a user's file
  overwritten, truncated or deleted (``keep``), or, when the command failed, an
  output left behind or changed (``keep_failed``).

The table goes to ``--out`` (benchmarks/results/bad_inputs.md): counts per surface,
then every case that is not clear or right. ``tests/test_bad_inputs.py`` runs every
``--every``-th case of the same list, so a regression fails the tests.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parents[1]
KINDS = ("clear", "right", "unclear", "refused", "traceback", "runaway", "slow",
         "silent wrong", "lost file")
#: The classes no case may end in (the command's exit status is 1 when one does).
BAD = ("refused", "traceback", "runaway", "silent wrong", "lost file")
SURFACES = ("trace", "workload", "pooling", "simulate", "descriptor", "transfer", "sweep",
            "rows", "ray", "trace-import")

# -- the inputs the cases start from ---------------------------------------------------

SMALL = """kvspec: 1
name: small
engine: {block_size: 16, max_model_len: 8192, memory: 8GiB, max_num_seqs: 64}
defaults: {num_kv_heads: 8, head_size: 128, dtype: bfloat16}
layer_types:
  attn: {kind: full_attention}
  swa: {kind: sliding_window, sliding_window: 1024}
layers:
  - {repeat: 2, pattern: [attn, swa]}
"""
GOOD_LINE = '{"arrival": 0, "prompt_tokens": 512, "output_tokens": 64}'
TRACE = "".join(f'{{"arrival": {i}, "prompt_tokens": {300 + 7 * i}, "output_tokens": 40}}\n'
                for i in range(20))
WORKLOAD = "{context_tokens: 512, output_tokens: 64, requests: 50}"


def source(pooling: str | None = None, engine: str | None = None) -> str:
    """The small source, with a ``pooling`` section (flow YAML) or another engine."""
    text = SMALL if engine is None else SMALL.replace(
        "{block_size: 16, max_model_len: 8192, memory: 8GiB, max_num_seqs: 64}", engine)
    return text + (f"pooling: {pooling}\n" if pooling is not None else "")


@dataclass(frozen=True)
class Outcome:
    """What a command did: its exit status, output, and the directory it ran in
    (still there when a case's ``ok`` looks at it)."""

    code: int
    stdout: str
    stderr: str
    where: Path


@dataclass(frozen=True)
class Case:
    """One bad input: the command line (in its own directory, beside ``files``; a
    name ending in ``/`` is a directory), and what its right answer is."""

    surface: str
    name: str
    argv: tuple[str, ...]
    files: dict[str, str | bytes] = field(default_factory=dict)
    stdin: bytes | None = None
    #: Files that must be as they were afterwards, whatever the exit status (a
    #: user's file given as -o); a name not in ``files`` must stay absent.
    keep: tuple[str, ...] = ()
    #: Files that must be as they were when the command fails (its -o target).
    keep_failed: tuple[str, ...] = ()
    #: When success may be the right answer: whether exit 0's answer is right.
    ok: Callable[[Outcome], bool] | None = None
    #: Success is the only right answer (an error is "refused").
    must_run: bool = False
    #: A pattern (multi-line) a clear error must match: where it must be placed.
    at: str | None = None
    #: Patterns a clear error must (``says``) and must not (``not_says``) match.
    says: tuple[str, ...] = ()
    not_says: tuple[str, ...] = ()
    #: Run in the case's directory before the case (rows from an earlier sweep, ...).
    prepare: Callable[[Path], None] | None = None


def _c(surface: str, name: str, *argv: str, files: dict[str, str | bytes] | None = None,
       stdin: bytes | None = None, **kw: Any) -> Case:
    return Case(surface, name, tuple(argv), files or {}, stdin, **kw)


# -- trace ---------------------------------------------------------------------------

_NUMBER_BAD = ("inf", "-inf", "nan", "NaN", "abc", "", "1,000", "0x10", "1e999")
TRACE_OPTIONS = {
    "-n": ("0", "-1", "1e30", "2.5", "100000000000"),
    "--prompt-mean": ("0", "-5", "1e30", "0.5", "3000000000"),
    "--output-mean": ("0", "-5", "1e30", "0.5", "3000000000"),
    "--prompt-spread": ("-1", "5", "1e30"),
    "--output-spread": ("-1", "5", "1e30"),
    "--rate": ("0", "-1", "1e-300", "1e30"),
    "--max-prompt-tokens": ("0", "-1", "1e30", "3000000000"),
    "--prefix-share": ("-0.1", "1.5", "1e30"),
    "--prefix-groups": ("0", "-1", "1e30"),
    "--prefix-tokens": ("0", "-1", "1e30", "3000000000"),
    "--seed": ("-1", "1e30", "18446744073709551616"),
}


def trace_cases() -> Iterator[Case]:
    for option, own in TRACE_OPTIONS.items():
        floaty = option not in ("-n", "--max-prompt-tokens", "--prefix-groups",
                                "--prefix-tokens", "--seed")
        bad = own + (_NUMBER_BAD if floaty else _NUMBER_BAD[:6] + ("1.5",))
        for value in dict.fromkeys(bad):
            yield _c("trace", f"{option} {value!r}", "trace", "-n", "3", option, value)
    yield _c("trace", "--format bogus", "trace", "--format", "bogus")
    yield _c("trace", "unknown option", "trace", "--prompt-men", "5")
    yield _c("trace", "-o into a missing directory", "trace", "-n", "2", "-o", "no/such/t.jsonl")
    yield _c("trace", "-o over a source", "trace", "-n", "2", "-o", "s.yaml",
             files={"s.yaml": SMALL})


# -- workload: trace files and the source's pooling.workload -------------------------

TRACE_FILES: dict[str, str | bytes] = {
    "NaN": '{"arrival": 0, "prompt_tokens": NaN, "output_tokens": 5}\n',
    "Infinity": '{"arrival": 0, "prompt_tokens": 5, "output_tokens": Infinity}\n',
    "-Infinity arrival": '{"arrival": -Infinity, "prompt_tokens": 5, "output_tokens": 5}\n',
    "missing key": '{"arrival": 0, "prompt_tokens": 5}\n',
    "typo key": '{"arival": 0, "prompt_tokens": 5, "output_tokens": 5}\n',
    "extra key": GOOD_LINE[:-1] + ', "priority": 1}\n',
    "zero prompt": '{"arrival": 0, "prompt_tokens": 0, "output_tokens": 5}\n',
    "zero output": '{"arrival": 0, "prompt_tokens": 5, "output_tokens": 0}\n',
    "negative arrival": '{"arrival": -1, "prompt_tokens": 5, "output_tokens": 5}\n',
    "float tokens": '{"arrival": 0, "prompt_tokens": 5.5, "output_tokens": 5}\n',
    "float 1e3 tokens": '{"arrival": 0, "prompt_tokens": 1e3, "output_tokens": 5}\n',
    "string tokens": '{"arrival": 0, "prompt_tokens": "512", "output_tokens": 5}\n',
    "bool tokens": '{"arrival": 0, "prompt_tokens": true, "output_tokens": 5}\n',
    "null tokens": '{"arrival": 0, "prompt_tokens": null, "output_tokens": 5}\n',
    "2^31+1 prompt": '{"arrival": 0, "prompt_tokens": 2147483649, "output_tokens": 5}\n',
    "10^30 output": '{"arrival": 0, "prompt_tokens": 5, "output_tokens": '
                    '1000000000000000000000000000000}\n',
    "5000-digit prompt": '{"arrival": 0, "prompt_tokens": ' + "9" * 5000 +
                         ', "output_tokens": 5}\n',
    "10^30 arrival": '{"arrival": 1000000000000000000000000000000, "prompt_tokens": 5, '
                     '"output_tokens": 5}\n',
    "arrivals decrease": '{"arrival": 5, "prompt_tokens": 5, "output_tokens": 5}\n'
                         '{"arrival": 2, "prompt_tokens": 5, "output_tokens": 5}\n',
    "prefix_id alone": GOOD_LINE[:-1] + ', "prefix_id": 1}\n',
    "prefix_tokens alone": GOOD_LINE[:-1] + ', "prefix_tokens": 4}\n',
    "prefix longer than prompt": GOOD_LINE[:-1] + ', "prefix_id": 1, "prefix_tokens": 9999}\n',
    "prefix_id a list": GOOD_LINE[:-1] + ', "prefix_id": [1], "prefix_tokens": 4}\n',
    "array line": "[0, 512, 64]\n",
    "number line": "42\n",
    "string line": '"hello"\n',
    "empty file": "",
    "blank lines only": "\n\n  \n",
    "truncated line": '{"arrival": 0, "prompt_tokens": 5,\n',
    "duplicate key": '{"arrival": 0, "prompt_tokens": 5, "prompt_tokens": 6, '
                     '"output_tokens": 5}\n',
    "deep nesting": '{"arrival": 0, "prompt_tokens": 5, "output_tokens": 5, "x": ' +
                    "[" * 5000 + "]" * 5000 + "}\n",
    "not UTF-8": b'{"arrival": 0, "prompt_tokens": 5, "output_tokens": 5}\n\xff\xfe\n',
    "UTF-16": GOOD_LINE.encode("utf-16"),
    "binary": bytes(range(256)),
    "YAML instead": "- {arrival: 0, prompt_tokens: 5, output_tokens: 5}\n",
    "CSV instead": "arrival,prompt_tokens,output_tokens\n0,512,64\n",
    "one JSON array": "[" + GOOD_LINE + ", " + GOOD_LINE + "]\n",
    "every prompt too long": '{"arrival": 0, "prompt_tokens": 9000, "output_tokens": 5}\n' * 3,
}

#: Bad values for the summary's token fields (context_tokens, output_tokens).
TOKENS_BAD = ("0", "-1", ".inf", ".nan", "1e30", "'512'", "true", "null", "[]", "5000000000",
              "{mean: 0}", "{mean: .inf}", "{mean: 5, spread: .nan}", "{mean: 5, spread: 5}",
              "{mean: 5, spread: -1}", "{histogram: []}", "{histogram: [[.inf, 1]]}",
              "{histogram: [[512, .inf]]}", "{histogram: [[512, .nan]]}",
              "{histogram: [[512, 0]]}", "{histogram: [[512.5, 1]]}",
              "{histogram: [[512]]}", "{histogram: [[512, 1, 2]]}",
              "{histogram: [[5000000000, 1]]}", "{mean: 5, histogram: [[5, 1]]}", "{}",
              "{mean: 5, sprad: 1}")
WORKLOAD_FIELDS_BAD = {
    "concurrency": ("0", "-1", ".inf", ".nan", "5000000000"),
    "draft_tokens": ("-1", "65", ".nan", "1.5"),
    "prefix_sharing": ("-0.1", "1.5", ".nan", ".inf"),
    "prefix_tokens": ("0", ".inf", "5000000000"),
    "requests": ("0", "-1", "1000000", ".inf", "1e6"),
    "seed": ("-1", ".nan", "1.5"),
}


def workload_cases() -> Iterator[Case]:
    for name, text in TRACE_FILES.items():
        yield _c("workload", f"simulate --workload: {name}", "simulate", "s.yaml",
                 "--workload", "t.jsonl", files={"s.yaml": SMALL, "t.jsonl": text})
        yield _c("workload", f"pooling.workload.trace: {name}", "compile", "s.yaml", "-o",
                 "s.kvlayout.json", files={"s.yaml": source(
                     "{policy: auto, serve_with: kvspec, workload: {trace: t.jsonl}}"),
                     "t.jsonl": text})
    for key in ("context_tokens", "output_tokens"):
        other = "output_tokens: 64" if key == "context_tokens" else "context_tokens: 512"
        for value in TOKENS_BAD:
            yield _c("workload", f"{key}: {value}", "validate", "s.yaml", files={
                "s.yaml": source(f"{{policy: auto, serve_with: kvspec, workload: "
                                 f"{{{key}: {value}, {other}}}}}")})
    for key, values in WORKLOAD_FIELDS_BAD.items():
        for value in values:
            yield _c("workload", f"{key}: {value}", "validate", "s.yaml", files={
                "s.yaml": source(f"{{policy: auto, serve_with: kvspec, workload: "
                                 f"{{context_tokens: 512, output_tokens: 64, {key}: {value}}}}}")})
    hand = {
        "context_tokens over max_model_len": "{context_tokens: 100000, output_tokens: 64}",
        "histogram all over max_model_len": "{context_tokens: {histogram: [[9000, 1], "
                                            "[12000, 1]]}, output_tokens: 64}",
        "trace and summary": "{trace: t.jsonl, context_tokens: 512}",
        "summary without output": "{context_tokens: 512}",
        "empty workload": "{}",
        "trace: ''": "{trace: ''}",
        "trace missing": "{trace: missing.jsonl}",
        "trace a directory": "{trace: .}",
        "trace not a string": "{trace: 5}",
        "workload a list": "[]",
        "unknown key": "{context_tokens: 512, output_tokens: 64, requets: 5}",
    }
    for name, value in hand.items():
        for command in ("validate", "compile"):
            yield _c("workload", f"{command}: {name}", command, "s.yaml", files={
                "s.yaml": source(f"{{policy: auto, serve_with: kvspec, workload: {value}}}"),
                "t.jsonl": TRACE})


# -- pooling: the rest of the section, and the budget --------------------------------

def pooling_cases() -> Iterator[Case]:
    w = f"workload: {WORKLOAD}"
    sections = {
        "polcy typo": "{polcy: auto}",
        "policy bogus": "{policy: bogus}",
        "policy .nan": "{policy: .nan}",
        "policy a list": "{policy: [auto]}",
        "serve_with bogus": "{serve_with: sglang}",
        "separate served by vllm": "{policy: separate, serve_with: vllm}",
        "auto without workload": "{policy: auto, serve_with: kvspec}",
        "split under unified": "{split: {full_attention: 1.0}}",
        "split sums to 0.5": "{policy: separate, serve_with: kvspec, "
                             "split: {full_attention: 0.25, sliding_window_1024: 0.25}}",
        "split .nan": "{policy: separate, serve_with: kvspec, split: {full_attention: .nan}}",
        "split .inf": "{policy: separate, serve_with: kvspec, split: {full_attention: .inf}}",
        "split 0": "{policy: separate, serve_with: kvspec, split: {full_attention: 0, "
                   "sliding_window_1024: 1}}",
        "split negative": "{policy: separate, serve_with: kvspec, split: {full_attention: -1}}",
        "split unknown pool": "{policy: separate, serve_with: kvspec, split: {mamba: 0.5, "
                              "full_attention: 0.5}}",
        "split a list": "{policy: separate, serve_with: kvspec, split: [0.5, 0.5]}",
        "max_groups 0": f"{{policy: auto, serve_with: kvspec, max_groups: 0, {w}}}",
        "max_groups -1": f"{{policy: auto, serve_with: kvspec, max_groups: -1, {w}}}",
        "max_groups .inf": f"{{policy: auto, serve_with: kvspec, max_groups: .inf, {w}}}",
        "max_groups .nan": f"{{policy: auto, serve_with: kvspec, max_groups: .nan, {w}}}",
        "max_groups 1 (every plan has 2)": f"{{policy: auto, serve_with: kvspec, max_groups: 1,"
                                           f" {w}}}",
        "max_groups under unified": "{max_groups: 1}",
        "max_groups under separate": "{policy: separate, serve_with: kvspec, max_groups: 1}",
        "state_block_size 0": f"{{policy: auto, serve_with: kvspec, state_block_size: 0, {w}}}",
        "state_block_size .nan": f"{{policy: auto, serve_with: kvspec, state_block_size: .nan, "
                                 f"{w}}}",
        "state_block_size under unified": "{state_block_size: 16}",
        "block_size 0": "{policy: separate, serve_with: kvspec, block_size: 0}",
        "block_size .inf": "{policy: separate, serve_with: kvspec, block_size: .inf}",
        "block_size 2^40": "{policy: separate, serve_with: kvspec, block_size: 1099511627776}",
        "block_size under unified": "{block_size: 32}",
        "pooling a list": "[]",
        "pooling a string": "auto",
        "pooling null field": "{policy: null}",
        "unknown key": "{policy: unified, workloads: {}}",
    }
    for name, section in sections.items():
        for command in ("validate", "compile"):
            yield _c("pooling", f"{command}: {name}", command, "s.yaml",
                     files={"s.yaml": source(section)})
    engines = {
        "memory 1000000TiB": "{block_size: 16, max_model_len: 8192, memory: 1000000TiB}",
        "memory 1e30": "{block_size: 16, max_model_len: 8192, memory: 1e30}",
        "memory .inf": "{block_size: 16, max_model_len: 8192, memory: .inf}",
        "memory -1GiB": "{block_size: 16, max_model_len: 8192, memory: -1GiB}",
        "memory 10^30 bytes": "{block_size: 16, max_model_len: 8192, memory: "
                              "1000000000000000000000000000000}",
        "memory 200TiB (2^31+ blocks)": "{block_size: 1, max_model_len: 8192, memory: 200TiB}",
        "num_blocks 10^12": "{block_size: 16, max_model_len: 8192, num_blocks: 1000000000000}",
        "num_blocks 0": "{block_size: 16, max_model_len: 8192, num_blocks: 0}",
        "max_model_len 10^12": "{block_size: 16, max_model_len: 1000000000000, memory: 8GiB}",
        "max_model_len .inf": "{block_size: 16, max_model_len: .inf, memory: 8GiB}",
        "max_num_seqs .nan": "{block_size: 16, max_model_len: 8192, memory: 8GiB, "
                             "max_num_seqs: .nan}",
    }
    for name, engine in engines.items():
        for command in ("validate", "compile"):
            yield _c("pooling", f"{command}: engine {name}", command, "s.yaml",
                     files={"s.yaml": source(engine=engine)})
    yield _c("pooling", "compile --memory 1000000TiB", "compile", "s.yaml", "--memory",
             "1000000TiB", files={"s.yaml": SMALL})
    yield _c("pooling", "compile --memory 1e30", "compile", "s.yaml", "--memory", "1e30",
             files={"s.yaml": SMALL})
    yield _c("pooling", "plan --memory .nan", "plan", "s.yaml", "--memory", "nan",
             files={"s.yaml": SMALL})


# -- simulate ------------------------------------------------------------------------

SIM_OPTIONS = {
    "--num-blocks": ("1000000000000", "1e30", "-1", "0", "1", "nan", "inf", "abc", "2.5",
                     "2000000"),
    "--memory": ("1000000TiB", "1e30", "-5GiB", "nan", "inf", "40 GB GB", "0", "1",
                 "200TiB", "40G", "1.5B"),
    "--max-num-seqs": ("0", "-1", "nan", "1e30", "abc"),
    "--against": ("sglang", ""),
    "--format": ("yaml",),
}


def simulate_cases() -> Iterator[Case]:
    files: dict[str, str | bytes] = {"s.yaml": SMALL, "t.jsonl": TRACE}
    for option, values in SIM_OPTIONS.items():
        for value in values:
            yield _c("simulate", f"{option} {value!r}", "simulate", "s.yaml", "--workload",
                     "t.jsonl", option, value, files=files)
    hand = {
        "--memory with --num-blocks": ("s.yaml", "--workload", "t.jsonl", "--memory", "8GiB",
                                       "--num-blocks", "100"),
        "no workload": ("s.yaml",),
        "workload missing": ("s.yaml", "--workload", "missing.jsonl"),
        "workload a directory": ("s.yaml", "--workload", "."),
        "workload the source": ("s.yaml", "--workload", "s.yaml"),
        "layout missing": ("missing.yaml", "--workload", "t.jsonl"),
        "layout a trace": ("t.jsonl", "--workload", "t.jsonl"),
        "layout a directory": (".", "--workload", "t.jsonl"),
        "stdin twice": ("-", "--workload", "-"),
        "every request refused": ("s.yaml", "--workload", "long.jsonl"),
        "--num-blocks on separate pools": ("sep.yaml", "--workload", "t.jsonl",
                                           "--num-blocks", "100"),
        "too few blocks for a request": ("s.yaml", "--workload", "t.jsonl", "--num-blocks",
                                         "2"),
        "--memory too small": ("s.yaml", "--workload", "t.jsonl", "--memory", "1MiB"),
        "-o over the source": ("s.yaml", "--workload", "t.jsonl", "-o", "s.yaml"),
        "-o with a bad suffix": ("s.yaml", "--workload", "t.jsonl", "-o", "out.yaml"),
        "--against vllm with separate pools": ("sep.yaml", "--workload", "t.jsonl",
                                               "--against", "vllm"),
    }
    more = {"long.jsonl": '{"arrival": 0, "prompt_tokens": 9000, "output_tokens": 5}\n' * 4,
            "sep.yaml": source("{policy: separate, serve_with: kvspec}")}
    for name, argv in hand.items():
        yield _c("simulate", name, "simulate", *argv, files={**files, **more})
    yield _c("simulate", "--workload - empty stdin", "simulate", "s.yaml", "--workload", "-",
             files=files, stdin=b"")
    yield _c("simulate", "--workload - NaN on stdin", "simulate", "s.yaml", "--workload", "-",
             files=files, stdin=TRACE_FILES["NaN"].encode())  # type: ignore[union-attr]


# -- descriptor and transfer ---------------------------------------------------------

def _artifacts() -> dict[str, str | bytes]:
    """A compiled artifact and edits of it (read from layouts/)."""
    art = (REPO / "layouts" / "llama-3.1-8b.kvlayout.json").read_text()
    sep = (REPO / "layouts" / "pooling-separate.kvlayout.json").read_text()
    return {
        "a.kvlayout.json": art,
        "sep.kvlayout.json": sep,
        "nan.kvlayout.json": art.replace('"max_num_seqs": 256', '"max_num_seqs": NaN', 1),
        "edited.kvlayout.json": art.replace('"max_num_seqs": 256', '"max_num_seqs": 255', 1),
        "truncated.kvlayout.json": art[: len(art) // 2],
        "empty.kvlayout.json": "",
        "list.kvlayout.json": "[]",
        "other.kvlayout.json": '{"format": "kvspec.layout/1"}',
        "dup.kvlayout.json": art.replace("{", '{"format": "x", ', 1),
        "t.jsonl": TRACE,
        "s.yaml": SMALL,
        "bin.kvlayout.json": bytes(range(256)),
    }


ARTIFACT_NAMES = ("nan.kvlayout.json", "edited.kvlayout.json", "truncated.kvlayout.json",
                  "empty.kvlayout.json", "list.kvlayout.json", "other.kvlayout.json",
                  "dup.kvlayout.json", "t.jsonl", "missing.kvlayout.json", ".",
                  "bin.kvlayout.json")


def descriptor_cases() -> Iterator[Case]:
    files = _artifacts()
    for name in ARTIFACT_NAMES:
        yield _c("descriptor", f"artifact {name}", "descriptor", name, files=files)
    for value in ("1e23", "100000000000000000000000", "-1", "0", "nan", "inf", "abc", "1"):
        yield _c("descriptor", f"--num-blocks {value}", "descriptor", "a.kvlayout.json",
                 "--num-blocks", value, files=files)
    for value in ("-1", "1000000", "nan", "abc"):
        yield _c("descriptor", f"--rank {value}", "descriptor", "a.kvlayout.json", "--rank",
                 value, files=files)
    yield _c("descriptor", "--as bogus", "descriptor", "a.kvlayout.json", "--as", "bogus",
             files=files)
    yield _c("descriptor", "--as vllm-nixl on separate pools", "descriptor",
             "sep.kvlayout.json", "--as", "vllm-nixl", files=files)


def transfer_cases() -> Iterator[Case]:
    files = _artifacts()
    for name in ARTIFACT_NAMES:
        yield _c("transfer", f"src {name}", "transfer", name, "a.kvlayout.json", files=files)
        yield _c("transfer", f"dst {name}", "transfer", "a.kvlayout.json", name, files=files)
    for option in ("--src-num-blocks", "--dst-num-blocks"):
        for value in ("1e21", "1000000000000000000000", "-1", "0", "nan", "abc"):
            yield _c("transfer", f"{option} {value}", "transfer", "a.kvlayout.json",
                     "a.kvlayout.json", option, value, files=files)
    yield _c("transfer", "one artifact", "transfer", "a.kvlayout.json", files=files)
    yield _c("transfer", "a source", "transfer", "s.yaml", "a.kvlayout.json", files=files)


# -- sweep: grid files -----------------------------------------------------------------

#: The workload every grid case serves: a summary of 20 requests (a point runs in
#: about a second, so a right answer comes well inside the timeout).
SWEEP_WORKLOAD = {"name": "chat", "context_tokens": "512", "output_tokens": "64",
                  "requests": "20"}
#: A number of 401 digits: past a float, and past any count.
HUGE = "1" + "0" * 400
#: The base of a gpu_memory grid: the model's weights beside its source.
WEIGHTED = "\n  - source: s.yaml\n    name: small\n    weights: 14GB"


def grid(*, version: str = "1", base: str = "s.yaml", axes: dict[str, str] | None = None,
         workload: dict[str, str | None] | None = None, workloads: str | None = None,
         target: dict[str, str | None] | None = None, constraints: list[str] | None = None,
         extra: str = "") -> str:
    """A grid file in block style (each field on a line of its own): the small source,
    ``tensor: [1]``, one workload, 20 requests/s at 30 ms a step, with the parts given
    replaced (a value None leaves its key out)."""
    lines = [f"kvspec_sweep: {version}", f"base:{base}" if base.startswith("\n")
             else f"base: {base}", "axes:"]
    lines += [f"  {k}: {v}" if v else f"  {k}:"
              for k, v in ({"tensor": "[1]"} if axes is None else axes).items()]
    if workloads is not None:
        lines.append(f"  workload: {workloads}" if workloads else "  workload:")
    else:
        lines.append("  workload:")
        fields = [(k, v) for k, v in {**SWEEP_WORKLOAD, **(workload or {})}.items()
                  if v is not None]
        for i, (k, v) in enumerate(fields):
            lines.append(("    - " if i == 0 else "      ") + f"{k}: {v}")
    lines.append("target:")
    lines += [f"  {k}: {v}" for k, v in {"rate": "20", "step_ms": "30", **(target or {})}.items()
              if v is not None]
    if constraints is not None:
        lines.append("constraints:")
        lines += ["  - '" + c.replace("'", "''") + "'" for c in constraints]
    return "\n".join(lines) + "\n" + extra


def line_of(text: str, key: str, after: int = 0) -> int:
    """The 1-based line of the first ``key:`` (a mapping key, list dashes aside) after
    line ``after``."""
    for number, line in enumerate(text.splitlines(), 1):
        if number > after and line.lstrip(" -").startswith(f"{key}:"):
            return number
    raise ValueError(f"no {key!r} in the grid")


def _grid_at(line: int | None = None, column: int | None = None, file: str = "g.yaml") -> str:
    """A clear error's place in the grid file: the line (and column) of the value."""
    any_number = r"\d+"
    return (rf"^{re.escape(file)}:{any_number if line is None else line}:"
            rf"{any_number if column is None else column}: error")


def _rows_of(path: Path) -> list[dict[str, Any]] | None:
    """The rows of a results file, or None when it is not one (a line that is not a
    row with an id, a point and ok)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    rows = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            return None
        if not (isinstance(row, dict) and {"id", "point", "ok"} <= set(row)):
            return None
        rows.append(row)
    return rows


def swept(n: int, *, failed: int | None = None, error_line: int | None = None,
          output: str = "r.jsonl") -> Callable[[Outcome], bool]:
    """``ok`` of a sweep whose right answer is to run: ``n`` rows in ``output`` (each
    point once), ``failed`` of them with an error (at ``error_line`` of the grid), and,
    when the summary is JSON, ``n`` points in it."""
    def ok(o: Outcome) -> bool:
        rows = _rows_of(o.where / output)
        if rows is None or len(rows) != n or len({r["id"] for r in rows}) != n:
            return False
        bad = [r for r in rows if not r["ok"]]
        if failed is not None and len(bad) != failed:
            return False
        if error_line is not None and any(
                (r.get("error") or {}).get("line") != error_line for r in bad):
            return False
        try:
            summary = json.loads(o.stdout)
        except ValueError:
            return True  # the text table
        return not isinstance(summary, dict) or summary.get("points") == n
    return ok


def rows_on_stdout(n: int) -> Callable[[Outcome], bool]:
    """``ok`` of ``-o -``: ``n`` rows on stdout, and no file named ``-``."""
    def ok(o: Outcome) -> bool:
        rows = []
        for line in o.stdout.splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and {"id", "point", "ok"} <= set(row):
                rows.append(row)
        return len(rows) == n and not (o.where / "-").exists()
    return ok


def _sweep_case(surface: str, name: str, text: str, *argv: str,
                files: dict[str, str | bytes] | None = None, line: int | bool | None = True,
                column: int | None = None, ok: Callable[[Outcome], bool] | None = None,
                **kw: Any) -> Case:
    """``kvspec sweep g.yaml -o r.jsonl -j 1`` over ``text``; a clear error is placed at
    ``line`` of the grid (True: any line; False: anywhere, the usual rules), and
    leaves no r.jsonl behind. With ``ok``, the summary is JSON (its point count is
    checked)."""
    at = None if line is False else _grid_at(None if line is True else line, column)
    fmt = ("--format", "json") if ok is not None else ()
    return _c(surface, name, "sweep", "g.yaml", "-o", "r.jsonl", "-j", "1", *fmt, *argv,
              files={"s.yaml": SMALL, "g.yaml": text, **(files or {})},
              keep_failed=("r.jsonl",), at=kw.pop("at", at), ok=ok, **kw)


#: Bad values of each number field of a grid (YAML text), beside those every number
#: field shares (:data:`_GRID_NUMBER_BAD`). ``1e30`` and ``1e-300`` are strings to
#: YAML 1.1 (no dot): the error says so.
_GRID_NUMBER_BAD = (".inf", ".nan", HUGE, "true")
_SIZE_BAD = ("-1GiB", "0", "1.0e+30", "1000000TiB", "'8 GiB GiB'", "null")
GRID_FIELDS_BAD: dict[str, tuple[str, ...]] = {
    "target.rate": ("0", "-1", "1.0e-300", "1.0e+300", "'20 requests/h'", "''", "null",
                    "'1e-300'", "'1e-300 requests/s'"),
    "target.step_ms": ("0", "-1", "1.0e+7", "1.0e-300", "{1: .nan}", "{1: .inf}",
                       "{0: 30}", "{-1: 30}", "{a: 30}", "{2: 30}", "[30]", "null"),
    "gpu_memory_utilization": ("0", "-0.1", "1.5", "'0.9'", "null"),
    "reserve": ("-1GiB", "1000000TiB", "1.0e+30", "null"),
    "axes.memory": _SIZE_BAD + ("[8GiB]",),
    "axes.gpu_memory": _SIZE_BAD + ("1",),
    "weights": ("-1GiB", "1000000TiB", "1.0e+30", "'14 GB GB'"),
    "axes.tensor": ("0", "-1", "1.5", "'1'", "null", "1.0e+30", "2147483648", "1000000"),
    "axes.pipeline": ("0", "-1", "1.5", "'1'", "null", "1.0e+30", "1000000"),
    "axes.block_size": ("0", "-1", "1.5", "'16'", "null", "1099511627776", "1.0e+30"),
    "axes.max_num_seqs": ("0", "-1", "1.5", "'64'", "null", "1000000000000"),
    "axes.kv_cache_dtype": ("fp9", "''", "5", "null", "[auto]"),
    "axes.pooling.policy": ("bogus", "5", "null", "''", "[unified]"),
    "workload.context_tokens": ("0", "-1", "1.0e+30", "'512'", "null", "5000000000",
                                "{mean: .nan}", "{mean: 5, spread: .inf}",
                                "{mean: 5, spread: -1}", "{mean: 0}",
                                "{histogram: [[512, 1]]}"),
    "workload.output_tokens": ("0", "-1", "'64'", "5000000000", "{mean: .inf}",
                               "{mean: 5, spread: .nan}"),
    "workload.requests": ("0", "-1", "1.5", "1.0e+6", "10000000", "'20'"),
    "workload.seed": ("-1", "1.5", "'0'"),
    "workload.rate": ("0", "-1", "1.0e-300", "'abc'"),
    "workload.prefix_sharing": ("-0.1", "1.5", "'0.5'"),
    "workload.prefix_tokens": ("0", "-1", "5000000000", "1.5"),
    "workload.name": ("''", "5", "[chat]"),
}
#: Numbers YAML reads as strings (no dot, or an exponent without one): the error
#: says it is YAML's reading.
YAML_STRINGS = {"target.step_ms": ("3e1",),
                "gpu_memory_utilization": ("9e-1",), "workload.rate": ("5e-1",),
                "workload.prefix_sharing": ("5e-1",)}


def _grid_with(path: str, value: str) -> tuple[str, int]:
    """The grid with ``value`` at ``path`` (a field of the tables above), and the
    line the value is on."""
    key = path.rpartition(".")[2]
    if path.startswith("target."):
        text = grid(target={key: value})
    elif path.startswith("workload."):
        text = grid(workload={key: value})
    elif path == "axes.gpu_memory":
        text = grid(base=WEIGHTED, axes={"gpu_memory": f"[{value}]"})
    elif path.startswith("axes."):
        axis = path.removeprefix("axes.")
        text = grid(axes={"tensor": "[1]", axis: f"[{value}]"} if axis != "tensor"
                    else {"tensor": f"[{value}]"})
        key = axis
    elif path == "weights":
        text = grid(base=WEIGHTED.replace("14GB", value), axes={"gpu_memory": "[24GB]"})
    else:  # a top-level field
        text = grid(base=WEIGHTED, axes={"gpu_memory": "[24GB]"}, extra=f"{path}: {value}\n")
        key = path
    return text, line_of(text, key)


def sweep_field_cases() -> Iterator[Case]:
    for path, own in GRID_FIELDS_BAD.items():
        shared = _GRID_NUMBER_BAD if path not in (
            "axes.kv_cache_dtype", "axes.pooling.policy", "workload.name") else (".nan",)
        for value in dict.fromkeys(own + shared):
            text, line = _grid_with(path, value)
            ok = None
            if path == "workload.seed" and value == HUGE:
                ok = swept(1)  # any whole number seeds the draw
            if path == "axes.gpu_memory" and value == "1":  # no memory left: an error row
                ok = swept(1, failed=1, error_line=line)
            at = None
            if path.startswith("workload."):  # at the value, or at its workload entry
                at = rf"^g\.yaml:({line_of(text, 'name')}|{line}):\d+: error"
            yield _sweep_case("sweep", f"{path}: {'10^400' if value == HUGE else value}",
                              text, line=line, ok=ok, **({"at": at} if at else {}))
        for value in YAML_STRINGS.get(path, ()):
            text, line = _grid_with(path, value)
            yield _sweep_case("sweep", f"{path}: {value} (a string to YAML)", text, line=line,
                              says=("YAML",))
    # a rate is a number or a string with its unit ('20 requests/s'): a string that
    # writes a number is that number, so YAML's reading of 2e1 as a string is harmless
    for value in ("'1e3 requests/s'", "2e1", "'20 requests/s'", "'0.5'"):
        text, line = _grid_with("target.rate", value)
        yield _sweep_case("sweep", f"target.rate: {value} (taken)", text, line=line,
                          ok=swept(1))
    # a tiny KV cache plans to an error row at the axis, or is refused there
    for value in ("1", "1.5"):
        text = grid(axes={"tensor": "[1]", "memory": f"[{value}]"})
        line = line_of(text, "memory")
        yield _sweep_case("sweep", f"axes.memory: {value} (bytes)", text, line=line,
                          ok=swept(1, failed=1, error_line=line))
    for value in ("'1'", "2", "1.0", "0", "null", "true", "''", "[1]"):
        text = grid(version=value)
        yield _sweep_case("sweep", f"kvspec_sweep: {value}", text, line=1,
                          not_says=(r"did you mean '1'\?",),
                          ok=swept(1) if value == "1.0" else None)  # 1.0 is 1: either


#: Duplicate axis values: an error at the axis, or one point (the issue allows either).
DUPLICATES = {
    "tensor: [1, 1, 1]": {"tensor": "[1, 1, 1]"},
    "pipeline: [1, 1]": {"tensor": "[1]", "pipeline": "[1, 1]"},
    "memory: [8GiB, 8GiB]": {"memory": "[8GiB, 8GiB]"},
    "memory: [8GiB, 8589934592]": {"memory": "[8GiB, 8589934592]"},
    "memory: [8GiB, 8192MiB]": {"memory": "[8GiB, 8192MiB]"},
    "block_size: [16, 16]": {"block_size": "[16, 16]"},
    "max_num_seqs: [64, 64]": {"max_num_seqs": "[64, 64]"},
    "kv_cache_dtype: [auto, auto]": {"kv_cache_dtype": "[auto, auto]"},
    "pooling.policy: [unified, unified]": {"pooling.policy": "[unified, unified]"},
}


def sweep_grid_cases() -> Iterator[Case]:
    for name, axes in DUPLICATES.items():
        text = grid(axes=axes)
        axis = next(iter(axes)) if len(axes) == 1 else list(axes)[1]
        yield _sweep_case("sweep", f"duplicate {name}", text, line=line_of(text, axis),
                          ok=swept(1))
    text = grid(base=WEIGHTED, axes={"gpu_memory": "[24GB, 24GB]"})
    yield _sweep_case("sweep", "duplicate gpu_memory: [24GB, 24GB]", text,
                      line=line_of(text, "gpu_memory"), ok=swept(1))
    text = grid(workloads="[{name: chat, context_tokens: 512, output_tokens: 64, requests: "
                          "20}, {name: chat, context_tokens: 512, output_tokens: 64, "
                          "requests: 20}]")
    yield _sweep_case("sweep", "the same workload twice", text, line=line_of(text, "workload"))
    yield _sweep_case("sweep", "the same base twice", grid(base="[s.yaml, s.yaml]"), line=2)
    # empty axes, and axes of no value
    for axis in ("tensor", "memory", "kv_cache_dtype"):
        for value, label in (("[]", "[]"), ("", "(no value)"), ("null", "null")):
            text = grid(axes={axis: value})
            yield _sweep_case("sweep", f"{axis}: {label}", text, line=line_of(text, axis))
    for value in ("[]", "", "null", "{}"):
        text = grid(workloads=value)
        yield _sweep_case("sweep", f"workload: {value or '(no value)'}", text,
                          line=line_of(text, "workload"))
    for name, axes_text in (("axes: {}", "{}"), ("axes: null", "null"), ("axes: []", "[]")):
        text = grid().replace("axes:\n  tensor: [1]\n  workload:\n    - name: chat\n"
                              "      context_tokens: 512\n      output_tokens: 64\n"
                              "      requests: 20\n", f"axes: {axes_text}\n")
        yield _sweep_case("sweep", name, text, line=3)
    # the grid's structure
    whole = {
        "unknown top-level key": grid(extra="constraint: ['tensor <= 8']\n"),
        "unknown axis tp": grid(axes={"tp": "[1, 2]"}),
        "unknown workload key": grid(workload={"requets": "20"}),
        "unknown target key": grid(target={"rps": "20"}),
        "no target": grid().replace("target:\n  rate: 20\n  step_ms: 30\n", ""),
        "no step_ms": grid(target={"step_ms": None}),
        "no rate": grid(target={"rate": None}),
        "no base": grid().replace("base: s.yaml\n", ""),
        "no version": grid().replace("kvspec_sweep: 1\n", ""),
        "memory and gpu_memory": grid(base=WEIGHTED, axes={"memory": "[8GiB]",
                                                           "gpu_memory": "[24GB]"}),
        "gpu_memory without weights": grid(axes={"gpu_memory": "[24GB]"}),
        "a workload trace and a summary": grid(workload={"trace": "t.jsonl"}),
        "a workload of neither": grid(workloads="[{name: chat}]"),
        "a preset and a summary": grid(workload={"preset": "chat"}),
        "an unknown preset": grid(workloads="[{preset: bogus}]"),
        "a summary without output_tokens": grid(workload={"output_tokens": None}),
        "duplicate key axes": grid() + "axes:\n  tensor: [2]\n",
        "a tab for indentation": grid().replace("  rate: 20", "\trate: 20"),
        "an unclosed bracket": grid(axes={"tensor": "[1, 2"}),
        "a billion laughs": grid(axes={"tensor": "*l9"}).replace(
            "axes:\n", "".join(f"l{i}: &l{i} [" + ", ".join(
                [f"*l{i - 1}"] * 10 if i else ["1"] * 10) + "]\n" for i in range(10))
            + "axes:\n"),
    }
    for name, text in whole.items():
        yield _sweep_case("sweep", f"grid: {name}", text, files={"t.jsonl": TRACE})
    art = (REPO / "layouts" / "llama-3.1-8b.kvlayout.json").read_text()
    files: dict[str, str | bytes] = {
        "empty.yaml": "", "list.yaml": "[]\n", "number.yaml": "5\n",
        "bin.yaml": bytes(range(256)), "latin1.yaml": grid().encode() + b"# \xe9t\xe9\n",
        "utf16.yaml": grid().encode("utf-16"), "a.kvlayout.json": art, "t.jsonl": TRACE,
        "d/": ""}
    for name in ("missing.yaml", "d", "empty.yaml", "list.yaml", "number.yaml", "bin.yaml",
                 "latin1.yaml", "utf16.yaml", "s.yaml", "a.kvlayout.json", "t.jsonl"):
        yield _c("sweep", f"the grid file is {name}", "sweep", name, "-o", "r.jsonl",
                 files={"s.yaml": SMALL, **files}, keep_failed=("r.jsonl",))
    # bases
    bad_source = SMALL.replace("max_num_seqs: 64}", "max_num_seqs: 64, bogus: 1}")
    bases = {"missing.yaml": ("missing.yaml", ()), "a directory": ("d", ()),
             "an artifact": ("a.kvlayout.json", ("artifact",)), "a trace": ("t.jsonl", ()),
             "the grid itself": ("g.yaml", ()), "''": ("''", ()), "5": ("5", ()),
             "[]": ("[]", ()), "null": ("null", ()), "{source: missing.yaml}":
             ("{source: missing.yaml}", ()), "{source: d}": ("{source: d}", ()),
             "{source: a.kvlayout.json}": ("{source: a.kvlayout.json}", ("artifact",)),
             "{source: s.yaml, wieghts: 1GB}": ("{source: s.yaml, wieghts: 1GB}", ()),
             "{hf: missing.json}": ("{hf: missing.json}", ()), "{hf: d}": ("{hf: d}", ()),
             "{hf: s.yaml}": ("{hf: s.yaml}", ()), "{hf: t.jsonl}": ("{hf: t.jsonl}", ()),
             "{hf: a.kvlayout.json}": ("{hf: a.kvlayout.json}", ()),
             "{hf: broken.json}": ("{hf: broken.json}", ()),
             "[s.yaml, missing.yaml]": ("[s.yaml, missing.yaml]", ())}
    hf = (REPO / "tests" / "data" / "sweep" / "llama-3.1-70b.json").read_text()
    base_files: dict[str, str | bytes] = {"a.kvlayout.json": art, "t.jsonl": TRACE, "d/": "",
                                          "broken.json": '{"architectures": ["Llama', "c.json": hf}
    # a base that is a file of another kind, or broken inside, is placed in that file
    # (the line and column of what is wrong there); one that is missing, at the grid's
    inside = {"a trace": r"t\.jsonl", "the grid itself": r"g\.yaml",
              "{hf: t.jsonl}": r"t\.jsonl", "{hf: broken.json}": r"broken\.json"}
    for name, (value, says) in bases.items():
        extra = {"at": rf"^(g\.yaml:2|{inside[name]}:\d+):\d+: error"} if name in inside else {}
        yield _sweep_case("sweep", f"base: {name}", grid(base=value), files=base_files, line=2,
                          says=says, **extra)
    yield _sweep_case("sweep", "base: a source with an unknown key", grid(base="bad.yaml"),
                      files={"bad.yaml": bad_source}, line=False, at=_grid_at(3, file="bad.yaml"))
    for key, values in {"max_model_len": (".inf", "0", "-1", "1000000000000", "'8k'"),
                        "target": ("bogus", "5"), "model": ("5",), "name": ("''",)}.items():
        for value in values:
            text = grid(base=f"\n  - hf: c.json\n    weights: 141GB\n    {key}: {value}",
                        axes={"gpu_memory": "[80GB]", "tensor": "[2]"})
            yield _sweep_case("sweep", f"base hf {key}: {value}", text, files=base_files,
                              line=line_of(text, key))
    # workloads: trace files (every format simulate reads is read here too)
    traces: dict[str, str | bytes] = {
        "az.csv": (REPO / "tests/data/traces/azure-2023.csv").read_text(),
        "burst.csv": (REPO / "tests/data/traces/burstgpt.csv").read_text(),
        "mc.jsonl": (REPO / "tests/data/traces/mooncake.jsonl").read_text(),
        "lengths.csv": (REPO / "tests/data/traces/lengths.csv").read_text(),
        "nan.jsonl": TRACE_FILES["NaN"], "big.jsonl": '{"arrival": 0, "prompt_tokens": '
        '1000000000000000, "output_tokens": 5}\n', "empty.jsonl": "", "d/": "",
        "s2.yaml": SMALL, "a.kvlayout.json": art}
    for name in ("az.csv", "burst.csv", "mc.jsonl"):
        yield _sweep_case("sweep", f"workload trace in another format: {name}",
                          grid(workloads=f"[{{name: t, trace: {name}}}]"), files=traces,
                          ok=swept(1), must_run=True)
    for name in ("lengths.csv", "nan.jsonl", "big.jsonl", "empty.jsonl", "d", "s2.yaml",
                 "a.kvlayout.json", "missing.jsonl"):
        text = grid(workloads=f"[{{name: t, trace: {name}}}]")
        yield _sweep_case("sweep", f"workload trace: {name}", text, files=traces,
                          line=False if name in ("nan.jsonl", "big.jsonl") else
                          line_of(text, "workload"),
                          at=_grid_at(1, file=name) if name in ("nan.jsonl", "big.jsonl")
                          else None)
    # options
    for argv in (("-j", "0"), ("-j", "-1"), ("-j", "abc"), ("--point", "bogus"),
                 ("--point", ""), ("--format", "yaml"), ("--report", "r.pdf"),
                 ("--csv", "r.txt")):
        yield _sweep_case("sweep", " ".join(argv), grid(), *argv, line=False,
                          at="--point|the id" if argv[0] == "--point" else None)


def sweep_constraint_cases() -> Iterator[Case]:
    axes = {"tensor": "[1]", "max_num_seqs": "[64]"}
    #: Constraints that hold, written to stress the parser: run (one point), or a
    #: clear error at the constraint.
    holds = {
        "400 nested parentheses": "(" * 400 + "tensor" + ")" * 400 + " <= 8",
        "100,000 nested parentheses": "(" * 100_000 + "tensor" + ")" * 100_000 + " <= 8",
        "1,000 leading minus signs": "-" * 1000 + "tensor <= 8",
        "100,001 leading minus signs": "-" * 100_001 + "tensor <= 8",
        "a 1,000-term sum": " + ".join(["tensor"] * 1000) + " <= 8000",
        "a 1,000-term product": " * ".join(["tensor"] * 1000) + " <= 8",
        "a 450,000-term sum (1.8 MB)": "1 <= " + " + ".join(["1"] * 450_000),
        "100,000 ands (1.6 MB)": "tensor <= 8 and " * 100_000 + "tensor <= 8",
        "1,000 chained comparisons": "1 <= tensor" + " <= 8" * 1000,
        "10,000 ors": " or ".join(["tensor == 1"] * 10_000),
        "a 400-digit number": "tensor < " + HUGE,
        "1.8 MB of spaces": "tensor" + " " * 1_800_000 + "<= 8",
        "an exponent": "tensor <= 1e3",
    }
    for name, c in holds.items():
        text = grid(axes=axes, constraints=[c])
        yield _sweep_case("sweep", f"constraint: {name}", text,
                          line=line_of(text, "constraints") + 1, ok=swept(1))
    #: Constraints that do not parse, and the offset in their text the error is at.
    bad = {
        "tensr <= 8": 0, "pipeline <= 2": 0, "model == 1": 0, "kv_cache_dtype == 8": 0,
        "workload == 1": 0, "__import__(os) == 1": 0, "not tensor <= 8": 0,
        "tensor <= 8 )": 12, "tensor <== 8": 9, "tensor ** 2 <= 8": 8,
        "tensor <= 8 and": 15, "(tensor <= 8": 12, "tensor": 0, "tensor = 8": 7,
        "tensor <= 8 && max_num_seqs": 12, "tensor \u2264 8": 7, "": 0, "   ": 0,
        "tensor <= 8 tensor": 12, "tensor <= 8; max_num_seqs": 11,
        "tensor <= (8": 12, "tensor >= 1 and or tensor <= 8": 16,
        # past the limits, the error is at the limit: the 33rd parenthesis, the
        # 10,001st character
        "(" * 400 + "tensr" + ")" * 400 + " <= 8": 32,
        "tensor <= 8 and " * 1000 + "tensr <= 8": 10_000,
    }
    for c, offset in bad.items():
        text = grid(axes=axes, constraints=["max_num_seqs >= 1", c])
        shown = c if len(c) <= 40 else c[:37] + "..."
        yield _sweep_case("sweep", f"constraint {shown!r} (column {offset + 1})", text,
                          line=line_of(text, "constraints") + 2, column=6 + offset)
    for name, value in (("a division by zero", "tensor / 0 <= 1"),
                        ("a remainder by zero", "tensor % 0 == 0"),
                        ("none holds", "tensor > 8")):
        yield _sweep_case("sweep", f"constraint: {name}", grid(axes=axes, constraints=[value]))
    for name, value in (("a number", "[5]"), ("null", "[null]"), ("a list", "[[tensor]]"),
                        ("a string, not a list", "'tensor <= 8'"), ("a mapping", "{a: 1}")):
        text = grid(axes=axes, extra=f"constraints: {value}\n")
        yield _sweep_case("sweep", f"constraints: {name}", text, line=line_of(text,
                                                                             "constraints"))


def _values(n: int, fmt: str = "{}") -> str:
    return "[" + ", ".join(fmt.format(i) for i in range(1, n + 1)) + "]"


def sweep_size_cases() -> Iterator[Case]:
    """Grids of 10^6 points and more: refused, naming the axes that multiply, or
    run with progress and bounded memory; never silent for the timeout."""
    mem = _values(1000, "{}GiB")
    big = {
        "10^6 points (memory x max_num_seqs)": {"memory": mem, "max_num_seqs": _values(1000)},
        "10^9 points": {"memory": mem, "max_num_seqs": _values(1000),
                        "block_size": _values(1000)},
        "10^6 points (100 workloads)": {"memory": _values(100, "{}GiB"),
                                        "max_num_seqs": _values(100)},
    }
    for name, axes in big.items():
        workloads = "[" + ", ".join(
            f"{{name: w{i}, context_tokens: 512, output_tokens: 64, requests: 20, seed: {i}}}"
            for i in range(100)) + "]" if "workloads" in name else None
        yield _sweep_case("sweep", f"a grid of {name}", grid(axes=axes, workloads=workloads))
    text = grid(axes={"memory": mem, "max_num_seqs": _values(1000)},
                constraints=["memory == 1GiB and max_num_seqs == 1"])
    yield _sweep_case("sweep", "a grid of 10^6 points, one meeting the constraints", text,
                      ok=swept(1))


# -- rows: the sweep's results file, --report and --csv ---------------------------------

def _kvspec(where: Path, *argv: str) -> None:
    """Run ``kvspec`` in ``where`` (a case's preparation): it must succeed."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1"}
    env.pop("RAY_ADDRESS", None)
    subprocess.run([sys.executable, "-m", "kvspec", *argv], cwd=where, env=env, check=True,
                   capture_output=True, timeout=120)


def _swept_before(grid_file: str = "g.yaml", then: Callable[[Path], None] | None = None
                  ) -> Callable[[Path], None]:
    """A preparation: sweep ``grid_file`` into r.jsonl, then edit it with ``then``."""
    def prepare(where: Path) -> None:
        _kvspec(where, "sweep", grid_file, "-o", "r.jsonl", "-j", "1")
        if then is not None:
            then(where / "r.jsonl")
    return prepare


def _append(text: str) -> Callable[[Path], None]:
    def edit(path: Path) -> None:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(text)
    return edit


def _insert_second(text: str) -> Callable[[Path], None]:
    def edit(path: Path) -> None:
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        path.write_text(lines[0] + text + "".join(lines[1:]), encoding="utf-8")
    return edit


def _first_id_int(path: Path) -> None:
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    row = json.loads(lines[0])
    row["id"] = 5
    path.write_text(json.dumps(row) + "\n" + "".join(lines[1:]), encoding="utf-8")


def rows_cases() -> Iterator[Case]:
    g1 = grid()
    g2 = grid(axes={"max_num_seqs": "[32, 64]"})
    other = grid(base="\n  - source: s.yaml\n    name: other", axes={"block_size": "[32]"},
                 workload={"name": "code"})
    files: dict[str, str | bytes] = {"s.yaml": SMALL, "g.yaml": g1, "g2.yaml": g2,
                                     "other.yaml": other, "t.jsonl": TRACE, "d/": ""}

    def case(name: str, *argv: str, more: dict[str, str | bytes] | None = None,
             **kw: Any) -> Case:
        return _c("rows", name, "sweep", *argv, files={**files, **(more or {})}, **kw)

    users = {
        "a user's JSONL": '{"name": "a"}\n{"name": "b"}\n',
        "a user's one-line JSON without a newline": '{"note": "mine"}',
        "a user's JSON array": '[{"id": "x", "point": {}, "ok": true}]\n',
        "a kvspec trace": TRACE,
        "a user's text": "hello\nworld\n",
        "a user's binary file": bytes(range(256)),
        "a user's JSONL whose first line has an id": '{"id": "a", "v": 1}\n{"id": "b"}\n',
    }
    for name, content in users.items():
        yield case(f"-o {name}", "g.yaml", "-o", "u.jsonl", "-j", "1", more={"u.jsonl": content},
                   keep=("u.jsonl",), at=r"u\.jsonl")
    yield case("-o a user's JSONL with --force", "g.yaml", "-o", "u.jsonl", "-j", "1",
               "--force", more={"u.jsonl": users["a user's JSONL"]}, ok=swept(1, output="u.jsonl"),
               must_run=True)
    yield case("-o an empty file", "g.yaml", "-o", "u.jsonl", "-j", "1", more={"u.jsonl": ""},
               ok=swept(1, output="u.jsonl"), must_run=True)
    yield case("-o the grid's own trace", "g3.yaml", "-o", "t.jsonl", "-j", "1",
               more={"g3.yaml": grid(workloads="[{name: t, trace: t.jsonl}]")},
               keep=("t.jsonl",))
    yield case("-o the grid", "g.yaml", "-o", "g.yaml", keep=("g.yaml",))
    yield case("-o the base source", "g.yaml", "-o", "s.yaml", keep=("s.yaml",))
    yield case("-o a directory", "g.yaml", "-o", "d", keep=("d",))
    yield case("-o a bad suffix", "g.yaml", "-o", "r.csv", keep=("r.csv",))
    yield case("-o into a missing directory", "g.yaml", "-o", "no/such/r.jsonl",
               keep=("no",), at="-o|--output|no/such")
    yield case("-o into a read-only place", "g.yaml", "-o", "/proc/kvspec-rows.jsonl",
               at="-o|--output|/proc/kvspec-rows.jsonl")
    yield case("-o into a read-only place with --parents", "g.yaml", "-o",
               "/proc/kvspec-no/r.jsonl", "--parents", at="-o|--output|/proc/kvspec-no")
    yield case("-o under a file", "g.yaml", "-o", "s.yaml/r.jsonl", keep=("s.yaml",))
    yield case("-o - (rows on stdout)", "g.yaml", "-o", "-", "-j", "1", ok=rows_on_stdout(1),
               must_run=True)
    # results files a sweep wrote, then edited
    yield case("rows of another grid", "g.yaml", "-o", "r.jsonl", "-j", "1",
               prepare=_swept_before("other.yaml"), keep=("r.jsonl",), at=r"r\.jsonl:1\b")
    yield case("a torn last line (resumed)", "g2.yaml", "-o", "r.jsonl", "-j", "1",
               "--format", "json", prepare=_swept_before("g2.yaml", _append('{"id": "ab')),
               ok=swept(2), must_run=True)
    yield case("an unparsable line between rows", "g2.yaml", "-o", "r.jsonl", "-j", "1",
               prepare=_swept_before("g2.yaml", _insert_second("{oops\n")), keep=("r.jsonl",),
               at=r"r\.jsonl:2\b")
    yield case("a whole last line that is not JSON", "g.yaml", "-o", "r.jsonl", "-j", "1",
               prepare=_swept_before("g.yaml", _append("oops\n")), keep=("r.jsonl",),
               at=r"r\.jsonl:2\b")
    yield case("a last line that is JSON but not a row", "g.yaml", "-o", "r.jsonl", "-j", "1",
               prepare=_swept_before("g.yaml", _append('{"note": 1}\n')), keep=("r.jsonl",),
               at=r"r\.jsonl:2\b")
    yield case("a row whose id is a number", "g2.yaml", "-o", "r.jsonl", "-j", "1",
               prepare=_swept_before("g2.yaml", _first_id_int), keep=("r.jsonl",),
               # its first line is no row: the file is no sweep's, refused as -o's
               at=r"r\.jsonl:1\b|-o/--output r\.jsonl")
    yield case("a blank line between rows", "g2.yaml", "-o", "r.jsonl", "-j", "1",
               "--format", "json", prepare=_swept_before("g2.yaml", _insert_second("\n")),
               ok=swept(2))
    # --report and --csv
    yield case("--report over a user's page", "g.yaml", "-o", "r.jsonl", "--report", "u.html",
               more={"u.html": "<html>mine</html>\n"}, keep=("u.html",))
    yield case("--csv over a user's CSV", "g.yaml", "-o", "r.jsonl", "--csv", "u.csv",
               more={"u.csv": "a,b\n1,2\n"}, keep=("u.csv",))
    yield case("--csv over the grid", "g.yaml", "-o", "r.jsonl", "--csv", "g.yaml",
               keep=("g.yaml",))
    yield case("--report the rows file", "g.yaml", "-o", "r.jsonl", "--report", "r.jsonl",
               keep=("r.jsonl",))
    yield case("--report into a missing directory", "g.yaml", "-o", "r.jsonl", "--report",
               "no/such/r.html", keep=("no", "r.jsonl"), at="--report|no/such")
    yield case("--csv into a read-only place", "g.yaml", "-o", "r.jsonl", "--csv",
               "/proc/kvspec-rows.csv", keep=("r.jsonl",), at="--csv|/proc/kvspec-rows.csv")


# -- ray: --ray addresses (loopback only; none starts a Ray instance) -------------------

#: Addresses that are not addresses: refused before anything runs.
RAY_MALFORMED = ("not-an-address", "127.0.0.1:99999", "127.0.0.1:0", "127.0.0.1:-1",
                 "127.0.0.1:abc", "127.0.0.1:", ":6379", "ray://", "ray://not an address",
                 "ray://127.0.0.1:99999", "http://127.0.0.1:1", "127.0.0.1:1:2", "x" * 5000)
#: Addresses of nothing (closed loopback ports): refused within seconds.
RAY_UNREACHABLE = ("127.0.0.1:1", "localhost:9", "[::1]:1", "ray://127.0.0.1:1",
                   "ray://localhost:9")


def ray_cases() -> Iterator[Case]:
    files: dict[str, str | bytes] = {"s.yaml": SMALL, "g.yaml": grid()}
    for address in RAY_MALFORMED:
        shown = address if len(address) <= 40 else address[:20] + f"... ({len(address)} chars)"
        yield _c("ray", f"--ray {shown!r}", "sweep", "g.yaml", "-o", "r.jsonl", "--ray",
                 address, files=files, keep_failed=("r.jsonl",), at="--ray")
    for address in RAY_UNREACHABLE:
        yield _c("ray", f"--ray {address} (nothing there)", "sweep", "g.yaml", "-o", "r.jsonl",
                 "--ray", address, files=files, at="--ray|" + re.escape(address))
    yield _c("ray", "--ray with a bad grid", "sweep", "g.yaml", "-o", "r.jsonl", "--ray",
             "127.0.0.1:1", files={**files, "g.yaml": grid(axes={"tp": "[1]"})},
             # the address is probed before any work, the grid's checks included: either
             # error is the first thing to put right
             keep_failed=("r.jsonl",), at=_grid_at(4) + "|--ray 127\\.0\\.0\\.1:1")


# -- trace-import: every format's fields, files and options ------------------------------

@dataclass(frozen=True)
class Format:
    """A trace format as ``trace import`` reads it: a file name, its header, a row from
    (time, prompt, output), two good times, and the options it needs."""

    name: str
    file: str
    header: str | None
    row: Callable[[str, str, str], str]
    times: tuple[str, str]
    argv: tuple[str, ...] = ()


def _burst(t: str, p: str, o: str) -> str:
    return f"{t},ChatGPT,{p},{o},600,Conversation log"


def _mooncake(t: str, p: str, o: str) -> str:
    return f'{{"timestamp": {t}, "input_length": {p}, "output_length": {o}, "hash_ids": [7]}}'


def _lengths_json(t: str, p: str, o: str) -> str:
    return f'{{"t": {t}, "in": {p}, "out": {o}}}'


LENGTHS = ("--columns", "prompt=in,output=out,time=t")
IMPORT_FORMATS = (
    Format("azure-2023", "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens",
           lambda t, p, o: f"{t},{p},{o}",
           ("2023-11-16 18:15:46.6805900", "2023-11-16 18:15:47.6805900")),
    Format("azure-2024", "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens",
           lambda t, p, o: f"{t},{p},{o}",
           ("2024-05-10 00:00:00.009930+00:00", "2024-05-10 00:00:01.009930+00:00")),
    Format("burstgpt", "b.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,"
           "Log Type", _burst, ("5.0", "6.0")),
    Format("mooncake", "m.jsonl", None, _mooncake, ("0", "1000")),
    Format("lengths", "l.csv", "t,in,out", lambda t, p, o: f"{t},{p},{o}", ("0", "1"), LENGTHS),
    Format("lengths", "l.jsonl", None, _lengths_json, ("0", "1"), LENGTHS),
)


def _trace_file(f: Format, rows: list[tuple[str, str, str]]) -> str:
    return "".join(x + "\n" for x in ([f.header] if f.header else []) + [f.row(*r) for r in rows])


def valid_trace(text: str) -> int | None:
    """The requests of ``text`` when it is a trace ``simulate`` reads (kvspec's JSONL:
    arrivals from 0 to 2^40 that never decrease, token counts from 1 to 2^31, a shared
    prefix inside its prompt, content blocks the prompt covers); else None."""
    def no_constants(name: str) -> Any:
        raise ValueError(name)

    count, last = 0, 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            r = json.loads(line, parse_constant=no_constants)
        except ValueError:
            return None
        if not isinstance(r, dict):
            return None

        def whole(key: str, least: int, most: int) -> int | None:
            v = r.get(key)
            return v if type(v) is int and least <= v <= most else None

        arrival = whole("arrival", last, 2**40)
        prompt = whole("prompt_tokens", 1, 2**31)
        output = whole("output_tokens", 1, 2**31)
        if arrival is None or prompt is None or output is None:
            return None
        if "prefix_tokens" in r and (whole("prefix_tokens", 0, prompt) is None):
            return None
        if "prefix_blocks" in r:
            blocks, size = r["prefix_blocks"], whole("prefix_block_tokens", 1, 2**31)
            if size is None or not isinstance(blocks, list) or not blocks or any(
                    type(b) is not int or b < 0 for b in blocks) or \
                    len(blocks) > math.ceil(prompt / size):
                return None
        last, count = arrival, count + 1
    return count or None


def imported(n: int, output: str | None = None) -> Callable[[Outcome], bool]:
    """``ok`` of an import whose right answer is success: ``n`` requests (on stdout, or
    in ``output``) that ``simulate`` reads."""
    def ok(o: Outcome) -> bool:
        try:
            text = o.stdout if output is None else (o.where / output).read_text("utf-8")
        except (OSError, UnicodeDecodeError):
            return False
        return valid_trace(text) == n
    return ok


def _import_case(f: Format, name: str, rows: list[tuple[str, str, str]], *argv: str,
                 line: int | None = None, **kw: Any) -> Case:
    """``kvspec trace import`` of the rows (the first a good one) in ``f``'s format; a
    clear error is at ``line`` of the file (default: the last row's)."""
    if line is None:
        line = len(rows) + (1 if f.header else 0)
    label = f"{f.name} ({f.file.rsplit('.', 1)[1]})" if f.name == "lengths" else f.name
    return _c("trace-import", f"{label}: {name}", "trace", "import", f.name, f.file, *f.argv,
              *argv, files={f.file: _trace_file(f, rows)},
              at=_grid_at(line, file=f.file), **kw)


#: Bad token counts as CSV text (each beside a good row): 2^31 is the most a count may
#: be (a right answer), 10^15 and 2^31 + 1 are past it.
CSV_TOKENS_BAD = ("1000000000000000", "999999999999999", "2147483649", "2147483648", "-5", "0",
                  "nan", "inf", "1e3", "1.5", "", "abc", "0x10", "1_000", "+5")
JSON_TOKENS_BAD = ("1000000000000000", "2147483649", "2147483648", "-5", "0", "NaN",
                   "Infinity", "1e3", "1.5", '"512"', "true", "null", "[]",
                   "100000000000000000000000000000")
#: The output's bad counts (beside the first three of the prompt's).
OUTPUT_TOKENS_BAD = ("-5", "1.5", "abc")
#: Bad times per format (the good row before it arrives at its first time).
TIMES_BAD = {
    "azure-2023": ("not a date", "", "2023-13-45 00:00:00", "nan", "1700000000",
                   "9999-12-31 23:59:59", "2023-11-16 18:15:45", "2023-11-16 18:15:47+05:00"),
    "azure-2024": ("not a date", "", "2024-05-10", "2024-05-09 00:00:00+00:00",
                   "9999-12-31 23:59:59+00:00"),
    "burstgpt": ("nan", "inf", "-inf", "abc", "", "1e300", "-5", "4.0"),
    "mooncake": ("NaN", "Infinity", "-1", '"5"', "1e300", "true", "null", "[]"),
    "l.csv": ("nan", "inf", "-1", "abc", "1e300", ""),
    "l.jsonl": ("NaN", "-Infinity", "-1", '"abc"', "1e300", "null"),
}


def trace_import_cases() -> Iterator[Case]:
    for f in IMPORT_FORMATS:
        t0, t1 = f.times
        good = (t0, "600", "60")
        tokens = CSV_TOKENS_BAD if f.header else JSON_TOKENS_BAD
        for which in ("prompt", "output"):
            for value in tokens if which == "prompt" else tokens[:3] + OUTPUT_TOKENS_BAD:
                if f.name == "burstgpt" and value == "0":
                    continue  # BurstGPT's failed requests: skipped, and counted
                row = (t1, value, "60") if which == "prompt" else (t1, "600", value)
                yield _import_case(f, f"{which} {value or '(empty)'}", [good, row],
                                   ok=imported(2))
        for value in TIMES_BAD[f.file if f.name == "lengths" else f.name]:
            yield _import_case(f, f"time {value or '(empty)'}", [good, (value, "600", "60")],
                               ok=imported(2))
        header = 1 if f.header else 0
        structural: dict[str, tuple[str | bytes, int | None]] = {
            "an empty file": ("", None), "only blank lines": ("\n\n  \n", None),
            "a row short of fields" if f.header else "a line that is an array":
                (_trace_file(f, [good]) + ("1,2\n" if f.header else "[1, 2]\n"), header + 2),
            "not UTF-8": (_trace_file(f, [good]).encode() + b"\xff\xfe\n", header + 2),
            "UTF-16": (_trace_file(f, [good]).encode("utf-16"), None),
            "binary": (bytes(range(256)), None),
            "times that decrease": (_trace_file(f, [(t1, "600", "60"), good]), header + 2),
        }
        if f.header:
            structural["only the header"] = (f.header + "\n", None)
            structural["the header twice"] = (_trace_file(f, [good]) + f.header + "\n",
                                              header + 2)
            structural["a header without the prompt's column"] = (
                f.header.replace("ContextTokens", "Context").replace(
                    "Request tokens", "Request").replace(",in,", ",inn,") + "\n" +
                f.row(*good) + "\n", 1)
        else:
            structural["a line nested 5,000 deep"] = (
                f.row(t0, "600", "[" * 5000 + "]" * 5000) + "\n", 1)
        label = f"{f.name} ({f.file.rsplit('.', 1)[1]})" if f.name == "lengths" else f.name
        for name, (content, line) in structural.items():
            yield _c("trace-import", f"{label}: {name}", "trace", "import", f.name, f.file,
                     *f.argv, files={f.file: content},
                     at=None if line is None else _grid_at(line, file=f.file))
    # Mooncake's hash_ids: one id per 512-token block of the prompt, no more
    hashes = {"3 blocks for 600 tokens": ("600", "[1, 2, 3]", ()),
              "100 blocks for 10 tokens": ("10", str(list(range(100))), ()),
              "2 blocks for 1 token": ("1", "[1, 2]", ()),
              "40 blocks of 16 tokens for 600": ("600", str(list(range(40))),
                                                 ("--block-tokens", "16")),
              "a negative id": ("600", "[-1]", ()), "a float id": ("600", "[1.5]", ()),
              "a string id": ("600", '["a"]', ()), "a nested list": ("600", "[[1]]", ()),
              "a string": ("600", '"abc"', ()), "null": ("600", "null", ()),
              "an object": ("600", "{}", ()), "a boolean id": ("600", "[true]", ())}
    for name, (prompt, ids, argv) in hashes.items():
        text = (_mooncake("0", "600", "60") + "\n" +
                f'{{"timestamp": 1000, "input_length": {prompt}, "output_length": 60, '
                f'"hash_ids": {ids}}}\n')
        yield _c("trace-import", f"mooncake: hash_ids {name}", "trace", "import", "mooncake",
                 "m.jsonl", *argv, files={"m.jsonl": text}, at=_grid_at(2, file="m.jsonl"))
    for name, (prompt, ids) in {"2 blocks for 1,024 tokens": ("1024", "[1, 2]"),
                                "3 blocks for 1,025 tokens": ("1025", "[1, 2, 3]"),
                                "ids of 10^30": ("600", "[1000000000000000000000000000000]"),
                                "no ids": ("600", "[]")}.items():
        text = (f'{{"timestamp": 0, "input_length": {prompt}, "output_length": 60, '
                f'"hash_ids": {ids}}}\n')
        yield _c("trace-import", f"mooncake: hash_ids {name} (right)", "trace", "import",
                 "mooncake", "m.jsonl", files={"m.jsonl": text}, ok=imported(1))
    # files that are not this format's, and paths that are not files
    samples: dict[str, str | bytes] = {
        name: (REPO / "tests/data/traces" / name).read_text()
        for name in ("azure-2023.csv", "burstgpt.csv", "mooncake.jsonl", "lengths.csv")}
    samples.update({"t.jsonl": TRACE, "s.yaml": SMALL, "d/": ""})
    wrong = [("azure-2023", "mooncake.jsonl"), ("azure-2023", "burstgpt.csv"),
             ("azure-2024", "t.jsonl"), ("burstgpt", "azure-2023.csv"),
             ("mooncake", "azure-2023.csv"), ("mooncake", "t.jsonl"), ("kvspec", "mooncake.jsonl"),
             ("kvspec", "azure-2023.csv"), ("azure-2023", "s.yaml"), ("mooncake", "s.yaml")]
    for fmt, name in wrong:
        yield _c("trace-import", f"{fmt} given {name}", "trace", "import", fmt, name,
                 files=samples)
    for fmt in ("azure-2023", "mooncake", "lengths"):
        for path in ("d", "missing.csv"):
            yield _c("trace-import", f"{fmt} given {path}", "trace", "import", fmt, path,
                     *(LENGTHS if fmt == "lengths" else ()), files=samples)
    yield _c("trace-import", "an unknown format", "trace", "import", "azure", "azure-2023.csv",
             files=samples)
    # options
    az = ("trace", "import", "azure-2023", "azure-2023.csv")
    for value in ("0", "-1", "nan", "inf", "1e7", "abc", "1e-300"):
        yield _c("trace-import", f"--step-ms {value}", *az, "--step-ms", value, files=samples,
                 ok=imported(6))
    for value in ("0", "-1", "abc", "1e30", "2147483649"):
        yield _c("trace-import", f"--block-tokens {value}", "trace", "import", "mooncake",
                 "mooncake.jsonl", "--block-tokens", value, files=samples, ok=imported(5))
    for value in ("prompt=input_len", "foo", "prompt=input_len,output=output_len,time=",
                  "prompt=input_len,output=output_len,x=c", "", "prompt=nope,output=output_len"):
        yield _c("trace-import", f"lengths --columns {value!r}", "trace", "import", "lengths",
                 "lengths.csv", "--columns", value, files=samples)
    yield _c("trace-import", "lengths without --columns", "trace", "import", "lengths",
             "lengths.csv", files=samples)
    yield _c("trace-import", "--time-unit h", "trace", "import", "lengths", "lengths.csv",
             "--columns", "prompt=input_len,output=output_len", "--time-unit", "h",
             files=samples)
    # -o: never over a user's file or the input, never half-written
    bad_rows = ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,5,5\n"
                "2023-11-16 18:15:47,-5,5\n")
    outs: dict[str, str | bytes] = {**samples, "bad.csv": bad_rows, "old.jsonl": TRACE,
                                    "u.jsonl": '{"name": "mine"}\n', "notes.json": '{"a": 1}'}
    for name, argv, keep in (
            ("-o into a missing directory", ("-o", "no/such/t.jsonl"), ("no",)),
            ("-o into a read-only place", ("-o", "/proc/kvspec-t.jsonl"), ()),
            ("-o a user's JSONL", ("-o", "u.jsonl"), ("u.jsonl",)),
            ("-o a user's JSON", ("-o", "notes.json"), ("notes.json",)),
            ("-o the input", ("-o", "azure-2023.csv"), ("azure-2023.csv",)),
            ("-o a source", ("-o", "s.yaml"), ("s.yaml",)),
            ("-o a directory", ("-o", "d"), ("d",)),
            ("-o a bad suffix", ("-o", "t.txt"), ("t.txt",)),
            ("--format json without -o", ("--format", "json"), ())):
        yield _c("trace-import", name, *az, *argv, files=outs, keep=keep)
    yield _c("trace-import", "a failed import over an earlier trace", "trace", "import",
             "azure-2023", "bad.csv", "-o", "old.jsonl", files=outs, keep_failed=("old.jsonl",),
             at=_grid_at(3, file="bad.csv"))
    yield _c("trace-import", "a failed import to a new file", "trace", "import", "azure-2023",
             "bad.csv", "-o", "new.jsonl", files=outs, keep_failed=("new.jsonl",),
             at=_grid_at(3, file="bad.csv"))
    yield _c("trace-import", "an import over an earlier trace (right)", *az, "-o", "old.jsonl",
             files=outs, ok=imported(6, "old.jsonl"), must_run=True)
    yield _c("trace-import", "a BOM and CRLF line ends (right)", "trace", "import", "azure-2023",
             "crlf.csv", files={"crlf.csv": "\ufeffTIMESTAMP,ContextTokens,GeneratedTokens\r\n"
                                "2023-11-16 18:15:46.6805900,374,44\r\n".encode()},
             ok=imported(1), must_run=True)


def cases() -> list[Case]:
    """Every case, in a fixed order."""
    return [*trace_cases(), *workload_cases(), *pooling_cases(), *simulate_cases(),
            *descriptor_cases(), *transfer_cases(), *sweep_field_cases(), *sweep_grid_cases(),
            *sweep_constraint_cases(), *sweep_size_cases(), *rows_cases(), *ray_cases(),
            *trace_import_cases()]


# -- running and classifying ---------------------------------------------------------

_POSITION = re.compile(r"^\S.*?:\d+(:\d+)?: error", re.MULTILINE)
_OPTION = re.compile(r"(^|[\s'\"(])--?[a-zA-Z][\w-]*")
#: A command's argument, by its name (click: "invalid value for FORMAT").
_ARGUMENT = re.compile(r"invalid value for '?[A-Z][A-Z_]*\b")
#: pydantic's own names: a message showing them says nothing a user wrote.
_LEAK = re.compile(r"constrained-(float|int|str)|Input should be|\[type=\w+|"
                   r"function-(after|before|wrap|plain)\[|tagged-union\[|lax-or-strict\[|"
                   r"json-or-python\[|is-instance\[")
#: A progress line (``label: N of M ...``, ``label: N ...``), as kvspec prints off a
#: terminal.
_PROGRESS = re.compile(r"^[^\n:]{1,60}: [\d,]+( of [\d,]+)?( |$)", re.MULTILINE)


@dataclass(frozen=True)
class Result:
    case: Case
    kind: str
    code: int | None
    seconds: float
    message: str
    #: What made it lost file or silent wrong, when that is not in the message.
    detail: str = ""


def _placed(case: Case, stderr: str) -> bool:
    """Whether the error places the problem as the case asks (see the docstring)."""
    if _LEAK.search(stderr):
        return False
    if any(not re.search(s, stderr, re.IGNORECASE | re.MULTILINE) for s in case.says) or any(
            re.search(s, stderr, re.IGNORECASE | re.MULTILINE) for s in case.not_says):
        return False
    if case.at is not None:
        return re.search(case.at, stderr, re.MULTILINE) is not None
    # the first line of the message names the option or a file the case gave, or the
    # message has a position (file:line:col, or an "at:" path into the source)
    files = {a for a in case.argv if "." in a or a == "-"} | \
        {f.rstrip("/") for f in case.files} | {"<stdin>"}
    first = next((line for line in stderr.splitlines() if "error" in line), "")
    return bool(_POSITION.search(stderr) or "\n  at: " in stderr or _OPTION.search(first)
                or "error: missing argument " in first or _ARGUMENT.search(first)
                or any(re.search(rf"(^|[\s:'\"(]){re.escape(f)}([\s:'\")]|$)", first)
                       for f in files))


def classify(case: Case, code: int | None, stderr: str, timed_out: bool,
             lost: tuple[str, ...] = (), right: bool | None = None) -> str:
    """The class of a run: ``lost`` names the files it changed that it must not have,
    ``right`` is the case's ``ok`` on a successful run (None: it has none)."""
    if timed_out:
        return "slow" if _PROGRESS.search(stderr) else "runaway"
    if "Traceback (most recent call last)" in stderr or code not in (0, 1, 2):
        return "traceback"
    if lost:
        return "lost file"
    if code == 0:
        return "right" if right else "silent wrong"
    if case.must_run:
        return "refused"
    return "clear" if _placed(case, stderr) else "unclear"


def _state(path: Path) -> bytes | str | None:
    """A file's bytes, "dir" for a directory, None when nothing is there."""
    if path.is_dir():
        return "dir"
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"unreadable: {exc}"


def _change(name: str, before: bytes | str | None, after: bytes | str | None) -> str:
    if before is None:
        return f"{name} left behind" + (f" ({len(after):,} bytes)"
                                        if isinstance(after, bytes) else "")
    if after is None:
        return f"{name} deleted"
    if isinstance(before, bytes) and isinstance(after, bytes):
        if before.startswith(after):
            return f"{name} truncated from {len(before):,} to {len(after):,} bytes"
        return f"{name} rewritten ({len(before):,} bytes, now {len(after):,})"
    return f"{name} changed"


def _make(where: Path, files: dict[str, str | bytes]) -> None:
    for name, content in files.items():
        path = where / name
        if name.endswith("/"):
            path.mkdir(parents=True, exist_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")


def _json_errors(stdout: str) -> str:
    """The errors of a ``--format json`` failure (``{"ok": false, "errors": [...]}`` on
    stdout) written as the text format writes them, so they are judged alike."""
    try:
        doc = json.loads(stdout)
    except ValueError:
        return ""
    if not isinstance(doc, dict) or doc.get("ok") is not False:
        return ""
    out = []
    for e in doc.get("errors") or []:
        if not isinstance(e, dict):
            continue
        place = ":".join(str(e[k]) for k in ("file", "line", "column") if e.get(k) is not None)
        out.append(f"{place or 'kvspec'}: error: {e.get('message')}")
        out += [f"  {k}: {e[key]}" for k, key in (("at", "path"), ("expected", "expected"),
                                                  ("found", "found"), ("hint", "hint"))
                if e.get(key) is not None]
    return "\n".join(out)


def _drain(pipe: IO[bytes] | None, into: list[bytes]) -> None:
    if pipe is not None:
        with contextlib.suppress(OSError, ValueError):
            into.extend(iter(lambda: pipe.read1(1 << 16), b""))  # type: ignore[attr-defined]


def _feed(pipe: IO[bytes] | None, data: bytes) -> None:
    if pipe is not None:
        with contextlib.suppress(OSError, ValueError):
            pipe.write(data)
            pipe.close()


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """The case's whole process group (its pool workers too), killed."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def run(case: Case, root: Path, timeout: float, python: str = sys.executable) -> Result:
    """``case`` through ``python -m kvspec`` in a directory of its own under ``root``."""
    where = Path(tempfile.mkdtemp(dir=root))
    try:
        _make(where, case.files)
        if case.prepare is not None:
            case.prepare(where)
    except (OSError, subprocess.SubprocessError) as exc:
        shutil.rmtree(where, ignore_errors=True)
        return Result(case, "traceback", None, 0.0, f"the case's preparation failed: {exc}")
    watched = dict.fromkeys(case.keep + case.keep_failed)
    before = {name: _state(where / name) for name in watched}
    env = {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1", "COLUMNS": "100"}
    env.pop("RAY_ADDRESS", None)  # --ray cases name their address (never a real cluster)
    start = time.monotonic()
    proc = subprocess.Popen([python, "-m", "kvspec", *case.argv], cwd=where, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    # the pipes are read on threads and the command's own exit is waited for: workers it
    # leaves behind holding the pipes are killed with its group, not waited for
    chunks: dict[str, list[bytes]] = {"out": [], "err": []}
    readers = [threading.Thread(target=_drain, args=(pipe, chunks[key]), daemon=True)
               for key, pipe in (("out", proc.stdout), ("err", proc.stderr))]
    readers.append(threading.Thread(target=_feed, args=(proc.stdin, case.stdin or b""),
                                    daemon=True))
    for t in readers:
        t.start()
    try:
        proc.wait(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
    _kill_group(proc)  # the command at the timeout, and whatever it left running
    proc.wait()
    for t in readers:
        t.join(timeout=10)
    out, err = b"".join(chunks["out"]), b"".join(chunks["err"])
    seconds = time.monotonic() - start
    code = None if timed_out else proc.returncode
    stdout = out.decode("utf-8", "replace")
    stderr = err.decode("utf-8", "replace")
    if code not in (None, 0) and "json" in case.argv:
        stderr = (stderr + "\n" + _json_errors(stdout)).strip()
    check = case.keep + (case.keep_failed if code != 0 else ())
    lost = tuple(_change(n, before[n], after) for n in dict.fromkeys(check)
                 if (after := _state(where / n)) != before[n])
    right = None
    if code == 0 and case.ok is not None:
        try:
            right = bool(case.ok(Outcome(0, stdout, stderr, where)))
        except Exception:  # noqa: BLE001 - a predicate that cannot judge says no
            right = False
    shutil.rmtree(where, ignore_errors=True)
    kind = classify(case, code, stderr, timed_out, lost, right)
    detail = "; ".join(lost)  # (shown with a traceback or a hang too)
    return Result(case, kind, code, seconds, stderr, detail)


def run_all(selected: list[Case], jobs: int, timeout: float, quiet: bool = False
            ) -> list[Result]:
    """Every case, ``jobs`` at a time; a line on stderr every 25 cases."""
    out: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="kvspec-bad-") as tmp, \
            ThreadPoolExecutor(max_workers=jobs) as pool:
        for r in pool.map(lambda c: run(c, Path(tmp), timeout), selected):
            out.append(r)
            if not quiet and len(out) % 25 == 0:
                print(f"{len(out)} of {len(selected)} cases", file=sys.stderr, flush=True)
    return out


def first_line(message: str) -> str:
    lines = [x for x in message.strip().splitlines() if x.strip()]
    if not lines:
        return "(nothing on stderr)"
    tb = [x for x in lines if re.match(r"^\w+(\.\w+)*(Error|Exception)\b", x)]
    line = tb[-1] if tb and "Traceback" in message else lines[0]
    return line if len(line) <= 150 else line[:147] + "..."


def shown(r: Result) -> str:
    """A result's first line for the table: what it lost or printed, and its message."""
    line = first_line(r.message)
    return f"{r.detail}; {line}" if r.detail else line


def report(results: list[Result], seconds: float, jobs: int, timeout: float) -> str:
    surfaces = [s for s in SURFACES if any(r.case.surface == s for r in results)]
    counts = {s: Counter(r.kind for r in results if r.case.surface == s) for s in surfaces}
    total = Counter(r.kind for r in results)
    out = ["# Bad inputs through the command line", "",
           ("Generated by `python benchmarks/bad_inputs.py` (issues 36 and 48): every case is "
            "an input kvspec must refuse, or one whose right answer the case states, run as "
            f"`python -m kvspec ...` with a {timeout:g} s timeout ({jobs} at a time, "
            f"{seconds:.0f} s in all). The classes are defined in the script's docstring; "
            "the target is 0 in each of " + ", ".join(BAD) + "."), "",
           "| surface | cases | " + " | ".join(KINDS) + " |",
           "|---|---:|" + "---:|" * len(KINDS)]
    for s in surfaces:
        c = counts[s]
        out.append(f"| {s} | {sum(c.values())} | " + " | ".join(str(c[k]) for k in KINDS) + " |")
    out.append(f"| **all** | **{len(results)}** | " +
               " | ".join(f"**{total[k]}**" for k in KINDS) + " |")
    bad = [r for r in results if r.kind not in ("clear", "right")]
    out += ["", "## Cases that are not clear errors or right answers", ""]
    if not bad:
        out.append("None.")
    for s in surfaces:
        rows = [r for r in bad if r.case.surface == s]
        if not rows:
            continue
        out += [f"### {s}", "", "| case | class | exit | first line |", "|---|---|---:|---|"]
        for r in rows:
            line = shown(r).replace("|", "\\|")
            out.append(f"| `{r.case.name}` | {r.kind} | {r.code if r.code is not None else '-'}"
                       f" | {line} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--only", choices=SURFACES)
    parser.add_argument("--every", type=int, default=1, help="run every K-th case")
    parser.add_argument("--match", metavar="REGEX", help="only the cases whose name matches")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/bad_inputs.md")
    parser.add_argument("--list", action="store_true", help="list the cases and stop")
    parser.add_argument("--json", action="store_true", help="print each result as JSON")
    args = parser.parse_args(argv)
    selected = [c for c in cases() if args.only in (None, c.surface) and (
        args.match is None or re.search(args.match, c.name))][::args.every]
    if args.list:
        for c in selected:
            print(f"{c.surface:10}  {c.name}")
        print(f"{len(selected)} cases")
        return 0
    start = time.monotonic()
    results = run_all(selected, args.jobs, args.timeout)
    seconds = time.monotonic() - start
    text = report(results, seconds, args.jobs, args.timeout)
    if args.json:
        for r in results:
            print(json.dumps({"surface": r.case.surface, "case": r.case.name, "kind": r.kind,
                              "exit": r.code, "seconds": round(r.seconds, 2),
                              "detail": r.detail, "message": r.message[-2000:]}))
    else:
        print(text)
    if args.only is None and args.every == 1 and args.match is None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")
    return 1 if any(r.kind in BAD for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
