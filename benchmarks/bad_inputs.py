"""Bad inputs through the real command line, each classified (issue 36).

    python benchmarks/bad_inputs.py [--jobs N] [--timeout S] [--only SURFACE] [--every K]
                                    [--out benchmarks/results/bad_inputs.md] [--list]

Every case is an input kvspec must refuse: hand-made ones (the issue's) and ones
generated from tables of bad values per option and field, across the surfaces
``trace`` (its options), ``workload`` (trace files and the source's
``pooling.workload``), ``pooling`` (the rest of the ``pooling`` section and the
budget), ``simulate`` (its options and inputs), ``descriptor`` and ``transfer``
(their options and artifacts). ``sweep`` has no command yet. Each case runs as
``python -m kvspec ...`` in a directory of its own, with ``--timeout`` seconds
(10), and is classified:

* **clear** -- exit 1 or 2, no traceback, and the message places the problem:
  ``file:line:col``, an ``at:`` path, the option's name, or the file it names;
* **unclear** -- exit 1 or 2, no traceback, but nothing places the problem;
* **traceback** -- a Python traceback, or an exit code that is neither 1 nor 2;
* **runaway** -- still running at the timeout with nothing on stderr (no progress);
* **slow** -- still running at the timeout, but saying how far it is on stderr;
* **silent wrong** -- exit 0, where an error is due.

The table goes to ``--out`` (benchmarks/results/bad_inputs.md): counts per surface,
then every case that is not clear. ``tests/test_bad_inputs.py`` runs every
``--every``-th case of the same list, so a regression fails the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KINDS = ("clear", "unclear", "traceback", "runaway", "slow", "silent wrong")
SURFACES = ("trace", "workload", "pooling", "simulate", "descriptor", "transfer")

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
class Case:
    """One bad input: the command line (in its own directory, beside ``files``)."""

    surface: str
    name: str
    argv: tuple[str, ...]
    files: dict[str, str | bytes] = field(default_factory=dict)
    stdin: bytes | None = None


def _c(surface: str, name: str, *argv: str, files: dict[str, str | bytes] | None = None,
       stdin: bytes | None = None) -> Case:
    return Case(surface, name, tuple(argv), files or {}, stdin)


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


def cases() -> list[Case]:
    """Every case, in a fixed order."""
    return [*trace_cases(), *workload_cases(), *pooling_cases(), *simulate_cases(),
            *descriptor_cases(), *transfer_cases()]


# -- running and classifying ---------------------------------------------------------

_POSITION = re.compile(r"^\S.*?:\d+(:\d+)?: error", re.MULTILINE)
_OPTION = re.compile(r"(^|[\s'\"(])--?[a-zA-Z][\w-]*")


@dataclass(frozen=True)
class Result:
    case: Case
    kind: str
    code: int | None
    seconds: float
    message: str


def classify(case: Case, code: int | None, stderr: str, timed_out: bool) -> str:
    if timed_out:
        return "slow" if stderr.strip() else "runaway"
    if "Traceback (most recent call last)" in stderr or code not in (0, 1, 2):
        return "traceback"
    if code == 0:
        return "silent wrong"
    # the first line of the message names the option or a file the case gave, or the
    # message has a position (file:line:col, or an "at:" path into the source)
    files = {a for a in case.argv if "." in a or a == "-"} | set(case.files) | {"<stdin>"}
    first = next((line for line in stderr.splitlines() if "error" in line), "")
    placed = (_POSITION.search(stderr) or "\n  at: " in stderr or _OPTION.search(first)
              or "error: missing argument " in first
              or any(re.search(rf"(^|[\s:'\"(]){re.escape(f)}([\s:'\")]|$)", first)
                     for f in files))
    return "clear" if placed else "unclear"


def run(case: Case, root: Path, timeout: float, python: str = sys.executable) -> Result:
    """``case`` through ``python -m kvspec`` in a directory of its own under ``root``."""
    where = Path(tempfile.mkdtemp(dir=root))
    for name, content in case.files.items():
        path = where / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1", "COLUMNS": "100"}
    start = time.monotonic()
    proc = subprocess.Popen([python, "-m", "kvspec", *case.argv], cwd=where, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        _, err = proc.communicate(case.stdin or b"", timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        timed_out = True
    seconds = time.monotonic() - start
    stderr = err.decode("utf-8", "replace")
    shutil.rmtree(where, ignore_errors=True)
    kind = classify(case, None if timed_out else proc.returncode, stderr, timed_out)
    return Result(case, kind, None if timed_out else proc.returncode, seconds, stderr)


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


def report(results: list[Result], seconds: float, jobs: int, timeout: float) -> str:
    counts = {s: Counter(r.kind for r in results if r.case.surface == s) for s in SURFACES}
    total = Counter(r.kind for r in results)
    out = ["# Bad inputs through the command line", "",
           ("Generated by `python benchmarks/bad_inputs.py` (issue 36): every case is an input "
            "kvspec must refuse, run as `python -m kvspec ...` with a "
            f"{timeout:g} s timeout ({jobs} at a time, {seconds:.0f} s in all). The classes "
            "are defined in the script's docstring; the target is 0 tracebacks, 0 runaways "
            "and 0 silent wrong results. `sweep` had no command when this was written, so "
            "it has no cases."), "",
           "| surface | cases | " + " | ".join(KINDS) + " |",
           "|---|---:|" + "---:|" * len(KINDS)]
    for s in SURFACES:
        c = counts[s]
        out.append(f"| {s} | {sum(c.values())} | " + " | ".join(str(c[k]) for k in KINDS) + " |")
    out.append(f"| **all** | **{len(results)}** | " +
               " | ".join(f"**{total[k]}**" for k in KINDS) + " |")
    bad = [r for r in results if r.kind != "clear"]
    out += ["", "## Cases that are not clear errors", ""]
    if not bad:
        out.append("None.")
    for s in SURFACES:
        rows = [r for r in bad if r.case.surface == s]
        if not rows:
            continue
        out += [f"### {s}", "", "| case | class | exit | first line |", "|---|---|---:|---|"]
        for r in rows:
            line = first_line(r.message).replace("|", "\\|")
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
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/bad_inputs.md")
    parser.add_argument("--list", action="store_true", help="list the cases and stop")
    parser.add_argument("--json", action="store_true", help="print each result as JSON")
    args = parser.parse_args(argv)
    selected = [c for c in cases() if args.only in (None, c.surface)][::args.every]
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
                              "message": r.message[-2000:]}))
    else:
        print(text)
    if args.only is None and args.every == 1:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")
    return 1 if any(r.kind in ("traceback", "runaway", "silent wrong") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
